"""memory_pipeline: index an agent's memory folder into LanceDB and search it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from memory_pipeline.allocator import tune_allocator  # noqa: E402 - before the heavy libraries allocate
from memory_pipeline.lazy_imports import defer_slow_packages  # noqa: E402 - before anything imports lancedb

tune_allocator()
defer_slow_packages()
# LanceDB's native logger writes its warnings straight to stderr, past our own: `memory eval`'s
# plain-LanceDB baseline printed two deprecation lines per query (1,620 over SciFact). Errors only,
# unless the environment says otherwise (`LANCEDB_LOG=warn`); lancedb reads it once, at its import,
# so here: the `memory` command, Dagster's code servers and runs (``definitions``) and library use
# all import this package before lancedb (a program that imported lancedb first keeps its own).
os.environ.setdefault("LANCEDB_LOG", "error")

if TYPE_CHECKING:
    from memory_pipeline.search import SearchResult


def search(query: str, **kwargs: Any) -> list[SearchResult]:
    """Hybrid search of the memory index (see ``memory_pipeline.search.search``)."""
    from memory_pipeline.search import search as _search

    return _search(query, **kwargs)


__all__ = ["search", "__version__"]
