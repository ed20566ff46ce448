"""The worker process that runs the media and document extractors, so one file cannot take the run down.

Decoders (Pillow, pypdf, PyAV, Whisper, the zip and XML readers) can hang inside
C code or allocate without bound on a hostile file, where no deadline check is ever
reached. So they run in one long-lived child process: a fresh interpreter (the spawn
method, never a fork of a threaded parent), started the first time a media or
document file comes, so a text-only run never starts it, and Whisper's model loads
once per worker. The parent opens the file (contained, ``memory_pipeline.safeio``)
and hands the worker the descriptor itself over a Unix socket (``SCM_RIGHTS``): the
worker never sees the path, only the open file.

While it waits, the parent polls the worker every 50 ms and kills it (with the tools
it started: ffmpeg, tesseract; they share its process group) when it outlives
``MediaOptions.hard_seconds()`` or its resident memory passes ``max_extract_mb``. The
file fails with that reason and the next file gets a fresh worker. RLIMIT_AS is not
used: onnxruntime and CTranslate2 reserve far more address space than they touch
(the worker's VmSize is 950 MB with Whisper loaded, 220 MB of it resident);
RLIMIT_DATA at twice the ceiling stops a single huge allocation between two polls.

No worker outlives its parent: the parent stops it at exit (``atexit``) and the
pipeline at the end of its extract stage (``shutdown_worker``); the kernel kills it
when the parent dies (``PR_SET_PDEATHSIG``, armed only when the parent started it from
its main thread, since the signal follows the starting *thread*); it exits when the
socket to its parent closes; and a watchdog thread exits it when its parent changes.
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.media import MediaOptions, Segments
from memory_pipeline.extraction.output import cap_segments
from memory_pipeline.models import Segment
from memory_pipeline.safeio import OpenedFile

POLL_SECONDS = 0.05
# Tools the worker started are summed in less often: listing a process's children reads /proc.
_CHILDREN_EVERY = 10
_START_TIMEOUT_SECONDS = 120.0
_REASON_CHARS = 500
_PR_SET_PDEATHSIG = 1
DATA_LIMIT_FACTOR = 2

# An extractor: (the opened file, mime type, options) -> segments; a test passes its own.
Extractor = Callable[[OpenedFile, str, MediaOptions], list[Segment]]


def media_extractor(modality: str) -> Extractor | None:
    """The extractor of a media modality, imported on use (a text-only process never loads them)."""
    if modality == "image":
        from memory_pipeline.extraction.image import extract_image as fn
    elif modality == "audio":
        from memory_pipeline.extraction.audio import extract_audio as fn
    elif modality == "video":
        from memory_pipeline.extraction.video import extract_video as fn
    elif modality == "pdf":
        from memory_pipeline.extraction.pdf import extract_pdf as fn
    elif modality == "document":
        from memory_pipeline.extraction.document import extract_document as fn
    else:
        return None
    return fn


def run_extractor(src: OpenedFile, modality: str, mime: str, options: MediaOptions, extractor: Extractor | None = None) -> Segments:
    """Run one extractor here, with every failure turned into an ExtractionError carrying a reason."""
    fn = extractor or media_extractor(modality)
    if fn is None:
        raise ExtractionError(src.path, f"no extractor for {modality} files")
    try:
        result = fn(src, mime, options)
    except ExtractionError as err:
        if not err.path:
            raise ExtractionError(src.path, err.reason) from err
        raise
    except MemoryError as err:
        raise ExtractionError(src.path, f"extraction needed more than {options.max_extract_mb} MB (max_extract_mb)") from err
    except RecursionError as err:
        raise ExtractionError(src.path, f"{modality} is nested too deeply to read") from err
    except PermissionError as err:
        raise ExtractionError(src.path, "permission denied") from err
    except OSError as err:
        raise ExtractionError(src.path, f"cannot read: {err.strerror or err}") from err
    except Exception as err:  # a decoder library's own error on a malformed file
        raise ExtractionError(src.path, f"{modality} is malformed: {type(err).__name__}: {err}") from err
    out = Segments(result)
    out.warning = getattr(result, "warning", "")
    return out


# --- the worker side -----------------------------------------------------------------------


def _die_with_parent(parent_pid: int, deathsig: bool) -> None:
    if deathsig:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # not Linux: the pipe and the watchdog still apply
            pass
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(0)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _limit_data(options: MediaOptions) -> None:
    """A second, instant bound under the 50 ms RSS poll: one huge allocation fails at once (MemoryError).

    RLIMIT_DATA counts private writable memory, which is more than what is resident:
    with Whisper loaded, 363 MB against 218 MB resident. Twice the ceiling leaves that
    room; the RSS poll is what enforces the ceiling itself.
    """
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        want = options.max_extract_mb * 1024 * 1024 * DATA_LIMIT_FACTOR
        resource.setrlimit(resource.RLIMIT_DATA, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
    except (ImportError, ValueError, OSError):  # not Unix, or a hard limit already lower
        pass


def serve_fd(fd: int, parent_pid: int, deathsig: bool) -> None:
    """The worker process's entry point: serve the socket ``fd`` its parent passed."""
    serve(Connection(fd), parent_pid, deathsig)


