"""Progress of long work, reported to whoever listens (the CLI prints it on stderr).

Stage functions call ``report(stage, done, total, unit)``; nothing is printed unless a
listener is set (``set_listener``), so Dagster runs and library use stay quiet.

A listener is any callable taking those four arguments. It may also have ``start()`` and
``close()``: ``set_listener`` starts the new one and closes the one it replaces, so
``set_listener(None)`` ends a live display and stops a heartbeat thread.

Two listeners come with the module, and ``stderr_progress`` picks one by what the stream is:

- ``BarProgress``, on a terminal: one live ``rich`` bar per stage (counts, rate, ETA,
  elapsed); log lines written to the same stream are printed above the bars, not through them.
- ``LineProgress``, anywhere else (a log file, a pipe): plain lines such as
  ``extract: 120/151 files (12.3/s, ETA 3s)``, at most one per stage every ``interval``
  seconds, the final line of every stage, and a heartbeat line when nothing was said for
  ``heartbeat`` seconds (a stage between two reports, or the gap between two stages).

A report with ``done == 0`` marks the start of a stage; without one, a stage is taken to
have started when the stage before it ended (or at its first report, for the first one), and
its rate is measured between its reports once there are two.
"""

from __future__ import annotations

import io
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

Listener = Callable[[str, int, int, str], None]
Clock = Callable[[], float]

# The stages of `memory index`, in the order they run.
STAGES = ("discover", "extract", "chunk", "embed", "write")

_listener: Listener | None = None


def set_listener(listener: Listener | None) -> None:
    """Send reports to ``listener`` (None: to no one); closes the previous one, starts the new one."""
    global _listener
    previous, _listener = _listener, listener
    if previous is not None and previous is not listener and hasattr(previous, "close"):
        previous.close()
    if listener is not None and hasattr(listener, "start"):
        listener.start()


def report(stage: str, done: int, total: int, unit: str = "items") -> None:
    """``done`` of ``total`` ``unit`` of ``stage`` are finished (failed ones count as finished)."""
    if _listener is not None:
        _listener(stage, done, total, unit)


def stderr_progress(
    stream: IO[str] | None = None,
    *,
    console: Any = None,
    interval: float = 10.0,
    heartbeat: float | None = 10.0,
    clock: Clock = time.monotonic,
) -> LineProgress | BarProgress:
    """Live bars when the output is a terminal (or ``console`` is one), plain log lines otherwise."""
    if console is not None:
        if console.is_terminal:
            return BarProgress(console, clock=clock, stale_after=heartbeat)
        stream = console.file
    out: IO[str] = stream or sys.stderr
    if _isatty(out):
        from rich.console import Console

        return BarProgress(Console(file=out), clock=clock, stale_after=heartbeat)
    return LineProgress(out, interval=interval, heartbeat=heartbeat, clock=clock)


# The name `memory index` (cli.py) has always called.
StderrProgress = stderr_progress


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


# --- what is known about a stage ---------------------------------------------------------


@dataclass(eq=False)
class StageProgress:
    """The latest report of one stage, and when things happened (clock seconds)."""

    name: str
    unit: str
    total: int
    done: int
    started: float  # best known start: a done == 0 report, the end of the stage before it, or the first report
    first_at: float  # the first report: rates are measured from it when there are two or more
    first_done: int
    updated: float
    ended: float | None = None
    stopped: bool = False  # the run ended (or moved on) before the stage reached its total
    shown_at: float = 0.0  # the last line printed for it (LineProgress)
    shown_done: int = -1

    @property
    def finished(self) -> bool:
        return self.ended is not None

    def rate(self) -> float | None:
        """Units per second, or None while unknown."""
        if self.updated > self.first_at and self.done > self.first_done:
            return (self.done - self.first_done) / (self.updated - self.first_at)
        span = self.updated - self.started
        return self.done / span if span > 0 and self.done > 0 else None

    def eta(self) -> float | None:
        rate = self.rate()
        return max(self.total - self.done, 0) / rate if rate else None

    def elapsed(self, now: float) -> float:
        return (self.ended if self.ended is not None else now) - self.started


