"""The `memory` process's exit (``cli.run``): the interpreter's exit steps done by hand, without
tearing the modules down. What a user or a script sees of an exit must not change: every line of
output arrives, the exit status is the command's, ``atexit`` handlers and non-daemon threads finish,
and the installed console script is this entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from memory_pipeline_tests.conftest import write_config

BIN = Path(sys.executable).parent

# A process that registers what the interpreter's exit must still do, then runs the `memory` entry point.
PROBE = """
import atexit, sys, threading, time
from pathlib import Path
out = Path(sys.argv.pop(1))
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.5)
    (out / "thread").write_text("finished")
threading.Thread(target=late).start()  # non-daemon: the exit waits for it
sys.stdout.write("x" * 300_000)  # left in the buffer: the exit flushes it
from memory_pipeline.cli import run
run()
"""


def _probe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path), *args],
        capture_output=True, text=True, timeout=300, env={"HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_an_exit_finishes_what_the_interpreter_would(tmp_path: Path):
    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "note.md").write_text("# Note\n\nThe exit keeps every line of this output.\n")
    config = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    proc = _probe(tmp_path, "scan", "--config", str(config), "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("x" * 300_000)
    assert [f["path"] for f in json.loads(proc.stdout[300_000:])["files"]] == [str(tmp_path / "mem" / "note.md")]
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "finished"


def test_the_exit_status_is_the_commands(tmp_path: Path):
    missing = _probe(tmp_path, "scan", "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1 and missing.stderr.startswith("[ERROR]") and "Traceback" not in missing.stderr
    usage = _probe(tmp_path, "no-such-command")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    assert (tmp_path / "atexit").read_text() == "ran"


def test_the_installed_command_is_this_entry_point():
    script = (BIN / "memory").read_text()
    assert "from memory_pipeline.cli import run" in script, script
    proc = subprocess.run([str(BIN / "memory"), "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("memory_pipeline ")


def _bare(tmp_path: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """The entry point alone, with the given descriptors; buffered output, as in a script."""
    env = {"HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1", "PATH": "/usr/bin:/bin"}
    code = "from memory_pipeline.cli import run; run()"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, timeout=300, cwd=tmp_path, **kwargs)


def test_output_that_cannot_be_written_is_an_error_not_a_success(tmp_path: Path):
    """stdout to a file that may not grow (a full disk, a quota): exit 120 and one line, as the
    interpreter's own exit gives, never 0 with the output lost."""
    import resource

    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "note.md").write_text("# Note\n\nSome text.\n")
    config = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    out = tmp_path / "out.json"
    with out.open("w") as fh:
        proc = _bare(tmp_path, "scan", "--config", str(config), "--json", stdout=fh, stderr=subprocess.PIPE, text=True,
                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)))  # fmt: skip
    assert proc.returncode == 120, proc.stderr
    assert "could not write the output" in proc.stderr and "Traceback" not in proc.stderr


def test_a_closed_stdout_is_not_a_traceback(tmp_path: Path):
    """Started with descriptor 1 closed (`memory … >&-`): the command's own status, no traceback."""
    proc = _bare(tmp_path, "scan", "--config", str(tmp_path / "nope.yaml"), stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1))
    assert proc.returncode == 1 and proc.stderr.startswith("[ERROR]") and "Traceback" not in proc.stderr