def serve(conn: Connection, parent_pid: int, deathsig: bool) -> None:
    """The worker's loop: receive a job and its descriptor, extract, answer; until an empty job or EOF."""
    _die_with_parent(parent_pid, deathsig)
    conn.send_bytes(b"ready")
    while True:
        try:
            job = conn.recv_bytes()
            if not job:
                return
            fd = reduction.recv_handle(conn)
        except (EOFError, OSError):
            return
        reply: tuple[Any, ...]
        modality = "file"
        src = OpenedFile(fd, "", os.fstat(fd))
        try:
            with src:
                # Unpickled here, not by recv: a job that cannot be loaded fails its file, not the worker.
                src.path, modality, mime, options, extractor = pickle.loads(job)
                _limit_data(options)
                segments = run_extractor(src, modality, mime, options, extractor)
            capped = cap_segments(segments, options)  # what crosses the pipe is bounded too
            reply = ("ok", [(s.text, s.line_start, s.line_end, s.label, s.kind) for s in capped], capped.warning)
        except ExtractionError as err:
            reply = ("error", err.reason[:_REASON_CHARS])
        except Exception as err:  # noqa: BLE001 - never lose the worker over an answer it could not build
            reply = ("error", f"{modality} extraction failed: {type(err).__name__}: {err}"[:_REASON_CHARS])
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return


# --- the parent side -----------------------------------------------------------------------


