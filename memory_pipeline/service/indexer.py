"""The server's index runs, in a companion process.

An index run is mostly Python (Dagster's execution and event log, the stages): run in one of the
server's threads it held the interpreter lock for most of its ~2 s, and the searches' own Python
steps queued behind it. At 100k chunks, 16 clients got 43 searches/s with nothing writing and 19/s
while one client ingested documents. The worker is a separate interpreter (spawned, not forked: the
server's LanceDB and model threads do not survive a fork) at ``service.index_nice``, started at the
first write and stopped after ``idle_seconds`` without one, so an idle server does not keep a
second model in memory.

Requests and answers go over a pipe: the shards to run (None: all), then the run's summary or
its error (our own errors keep their type, message, hint and field; anything else becomes a
``MemoryPipelineError`` naming it). A worker that dies mid-run (killed, out of memory) fails
that request with a clear error; the next request starts a new one, and the runner's records make
the interrupted run's shards run again.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import threading
from typing import TYPE_CHECKING, Any

from memory_pipeline.errors import MemoryPipelineError

if TYPE_CHECKING:
    from memory_pipeline.settings import Settings
    from memory_pipeline.stages.report import RunSummary

log = logging.getLogger(__name__)

IDLE_SECONDS = 300.0


class IndexWorkerError(MemoryPipelineError):
    """The worker died, or failed with an error that is not one of ours (HTTP 500: a bug or a crash)."""


_ATTRS = (str, int, float, bool, type(None))


class IndexWorker:
    """One companion process that runs ``run_index`` for the server, one request at a time."""

    def __init__(self, settings: Settings, *, idle_seconds: float = IDLE_SECONDS) -> None:
        self.settings = settings
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        self._idle: threading.Timer | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.is_alive() else None

    def run(self, shards: frozenset[str] | None) -> RunSummary:
        """An index run over ``shards`` (None: every shard with work); its summary, or its error."""
        from memory_pipeline.stages.report import RunSummary

        return RunSummary(**self._ask("index", None if shards is None else sorted(shards)))

    def fold(self) -> dict:
        """``VectorStore.fold_new_rows`` on the current table, at the worker's priority."""
        return self._ask("fold", None)

    def _ask(self, kind: str, arg: Any) -> dict:
        with self._lock:
            if self._idle is not None:
                self._idle.cancel()
            if self._closed:
                raise IndexWorkerError("the server is stopping: no index run is started now", hint="run `memory index` once it has stopped")
            self._start()
            try:
                self._conn.send((kind, arg))
                answer, payload = self._conn.recv()
            except (EOFError, OSError) as err:
                code = self._stop_now()
                log.error("the index worker stopped during a request (exit code %s)", code)
                raise IndexWorkerError(
                    f"the server's index worker stopped during the run (exit code {code}): {type(err).__name__}",
                    hint="the next write starts a new worker; `memory index` finishes what this run left",
                ) from None
            finally:
                self._arm_idle()
        if answer == "ok":
            return payload
        raise _rebuilt(payload)

    def close(self) -> None:
        """Stop the worker: asked to when idle; a run still going after 5 s is cut short (the
        server is stopping, and the runner's records make the next run finish its shards)."""
        self._closed = True
        if self._idle is not None:
            self._idle.cancel()
        idle = self._lock.acquire(timeout=5)
        try:
            self._stop_now(ask=idle)
        finally:
            if idle:
                self._lock.release()

    # --- the process ---------------------------------------------------------------------

    def _start(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        self._stop_now()
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(self.settings, child), name="memory-index-worker", daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent

    def _stop_now(self, ask: bool = False) -> int | None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is None:
            return None
        if ask and proc.is_alive():
            try:
                conn.send(("stop", None))
            except (OSError, ValueError):
                pass
            proc.join(10)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        if conn is not None:
            conn.close()
        return proc.exitcode

    def _arm_idle(self) -> None:
        if self.idle_seconds <= 0 or self._proc is None:
            return
        self._idle = threading.Timer(self.idle_seconds, self._stop_if_idle)
        self._idle.daemon = True
        self._idle.start()

    def _stop_if_idle(self) -> None:
        if self._lock.acquire(blocking=False):  # a run under way: it re-arms the timer itself
            try:
                self._stop_now(ask=True)
            finally:
                self._lock.release()


def _described(err: BaseException) -> dict:
    import traceback

    attrs = {k: (v if isinstance(v, _ATTRS) else str(v)) for k, v in vars(err).items()}  # a Path as its text
    tb = "" if isinstance(err, MemoryPipelineError) else "".join(traceback.format_exception(err))
    return {"module": type(err).__module__, "name": type(err).__qualname__, "message": str(err), "attrs": attrs, "traceback": tb}


def _rebuilt(payload: dict) -> BaseException:
    """The worker's error as the server raises it: our own types as themselves, others named."""
    try:
        cls = getattr(importlib.import_module(payload["module"]), payload["name"])
    except (ImportError, AttributeError):
        cls = None
    if isinstance(cls, type) and issubclass(cls, MemoryPipelineError):
        err = cls.__new__(cls)
        Exception.__init__(err, payload["message"])
        err.__dict__.update(payload["attrs"])
        return err
    log.error("the index worker's run failed: %s: %s\n%s", payload["name"], payload["message"], payload.get("traceback", ""))
    return IndexWorkerError(
        f"the index run failed: {payload['name']}: {payload['message']}", hint="see the server's log and the run in the Dagster UI (make ui)"
    )


def fold(settings: Settings) -> dict:
    """Fold new rows into the current table's indices (``VectorStore.fold_new_rows``), then train the
    vector index again as one if folds left more than ANN_MAX_DELTAS deltas (tables up to
    ANN_REBUILD_ROWS rows). Run by the worker, or in-process by a service without one."""
    from memory_pipeline import storage
    from memory_pipeline.stores import generations
    from memory_pipeline.stores.lance import ANN_MAX_DELTAS, ANN_REBUILD_ROWS, WRITE_CACHE_MIB, VectorStore

    store = VectorStore(storage.of(settings).lancedb_uri, generations.current(settings)[0], cache_mib=WRITE_CACHE_MIB)
    done = store.fold_new_rows()
    if done.get("fold") == "optimized" and store.count_rows() <= ANN_REBUILD_ROWS:
        # Each fold adds a delta vector index that queries search too: one again past ANN_MAX_DELTAS.
        done["ann"] = store.ensure_ann(settings.ann, max_deltas=ANN_MAX_DELTAS).get("ann", "")
    return done


def _serve(settings: Settings, conn) -> None:
    """The worker's loop: index requests until told to stop or the server goes away."""
    try:
        os.dup2(2, 1)  # `memory mcp` speaks on stdout: nothing of this process may land there
    except OSError:
        pass
    import signal

    from memory_pipeline.discovery import keep_name_checks
    from memory_pipeline.priority import raise_nice
    from memory_pipeline.runner import run_index

    keep_name_checks()  # it walks the folder at every request

    # Ctrl-C in the server's terminal reaches this process too: the server stops it (close).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if settings.service.index_nice > 0:
        raise_nice(settings.service.index_nice)  # the server's background writer: its searches come first
    while True:
        try:
            kind, arg = conn.recv()
        except (EOFError, OSError):
            return  # the server is gone
        if kind not in ("index", "fold"):
            return
        try:
            answer = ("ok", run_index(settings, shards=arg, keep_model=True).as_dict() if kind == "index" else fold(settings))
        except BaseException as err:  # noqa: BLE001 - every failure goes back to the server
            answer = ("error", _described(err))
        try:
            conn.send(answer)
        except (OSError, ValueError):
            return


__all__ = ["IndexWorker", "IndexWorkerError", "fold"]