def duration(seconds: float) -> str:
    """``7s``, ``2m05s``, ``1h02m``."""
    s = max(int(math.ceil(seconds - 1e-9)), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _rate(rate: float) -> str:
    return f"{rate:.1f}/s" if rate < 100 else f"{rate:.0f}/s"


def progress_line(st: StageProgress) -> str:
    """``extract: 120/151 files (12.3/s, ETA 3s)``; every line of a stage has this shape."""
    line = f"{st.name}: {st.done}/{st.total} {st.unit}"
    rate = st.rate()
    if rate is None:
        return line
    if st.stopped:
        return f"{line} ({_rate(rate)})"
    eta = st.eta()
    return f"{line} ({_rate(rate)}, ETA {duration(eta or 0)})"


# --- the common part: stages, their order, start and close -------------------------------


class _Progress:
    """Turns reports into stage records; subclasses show them."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._stages: dict[str, StageProgress] = {}
        self._active: StageProgress | None = None  # the stage reported last
        self._opened = clock()
        self._last_end: float | None = None
        self._started = self._closed = False

    def __call__(self, stage: str, done: int, total: int, unit: str = "items") -> None:
        with self._lock:
            if self._closed:
                return
            now = self._clock()
            st = self._stages.get(stage)
            if st is not None and st.finished:
                if done >= total and (done, total) == (st.done, st.total):
                    return  # the same final report again
                st = None  # the stage runs again (a run retried with the fallback provider)
            if st is None:
                self._end_earlier_stages(stage, now)
                # Without a done == 0 report, the stage began when the one before it ended, if known;
                # the time before the first stage (Dagster starting, the stat walk) is no stage's.
                started = now if done == 0 or self._last_end is None else self._last_end
                st = StageProgress(stage, unit, total, done, started, now, done, now)
                self._stages[stage] = st
                self._added(st, now)
            st.done, st.total, st.unit, st.updated = done, total, unit, now
            self._active = st
            if done >= total:
                self._end(st, now)
            else:
                self._updated(st, now)

    def _end_earlier_stages(self, stage: str, now: float) -> None:
        """A report of a later stage means the earlier ones are over, whatever they last said."""
        if stage not in STAGES:
            return
        for name in STAGES[: STAGES.index(stage)]:
            st = self._stages.get(name)
            if st is not None and not st.finished:
                st.stopped = st.done < st.total
                self._end(st, now)

    def _end(self, st: StageProgress, now: float) -> None:
        st.ended = now
        self._last_end = now
        self._finished(st, now)

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            self._opened = self._clock()
        self._open()

    def close(self) -> None:
        """Ends the display; a stage still running is shown as stopped where it was."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            now = self._clock()
            for st in self._stages.values():
                if not st.finished:
                    st.stopped = True
                    st.ended = now
                    self._finished(st, now)
        self._shut()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # What subclasses show; called under the lock, except _open and _shut.
    def _added(self, st: StageProgress, now: float) -> None: ...
    def _updated(self, st: StageProgress, now: float) -> None: ...
    def _finished(self, st: StageProgress, now: float) -> None: ...
    def _open(self) -> None: ...
    def _shut(self) -> None: ...


# --- not a terminal: plain, rate-limited lines ---------------------------------------------


class LineProgress(_Progress):
    """Plain lines for a log: at most one per stage every ``interval`` s, plus each stage's final line.

    A heartbeat thread (every ``heartbeat`` s of silence; None: no thread) says where a
    stage stands when it has not reported, so a log is never silent for long.
    Lines end with a newline, never a carriage return.
    """

    def __init__(
        self,
        stream: IO[str],
        *,
        interval: float = 10.0,
        heartbeat: float | None = 10.0,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(clock)
        self.stream = stream
        self.interval = interval
        self.heartbeat = heartbeat
        self._last_output = self._opened
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._broken = False

    def _open(self) -> None:
        self._last_output = self._opened
        if self.heartbeat is not None:
            self._thread = threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True)
            self._thread.start()

    def _shut(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _added(self, st: StageProgress, now: float) -> None:
        # The limit is per stage; its first line may come as soon as the log has been quiet long enough.
        st.shown_at = self._last_output

    def _updated(self, st: StageProgress, now: float) -> None:
        if now - st.shown_at >= self.interval:
            self._show(st, progress_line(st), now)

    def _finished(self, st: StageProgress, now: float) -> None:
        line = progress_line(st)
        if st.stopped:
            line += f", stopped after {duration(st.elapsed(now))}"
        self._show(st, line, now)

    def tick(self) -> None:
        """The heartbeat: say where things stand if nothing was said for ``heartbeat`` seconds."""
        with self._lock:
            if self._closed or self.heartbeat is None:
                return
            now = self._clock()
            if now - self._last_output < self.heartbeat:
                return
            st = self._active
            if st is not None and not st.finished:
                if now - st.shown_at < self.interval:
                    return
                if st.done > st.shown_done:
                    self._show(st, progress_line(st), now)
                else:
                    self._show(
                        st,
                        f"{st.name}: {st.done}/{st.total} {st.unit}, no update for {duration(now - st.updated)} ({duration(st.elapsed(now))} elapsed)",
                        now,
                    )
            elif st is not None:
                self._show(None, f"still working: {duration(now - (st.ended or now))} since {st.name} finished", now)
            else:
                self._show(None, f"still working: {duration(now - self._opened)}, no stage reported yet", now)

    def _next_beat(self) -> float:
        """Seconds until the next heartbeat may be due."""
        with self._lock:
            due = self._last_output + (self.heartbeat or 0.0)
            st = self._active
            if st is not None and not st.finished:
                due = max(due, st.shown_at + self.interval)
            return max(due - self._clock(), 0.001)

    def _beat(self) -> None:
        while not self._stop.wait(self._next_beat()):
            self.tick()

    def _show(self, st: StageProgress | None, line: str, now: float) -> None:
        if st is not None:
            st.shown_at, st.shown_done = now, st.done
        self._last_output = now
        if self._broken:
            return
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            # stderr went away (a closed pipe, a closed file): progress is not worth failing the run for.
            self._broken = True


# --- a terminal: live bars -----------------------------------------------------------------


class BarProgress(_Progress):
    """One live ``rich`` bar per stage on a terminal; finished bars stay on screen as a record.

    While the bars are up, log handlers that write to the same stream (the CLI's ``[WARN]``
    handler) and ``sys.stderr`` are routed through the console, so their lines are printed
    above the bars instead of through them. A stage with no report for ``stale_after``
    seconds says so on its row; between two stages a "working" row pulses.
    """

    def __init__(self, console: Any, *, clock: Clock = time.monotonic, stale_after: float | None = 10.0) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        super().__init__(clock)
        self.console = console
        self.stale_after = stale_after
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=30),
            _text_column(self._counts),
            _text_column(self._detail),
            _text_column(self._elapsed),
            console=console,
            get_time=clock,
            transient=False,
            redirect_stdout=False,  # stdout may be a file while stderr is a terminal: keep them apart
            redirect_stderr=True,
            refresh_per_second=4,
        )
        self._tasks: dict[int, Any] = {}  # id(StageProgress) -> its rich task
        self._waiting: Any = None  # the "working" row while no stage is running
        self._rerouted: list[tuple[logging.StreamHandler, IO[str]]] = []

    def _open(self) -> None:
        self.progress.start()
        self._reroute_logs()
        with self._lock:
            self._show_waiting()

    def _shut(self) -> None:
        with self._lock:
            self._hide_waiting()
        self.progress.stop()
        for handler, stream in self._rerouted:
            handler.setStream(stream)
        self._rerouted.clear()

    def _added(self, st: StageProgress, now: float) -> None:
        self._hide_waiting()
        self._tasks[id(st)] = self.progress.add_task(st.name, total=st.total or None, completed=st.done, stage=st)

    def _updated(self, st: StageProgress, now: float) -> None:
        self._hide_waiting()
        self.progress.update(self._tasks[id(st)], total=st.total or None, completed=st.done)

    def _finished(self, st: StageProgress, now: float) -> None:
        self.progress.update(self._tasks[id(st)], total=st.total or 1, completed=st.done if st.total else 1)
        self.progress.stop_task(self._tasks[id(st)])
        if not self._closed:
            self._show_waiting()

    def _show_waiting(self) -> None:
        if self._waiting is None:
            self._waiting = self.progress.add_task("working", total=None, stage=None, since=self._clock())

    def _hide_waiting(self) -> None:
        if self._waiting is not None:
            self.progress.remove_task(self._waiting)
            self._waiting = None

    def _reroute_logs(self) -> None:
        stream = self.console.file
        writer = _ConsoleWriter(self.console)
        loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger))]
        for logger in loggers:
            for handler in logger.handlers:
                if type(handler) is logging.StreamHandler and handler.stream is stream:
                    handler.setStream(writer)  # returns the old stream: `stream`, as just checked
                    self._rerouted.append((handler, stream))

    # The columns after the bar, computed at each refresh from the stage record.
    def _counts(self, task) -> str:
        st = task.fields.get("stage")
        return f"{st.done}/{st.total} {st.unit}" if st else ""

    def _detail(self, task) -> str:
        st: StageProgress | None = task.fields.get("stage")
        if st is None:
            after = self._active.name if self._active is not None else None
            return f"after {after}" if after else "starting"
        rate = st.rate()
        if st.finished:
            return "stopped" if st.stopped else (f"{_rate(rate)}, done" if rate else "done")
        now = self._clock()
        parts = [_rate(rate), f"ETA {duration(st.eta() or 0)}"] if rate else []
        if self.stale_after is not None and now - st.updated >= self.stale_after:
            parts.append(f"no update for {duration(now - st.updated)}")
        return ", ".join(parts)

    def _elapsed(self, task) -> str:
        st: StageProgress | None = task.fields.get("stage")
        if st is None:
            return duration(self._clock() - task.fields.get("since", self._opened))
        return duration(st.elapsed(self._clock()))


def _text_column(render: Callable[[Any], str]) -> Any:
    """A rich progress column showing ``render(task)`` (defined here: rich is imported only for bars)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class TextOf(ProgressColumn):
        def render(self, task) -> Text:
            return Text(render(task))

    return TextOf()


class _ConsoleWriter(io.TextIOBase):
    """A text stream whose whole lines are printed through a rich console (above its live display)."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self._pending = ""

    def write(self, text: str) -> int:
        from rich.text import Text

        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        for line in lines:
            # Text, not a string: a log line's "[WARN]" is not rich markup.
            self.console.print(Text(line), soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        from rich.text import Text

        if self._pending:
            self.console.print(Text(self._pending), soft_wrap=True)
            self._pending = ""
