"""One searcher kept loaded for the life of the server, that still sees every new commit.

The model, the provider and the table handle are opened once (the first query pays for them;
``warm()`` pays at start-up instead). Before a query, at most every ``refresh_seconds``, the
handle moves to the table's latest committed version (a manifest read, well under a millisecond),
so rows written by `memory index`, a Dagster run or another process show up without a restart.
A query runs on one version from start to end: it sees a file's old rows or its new rows (each
file is replaced in one commit), never a mix. Reads never take the write lock.

A version whose new rows the indices do not cover yet is waited out, for a while: every query
scans the rows its full-text and vector indices lack, and a large batch of them is costly until
the writer folds them in (measured at 100k chunks: 2,000 unindexed rows 30 -> 71 ms of CPU per
hybrid search; the ~20,000 of a 2,000-note `memory index`, committed shard by shard before its
fold, 0.5-1.2 s per search for the half-minute until the fold landed). So when the latest version
holds more than ``DEFER_ROWS`` unindexed rows (and more than the version searched now), searches
stay on the current, indexed version (its files are kept: Lance's versions are immutable) until a
fold brings the count down, or for ``MAX_LAG_SECONDS`` at most; this server's own writes are seen
at once (``invalidate``). A query still never sees a mix of one file's old and new rows.

Since 2026-12-05 any number of them is waited out (``DEFER_ROWS`` 0, was 1,000): a few hundred
already cost every search as much as the rest of it. Measured in one process on a 100k-chunk table
(200 queries, hybrid): 500 unindexed rows took a search's CPU from 14.2 to 24.8 ms, and 16 clients
beside a `memory index` of 40 notes (a few hundred rows, under the old threshold) got 35.8-39.6
searches/s against 91-99 with nothing writing. The writer folds them when its run ends (a run that
finds a server up always folds; a run also folds every 65,536 rows it writes, unless it is a forced
run into a table with a full-text index, ``VectorStore.fold_segment``), so they appear then, whole, or
after ``MAX_LAG_SECONDS``.
"""

from __future__ import annotations

import copy
import logging
import threading
import time

from memory_pipeline.settings import Settings

log = logging.getLogger(__name__)

DEFER_ROWS = 0  # unindexed rows (beyond the searched version's) past which a new version is waited out: any
MAX_LAG_SECONDS = 60.0  # and never longer than this after it was committed


class WarmSearcher:
    """A ``MemorySearcher`` opened once and moved to the latest table version as commits land."""

    def __init__(self, settings: Settings, *, refresh_seconds: float = 0.25) -> None:
        from memory_pipeline.search.lru import LRU  # not at import: the search package is heavy

        self.settings = settings
        self.refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._searcher = None
        self._checked = 0.0
        self._own_write = False  # the next refresh takes the latest version, unindexed rows or not
        self._deferred: tuple[int, float] | None = None  # (version waited out, since when)
        self._backlogs: LRU[tuple[str, int], int] = LRU(8)  # (table, version) -> its unindexed rows
        self._probe = None  # a handle of the refresh's own, to look at the latest version with

    def get(self):
        """The searcher, on a table version at most ``refresh_seconds`` old."""
        searcher = self._searcher
        if searcher is not None and time.monotonic() - self._checked < self.refresh_seconds:
            return searcher
        with self._lock:
            if self._searcher is not None and time.monotonic() - self._checked < self.refresh_seconds:
                return self._searcher
            self._searcher = self._refreshed(self._searcher)
            self._checked = time.monotonic()
            return self._searcher

    def invalidate(self) -> None:
        """Look for a new table version on the next ``get`` (after this process wrote): the latest,
        even with rows the indices lack (this server's writer wants its rows seen at once)."""
        self._own_write = True
        self._checked = 0.0

    def warm(self) -> None:
        """Open everything and embed one query now, so the first caller does not wait for the model."""
        searcher = self.get()
        if searcher.provider is not None:
            searcher.provider.embed_query("warm up")
        searcher.warm()  # the vectors and full-text statistics in memory, when the table fits them

    def _refreshed(self, searcher):
        from memory_pipeline.search import MemorySearcher
        from memory_pipeline.stores import generations

        if searcher is None:
            self._probe = None
            return MemorySearcher(self.settings)
        name, _ = generations.current(self.settings)
        if searcher.table is None or name != searcher.store.table_name:
            # The table appeared, or a new generation (another model) became current.
            self._probe = None
            return MemorySearcher(self.settings)
        own, self._own_write = self._own_write, False
        table = searcher.table
        try:
            current = int(table.version)
            # The latest version is looked at through a handle of the refresh's own: queries in
            # flight read the searcher's handle several times (each leg, then the rows taken), so
            # it must never move under them; a searcher moved on gets a new handle (``_on``).
            probe = self._probe or searcher.store.db.open_table(name)
            self._probe = probe
            probe.checkout_latest()
            latest = int(probe.version)
            if latest == current:
                self._deferred = None
                return searcher
            if not own:
                backlog = self._backlog(probe, name, latest)
                # Measured only when a new version holds many: the one searched now, for comparison.
                if backlog > DEFER_ROWS and backlog > self._backlog(table, name, current):
                    first = self._deferred[1] if self._deferred is not None else time.monotonic()
                    if time.monotonic() - first < MAX_LAG_SECONDS:
                        # Rows a writer has not folded into the indices yet: searches stay on the
                        # indexed version meanwhile (a fold, or the lag bound, moves them on).
                        self._deferred = (latest, first)
                        return searcher
                    log.info("searching table version %d with %d rows the indices lack (not folded after %.0f s)", latest, backlog, MAX_LAG_SECONDS)
            self._deferred = None
            self._probe = None  # the probe becomes the searcher's handle; the next refresh opens another
            return _on(searcher, probe)
        except Exception as err:  # noqa: BLE001 - the table was dropped or rebuilt under us: open it anew
            self._probe = None
            log.info("re-opening the table after %s: %s", type(err).__name__, err)
            return MemorySearcher(self.settings)

    def _backlog(self, table, name: str, version: int) -> int:
        """The unindexed rows of ``table`` (called ``name``) at its checked-out ``version``, counted
        once per version (a version never changes; a wait refreshes every ``refresh_seconds``
        under the lock)."""
        from memory_pipeline.stores.lance import unindexed_rows

        known = self._backlogs.get((name, version))
        if known is None:
            known = unindexed_rows(table)
            self._backlogs.put((name, version), known)
        return known

    @property
    def deferred_version(self) -> int | None:
        """The latest table version searches are waiting out (its new rows not indexed yet), if any."""
        deferred = self._deferred
        return deferred[0] if deferred is not None else None


def _on(searcher, table):
    """``searcher`` on another handle (another version) of its table, sharing what it loaded (the
    model, the per-version vectors and full-text statistics): queries in flight on ``searcher``
    keep its handle, and so one version from start to end."""
    moved = copy.copy(searcher)
    moved.table = table
    return moved
