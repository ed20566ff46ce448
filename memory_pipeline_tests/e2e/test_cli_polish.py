"""Issue 12, CLI polish: --version, help with an example on every option, problem files in `memory analytics`,
and an analytics database that keeps working when the data folder is copied elsewhere."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memory_pipeline import __version__
from memory_pipeline.cli import PROBLEMS_SHOWN, build_parser
from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import run_cli, run_json

EXAMPLE = re.compile(r"e\.g\.|example", re.IGNORECASE)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_version_prints_name_and_version():
    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"memory_pipeline {__version__}"


def test_every_option_has_help_with_an_example_and_every_subcommand_an_example():
    parser = build_parser()
    subs = _subparsers(parser)
    assert {"index", "search", "store", "eval", "scan", "analytics", "generations", "doctor", "status"} <= set(subs)
    missing = []
    for name, p in [("memory", parser), *subs.items()]:
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help and action.help.strip() and EXAMPLE.search(action.help)):
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: {action.help!r}")
    assert not missing, "options without help or an example:\n" + "\n".join(missing)
    for name, p in subs.items():
        assert p.description, name
        assert (p.epilog or "").startswith("Example"), name
        assert p.formatter_class is argparse.RawDescriptionHelpFormatter, name
        assert f"memory {name}" in p.epilog, name
        # The example line survives formatting as written.
        assert p.epilog.splitlines()[1] in p.format_help(), name


BROKEN = 23  # more than the 20 problems the human output shows


@pytest.fixture(scope="module")
def indexed_once(tmp_path_factory):
    """The sample plus files that cannot be indexed, after exactly one `memory index`."""
    root = tmp_path_factory.mktemp("polish")
    shutil.copytree(SAMPLE, root / "mem", ignore=TEXT_ONLY)
    for i in range(BROKEN):
        (root / "mem" / f"broken-{i:02}.md").write_bytes(b"\xff\xfe not utf-8\n")
    cfg = write_config(root / "memory_pipeline.yaml")
    summary = run_json("index", "--config", str(cfg), "--json")
    return root, cfg, summary


@pytest.mark.slow
def test_analytics_lists_problem_files_with_reasons(indexed_once):
    _, cfg, summary = indexed_once
    failed = sorted(Path(e["path"]).name for e in summary["errors"] if e["status"] == "failed")
    assert len(failed) == BROKEN
    out = run_json("analytics", "--config", str(cfg), "--json")
    assert out["problems"] == [{"kind": "failed", "files": BROKEN, "rows": 0}]  # the counts, as before
    files = out["problem_files"]
    assert [set(f) for f in files] == [{"kind", "path", "reason", "doc_id", "rows"}] * BROKEN
    assert sorted(f["path"] for f in files) == failed
    assert all(f["kind"] == "failed" and f["reason"] for f in files)

    human = run_cli("analytics", "--config", str(cfg))
    assert human.returncode == 0, human.stderr
    text = human.stdout
    assert text.index("coverage") < text.index("kind  ")  # the list comes after the coverage table
    listed = [line for line in text.splitlines() if line.startswith("failed ")]
    assert len(listed) == PROBLEMS_SHOWN + 1  # 20 files, then the count by kind
    assert all(files[0]["reason"][:40] in line for line in listed[:PROBLEMS_SHOWN])
    assert f"… {BROKEN - PROBLEMS_SHOWN} more" in text


@pytest.mark.slow
def test_runs_table_holds_the_first_run(indexed_once):
    _, cfg, summary = indexed_once
    rows = run_json("analytics", "--config", str(cfg), "--json", "--sql", "SELECT run_id, files_seen, errors FROM runs")["rows"]
    assert rows == [{"run_id": summary["run_id"], "files_seen": summary["files_seen"], "errors": len(summary["errors"])}]


PLAIN_DUCKDB = """
import json, sys, duckdb
con = duckdb.connect('analytics.duckdb', read_only=True)
names = [r[0] for r in con.sql("SELECT table_name FROM duckdb_tables() WHERE NOT internal "
                               "UNION ALL SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]
out, failed = {}, {}
for name in names:
    try:
        out[name] = con.sql(f'SELECT count(*) FROM "{name}"').fetchall()[0][0]
    except duckdb.Error as err:
        failed[name] = str(err).splitlines()[0]
print(json.dumps({"counts": out, "failed": failed, "modules": [m for m in sys.modules if m.startswith("memory_pipeline")]}))
"""


def _plain_duckdb(db_dir: Path, cwd: Path) -> dict:
    code = PLAIN_DUCKDB.replace("'analytics.duckdb'", repr(str(db_dir / "analytics.duckdb")) if db_dir != cwd else "'analytics.duckdb'")
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_copied_data_folder_keeps_analytics_working(indexed_once, tmp_path: Path):
    root, _, summary = indexed_once
    original = root / "index"
    copy = tmp_path / "elsewhere" / "index"
    shutil.copytree(original, copy)
    shutil.rmtree(root)  # the original is gone (this test runs last on the module's index)
    out = _plain_duckdb(copy, cwd=copy)
    assert out["modules"] == []
    assert out["failed"] == {}
    counts = out["counts"]
    expected = {"source_files", "extraction_status", "indexed_state", "memory_chunks", "vector_rows", "file_status",
                "coverage", "problems", "embedding_cost", "embedding_usage", "prices", "runs", "table_info", "refresh_state"}  # fmt: skip
    assert expected <= set(counts)
    assert counts["runs"] == 1 and counts["problems"] == BROKEN and counts["memory_chunks"] > 40
    assert counts["source_files"] == counts["file_status"] == summary["files_seen"]
    # From any other directory every table still answers; only the memory_chunks view needs the data folder.
    away = _plain_duckdb(copy, cwd=tmp_path)
    assert set(away["failed"]) == {"memory_chunks"} and away["counts"]["runs"] == 1


def test_analytics_builds_a_missing_database_and_says_when_nothing_is_indexed(tmp_path: Path):
    """A data folder whose analytics database is gone (deleted, or a copy without it) answers
    `memory analytics` anyway: it was a dead end, as `memory index` finds nothing changed and
    builds nothing. A folder never indexed says so."""
    mem = tmp_path / "mem"
    mem.mkdir()
    for i in range(3):
        (mem / f"2026-04-0{i + 1}.md").write_text(f"# Day {i}\n\nThe kiln reached {900 + i} degrees on day {i}.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    never = run_cli("analytics", "--config", str(cfg))
    assert never.returncode == 1 and "nothing is indexed" in never.stderr and "run `memory index` first" in never.stderr, never.stderr
    assert len(never.stderr.strip().splitlines()) == 1 and not (tmp_path / "index" / "analytics.duckdb").exists()
    assert run_cli("index", "--config", str(cfg)).returncode == 0
    db = tmp_path / "index" / "analytics.duckdb"
    db.unlink()
    skipped = json.loads(run_cli("index", "--config", str(cfg), "--json").stdout)
    assert skipped["skipped_run"] is True and skipped["shards"] == [], skipped  # no shard had work (it listed all 16)
    assert not db.exists()
    rows = run_json(
        "analytics", "--config", str(cfg), "--json", "--sql", "SELECT sum(files_indexed)::BIGINT AS n, (SELECT count(*) FROM runs) AS runs FROM coverage"
    )["rows"]
    assert rows == [{"n": 3, "runs": 2}] and db.is_file()
    bad_sql = run_cli("analytics", "--config", str(cfg), "--sql", "SELECT nope FROM nowhere")
    assert bad_sql.returncode == 1 and bad_sql.stderr.startswith("[ERROR] query failed: ") and "check the SQL" in bad_sql.stderr, bad_sql.stderr
    # A data file DuckDB cannot read while it builds the database: one line naming it, exit 1.
    damaged = next((tmp_path / "index" / "assets" / "source_files").glob("[0-9a-f][0-9a-f].parquet"))
    damaged.write_bytes(b"not parquet at all")
    broken = run_cli("analytics", "--config", str(cfg))
    err = broken.stderr.strip()
    assert broken.returncode == 1 and err.startswith("[ERROR] cannot build the analytics database: ") and damaged.name in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "`memory index` repairs" in err, err


def test_coverage_counts_files_that_failed_before_extraction(tmp_path: Path):
    """A file that fails at discovery (a PNG named `.txt`, which is not the text its name claims) is a
    file the user asked to index and did not get: it lowers coverage like a file that failed to
    extract. Before, only files that passed discovery counted, so a kind of file of which every one
    failed (here: the image files, as the content says) showed coverage 1.0."""
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "note.md").write_text("# Day\n\nThe kiln reached 900 degrees.\n")
    (mem / "scan.txt").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none", checks={"min_coverage": 0.9})
    summary = run_json("index", "--config", str(cfg), "--json")
    assert [(Path(e["path"]).name, e["status"]) for e in summary["errors"]] == [("scan.txt", "failed")], summary["errors"]
    rows = run_json(
        "analytics", "--config", str(cfg), "--json", "--sql", "SELECT modality, files_indexable, files_indexed, files_failed, coverage FROM coverage"
    )["rows"]
    by = {r["modality"]: r for r in rows}
    assert by["image"] == {"modality": "image", "files_indexable": 1, "files_indexed": 0, "files_failed": 1, "coverage": 0.0}, rows
    assert by["markdown"]["coverage"] == 1.0
    out = run_json("analytics", "--config", str(cfg), "--json")
    assert [(f["kind"], f["path"]) for f in out["problem_files"]] == [("failed", "scan.txt")]


def test_search_of_a_folder_never_indexed_says_so(tmp_path: Path):
    """An empty answer from a folder never indexed is not "nothing relevant": a warning on stderr says
    to run `memory index` (the answer and exit 0 stay those of an empty search); none once indexed."""
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "note.md").write_text("# Day\n\nThe kiln reached 900 degrees.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    for extra in ([], ["--json"]):
        proc = run_cli("search", "kiln", "--config", str(cfg), "--no-server", *extra)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == f"[WARN] nothing is indexed at {tmp_path / 'index'} yet: run `memory index` first\n", proc.stderr
        assert (json.loads(proc.stdout)["results"] == []) if extra else proc.stdout == "No relevant memories for 'kiln'.\n"
    assert run_cli("index", "--config", str(cfg)).returncode == 0
    proc = run_cli("search", "walrus", "--config", str(cfg), "--no-server")
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == "No relevant memories for 'walrus'.\n", proc.stderr


def test_turning_a_media_type_on_or_off_is_a_change(tmp_path: Path):
    """`multimodal.types` decides which media are indexed, but the stat walk sees no change when it
    is edited: the next run was skipped, so a type turned on stayed unindexed (coverage 1.000 for it)
    and one turned off stayed searchable, until `--force`."""
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "note.md").write_text("# Day\n\nThe kiln reached 900 degrees.\n")
    shutil.copy(SAMPLE / "media" / "courier-contract.pdf", mem / "courier-contract.pdf")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none", multimodal={"types": ["image"]})
    first = run_json("index", "--config", str(cfg), "--json")
    assert any(e["path"].endswith("courier-contract.pdf") and e["status"] == "skipped" for e in first["errors"]), first["errors"]
    write_config(cfg, provider="none", multimodal={"types": ["image", "pdf"]})
    on = run_json("index", "--config", str(cfg), "--json")
    assert not on["skipped_run"] and on["files_changed"] == 1 and not on["errors"], on
    assert run_json("search", "courier", "--config", str(cfg), "--json", "--type", "pdf", "--no-server")["results"]
    write_config(cfg, provider="none", multimodal={"types": ["image"]})
    off = run_json("index", "--config", str(cfg), "--json")
    assert not off["skipped_run"] and off["rows_deleted"] > 0, off
    assert not run_json("search", "courier", "--config", str(cfg), "--json", "--type", "pdf", "--no-server")["results"]
    assert run_json("index", "--config", str(cfg), "--json")["skipped_run"] is True  # settled again


def test_status_and_doctor_compare_the_records_with_the_table(tmp_path: Path):
    """`status` counted every record as an indexed file (a file that fails now, whose older version's
    rows stand in, too) and never looked at the table: with rows deleted by hand it said "4 indexed"
    over 2 rows, and `doctor` said "all good"."""
    import lancedb

    mem = tmp_path / "mem"
    mem.mkdir()
    for i in range(4):
        (mem / f"h{i}.md").write_text(f"# Note {i}\n\nThe kiln note number {i}.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    run_json("index", "--config", str(cfg), "--json")
    (mem / "h3.md").write_bytes(b"\xff\xfe not utf-8 any more\n")  # fails now: its old rows stand in
    run_json("index", "--config", str(cfg), "--json")
    status = run_json("status", "--config", str(cfg), "--json")
    assert status["sources"]["mem"] == {"files": 4, "indexed_files": 3, "stale_files": 1, "chunks": 4}, status["sources"]
    assert "mismatch" not in status["table"] and status["table"]["recorded_chunks"] == status["table"]["rows"] == 4
    lancedb.connect(str(tmp_path / "index" / "lancedb")).open_table("memory_vectors").delete("path = 'h0.md' OR path = 'h1.md'")
    status = run_json("status", "--config", str(cfg), "--json")
    assert status["table"]["mismatch"].startswith("the table holds 2 rows where the index records say 4"), status["table"]
    text = run_cli("status", "--config", str(cfg)).stdout
    assert "[WARN] the table holds 2 rows where the index records say 4" in text and "3 indexed (1 by an older version" in text, text
    doctor = run_cli("doctor", "--config", str(cfg), "--json")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert doctor.returncode == 1 and checks["index records"]["status"] == "fail", checks
    assert run_json("index", "--config", str(cfg), "--json")["files_repaired"] == 2
    assert run_cli("doctor", "--config", str(cfg)).returncode == 0


def test_a_file_that_still_fails_is_not_counted_as_changed(tmp_path: Path):
    """A file whose extraction failed is tried again by each run of its shard; with its content
    unchanged it was counted in `files_changed` every time (2 for one new file beside it)."""
    from memory_pipeline.discovery import shard_of

    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "bad.md").write_bytes(b"\xff\xfe not utf-8\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    assert run_json("index", "--config", str(cfg), "--json")["files_changed"] == 1
    name = next(f"n{i}.md" for i in range(1000) if shard_of("mem", f"n{i}.md") == shard_of("mem", "bad.md"))
    (mem / name).write_text("# New\n\nA new note in the same shard.\n")
    again = run_json("index", "--config", str(cfg), "--json")
    assert again["files_changed"] == 1 and [Path(e["path"]).name for e in again["errors"]] == ["bad.md"], again


def test_a_folder_row_is_a_problem_not_a_file_in_coverage(tmp_path: Path):
    """A folder that is not walked (its name looks like a secret; or it cannot be listed) is listed
    among the problems, but it is not a file: counted as one, it kept coverage below 1.0."""
    mem = tmp_path / "mem"
    secret = mem / ("ghp_" + "K7mPq2RxT9vWb4NzH6cYd8FjL3sGe5UaXw2R")
    secret.mkdir(parents=True)
    (secret / "inside.md").write_text("# In\n\nNot walked.\n")
    (mem / "a.md").write_text("# A\n\nThe kiln note.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    run_json("index", "--config", str(cfg), "--json")
    rows = run_json("analytics", "--config", str(cfg), "--json", "--sql", "SELECT sum(files_indexable)::BIGINT AS n, min(coverage) AS c FROM coverage")["rows"]
    assert rows == [{"n": 1, "c": 1.0}], rows
    kinds = [(f["kind"], f["path"].endswith("/")) for f in run_json("analytics", "--config", str(cfg), "--json")["problem_files"]]
    assert kinds == [("failed", True)], kinds


def test_index_warns_when_coverage_is_below_the_threshold(tmp_path: Path):
    """The text summary said "Indexed 4 files: 4 changed" with three of them failed, and nothing
    about the coverage check it had just failed."""
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "good.md").write_text("# Good\n\nThe kiln note.\n")
    for i in range(3):
        (mem / f"bad{i}.md").write_bytes(b"\xff\xfe not utf-8\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    proc = run_cli("index", "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "[WARN] coverage 0.250 is below checks.min_coverage 0.9: `memory analytics` lists the files not indexed and why" in proc.stderr, proc.stderr
