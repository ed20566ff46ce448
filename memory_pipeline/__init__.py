"""memory_pipeline: index an agent's memory folder into LanceDB and search it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from memory_pipeline.allocator import tune_allocator  # noqa: E402 - before the heavy libraries allocate
from memory_pipeline.lazy_imports import defer_slow_packages  # noqa: E402 - before anything imports lancedb

tune_allocator()
defer_slow_packages()

if TYPE_CHECKING:
    from memory_pipeline.search import SearchResult


def search(query: str, **kwargs: Any) -> list[SearchResult]:
    """Hybrid search of the memory index (see ``memory_pipeline.search.search``)."""
    from memory_pipeline.search import search as _search

    return _search(query, **kwargs)


__all__ = ["search", "__version__"]
