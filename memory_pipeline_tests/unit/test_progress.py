"""Progress on stderr: plain rate-limited lines for logs, live bars on a terminal, a heartbeat."""

from __future__ import annotations

import io
import logging
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from memory_pipeline import progress
from memory_pipeline.progress import BarProgress, LineProgress, stderr_progress
from memory_pipeline_tests.helpers import run_cli

LINE = re.compile(r"^(?P<stage>\w+): (?P<done>\d+)/(?P<total>\d+) (?P<unit>\w+)( \(.*\))?(, .*)?$")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _no_listener_left():
    yield
    progress.set_listener(None)


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def _run_stages(listener, clock: FakeClock, plan: list[tuple[str, int, str, float]]) -> None:
    """Report every item of each (stage, total, unit, seconds per item), in order."""
    for stage, total, unit, step in plan:
        for done in range(1, total + 1):
            clock.now += step
            listener(stage, done, total, unit)


PLAN = [
    ("extract", 151, "files", 0.5),  # 75 s
    ("chunk", 40, "files", 0.01),  # under a second: its final line only
    ("embed", 2000, "chunks", 0.05),  # 100 s
    ("write", 16, "partitions", 0.2),
]


def test_plain_lines_have_no_carriage_return_are_rate_limited_and_end_each_stage():
    clock, out = FakeClock(), io.StringIO()
    listener = LineProgress(out, interval=10.0, heartbeat=None, clock=clock)
    _run_stages(listener, clock, PLAN)
    listener.close()

    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = _lines(out)
    for stage, total, unit, step in PLAN:
        mine = [line for line in lines if line.startswith(f"{stage}:")]
        assert all(LINE.match(line) for line in mine), mine
        # at most one line per 10 s of the stage, plus its final line
        assert len(mine) <= int(total * step // 10) + 1, mine
        assert mine[-1].startswith(f"{stage}: {total}/{total} {unit} ("), mine
    assert "extract: 151/151 files (2.0/s, ETA 0s)" in lines
    assert lines == sorted(lines, key=lambda line: [p[0] for p in PLAN].index(line.split(":")[0]))
    assert len([line for line in lines if line.startswith("chunk:")]) == 1


def test_progress_lines_carry_rate_and_eta():
    clock, out = FakeClock(), io.StringIO()
    listener = LineProgress(out, interval=10.0, heartbeat=None, clock=clock)
    listener("extract", 0, 151, "files")  # a done == 0 report starts the stage's clock
    for done in range(1, 121):
        clock.now += 0.1
        listener("extract", done, 151, "files")
    assert _lines(out) == ["extract: 100/151 files (10.0/s, ETA 6s)"]


def test_a_short_stage_prints_only_its_final_line_and_a_repeat_is_not_printed_twice():
    clock, out = FakeClock(), io.StringIO()
    listener = LineProgress(out, interval=10.0, heartbeat=None, clock=clock)
    for done in (1, 2, 3, 3):
        clock.now += 0.5
        listener("write", done, 3, "partitions")
    assert _lines(out) == ["write: 3/3 partitions (2.0/s, ETA 0s)"]


def test_the_first_stage_has_no_rate_until_its_second_report():
    # The time before the first report (Dagster starting, discovery) is no stage's: no guessed rate.
    clock, out = FakeClock(), io.StringIO()
    listener = LineProgress(out, interval=0.0, heartbeat=None, clock=clock)
    clock.now += 30
    listener("extract", 1, 5, "files")
    clock.now += 2
    listener("extract", 3, 5, "files")
    assert _lines(out) == ["extract: 1/5 files", "extract: 3/5 files (1.0/s, ETA 2s)"]


def test_a_failed_file_still_advances_the_count_to_the_final_line():
    # The extract stage reports a file that failed like one that worked (pipeline.py); the
    # listener has no notion of failure: the count moves on and the stage still finishes.
    clock, out = FakeClock(), io.StringIO()
    listener = LineProgress(out, interval=0.0, heartbeat=None, clock=clock)
    progress.set_listener(listener)
    clock.now += 1
    progress.report("extract", 1, 3, "files")
    clock.now += 1
    progress.report("extract", 2, 3, "files")  # this one failed
    clock.now += 1
    progress.report("extract", 3, 3, "files")
    progress.set_listener(None)
    assert [line.split(" (")[0] for line in _lines(out)] == ["extract: 1/3 files", "extract: 2/3 files", "extract: 3/3 files"]


def test_a_stage_left_unfinished_is_closed_as_stopped():
    clock, out = FakeClock(), io.StringIO()
    listener = LineProgress(out, interval=10.0, heartbeat=None, clock=clock)
    listener("extract", 0, 4, "files")
    clock.now += 2
    listener("extract", 2, 4, "files")
    clock.now += 3
    listener.close()
    assert _lines(out) == ["extract: 2/4 files (1.0/s), stopped after 5s"]


def test_the_heartbeat_speaks_when_a_stage_stalls_and_between_stages():
    clock, out = FakeClock(), io.StringIO()
    listener = LineProgress(out, interval=10.0, heartbeat=10.0, clock=clock)  # ticked by hand: no thread
    clock.now += 12
    listener.tick()
    listener("extract", 0, 6, "files")
    clock.now += 12
    listener("extract", 6, 6, "files")
    clock.now += 11
    listener.tick()
    listener("embed", 512, 2000, "chunks")
    for _ in range(5):
        clock.now += 5
        listener.tick()
    assert _lines(out) == [
        "still working: 12s, no stage reported yet",
        "extract: 6/6 files (0.5/s, ETA 0s)",  # 6 files in the 12 s since its done == 0 report
        "still working: 11s since extract finished",
        # embed started when extract ended: its rate counts from there
        "embed: 512/2000 chunks (46.5/s, ETA 32s)",  # news since the last line: the count itself
        "embed: 512/2000 chunks, no update for 20s (31s elapsed)",
    ]


def test_the_heartbeat_thread_fires_during_a_stall_and_stops_with_the_listener():
    out = io.StringIO()
    listener = LineProgress(out, interval=0.05, heartbeat=0.05)
    progress.set_listener(listener)
    progress.report("embed", 512, 2000, "chunks")
    deadline = time.monotonic() + 5
    while len([line for line in _lines(out) if "no update for" in line]) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    progress.set_listener(None)
    stalls = [line for line in _lines(out) if "no update for" in line]
    assert len(stalls) >= 3 and all(line.startswith("embed: 512/2000 chunks, no update for") for line in stalls)
    assert listener._thread is not None and not listener._thread.is_alive()
    said = out.getvalue()
    time.sleep(0.2)
    assert out.getvalue() == said  # silent once closed
    assert said.splitlines()[-1].startswith("embed: 512/2000 chunks") and "stopped after" in said.splitlines()[-1]


def test_stderr_progress_picks_lines_off_a_terminal_and_bars_on_one():
    assert isinstance(stderr_progress(io.StringIO()), LineProgress)
    assert isinstance(stderr_progress(console=Console(file=io.StringIO(), force_terminal=True)), BarProgress)
    assert isinstance(stderr_progress(console=Console(file=io.StringIO(), force_terminal=False)), LineProgress)


def test_terminal_bars_show_stage_names_and_counts_and_log_lines_go_above_them():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    logger = logging.getLogger("memory_pipeline.test_progress")
    handler = logging.StreamHandler(out)  # what cli.py's [WARN] handler is: a StreamHandler on stderr
    handler.setFormatter(logging.Formatter("[WARN] %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        listener = stderr_progress(console=console)
        progress.set_listener(listener)
        for done in range(1, 152):
            progress.report("extract", done, 151, "files")
            if done == 50:
                logger.warning("a [bold]file[/bold] was skipped")
        assert handler.stream is not out  # routed through the console while the bars are up
        for done in (512, 1024, 1536, 2000):
            progress.report("embed", done, 2000, "chunks")
        progress.report("write", 16, 16, "partitions")
        progress.set_listener(None)
        assert handler.stream is out
    finally:
        logger.removeHandler(handler)

    text = ANSI.sub("", out.getvalue())
    for stage, counts in (("extract", "151/151 files"), ("embed", "2000/2000 chunks"), ("write", "16/16 partitions")):
        assert re.search(rf"{stage}\s.*{counts}", text), text[-2000:]
    # The warning is a line of its own, whole, markup left as written.
    assert any(part.endswith("[WARN] a [bold]file[/bold] was skipped") for part in re.split(r"[\r\n]", text)), text
    final = text.rsplit("\r", 1)[-1]  # what stays on screen when the bars are done
    assert "working" not in final and all(s in final for s in ("extract", "embed", "write"))


def test_a_stalled_bar_says_how_long_since_its_last_update():
    clock, out = FakeClock(), io.StringIO()
    listener = BarProgress(Console(file=out, force_terminal=True, width=120, color_system=None), clock=clock, stale_after=10.0)
    with listener:
        listener("extract", 151, 151, "files")
        clock.now += 60
        listener("embed", 512, 2000, "chunks")
        clock.now += 25
        listener.progress.refresh()
        screen = ANSI.sub("", out.getvalue()).rsplit("\r", 1)[-1]
    assert re.search(r"embed\s.*512/2000 chunks\s+8\.5/s, ETA 2m55s, no update for 25s\s+1m25s", screen), screen


@pytest.mark.slow
def test_memory_index_with_stderr_not_a_terminal_prints_plain_progress_lines(sample_config: Path):
    bad = sample_config.parent / "mem" / "latin1.md"
    bad.write_bytes("# Caf\xe9 notes\n".encode("latin-1"))  # fails at extraction, still counted
    proc = run_cli("index", "--config", str(sample_config))
    assert proc.returncode == 0, proc.stderr
    assert "Indexed 18 files" in proc.stdout
    err = proc.stderr
    assert "\r" not in err
    lines = err.splitlines()
    # (other stderr lines, e.g. a library's warning, are not ours to check)
    stage_lines = [line for line in lines if line.split(":")[0] in progress.STAGES]
    assert stage_lines and all(LINE.match(line) for line in stage_lines), lines
    assert "extract: 18/18 files (" in err  # the failed file advanced the count
    assert re.search(r"^embed: (\d+)/\1 chunks \(", err, re.M), err
    assert re.search(r"^write: (\d+)/\1 partitions \(", err, re.M), err
    assert any(line.startswith("  failed:") and "latin1.md" in line for line in lines), lines
