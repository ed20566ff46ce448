"""The full-text leg: one LanceDB FTS query, its failures translated into our errors.

What LanceDB 0.40 does here (found by experiment; pinned by ``test_search_package.py``):

* a table without an FTS index, or an empty one, is searched anyway (it scans the rows);
* odd syntax (``"unbalanced``, ``a AND``, ``(``, ``*``, punctuation only) is no error: a query
  string is matched as words, not parsed by a query language;
* a query wrapped whole in double quotes is a phrase query; on an index built without
  positions it raises ``ValueError`` (LanceDB's "invalid input", the type a bad filter raises too);
* a missing FTS column raises ``RuntimeError`` (a "lance error").

Whether a failure means "full-text cannot answer this query on this table" is decided from the
table and the query (``FullTextUnavailable``, the search goes on without this leg), never from the
message; any other failure is a ``SearchError``.
"""

from __future__ import annotations

from typing import Any

from memory_pipeline.errors import FullTextUnavailable, SearchError


def is_phrase_query(query: str) -> bool:
    """Whether LanceDB reads ``query`` as a phrase: the whole string in double quotes."""
    return len(query) >= 2 and query.startswith('"') and query.endswith('"')


def fts_rows(table: Any, query: str, *, column: str, where: str | None, limit: int, columns: list[str]) -> list[dict]:
    """The rows of ``table`` matching ``query`` in ``column``, best BM25 first (``_score``)."""
    # The raw text goes to the index's own tokenizer: ERR_PAYMENT_4471 and mon-03.fra.internal
    # stay whole tokens there, so splitting them here would lose the exact match.
    try:
        q = table.search(query, query_type="fts", fts_columns=column).limit(limit)
        if where:
            q = q.where(where, prefilter=True)
        return q.select(columns).to_list()
    except (ValueError, RuntimeError, OSError) as err:  # what LanceDB raises (see above)
        reason = unavailable_reason(table, query, column)
        if reason:
            raise FullTextUnavailable(reason, query=query) from err
        raise SearchError(f"full-text search failed: {err}", query=query) from err


def unavailable_reason(table: Any, query: str, column: str) -> str | None:
    """Why full-text search cannot answer ``query`` on ``table``, or None when it can."""
    if column not in table.schema.names:
        return f"the table has no full-text column {column!r}"
    if is_phrase_query(query) and not _phrase_ready(table, column):
        return "phrase queries need a full-text index built with positions"
    return None


def _phrase_ready(table: Any, column: str) -> bool:
    for idx in table.list_indices():
        if idx.index_type == "FTS" and column in idx.columns:
            return bool((getattr(idx, "index_details", None) or {}).get("with_position", False))
    return True  # no index: the rows are scanned, phrases included
