"""The `memory` command under conditions a user meets: Ctrl-C or SIGTERM in the middle of a run,
a missing config with ``--json``, out-of-range search options, dates at the calendar's ends, a
query that is not UTF-8, a read-only data folder, a full disk, a missing source folder, an output
that cannot be written. Each gets one clear line and a meaningful exit status, never a traceback
or "a bug"."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memory_pipeline_tests.conftest import REPO, SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import run_cli, run_json

# `memory` with a stage hook that sends this process a signal at a named point of the run
# (inside Dagster's step): the real CLI, the real signal, Dagster's own handling of it.
SIGNAL_AT = """
import os, signal, sys
from dataclasses import dataclass
from memory_pipeline.cli import exit_process, main
from memory_pipeline.stages.hooks import StageHooks

@dataclass(frozen=True)
class SignalAt(StageHooks):
    point: str = ""
    signum: int = 0

    def at(self, point):
        if point == self.point:
            os.kill(os.getpid(), self.signum)

point, signum, *argv = sys.argv[1:]
exit_process(main(argv, hooks=SignalAt(point=point, signum=int(signum))))
"""

# `memory` that receives SIGINT once its config is loaded, before any Dagster run starts.
SIGINT_BEFORE_RUN = """
import os, signal, sys
import memory_pipeline.settings as settings
from memory_pipeline.cli import exit_process, main

load = settings.load_settings

def load_then_interrupt(*args, **kwargs):
    loaded = load(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)
    return loaded

