"""How this process's C heap gives freed memory back (glibc, Linux).

glibc serves a request from ``mmap`` when it is at least the *mmap threshold* (128 KiB at start) and
hands it back to the system on ``free``; but each time such a block is freed it raises the
threshold to that block's size (up to 32 MiB), so later blocks of up to that size come from the
heap, where a free leaves them resident until whatever lies above them is freed too. LanceDB's
compaction and index builds and Arrow's row batches allocate and free many blocks of a few hundred
KiB to a few MiB: with the moving threshold a 10,000-note index run's compaction and full-text
build kept 470 MB resident where 287 MB were live (53,244 rows, peak 476 -> 373 MB with the
threshold fixed; the whole run's full-text phase 529 -> 485 MB). Fixing the threshold at its
starting value keeps big blocks on ``mmap``, so the memory a step frees leaves the process.

Arrow's buffers then come from that same ``malloc`` (pyarrow's default pool is its bundled mimalloc,
which keeps what is freed: see ``_arrow_system_pool``).

``tune_allocator`` runs once, when ``memory_pipeline`` is imported (every command, the Dagster
code server and run workers, ``memory serve``). It does nothing where the user tuned glibc
themselves (any ``MALLOC_*_`` variable of the thresholds), where ``MEMORY_PIPELINE_MALLOC=default``
asks for glibc's and Arrow's own behaviour, or where the C library is not glibc; a pool named in
``ARROW_DEFAULT_MEMORY_POOL`` is left as it is.

One workload wants the opposite: a torch model's forward passes allocate and free the same
activations, a few MiB each, batch after batch. Under the fixed threshold each is mapped, zeroed and
unmapped again: the torch runtime spent 29-33 s of system time indexing 2,667 chunks, against 6 s for
``SentenceTransformer.encode`` alone under glibc's moving threshold. :func:`model_buffers_on_heap`
lifts the threshold to glibc's largest (32 MiB) while a model embeds a slice of texts, so those
blocks are reused from the heap, then fixes it again and trims the heap.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# mallopt(3) parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's own starting threshold: requests this large or larger are mapped, and unmapped when freed.
MMAP_THRESHOLD_BYTES = 128 * 1024
# The largest threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): bigger blocks are always mapped.
HEAP_BLOCK_MAX_BYTES = 32 * 1024 * 1024
# glibc's starting trim threshold: free memory past this at the heap's top is handed back at once.
TRIM_THRESHOLD_BYTES = 128 * 1024
OPT_OUT_ENV = "MEMORY_PIPELINE_MALLOC"
# Setting any of these makes glibc's threshold fixed already: the user's values win.
GLIBC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"

_tuned: bool | None = None
_mallopt = None
_heap_lock = threading.Lock()
_heap_users = 0


def _arrow_system_pool() -> None:
    """Arrow's buffers from the C library's ``malloc`` (so under the threshold above), not from
    pyarrow's bundled mimalloc, which kept what the stages freed: a 10,000-note index run peaked
    at 474 MB with the system pool against 526-536 MB with mimalloc, a 1,000-note one at 439
    against 479-495 (2026-12-05, polled). A pool the user chose (``ARROW_DEFAULT_MEMORY_POOL``)
    wins; read by pyarrow when it first allocates, and set here too where pyarrow is loaded already."""
    if os.environ.get(ARROW_POOL_ENV):
        return
    os.environ[ARROW_POOL_ENV] = "system"
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        try:
            pa.set_memory_pool(pa.system_memory_pool())
        except Exception:  # noqa: BLE001 - an Arrow without the call: its own pool stays
            pass


def tune_allocator() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD_BYTES`` (once per process); True if set."""
    global _tuned, _mallopt
    if _tuned is not None:
        return _tuned
    _tuned = False
    if os.environ.get(OPT_OUT_ENV, "").strip().lower() in {"default", "glibc", "off", "0", "false", "no"}:
        return False
    if any(name in os.environ for name in GLIBC_ENV) or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl has no libc.so.6 and no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _tuned = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    if _tuned:
        _mallopt = mallopt
        _arrow_system_pool()
    return _tuned


def trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``); nothing elsewhere
    (musl, macOS: freed memory is reused, just not returned)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@contextmanager
def model_buffers_on_heap() -> Iterator[None]:
    """While inside, blocks of up to ``HEAP_BLOCK_MAX_BYTES`` come from the heap and are reused
    (glibc's threshold lifted, and its top not trimmed after every free); on leaving, the threshold
    is fixed again and the heap's free pages are given back (``malloc_trim``), so what other work
    frees leaves the process as before. Threads may nest: the last one out fixes it. Nothing
    happens where :func:`tune_allocator` left glibc alone.

    Meant around many passes (one call of a model over a slice of texts), not one: each trim costs
    the next pass its page faults again. The heap grows over a slice's passes as blocks of new
    sizes are needed (torch, 2,667 chunks: 650 MB peak with every block mapped, 1.2 GB with
    5,376-token passes, 0.8 GB with the default 2,048), and the trim hands that back between
    slices."""
    global _heap_users
    if not _tuned or _mallopt is None:
        yield
        return
    with _heap_lock:
        _heap_users += 1
        if _heap_users == 1:
            _mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK_MAX_BYTES)
            # and the heap's top kept while inside (a block freed there is the next pass's too)
            _mallopt(M_TRIM_THRESHOLD, 2 * HEAP_BLOCK_MAX_BYTES)
    try:
        yield
    finally:
        with _heap_lock:
            _heap_users -= 1
            if _heap_users == 0:
                _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
                trim_heap()


__all__ = ["ARROW_POOL_ENV", "HEAP_BLOCK_MAX_BYTES", "MMAP_THRESHOLD_BYTES", "OPT_OUT_ENV", "model_buffers_on_heap", "trim_heap", "tune_allocator"]
