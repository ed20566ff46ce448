"""Index runs give way to a running server's searches.

An agent's searches are interactive; an index run (``memory index``, a Dagster run, a backfill) is
batch work. On a small machine both want every core: a run embedding notes next to `memory serve`
took more than half its CPU and its searches/s fell by more than half. While a server is up for the
same data folder (its ``server.json`` names a live process), an index run raises its own nice value
to ``service.index_nice`` (10 by default; 0 leaves it alone), so the scheduler gives the server's
threads the CPU first and the run whatever they leave. On an idle machine the run is as fast as
before: a nice value only matters when something else wants the CPU.

Linux keeps a nice value per thread and a new thread takes its creator's, so every thread the
process already has is moved (the model's and LanceDB's worker pools may exist already) and those
it starts later follow. A process can always lower its own priority, never raise it back without
privileges: the value only goes up, and never in the server's own process (its own index runs go
to a companion process, ``service.indexer``, which sets the same value for itself).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from memory_pipeline.settings import Settings

log = logging.getLogger(__name__)

_TASKS = Path("/proc/self/task")


def yield_to_server(settings: Settings) -> int | None:
    """Lower this process's CPU priority when a server for ``settings``' data folder is up; the
    nice value asked for (threads already there or above keep theirs), or None when there is
    nothing to do (no server, it is this process, ``service.index_nice`` is 0, or the platform
    has no ``setpriority``)."""
    step = settings.service.index_nice
    if step <= 0 or not hasattr(os, "setpriority"):
        return None
    from memory_pipeline import storage
    from memory_pipeline.service import serverfile

    record = serverfile.read(storage.of(settings).root)
    if record is None or record.get("pid") == os.getpid():
        return None
    target = min(19, step)
    raised = raise_nice(target)
    if raised:
        log.info("a server is up for this data folder (pid %s): this run gives its searches the CPU first (nice %d)", record["pid"], target)
    return target


def raise_nice(target: int) -> int:
    """Every thread of this process to nice ``target`` at least (threads it starts later inherit
    it); how many were moved."""
    try:
        tids = [int(t) for t in os.listdir(_TASKS)]
    except OSError:
        tids = [0]  # no /proc: this thread only (and those it starts)
    moved = 0
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < target:
                os.setpriority(os.PRIO_PROCESS, tid, target)
                moved += 1
        except OSError:  # the thread ended meanwhile, or the platform refuses: not worth failing a run
            continue
    return moved


__all__ = ["yield_to_server", "raise_nice"]