settings.load_settings = load_then_interrupt
exit_process(main(sys.argv[1:]))
"""


def _python(script: str, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"}
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=timeout)


def _sample(root: Path) -> Path:
    shutil.copytree(SAMPLE, root / "mem", ignore=TEXT_ONLY)
    return write_config(root / "memory_pipeline.yaml")


def _one_line_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr and "a bug" not in stderr, stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("[ERROR] "), stderr[-3000:]
    return lines[0]


# --- 1. an interruption inside the Dagster run ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_dagster_run_exits_130_and_the_next_run_resumes(tmp_path: Path, signum: int):
    cfg = _sample(tmp_path)
    proc = _python(SIGNAL_AT, "write_after_first_commit", str(int(signum)), "index", "--config", str(cfg), "--json")
    assert proc.returncode == 130, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert _one_line_error(proc.stderr) == "[ERROR] interrupted; run the same command again to resume"
    out = json.loads(proc.stdout)
    assert out["ok"] is False and out["interrupted"] is True, out
    assert out["error"] == "interrupted; run the same command again to resume", out

    again = run_json("index", "--config", str(cfg), "--json")
    assert again["ok"] is True and again["table_rows"] > 0


# --- 2. `index --json` prints one object whatever stops it ---------------------------------


def test_index_json_with_a_missing_config_prints_one_object(tmp_path: Path):
    proc = run_cli("index", "--config", str(tmp_path / "nonexistent.yaml"), "--json")
    assert proc.returncode == 1, proc.stderr
    line = _one_line_error(proc.stderr)
    out = json.loads(proc.stdout)
    assert out["ok"] is False and "nonexistent.yaml" in out["error"] and out["errors"] == [], out
    assert out["error"] in line


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "kiln"],
        ["status"],
        ["analytics"],
        ["analytics", "--sql", "SELECT 1"],
        ["scan"],
        ["generations"],
        ["config", "show"],
        ["store", "--file", "x.md"],
        ["eval", "--corpus", "c.jsonl", "--queries", "q.jsonl", "--qrels", "r.tsv"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_every_json_command_prints_one_object_when_it_fails(tmp_path: Path, argv: list[str]):
    """Scripts and agents parse stdout: a `--json` command that fails (here: its config file is not
    there) prints `{"ok": false, "error", "hint"}`, beside the one `[ERROR]` line and exit 1. Before,
    only `index` did; every other command printed nothing on stdout. (`doctor --json` reports a
    config that does not load as its failed `config` check.)"""
    for name in ("c.jsonl", "q.jsonl", "r.tsv"):
        (tmp_path / name).write_text("")
    proc = run_cli(*argv, "--config", str(tmp_path / "nonexistent.yaml"), "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    line = _one_line_error(proc.stderr)
    out = json.loads(proc.stdout)
    assert out == {"ok": False, "error": f"config file not found: {tmp_path / 'nonexistent.yaml'}", "hint": out["hint"]}, out
    assert out["error"] in line and out["hint"] and out["hint"] in line


def test_a_json_usage_error_prints_nothing_on_stdout(tmp_path: Path):
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    proc = run_cli("search", "kiln", "--config", str(cfg), "--json", "--since", "2026-05-01", "--until", "2026-04-01")
    assert proc.returncode == 2 and proc.stdout == "" and "--since" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_index_json_interrupted_before_the_run_prints_one_object(tmp_path: Path):
    cfg = _sample(tmp_path)
    proc = _python(SIGINT_BEFORE_RUN, "index", "--config", str(cfg), "--json")
    assert proc.returncode == 130, (proc.stdout, proc.stderr[-3000:])
    assert _one_line_error(proc.stderr) == "[ERROR] interrupted; run the same command again to resume"
    out = json.loads(proc.stdout)
    assert out == {
        "ok": False,
        "interrupted": True,
        "error": "interrupted; run the same command again to resume",
        "hint": "",
        "skipped_run": False,
        "errors": [],
    }


# --- 3-5. search options, dates and query text -------------------------------------------


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> Path:
    """The sample's text part, indexed once; the config's path."""
    cfg = _sample(tmp_path_factory.mktemp("indexed"))
    run_json("index", "--config", str(cfg), "--json")
    return cfg


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-results", "-1"),
        ("--max-results", "0"),
        ("--max-results", "201"),
        ("--max-results", "99999999999999999999"),
        ("--max-results", "2.5"),
        ("--min-score", "2"),
        ("--min-score", "-0.1"),
        ("--min-score", "nan"),
        ("--mmr-lambda", "-3"),
        ("--mmr-lambda", "5"),
        ("--recency-half-life", "-5"),
        ("--recency-half-life", "nan"),
        ("--recency-half-life", "inf"),
    ],
)
def test_a_search_option_out_of_the_apis_bounds_is_a_usage_error(tmp_path: Path, option: str, value: str):
    cfg = write_config(tmp_path / "memory_pipeline.yaml")  # never read: the command line is refused first
    proc = run_cli("search", "standup", "--config", str(cfg), "--no-server", option, value)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == "" and f"argument {option}:" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_an_empty_date_range_is_a_usage_error_without_the_config_hint(tmp_path: Path):
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    proc = run_cli("search", "standup", "--config", str(cfg), "--no-server", "--since", "2026-10-05", "--until", "2026-10-01")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.strip() == "memory search: error: --since 2026-10-05 is after --until 2026-10-01: no date is in that range"


@pytest.mark.slow
def test_the_calendars_first_and_last_days_are_open_ends(indexed: Path):
    def paths(*options: str) -> list[str]:
        out = run_json("search", "Dana Whitfield Parcelwise", "--config", str(indexed), "--no-server", "--json", "--min-score", "0", *options)
        return [Path(r["path"]).name for r in out["results"]]

    everything = paths()
    assert "MEMORY.md" in everything  # dated by its mtime: the mtime leg of the filter
    assert paths("--until", "9999-12-31") == everything
    assert paths("--since", "0001-01-01", "--until", "9999-12-31") == everything
    assert paths("--since", "9999-12-31") == []
    assert paths("--until", "0001-01-01") == []


@pytest.mark.parametrize(("arg", "byte"), [(b"LanceDB\xff", "0xff"), (b"caf\xe9", "0xe9")])
def test_a_query_that_is_not_utf8_is_a_usage_error_naming_the_byte(tmp_path: Path, arg: bytes, byte: str):
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable.encode(), b"-m", b"memory_pipeline.cli", b"search", arg, b"--config", str(cfg).encode(), b"--no-server"]
    proc = subprocess.run(argv, capture_output=True, env=env, cwd=str(REPO), timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.startswith("memory search: error: the query is not valid UTF-8 (byte " + byte) and len(err.splitlines()) == 1, err


# --- 9. an output that cannot be written ---------------------------------------------------


@pytest.mark.parametrize("stdout", ["closed", "/dev/full"])
def test_json_to_an_output_that_cannot_be_written_exits_120_with_one_line(tmp_path: Path, stdout: str):
    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "note.md").write_text("# A note\n\nSomething to scan.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "memory_pipeline.cli", "scan", "--config", str(cfg), "--json"]
    if stdout == "closed":
        # The child's descriptor 1 closed, as the shell's `>&-` leaves it.
        proc = subprocess.run(["/bin/sh", "-c", 'exec "$@" >&-', "sh", *argv], stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO), timeout=300)
        said = "standard output is closed"
    else:
        with open("/dev/full", "w") as full:
            proc = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO), timeout=300)
        said = "No space left on device"
    assert proc.returncode == 120, proc.stderr
    assert _one_line_error(proc.stderr).startswith("[ERROR] could not write the output: ") and said in proc.stderr, proc.stderr


def test_plain_text_output_that_fills_the_disk_midway_exits_120_with_one_line(tmp_path: Path):
    """Text output larger than the stream's buffer fails while the command runs, not at exit: that
    too is exit 120, "could not write the output" (it was exit 1 with "a file or storage error:
    check the data folder's disk", which sent the user to the wrong disk)."""
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "note.md").write_text("# A note\n\nSomething to index.\n")
    assert run_cli("index", "--config", str(cfg), "--quiet").returncode == 0
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "memory_pipeline.cli", "analytics", "--config", str(cfg), "--sql", "SELECT range FROM range(20000)"]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO), timeout=300)
    assert proc.returncode == 120, proc.stderr
    assert _one_line_error(proc.stderr).startswith("[ERROR] could not write the output: ") and "No space left on device" in proc.stderr, proc.stderr


