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

``text_leg`` is what the searcher runs: the parsed query (``syntax``) as one BM25 query per word
and per phrase, so that a document's evidence is summed over its chunks (see ``TextLeg``), with
the query's required and excluded clauses as a prefilter and checked again on every row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memory_pipeline.errors import FullTextUnavailable, SearchError
from memory_pipeline.search.syntax import ParsedQuery, Term


def is_phrase_query(query: str) -> bool:
    """Whether LanceDB reads ``query`` as a phrase: the whole string in double quotes."""
    return len(query) >= 2 and query.startswith('"') and query.endswith('"')


def fts_rows(table: Any, query: Any, *, column: str, where: str | None, limit: int, columns: list[str]) -> list[dict]:
    """The rows of ``table`` matching ``query`` (a string or a LanceDB full-text query object) in
    ``column``, best BM25 first (``_score``)."""
    # The raw text goes to the index's own tokenizer: ERR_PAYMENT_4471 and mon-03.fra.internal
    # stay whole tokens there, so splitting them here would lose the exact match.
    try:
        if isinstance(query, str):
            q = table.search(query, query_type="fts", fts_columns=column).limit(limit)
        else:
            q = table.search(query, query_type="fts").limit(limit)
        if where:
            q = q.where(where, prefilter=True)
        return q.select(columns).to_list()
    except (ValueError, RuntimeError, OSError) as err:  # what LanceDB raises (see above)
        text = query if isinstance(query, str) else str(getattr(query, "query", ""))
        phrase = is_phrase_query(query) if isinstance(query, str) else type(query).__name__ == "PhraseQuery"
        reason = unavailable_reason(table, text, column, phrase=phrase)
        if reason:
            raise FullTextUnavailable(reason, query=text) from err
        raise SearchError(f"full-text search failed: {err}", query=text) from err


def unavailable_reason(table: Any, query: str, column: str, *, phrase: bool | None = None) -> str | None:
    """Why full-text search cannot answer ``query`` on ``table``, or None when it can."""
    if column not in table.schema.names:
        return f"the table has no full-text column {column!r}"
    if (is_phrase_query(query) if phrase is None else phrase) and not phrase_ready(table, column):
        return "phrase queries need a full-text index built with positions"
    return None


def phrase_ready(table: Any, column: str) -> bool:
    """Whether phrase queries work on ``column``: an index with positions, or no index (a scan)."""
    for idx in table.list_indices():
        if idx.index_type == "FTS" and column in idx.columns:
            return bool((getattr(idx, "index_details", None) or {}).get("with_position", False))
    return True  # no index: the rows are scanned, phrases included


@dataclass
class TextLeg:
    """The full-text evidence of one query, per chunk and per document.

    Each word (and each phrase) of the query is one BM25 query, so a chunk gets one score per
    term. A document's score for a term is its best chunk's, and its full-text ``strength`` is

        sum over terms of (the document's score for the term) / sum over terms of W_term

    where ``W_term`` is the best score any chunk reached for the term (about the term's IDF), or,
    for a term found nowhere, the IDF of a term in no row. So the order of documents is BM25 over
    the whole document (a term in chunk 1 and another in chunk 3 both count: chunking does not
    dilute a document's evidence), and the strength reads as the share of the query's full-text
    evidence present: 1 for a document holding every term as well as the best one does, a
    rare missing word costing much and a common one little. For the *order*, the strength is
    multiplied by ``coverage`` (the share of the terms present, Lucene's classic coordination
    factor): among documents of similar BM25 mass, the one that answers more of the question ranks
    first; relevance (and so abstention) reads the strength alone.
    """

    rows: dict[str, dict] = field(default_factory=dict)  # chunk_id -> row (accepted by the syntax)
    chunk_terms: dict[str, dict[str, float]] = field(default_factory=dict)  # chunk_id -> term -> BM25
    weights: dict[str, float] = field(default_factory=dict)  # term -> W_term
    floors: dict[str, float] = field(default_factory=dict)  # term -> lowest score of a full hit list
    presence: dict[str, Callable[[str], bool]] = field(default_factory=dict)  # term -> test on folded text
    _docs: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.weights.values())

    def doc_terms(self, doc_id: str) -> dict[str, float]:
        return self._docs.get(doc_id, {})

    def strength(self, doc_id: str) -> float:
        """The document's share of the query's full-text evidence, in [0, 1]."""
        total = self.total
        if total <= 0:
            return 0.0
        got = self.doc_terms(doc_id)
        return min(1.0, sum(min(v, self.weights[t]) for t, v in got.items()) / total)

    def coverage(self, doc_id: str) -> float:
        """The share of the query's terms the document holds at all (Lucene's classic ``coord``)."""
        return len(self.doc_terms(doc_id)) / len(self.weights) if self.weights else 0.0

    def chunk_strength(self, chunk_id: str) -> float:
        """The chunk's own share (breaks ties between chunks of one document)."""
        total = self.total
        got = self.chunk_terms.get(chunk_id, {})
        return min(1.0, sum(min(v, self.weights[t]) for t, v in got.items()) / total) if total > 0 else 0.0

    def estimate(self, folded: str) -> float:
        """The strength of a row no term query returned (a vector-leg candidate): a term it holds
        scores at most the lowest score of that term's full hit list, 0 when the list was complete."""
        total = self.total
        if total <= 0:
            return 0.0
        got = sum(self.floors.get(t, 0.0) for t, test in self.presence.items() if self.floors.get(t) and test(folded))
        return min(1.0, got / total)

    def fill_truncated(self, folded_text: Callable[[dict], str]) -> None:
        """A term's hit list is cut at ``limit``: a chunk found through another term that holds
        this one too, but ranked below the cut, gets the cut's score (the most it can have had)
        rather than nothing, so a rare word does not lose its document to the truncation of a
        common word's list."""
        cut = {t: f for t, f in self.floors.items() if f > 0}
        if not cut:
            return
        for cid, row in self.rows.items():
            terms = self.chunk_terms.setdefault(cid, {})
            missing = [t for t in cut if t not in terms]
            if not missing:
                continue
            folded = folded_text(row)
            doc = self._docs.setdefault(row.get("doc_id") or cid, {})
            for t in missing:
                if self.presence[t](folded):
                    terms[t] = cut[t]
                    doc[t] = max(doc.get(t, 0.0), cut[t])

    def add(self, term: str, rows: list[dict], weight: float | None, floor: float) -> None:
        self.weights[term] = weight if weight is not None else 0.0
        self.floors[term] = floor
        for row in rows:
            score = float(row.pop("_score", 0.0) or 0.0)
            cid = row["chunk_id"]
            self.rows.setdefault(cid, row)
            self.chunk_terms.setdefault(cid, {})[term] = score
            doc = self._docs.setdefault(row.get("doc_id") or cid, {})
            doc[term] = max(doc.get(term, 0.0), score)


