"""One searcher kept loaded for the life of the server, that still sees every new commit.

The model, the provider and the table handle are opened once (the first query pays for them;
``warm()`` pays at start-up instead). Before a query, at most every ``refresh_seconds``, the
handle moves to the table's latest committed version (a manifest read, well under a millisecond),
so rows written by `memory index`, a Dagster run or another process show up without a restart.
A query runs on one version from start to end: it sees a file's old rows or its new rows (each
file is replaced in one commit), never a mix. Reads never take the write lock.
"""

from __future__ import annotations

import logging
import threading
import time

from memory_pipeline.settings import Settings

log = logging.getLogger(__name__)


class WarmSearcher:
    """A ``MemorySearcher`` opened once and moved to the latest table version as commits land."""

    def __init__(self, settings: Settings, *, refresh_seconds: float = 0.25) -> None:
        self.settings = settings
        self.refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._searcher = None
        self._checked = 0.0

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
        """Look for a new table version on the next ``get`` (after this process wrote)."""
        self._checked = 0.0

    def warm(self) -> None:
        """Open everything and embed one query now, so the first caller does not wait for the model."""
        searcher = self.get()
        if searcher.provider is not None:
            searcher.provider.embed_query("warm up")

    def _refreshed(self, searcher):
        from memory_pipeline.search import MemorySearcher
        from memory_pipeline.stores import generations

        if searcher is None:
            return MemorySearcher(self.settings)
        name, _ = generations.current(self.settings)
        if searcher.table is None or name != searcher.store.table_name:
            # The table appeared, or a new generation (another model) became current.
            return MemorySearcher(self.settings)
        try:
            searcher.table.checkout_latest()
        except Exception as err:  # noqa: BLE001 - the table was dropped or rebuilt under us: open it anew
            log.info("re-opening the table after %s: %s", type(err).__name__, err)
            return MemorySearcher(self.settings)
        return searcher