# --- 6. a data folder this user cannot write, or cannot enter ------------------------------


def _read_only_tree(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)


def _writable_tree(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)


@pytest.mark.slow
def test_status_and_doctor_report_a_read_only_data_folder(indexed: Path, tmp_path: Path):
    shutil.copytree(indexed.parent, tmp_path / "copy")
    cfg, data = tmp_path / "copy" / indexed.name, tmp_path / "copy" / "index"
    _read_only_tree(data)  # `chmod -R a-w`; the child runs without root's override of file permissions
    try:
        proc = run_cli("status", "--config", str(cfg), "--json", honor_permissions=True)
        assert proc.returncode == 0, proc.stderr
        status = json.loads(proc.stdout)
        assert status["cache"]["entries"] > 0 and "error" not in status["cache"], status["cache"]
        assert status["table"]["rows"] > 0

        proc = run_cli("doctor", "--config", str(cfg), "--json", honor_permissions=True)
        [cache] = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "cache"]
        assert cache["status"] == "ok" and str(status["cache"]["entries"]) in cache["detail"], cache
    finally:
        _writable_tree(data)


def test_doctor_reports_a_data_folder_it_cannot_enter_as_a_failed_check(tmp_path: Path):
    (tmp_path / "mem").mkdir()
    (tmp_path / "locked" / "index" / "cache").mkdir(parents=True)
    (tmp_path / "locked" / "index" / "cache" / "embeddings.sqlite").write_bytes(b"")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", data_dir="locked/index", provider="none")
    (tmp_path / "locked").chmod(0)
    try:
        proc = run_cli("doctor", "--config", str(cfg), "--json", honor_permissions=True)
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["config"]["status"] == "ok"  # the other checks ran
    cache = checks["cache"]
    assert cache["status"] == "fail" and "Permission denied" in cache["detail"], cache
    assert "check the permissions" in cache["fix"] and "delete" not in cache["fix"], cache


def test_doctor_advises_deleting_only_a_damaged_cache(tmp_path: Path):
    (tmp_path / "mem").mkdir()
    (tmp_path / "index" / "cache").mkdir(parents=True)
    (tmp_path / "index" / "cache" / "embeddings.sqlite").write_bytes(b"this is not a database, only text" * 200)
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    proc = run_cli("doctor", "--config", str(cfg), "--json")
    [cache] = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "cache"]
    assert cache["status"] == "fail" and cache["fix"].startswith("delete the file"), cache


