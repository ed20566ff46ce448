"""Bad input never fails the run: each bad file is reported with its reason, the rest is indexed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import run_cli, run_json, table_rows

pytestmark = pytest.mark.slow
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + os.urandom(200)


@pytest.fixture
def shared_tmp(tmp_path: Path) -> Path:
    return tmp_path


def _make_bad_corpus(root: Path) -> dict[str, str]:
    mem = root / "mem"
    shutil.copytree(SAMPLE, mem, ignore=TEXT_ONLY)
    bad = mem / "bad"
    bad.mkdir()
    (bad / "latin1.md").write_bytes("# Caf\xe9 notes\nna\xefve r\xe9sum\xe9\n".encode("latin-1"))
    (bad / "empty.md").write_bytes(b"")
    (bad / "image-renamed.md").write_bytes(PNG)
    (bad / "secret.md").write_text("# private\nno access\n")
    (bad / "secret.md").chmod(0)
    os.symlink("/etc/hostname", bad / "outside-link.md")
    with open(bad / "huge.md", "wb") as fh:  # 50 MB of real markdown
        line = b"- a line of a very large generated markdown note about nothing in particular\n"
        fh.write(line * (50 * 1024 * 1024 // len(line) + 1))
    return {
        "latin1.md": "UTF-8",
        "empty.md": "empty",
        "image-renamed.md": "image/png",
        "secret.md": "permission denied",
        "outside-link.md": "outside the source root",
        "huge.md": "max_file_bytes",
    }


def test_bad_files_are_reported_and_everything_else_indexed(shared_tmp: Path):
    expected = _make_bad_corpus(shared_tmp)
    index = shared_tmp / "index"
    cfg = write_config(shared_tmp / "memory_pipeline.yaml")
    # root reads any file: the child drops that privilege so the chmod 000 file is really unreadable.
    user = True
    env: dict = {}
    summary = run_json("index", "--config", str(cfg), "--json", env=env, honor_permissions=user)

    reasons = {Path(e["path"]).name: e["reason"] for e in summary["errors"]}
    for name, fragment in expected.items():
        assert name in reasons, (name, summary["errors"])
        assert fragment.lower() in reasons[name].lower(), (name, reasons[name])
    # every good file of the sample, plus latin1.md: new, so tried, and failed at extraction
    assert summary["files_changed"] == 18
    indexed = {r["path"] for r in table_rows(index, columns=("path",))}
    good = {p.relative_to(shared_tmp / "mem").as_posix() for p in (shared_tmp / "mem").rglob("*") if p.is_file() and "bad" not in p.parts}
    assert indexed == good

    # scan reports the same problems without indexing anything.
    scan = run_cli("scan", "--config", str(cfg), env=env, honor_permissions=user)
    assert scan.returncode == 0, scan.stderr
    for name in expected:
        assert name in scan.stdout
    assert "Found 17 text files, 0 media files" in scan.stdout

    # A second run: still reported, nothing re-embedded, nothing lost.
    again = run_json("index", "--config", str(cfg), "--json", env=env, honor_permissions=user)
    assert again["chunks_embedded"] == 0 and again["table_rows"] == summary["table_rows"]
    assert {Path(e["path"]).name for e in again["errors"]} >= set(expected)


def test_large_markdown_under_the_limit_is_indexed_in_bounded_memory(tmp_path: Path):
    import resource
    import subprocess
    import sys

    mem = tmp_path / "mem"
    mem.mkdir()
    lines = [f"## Section {i}\n- item {i}: notes on shipment batch {i} and carrier route {i % 97}\n" for i in range(60_000)]
    (mem / "big.md").write_text("# Big log\n" + "".join(lines))
    size = (mem / "big.md").stat().st_size
    assert size > 4 * 1024 * 1024
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    code = (
        "import resource, subprocess, sys, json;"
        f"p = subprocess.run([sys.executable, '-m', 'memory_pipeline.cli', 'index', '--config', {str(cfg)!r}, '--json'], capture_output=True, text=True);"
        "print(json.dumps({'rc': p.returncode, 'out': p.stdout, 'err': p.stderr[-2000:], 'maxrss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))"
    )
    import json

    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert out["rc"] == 0, out["err"]
    summary = json.loads(out["out"])
    assert summary["errors"] == [] and summary["table_rows"] > 1000
    assert summary["mode"] == "fts-only"
    assert out["maxrss_kb"] < 1_500_000  # generous: the point is it does not blow up with file size
    del resource


def test_an_unreadable_data_file_is_an_error_that_names_it_and_it_is_not_set_aside(tmp_path: Path):
    """A partition file of the data folder that this user cannot read (permissions) is not damaged:
    it was moved aside as "damaged" (by `memory status`, a command that only reads) and its work
    redone. Now every command that needs it says which file and what to check, in one line, exit 1,
    and leaves it where it is; once readable again, nothing was lost."""
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "kiln.md").write_text("# Kiln\n\nThe kiln reached 1,200 degrees on the third firing.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    assert run_cli("index", "--config", str(cfg)).returncode == 0
    for path in tmp_path.rglob("*"):  # the unprivileged child may read and write the rest
        path.chmod(0o777 if path.is_dir() else 0o666)
    # The partition holding the note (every shard has a file; the others are empty).
    locked = max((tmp_path / "index" / "assets" / "source_files").glob("*.parquet"), key=lambda p: p.stat().st_size)
    locked.chmod(0)
    for args in (["status"], ["index"], ["index", "--force"]):
        proc = run_cli(*args, "--config", str(cfg), honor_permissions=True)
        err = proc.stderr.strip()
        assert proc.returncode == 1, (args, proc.stdout, err)
        assert str(locked) in err and "Permission denied" in err and "Traceback" not in err and "a bug" not in err, (args, err)
        assert "[ERROR]" in err and len([line for line in err.splitlines() if "[ERROR]" in line]) == 1, (args, err)
        # Left where it is: nothing set aside as damaged (a forced run writes the other shards' files).
        assert locked.is_file() and not list(tmp_path.rglob("*.corrupt-*")), (args, sorted(p.name for p in locked.parent.iterdir()))
    locked.chmod(0o644)
    again = run_json("index", "--config", str(cfg), "--json")
    assert again["chunks_embedded"] == 0 and again["files_changed"] == 0 and again["rows_written"] == 0, again


def test_a_name_that_is_not_utf8_and_a_json_surrogate_escape_fail_only_their_own_file(tmp_path: Path):
    """Two ordinary things a memory folder holds stopped whole runs: a Latin-1 file name (`memory
    scan` and `memory index` exited with a UnicodeEncodeError, nothing indexed) and a transcript
    line with a JSON "\\ud800" escape (the shard's frame could not be built). Now the name is
    reported, escaped, the escape becomes U+FFFD with a warning, and the rest is indexed."""
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "kiln.md").write_text("# Kiln\n\nThe kiln reached cone ten on the glaze firing.\n")
    (mem / "chat.jsonl").write_text('{"role": "user", "content": "the wombat \\ud800 conference is in Hobart"}\n')
    (mem / "doc.json").write_text('{"title": "x \\udfff y", "body": "the quokka census is on Rottnest"}\n')
    with open(os.path.join(os.fsencode(mem), b"caf\xe9.md"), "wb") as fh:
        fh.write(b"# Cafe\n\nlatin name\n")
    # A real file named as the Latin-1 one is shown: it shared that one's record, and every run
    # wrote its row again (files_changed 1 on each later run, the file counted as not indexed).
    (mem / "caf\\xe9.md").write_text("# Twin\n\nThe narwhal tusk survey is named with a backslash.\n")
    os.mkdir(os.path.join(os.fsencode(mem), b"old\xff"))
    with open(os.path.join(os.fsencode(mem), b"old\xff", b"inside.md"), "wb") as fh:
        fh.write(b"# Inside\n\ninside a folder of a latin name\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    scan = run_cli("scan", "--config", str(cfg))
    assert scan.returncode == 0 and "caf\\xe9.md~2" in scan.stdout and "Traceback" not in scan.stderr, scan.stdout + scan.stderr
    summary = run_json("index", "--config", str(cfg), "--json")
    errors = {Path(e["path"]).name: e for e in summary["errors"]}
    assert errors["caf\\xe9.md~2"]["status"] == "failed" and "not valid UTF-8" in errors["caf\\xe9.md~2"]["reason"], errors
    assert "caf\\xe9.md" not in errors, errors
    assert errors["old\\xff"]["status"] == "failed" and "folder name" in errors["old\\xff"]["reason"], errors
    for name in ("chat.jsonl", "doc.json"):
        assert errors[name]["status"] == "partial" and "U+FFFD" in errors[name]["reason"], errors
    for query, path in (
        ("wombat conference Hobart", "chat.jsonl"),
        ("quokka census", "doc.json"),
        ("kiln glaze firing", "kiln.md"),
        ("narwhal tusk survey", "caf\\xe9.md"),
    ):
        hits = run_json("search", query, "--config", str(cfg), "--json")["results"]
        assert hits and hits[0]["path"].endswith(path), (query, hits[:2])
    rows = table_rows(tmp_path / "index")
    assert not [r for r in rows if "\ufffd" not in r["text"] and "wombat" in r["text"]]  # the escape is U+FFFD in the table
    again = run_json("index", "--config", str(cfg), "--json")
    assert again["chunks_embedded"] == 0 and again["files_changed"] == 0, again


def test_the_rows_of_a_file_whose_name_a_shown_name_takes_over_are_removed_when_it_is_deleted(tmp_path: Path):
    """A real ``caf\\xe9.md`` beside a Latin-1 ``caf<E9>.md`` (shown ``caf\\xe9.md~2``): once the real
    one is deleted, the Latin-1 one is shown as ``caf\\xe9.md`` again, the deleted file's path. As a
    failed file's record it kept that file's rows, so a deleted note was still found by search.
    A shown name keeps no rows: they are removed, and the next run does nothing."""
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "kiln.md").write_text("# Kiln\n\nThe kiln reached cone ten on the glaze firing.\n")
    real = mem / "caf\\xe9.md"
    real.write_text("# Twin\n\nThe narwhal tusk survey is named with a backslash.\n")
    with open(os.path.join(os.fsencode(mem), b"caf\xe9.md"), "wb") as fh:
        fh.write(b"# Cafe\n\nlatin name\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    first = run_json("index", "--config", str(cfg), "--json")
    assert [Path(e["path"]).name for e in first["errors"]] == ["caf\\xe9.md~2"], first["errors"]
    assert run_json("search", "narwhal tusk survey", "--config", str(cfg), "--json")["results"][0]["path"].endswith("caf\\xe9.md")
    real.unlink()
    second = run_json("index", "--config", str(cfg), "--json")
    assert [Path(e["path"]).name for e in second["errors"]] == ["caf\\xe9.md"], second["errors"]
    assert second["files_deleted"] == 1 and second["rows_deleted"] == 1 and second["table_rows"] == 1, second
    hits = run_json("search", "narwhal tusk survey", "--config", str(cfg), "--json")["results"]
    assert not [h for h in hits if "caf" in h["path"]], hits
    third = run_json("index", "--config", str(cfg), "--json")
    assert third["files_changed"] == 0 and third["files_deleted"] == 0 and third["rows_written"] == 0 and third["rows_deleted"] == 0, third


def test_a_folder_that_cannot_be_listed_keeps_the_rows_of_its_files(tmp_path: Path):
    """A folder this user cannot list (chmod 000, a disk error) was walked as empty: every file under
    it counted as deleted and its rows went (the source folder itself unlistable: the whole table).
    Its files are now kept as a missing source's are, also by a forced run (which had cleared their
    shard) and under a folder that can be listed but not entered (mode 644: each entry's stat
    fails), the folder is reported with the real reason (a double close of a descriptor had turned
    it into "Bad file descriptor"), and once it can be listed again nothing is re-indexed."""
    mem = tmp_path / "mem"
    (mem / "sub" / "deeper").mkdir(parents=True)
    (mem / "kiln.md").write_text("# Kiln\n\nThe kiln reached cone ten on the glaze firing.\n")
    (mem / "sub" / "otter.md").write_text("# Otters\n\nThe river otter census counted forty animals.\n")
    (mem / "sub" / "deeper" / "heron.md").write_text("# Herons\n\nA grey heron nests by the weir.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    first = run_json("index", "--config", str(cfg), "--json")
    assert first["table_rows"] == 3, first
    every = {"kiln.md", "sub/otter.md", "sub/deeper/heron.md"}
    for path in tmp_path.rglob("*"):  # the unprivileged child may read and write the rest
        path.chmod(0o777 if path.is_dir() else 0o666)
    tmp_path.chmod(0o777)
    try:
        for locked, mode, force, why in (
            (mem / "sub", 0, False, "cannot list folder: Permission denied"),
            (mem / "sub", 0, True, "cannot list folder: Permission denied"),
            (mem / "sub", 0o644, False, "cannot stat: Permission denied"),
            (mem, 0, False, "cannot list folder: Permission denied"),
        ):
            locked.chmod(mode)
            run = run_json("index", "--config", str(cfg), "--json", *(["--force"] if force else []), honor_permissions=True)
            locked.chmod(0o777)
            assert run["files_deleted"] == 0 and run["rows_deleted"] <= 1 and run["table_rows"] == 3, (locked, mode, force, run)
            reasons = [e["reason"] for e in run["errors"]]
            assert any(why in r for r in reasons), reasons
            assert {r["path"] for r in table_rows(tmp_path / "index", columns=("path",))} == every, (locked, mode, force)
    finally:
        for locked in (mem, mem / "sub"):
            locked.chmod(0o777)
    for query, name in (("river otter census", "sub/otter.md"), ("grey heron weir", "sub/deeper/heron.md")):
        hits = run_json("search", query, "--config", str(cfg), "--json")["results"]
        assert hits and hits[0]["path"].endswith(name), hits[:2]
    again = run_json("index", "--config", str(cfg), "--json")
    assert again["chunks_embedded"] == 0 and again["rows_written"] == 0 and again["table_rows"] == 3, again
    settled = run_json("index", "--config", str(cfg), "--json")
    assert settled["files_changed"] == 0 and settled["rows_written"] == 0, settled


def test_a_data_folder_inside_the_source_is_never_indexed(tmp_path: Path):
    """``path: .`` with the default ``data_dir: data/index`` beside it (the quick start's layout): the
    walk indexed the pipeline's own Parquet files, run records and table as notes, and every run
    found its own writes changed. The data folder is not walked; the second run does nothing."""
    mem = tmp_path / "agent"
    mem.mkdir()
    (mem / "kiln.md").write_text("# Kiln\n\nThe kiln reached cone ten on the glaze firing.\n")
    cfg = write_config(mem / "memory_pipeline.yaml", data_dir="data/index", sources=[{"name": "agent", "path": "."}])
    first = run_json("index", "--config", str(cfg), "--json")
    second = run_json("index", "--config", str(cfg), "--json")
    assert second["files_changed"] == 0 and second["rows_written"] == 0, second
    assert second["files_seen"] == first["files_seen"] == 2, second  # the note and the config file
    paths = {r["path"] for r in table_rows(mem / "data" / "index", columns=("path",))}
    assert paths == {"kiln.md", "memory_pipeline.yaml"}, paths
    scan = run_cli("scan", "--config", str(cfg))
    assert scan.returncode == 0 and "data/index" not in scan.stdout, scan.stdout


def test_a_missing_source_folder_keeps_its_rows_and_the_checks_pass(tmp_path: Path):
    """An unmounted disk: the source folder is gone for a run. Its rows were kept, but the files had
    no record, so the orphan check failed the run. Their last records are kept with them."""
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "kiln.md").write_text("# Kiln\n\nThe kiln reached cone ten on the glaze firing.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    assert run_json("index", "--config", str(cfg), "--json")["table_rows"] == 1
    mem.rename(tmp_path / "unmounted")
    away = run_json("index", "--config", str(cfg), "--json")
    assert away["files_deleted"] == 0 and away["table_rows"] == 1, away
    assert [e["reason"] for e in away["errors"]] == ["source folder not found; its indexed rows are kept"], away["errors"]
    assert run_json("search", "kiln glaze firing", "--config", str(cfg), "--json")["results"]
    (tmp_path / "unmounted").rename(mem)
    back = run_json("index", "--config", str(cfg), "--json")
    assert back["chunks_embedded"] == 0 and back["rows_written"] == 0 and back["errors"] == [], back


def test_a_moved_source_folder_is_shown_where_it_is_now(tmp_path: Path):
    """A source folder moved (its ``path`` changed to follow it): every file is unchanged, so nothing
    is written again, and search showed each file at the folder that is gone until `--force`."""
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "kiln.md").write_text("# Kiln\n\nThe kiln reached cone ten on the glaze firing.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    run_json("index", "--config", str(cfg), "--json")
    mem.rename(tmp_path / "moved")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", sources=[{"name": "mem", "path": "moved"}])
    again = run_json("index", "--config", str(cfg), "--json")
    assert again["chunks_embedded"] == 0 and again["rows_written"] == 0, again
    hits = run_json("search", "kiln glaze firing", "--config", str(cfg), "--json")["results"]
    assert hits and hits[0]["path"] == str(tmp_path / "moved" / "kiln.md"), hits[:1]
    assert Path(hits[0]["path"]).is_file()


def test_a_model_change_waits_for_a_folder_that_cannot_be_listed(tmp_path: Path):
    """A new model's generation is built beside the current one and searched once it holds every
    file. The files of a folder that cannot be listed are kept in the current generation but cannot
    be read for the new one: the switch used to happen without them (they counted as failed), and
    searches lost them until the folder was readable again. So did a file that fails now (the rows of
    its last good version are kept). The switch now waits for them, and the run names them."""
    mem = tmp_path / "mem"
    (mem / "sub").mkdir(parents=True)
    (mem / "kiln.md").write_text("# Kiln\n\nThe kiln reached cone ten on the glaze firing.\n")
    (mem / "sub" / "otter.md").write_text("# Otters\n\nThe river otter census counted forty animals.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    assert run_json("index", "--config", str(cfg), "--json")["table_rows"] == 2
    for path in tmp_path.rglob("*"):  # the unprivileged child may read and write the rest
        path.chmod(0o777 if path.is_dir() else 0o666)
    tmp_path.chmod(0o777)
    write_config(cfg, provider="local")
    good = (mem / "kiln.md").read_bytes()
    (mem / "kiln.md").write_bytes(good + b"\xff\xfe not utf-8\n")  # fails now: the rows of its last good version stay
    (mem / "sub").chmod(0)
    try:
        run = run_json("index", "--config", str(cfg), "--json", honor_permissions=True)
    finally:
        (mem / "sub").chmod(0o777)
    assert run["generation"] == "building" and run["table"] == "memory_vectors__g2", run
    assert sorted(run["generation_waits_for"]) == ["mem:kiln.md", "mem:sub/otter.md"], run
    for query, name in (("river otter census", "sub/otter.md"), ("kiln cone ten glaze", "kiln.md")):
        hits = run_json("search", query, "--config", str(cfg), "--json")["results"]
        assert hits and hits[0]["path"].endswith(name), hits  # still the current generation's
    waiting = run_json("index", "--config", str(cfg), "--json")  # the folder is back; the note still fails
    assert waiting["generation"] == "building" and waiting["generation_waits_for"] == ["mem:kiln.md"], waiting
    # Not a skipped run while the build waits: each run tries the file again and says so (a run
    # settled on the failed file's unchanged content had been skipped, silent about the build).
    again = run_cli("index", "--config", str(cfg))
    assert again.returncode == 0 and "[WARN] the new generation memory_vectors__g2 is not complete" in again.stderr, again.stderr
    assert "it waits for mem:kiln.md (fix or delete them" in again.stderr, again.stderr
    (mem / "kiln.md").write_bytes(good)
    done = run_json("index", "--config", str(cfg), "--json")
    assert done["generation"] == "switched" and done["table"] == "memory_vectors__g2" and done["table_rows"] == 2, done
    hits = run_json("search", "river otter census", "--config", str(cfg), "--json", "--mode", "vector")["results"]
    assert hits and hits[0]["path"].endswith("sub/otter.md"), hits
