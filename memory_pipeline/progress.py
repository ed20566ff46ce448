"""Progress of long work, reported to whoever listens (the CLI prints it on stderr).

Stage functions call ``report``; nothing is printed unless a listener is set, so
Dagster runs and library use stay quiet.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

Listener = Callable[[str, int, int, str], None]
_listener: Listener | None = None


def set_listener(listener: Listener | None) -> None:
    global _listener
    _listener = listener


def report(stage: str, done: int, total: int, unit: str = "items") -> None:
    if _listener is not None:
        _listener(stage, done, total, unit)


class StderrProgress:
    """One updating line per stage: done/total, rate and ETA."""

    def __init__(self, stream=None, min_interval: float = 0.5) -> None:
        self.stream = stream or sys.stderr
        self.min_interval = min_interval
        self._started: dict[str, float] = {}
        self._last = 0.0

    def __call__(self, stage: str, done: int, total: int, unit: str) -> None:
        now = time.monotonic()
        start = self._started.setdefault(stage, now)
        finished = total > 0 and done >= total
        if not finished and now - self._last < self.min_interval:
            return
        self._last = now
        elapsed = now - start
        line = f"{stage}: {done}/{total} {unit}"
        if elapsed >= 0.2 and done:
            rate = done / elapsed
            eta = (total - done) / rate if total else 0.0
            line += f" ({rate:.1f}/s, ETA {eta:.0f}s)"
        end = "\n" if finished else "\r"
        self.stream.write(f"\r{line:<78}{end}")
        self.stream.flush()