# --- 7. a full disk ------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A real 600 KiB file system (tmpfs): the sample's index does not fit on it."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_full_disk_says_so_naming_the_data_folder(tmp_path: Path, tiny_disk: Path):
    shutil.copytree(SAMPLE, tmp_path / "mem", ignore=TEXT_ONLY)
    cfg = write_config(tmp_path / "memory_pipeline.yaml", data_dir=str(tiny_disk / "index"))
    proc = run_cli("index", "--config", str(cfg), "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "a bug" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("[ERROR] ") and str(tiny_disk) in last, last
    assert "is full or failing" in last or "No space left on device" in last, last
    out = json.loads(proc.stdout)
    assert out["ok"] is False and out["error"] in last, out


# --- 8. a source folder that is not there --------------------------------------------------


def test_scan_warns_about_a_source_folder_that_is_missing_or_a_file(tmp_path: Path):
    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "note.md").write_text("# A note\n\nSomething to scan.\n")
    (tmp_path / "afile").write_text("not a folder\n")
    sources = [{"name": "mem", "path": "mem"}, {"name": "gone", "path": "unmounted"}, {"name": "file", "path": "afile"}]
    cfg = write_config(tmp_path / "memory_pipeline.yaml", sources=sources)
    proc = run_cli("scan", "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"[WARN] source gone: {tmp_path / 'unmounted'} not found: nothing scanned there",
        f"[WARN] source file: {tmp_path / 'afile'} is not a folder: nothing scanned there",
    ], proc.stderr
    assert "Found 1 text files" in proc.stdout
    out = json.loads(run_cli("scan", "--config", str(cfg), "--json").stdout)
    assert out["missing_sources"] == [
        {"source": "gone", "path": str(tmp_path / "unmounted"), "reason": "not found"},
        {"source": "file", "path": str(tmp_path / "afile"), "reason": "is not a folder"},
    ]


def test_status_and_doctor_word_full_text_only_and_warnings_plainly(tmp_path: Path):
    """``provider: none`` read "provider: none (provider: none (full-text search only))", and doctor
    ended a report with a warning in it with "all good"."""
    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "a.md").write_text("# A\n\nkiln\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    status = run_cli("status", "--config", str(cfg))
    assert status.returncode == 0 and "provider: none — full-text search only (as configured)" in status.stdout, status.stdout
    doctor = run_cli("doctor", "--config", str(cfg))  # no table yet: a warning
    assert doctor.returncode == 0 and "[warn]" in doctor.stdout, doctor.stdout
    assert doctor.stdout.strip().splitlines()[-1] == "no problems; 1 warning above", doctor.stdout


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_serve_with_a_port_out_of_range_is_a_usage_error(tmp_path: Path, port: str):
    """``memory serve --port 99999`` printed "unexpected error: OverflowError … a bug", exit 1."""
    proc = run_cli("serve", "--port", port, "--config", str(tmp_path / "none.yaml"))
    assert proc.returncode == 2 and "--port" in proc.stderr and "a bug" not in proc.stderr, proc.stderr


def test_doctor_does_not_advise_deleting_a_cache_it_read_without_locks(indexed: Path, tmp_path: Path):
    """In a data folder this user cannot write, the cache is read as it is on disk (immutable): a
    run of its owner may be half-way through a write, which reads as damage. Doctor told this user
    to delete the file; it now says to check as the owner first."""
    shutil.copytree(indexed.parent, tmp_path / "copy")
    cfg, data = tmp_path / "copy" / indexed.name, tmp_path / "copy" / "index"
    cache = next(data.rglob("embeddings.sqlite"))
    raw = bytearray(cache.read_bytes())
    raw[4096:8192] = b"\x00" * min(4096, max(0, len(raw) - 4096))  # a page torn mid-write
    cache.write_bytes(bytes(raw))
    for side in cache.parent.glob("embeddings.sqlite-*"):
        side.unlink()
    _read_only_tree(data)
    try:
        proc = run_cli("doctor", "--config", str(cfg), "--json", honor_permissions=True)
        [check] = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "cache"]
        assert check["status"] == "fail" and "read without locks" in check["detail"], check
        assert "as the user who owns the data folder" in check["fix"], check
    finally:
        _writable_tree(data)
