"""The searcher's LanceDB queries on the table's asynchronous handle, several in one round trip.

LanceDB's synchronous query builders wrap the asynchronous ones, and each query pays for the
wrapping: the table's schema read and walked again, a legacy-index check, the hand-over to the
background event loop and back. Measured on the pinned 0.40 (SciFact's 14k-chunk table): a
one-term full-text query with limit 1 costs 3.0 ms of CPU through the synchronous API; nine of
them cost 28 ms of CPU and 22 ms of wall one by one or on a thread pool, and 10 ms of CPU and
7 ms of wall as one ``asyncio.gather`` on the table's asynchronous handle. The rows and scores
are the same (the synchronous builder sends the same query object).

``run`` sends a batch of queries that way and gives back one Arrow table per query, in order,
or raises the first query's error as LanceDB raised it (callers translate errors, which needs the
synchronous API again: never from inside the event loop). A table without an asynchronous handle
(another LanceDB table class) runs the same queries through its synchronous builders.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class TextQuery:
    """A full-text query: ``query`` (a string, read by LanceDB's parser, or a query object) on ``column``."""

    query: Any
    column: str
    columns: list[str]
    limit: int
    where: str | None = None
    row_id: bool = False  # with LanceDB's ``_rowid`` (for a later ``Take``)


@dataclass(frozen=True)
class VectorQuery:
    """A nearest-neighbour query on ``column`` by cosine distance; ``ann`` applies probes and
    re-ranking (``stores.lance.ann_query``) when the column has an index."""

    vector: Any
    column: str
    columns: list[str]
    limit: int
    where: str | None = None
    ann: Any = None
    row_id: bool = False


@dataclass(frozen=True)
class Take:
    """Rows by LanceDB row id (``_rowid``, valid within the table version it was read at)."""

    row_ids: list[int]
    columns: list[str]


Query = TextQuery | VectorQuery | Take


def async_handle(table: Any) -> Any | None:
    """The table's asynchronous LanceDB handle, or None (then queries run synchronously)."""
    inner = getattr(table, "_table", None)
    if inner is None or not hasattr(inner, "query") or not asyncio.iscoroutinefunction(getattr(inner, "schema", None)):
        return None
    return inner


def run(table: Any, queries: Sequence[Query]) -> list[pa.Table]:
    """Every query's rows, in order; the first failure raised as LanceDB raised it."""
    if not queries:
        return []
    handle = async_handle(table)
    if handle is None:
        out = []
        for i, q in enumerate(queries):
            try:
                out.append(_sync(table, q))
            except BaseException as err:
                failed_query(err, i)
                raise
        return out
    from lancedb.background_loop import LOOP

    async def gather() -> list[Any]:
        return await asyncio.gather(*(_async(handle, q) for q in queries), return_exceptions=True)

    results = LOOP.run(gather())
    for i, r in enumerate(results):
        if isinstance(r, BaseException):
            failed_query(r, i)
            raise r
    return results


def failed_query(err: BaseException, index: int | None = None) -> int:
    """Which query of a batch raised ``err`` (set by ``run``; 0 when it was not said)."""
    if index is not None:
        try:
            err.query_index = index  # type: ignore[attr-defined]
        except AttributeError:
            pass
    return getattr(err, "query_index", 0)


async def _async(handle: Any, q: Query) -> pa.Table:
    if isinstance(q, Take):
        return await handle.take_row_ids(q.row_ids).select(q.columns).to_arrow()
    if isinstance(q, TextQuery):
        builder = handle.query().nearest_to_text(q.query, columns=[q.column])
    else:
        builder = handle.query().nearest_to(q.vector).column(q.column).distance_type("cosine")
        if q.ann is not None:
            from memory_pipeline.stores.lance import ann_query

            builder = ann_query(builder, q.ann, q.limit)
    if q.where:
        builder = builder.where(q.where)  # a prefilter (LanceDB's default here)
    if q.row_id:
        builder = builder.with_row_id()
    return await builder.select(q.columns).limit(q.limit).to_arrow()


def _sync(table: Any, q: Query) -> pa.Table:
    if isinstance(q, Take):
        return table.take_row_ids(q.row_ids).select(q.columns).to_arrow()
    if isinstance(q, TextQuery):
        builder = table.search(q.query, query_type="fts", fts_columns=q.column) if isinstance(q.query, str) else table.search(q.query, query_type="fts")
    else:
        builder = table.search(q.vector, vector_column_name=q.column).distance_type("cosine")
        if q.ann is not None:
            from memory_pipeline.stores.lance import ann_query

            builder = ann_query(builder, q.ann, q.limit)
    if q.where:
        builder = builder.where(q.where, prefilter=True)
    if q.row_id:
        builder = builder.with_row_id(True)
    return builder.select(q.columns).limit(q.limit).to_arrow()