class ExtractionWorker:
    """One worker process, started on first use, killed at a file's limits and restarted on the next."""

    def __init__(self, poll_seconds: float = POLL_SECONDS) -> None:
        self.poll_seconds = poll_seconds
        self.starts = 0  # how many processes were started (a restart after a kill counts)
        self._proc = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def run(self, src: OpenedFile, modality: str, mime: str, options: MediaOptions, extractor: Extractor | None = None) -> Segments:
        """Extract ``src`` in the worker within the limits in ``options``; ExtractionError when it cannot."""
        job = pickle.dumps((src.path, modality, mime, options, extractor))
        with self._lock:
            for attempt in (1, 2):
                self._ensure(src.path)
                try:
                    assert self._conn is not None and self._proc is not None
                    self._conn.send_bytes(job)
                    reduction.send_handle(self._conn, src.fd, self._proc.pid)
                    break
                except (OSError, EOFError, ValueError) as err:
                    # A worker that died while idle (its parent thread ended, someone killed it): once more.
                    self._stop(kill=True)
                    if attempt == 2:
                        raise ExtractionError(src.path, f"cannot hand the file to the extraction worker: {err}") from err
            try:
                return self._wait(src.path, options)
            except ExtractionError:
                raise
            except BaseException:
                # Interrupted mid-file (Ctrl-C, a bug): the worker's late answer must never be
                # taken for the next file's, so this worker goes.
                self._stop(kill=True)
                raise

    def close(self) -> None:
        """Stop the worker (asking first, then killing); the next ``run`` starts a new one."""
        if self._lock.acquire(timeout=1.0):
            try:
                self._stop(kill=False)
            finally:
                self._lock.release()
            return
        # Another thread is waiting on a file (at interpreter exit, say): kill; that thread sees it die.
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()

    def _ensure(self, path: str) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._stop(kill=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        deathsig = threading.current_thread() is threading.main_thread()
        # A fresh interpreter (the spawn method), started by hand rather than by multiprocessing,
        # whose spawn re-runs the parent's __main__ script: a script without a main guard would
        # extract again inside the worker. The parent's sys.path comes along for test hooks.
        code = (
            f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; "
            "from memory_pipeline.extraction.worker import serve_fd; "
            f"serve_fd({theirs.fileno()}, {os.getpid()}, {deathsig})"
        )
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: killed with the tools it started
            )
        except OSError as err:
            ours.close()
            raise ExtractionError(path, f"cannot start the extraction worker: {err.strerror or err}") from err
        finally:
            theirs.close()
        self._proc, self._conn = proc, Connection(ours.detach())
        self.starts += 1
        try:
            ready = self._conn.poll(_START_TIMEOUT_SECONDS) and self._conn.recv_bytes() == b"ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            code_ = proc.poll()
            self._stop(kill=True)
            raise ExtractionError(path, f"the extraction worker failed to start (exit code {code_})")

    def _wait(self, path: str, options: MediaOptions) -> Segments:
        import psutil

        assert self._conn is not None and self._proc is not None
        seconds = options.hard_seconds()
        limit_bytes = options.max_extract_mb * 1024 * 1024
        end = time.monotonic() + seconds
        try:
            ps = psutil.Process(self._proc.pid)
        except psutil.Error:  # it died already: the poll below says so
            ps = None
        children: list[Any] = []
        polls = 0
        while True:
            try:
                if self._conn.poll(self.poll_seconds):
                    reply = self._conn.recv()
                    break
            except (EOFError, OSError):
                reply = None
                break
            if self._proc.poll() is not None:
                reply = None
                break
            if polls % _CHILDREN_EVERY == 0:
                children = _children(ps)
            polls += 1
            if _rss(ps, children) > limit_bytes:
                self._stop(kill=True)
                raise ExtractionError(path, f"extraction needed more than {options.max_extract_mb} MB (max_extract_mb); the worker was stopped")
            if time.monotonic() > end:
                self._stop(kill=True)
                raise ExtractionError(path, f"extraction took longer than {seconds:g} s (max_extract_seconds); the worker was stopped")
        if reply is None:
            code = self._proc.wait()
            self._stop(kill=True)
            why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            raise ExtractionError(path, f"the extraction worker died while reading this file ({why})")
        if reply[0] == "error":
            raise ExtractionError(path, reply[1])
        out = Segments(Segment(*row) for row in reply[1])
        out.warning = reply[2]
        # Freed memory does not always go back to the system: a worker that grew large is
        # replaced before it makes the next, ordinary file look like a balloon.
        if _rss(ps, _children(ps)) > limit_bytes * 0.75:
            self._stop(kill=False)
        return out

    def _stop(self, *, kill: bool) -> None:
        proc, conn = self._proc, self._conn
        self._proc, self._conn = None, None
        if proc is None:
            return
        if not kill and proc.poll() is None and conn is not None:
            try:
                conn.send_bytes(b"")
                proc.wait(5.0)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker and the ffmpeg/tesseract it started
            except (ProcessLookupError, PermissionError):
                proc.kill()
        proc.wait()
        if conn is not None:
            conn.close()


def _children(ps) -> list[Any]:
    import psutil

    if ps is None:
        return []
    try:
        return ps.children(recursive=True)
    except psutil.Error:
        return []


def _rss(ps, children: list[Any]) -> int:
    import psutil

    total = 0
    for p in [ps, *children]:
        if p is None:
            continue
        try:
            total += p.memory_info().rss
        except psutil.Error:  # a tool that just exited
            pass
    return total


_WORKER = ExtractionWorker()


def default_worker() -> ExtractionWorker:
    """The process-wide worker ``extract`` uses when none is given."""
    return _WORKER


def shutdown_worker() -> None:
    """Stop the process-wide worker (the pipeline calls this when its extract stage ends)."""
    _WORKER.close()


atexit.register(shutdown_worker)