def text_leg(
    table: Any,
    parsed: ParsedQuery,
    *,
    column: str,
    where: str | None,
    limit: int,
    columns: list[str],
    folded_text: Callable[[dict], str],
    total_rows: int,
) -> TextLeg:
    """Run ``parsed`` against the full-text index: one BM25 query per word and phrase, prefixes
    and the required/excluded clauses as a regex prefilter (checked again on the folded text)."""
    leg = TextLeg()
    constraint = parsed.sql_filter(column)
    full_where = " AND ".join(f"({w})" for w in (where, constraint) if w) or None
    # A term found in no row weighs what BM25's IDF gives a term in none: ln(1 + (N + 0.5) / 0.5).
    absent_weight = math.log(1.0 + (max(total_rows, 1) + 0.5) / 0.5)
    cols = columns + ["_score"]

    def run(term_key: str, query: Any, test: Callable[[str], bool]) -> None:
        try:
            rows = fts_rows(table, query, column=column, where=full_where, limit=limit, columns=cols)
        except SearchError:
            if constraint is None:
                raise
            # A prefilter LanceDB refuses (an odd regex): search without it, check on the text.
            rows = fts_rows(table, query, column=column, where=where, limit=limit, columns=cols)
        rows = [r for r in rows if parsed.accepts(folded_text(r))]
        best = max((float(r.get("_score") or 0.0) for r in rows), default=0.0)
        floor = min((float(r.get("_score") or 0.0) for r in rows), default=0.0) if len(rows) >= limit else 0.0
        leg.presence[term_key] = test
        leg.add(term_key, rows, best if best > 0 else absent_weight, floor)

    from lancedb.query import MatchQuery, PhraseQuery

    for word in parsed.words:
        test = Term("word", tuple(_fold_words(word)) or (word.lower(),)).matches
        run(word, MatchQuery(word, column), test)  # pyright: ignore[reportCallIssue] - lancedb's query models have defaults its stubs hide
    phrases_ok = phrase_ready(table, column)
    for term in parsed.phrases:
        key = '"' + term.text + '"'
        if phrases_ok:
            run(key, PhraseQuery(term.text, column), term.matches)  # pyright: ignore[reportCallIssue] - see MatchQuery above
        else:
            # No positions in this index: every word must be there; adjacency is checked on the text.
            run(key, MatchQuery(term.text, column, operator="AND"), term.matches)  # pyright: ignore[reportCallIssue] - see above
    if parsed.prefixes and not parsed.words and not parsed.phrases:
        # Only prefixes: no BM25 term to rank by; the rows holding them, each prefix one unit.
        q = table.search().where(full_where) if full_where else table.search()
        rows = q.select(columns).limit(limit).to_list()
        rows = [r for r in rows if parsed.accepts(folded_text(r))]
        for term in parsed.prefixes:
            for r in rows:
                r["_score"] = 1.0 if term.matches(folded_text(r)) else 0.0
            leg.presence[term.text + "*"] = term.matches
            leg.add(term.text + "*", [dict(r) for r in rows if r["_score"] > 0], 1.0, 0.0)
    leg.fill_truncated(folded_text)
    return leg


def _fold_words(text: str) -> list[str]:
    from memory_pipeline.search.folding import TERM_RE, fold

    return TERM_RE.findall(fold(text))
