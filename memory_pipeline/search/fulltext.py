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
from collections.abc import Callable, Iterable
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
    rare missing word costing much and a common one little. The strength is both the order and
    the relevance. (Lucene's classic coordination factor, the share of the terms present, is not
    applied: BM25 already rewards each further term by its IDF, and multiplying by it cost SciFact
    4 points of nDCG@10 for a 1-point gain on LoCoMo; see the README's search section.)

    With a document column (``doc_text_leg``) the per-term scores of a document are BM25 over
    its whole text, and the chunks' own scores only choose which chunk a result shows.
    """

    rows: dict[str, dict] = field(default_factory=dict)  # chunk_id -> row (accepted by the syntax)
    chunk_terms: dict[str, dict[str, float]] = field(default_factory=dict)  # chunk_id -> term -> BM25
    weights: dict[str, float] = field(default_factory=dict)  # term -> W_term
    floors: dict[str, float] = field(default_factory=dict)  # term -> lowest score of a full hit list
    presence: dict[str, Callable[[str], bool]] = field(default_factory=dict)  # term -> test on folded text
    _docs: dict[str, dict[str, float]] = field(default_factory=dict)
    # Document level (``doc_text_leg``): the documents' scores come from the whole-document column,
    # the chunks' (which chunk a result points at) from the chunk column, weighed by their own W.
    chunk_weights: dict[str, float] = field(default_factory=dict)
    doc_level: bool = False
    _completer: Callable[..., dict[str, float]] | None = None

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
        if self.doc_level:  # one exact sum per document (each term's part is at most its W)
            return min(1.0, sum(got.values()) / total)
        return min(1.0, sum(min(v, self.weights[t]) for t, v in got.items()) / total)

    def coverage(self, doc_id: str) -> float:
        """The share of the query's terms the document holds at all (Lucene's classic ``coord``; not
        part of the score, see the class docstring)."""
        return len(self.doc_terms(doc_id)) / len(self.weights) if self.weights else 0.0

    def chunk_strength(self, chunk_id: str) -> float:
        """The chunk's own share (breaks ties between chunks of one document: the best one is shown)."""
        weights = self.chunk_weights or self.weights
        total = sum(weights.values())
        got = self.chunk_terms.get(chunk_id, {})
        return min(1.0, sum(min(v, weights.get(t, 0.0)) for t, v in got.items()) / total) if total > 0 else 0.0

    def complete(self, doc_ids: Iterable[str]) -> None:
        """Document level: the exact score of each of ``doc_ids`` for every term whose hit list was
        cut at the limit (one query per such term, restricted to the documents lacking it). A term
        whose list was complete is, for a document not in it, absent (score 0): so every document
        asked about gets its whole-document BM25, whether a term query or the vector leg found it."""
        if self._completer is None:
            return
        docs = list(dict.fromkeys(doc_ids))
        if self.doc_level:  # one summed query for the documents not scored yet
            missing = [d for d in docs if d not in self._docs]
            for i in range(0, len(missing), 500):
                part = missing[i : i + 500]
                got = self._completer(part)
                for d in part:
                    self._docs[d] = {SUM_KEY: got[d]} if got.get(d) else {}
            return
        for term, floor in self.floors.items():
            if floor <= 0:
                continue
            missing = [d for d in docs if term not in self._docs.get(d, {})]
            for i in range(0, len(missing), 500):
                for d, score in self._completer(term, missing[i : i + 500]).items():
                    self._docs.setdefault(d, {})[term] = score

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
        rows = accepted(parsed, rows, folded_text)
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
        rows = accepted(parsed, rows, folded_text)
        for term in parsed.prefixes:
            for r in rows:
                r["_score"] = 1.0 if term.matches(folded_text(r)) else 0.0
            leg.presence[term.text + "*"] = term.matches
            leg.add(term.text + "*", [dict(r) for r in rows if r["_score"] > 0], 1.0, 0.0)
    leg.fill_truncated(folded_text)
    return leg


def doc_text_leg(
    table: Any,
    parsed: ParsedQuery,
    *,
    column: str,
    doc_column: str,
    where: str | None,
    limit: int,
    columns: list[str],
    folded_text: Callable[[dict], str],
    total_docs: int,
    term_weights: VersionWeights | None = None,
) -> TextLeg:
    """The full-text leg at document level: documents ranked by BM25 over their whole text
    (``doc_column``, one row per document), each result pointing at its best chunk.

    LanceDB scores a query of several terms (a boolean query whose terms are all optional) as the
    sum of each term's BM25, so a document's whole-document score over the query is one query:

    1. the query's words and phrases as one such query on ``doc_column`` (the filters apply; the
       syntax's required/excluded clauses are checked on the chunks below): the best ``limit``
       documents with their exact BM25 sums;
    2. each term alone with limit 1, at the same time: the best score any document reaches for
       it (``W_term``, the denominator of ``TextLeg.strength``);
    3. a document another leg found (the vector leg) gets its exact sum from one more such
       query restricted to those documents (``TextLeg.complete``);
    4. the same query on the chunk column, restricted to the best documents and to the syntax's
       clauses, finds the chunk to show (a document none of whose chunks it reached is shown by
       its first chunk, when that passes the clauses).

    Four LanceDB queries plus one per term, the per-term ones concurrent, whatever the length of
    the query: the per-term lists of earlier versions cost three queries per term. ``term_weights``
    (a long-lived searcher's) keeps each term's ``W_term`` for the table version and filters it
    was measured on, so a word asked about again costs no query.

    Queries of prefixes only have no BM25 term: ``text_leg`` answers those.
    """
    leg = TextLeg(doc_level=True)
    absent_weight = math.log(1.0 + (max(total_docs, 1) + 0.5) / 0.5)
    from lancedb.query import BooleanQuery, MatchQuery, Occur, PhraseQuery

    phrases_ok = phrase_ready(table, column) and phrase_ready(table, doc_column)
    terms: list[tuple[str, Callable[[str], Any], Callable[[str], bool]]] = []
    for word in parsed.words:
        test = Term("word", tuple(_fold_words(word)) or (word.lower(),)).matches
        terms.append((word, lambda col, w=word: MatchQuery(w, col), test))  # pyright: ignore[reportCallIssue] - lancedb's query models have defaults its stubs hide
    for term in parsed.phrases:
        if phrases_ok:
            make = lambda col, t=term.text: PhraseQuery(t, col)  # noqa: E731  # pyright: ignore[reportCallIssue] - see above
        else:  # no positions in an index: every word must be there; adjacency is checked on the chunk's text
            make = lambda col, t=term.text: MatchQuery(t, col, operator="AND")  # noqa: E731  # pyright: ignore[reportCallIssue] - see above
        terms.append(('"' + term.text + '"', make, term.matches))
    if not terms:
        return leg

    joined = joined_words(parsed)

    def summed(col: str) -> Any:
        """Every term, each optional: LanceDB's score is the sum of the terms' BM25."""
        if len(terms) == 1:
            return terms[0][1](col)
        if joined is not None:
            return MatchQuery(joined, col)  # pyright: ignore[reportCallIssue] - see above
        return BooleanQuery([(Occur.SHOULD, make(col)) for _, make, _ in terms])  # pyright: ignore[reportCallIssue] - see above

    def restricted(extra: str, docs: list[str]) -> str:
        return " AND ".join(f"({w})" for w in (extra, f"doc_id IN ({_sql_list(docs)})") if w)

    def best_of(make: Callable[[str], Any]) -> float:
        rows = fts_rows(table, make(doc_column), column=doc_column, where=where, limit=1, columns=["doc_id", "_score"])
        return max((float(r.get("_score") or 0.0) for r in rows), default=0.0)

    pool = _term_pool()
    known = {key: w for key, _, _ in terms if (w := term_weights.get(key, where)) is not None} if term_weights is not None and len(terms) > 1 else {}
    best = {key: pool.submit(best_of, make) for key, make, _ in terms if key not in known} if len(terms) > 1 else {}
    rows = fts_rows(table, summed(doc_column), column=doc_column, where=where, limit=limit, columns=columns + ["_score"])
    first_rows: dict[str, dict] = {}
    for row in rows:
        score = float(row.pop("_score", 0.0) or 0.0)
        leg._docs[row["doc_id"]] = {SUM_KEY: score}
        first_rows.setdefault(row["doc_id"], row)
    for key, _, test in terms:
        leg.presence[key] = test
        if key in known:
            w = known[key]
        elif key in best:
            w = best[key].result()
            if term_weights is not None:
                term_weights.put(key, where, w)
        else:
            w = max((d[SUM_KEY] for d in leg._docs.values()), default=0.0)
        leg.weights[key] = w or absent_weight

    def completer(docs: list[str]) -> dict[str, float]:
        got = fts_rows(table, summed(doc_column), column=doc_column, where=restricted(where or "", docs), limit=len(docs), columns=["doc_id", "_score"])
        return {r["doc_id"]: float(r.get("_score") or 0.0) for r in got}

    leg._completer = completer
    # The chunks to show: those of the best ``limit`` documents (the others rank below any result asked for).
    docs = sorted(leg._docs, key=lambda d: -leg._docs[d][SUM_KEY])[:limit]
    if not docs:
        return leg
    constraint = parsed.sql_filter(column)
    shown: set[str] = set()
    for i in range(0, len(docs), 1000):
        part = docs[i : i + 1000]
        scope = restricted(" AND ".join(f"({w})" for w in (where, constraint) if w), part)
        try:
            found = fts_rows(table, summed(column), column=column, where=scope, limit=2 * limit, columns=columns + ["_score"])
        except SearchError:
            if constraint is None:
                raise
            found = fts_rows(table, summed(column), column=column, where=restricted(where or "", part), limit=2 * limit, columns=columns + ["_score"])
        found = accepted(parsed, found, folded_text)
        top = max((float(r.get("_score") or 0.0) for r in found), default=0.0)
        leg.chunk_weights[SUM_KEY] = max(leg.chunk_weights.get(SUM_KEY, 0.0), top)
        for row in found:
            score = float(row.pop("_score", 0.0) or 0.0)
            leg.rows.setdefault(row["chunk_id"], row)
            leg.chunk_terms.setdefault(row["chunk_id"], {})[SUM_KEY] = score
            shown.add(row["doc_id"])
    for d, row in first_rows.items():
        if d not in shown and (not parsed.constrains or parsed.accepts(folded_text(row))):
            leg.rows.setdefault(row["chunk_id"], row)
    return leg


def accepted(parsed: ParsedQuery, rows: list[dict], folded_text: Callable[[dict], str]) -> list[dict]:
    """The rows whose folded text satisfies the query's required and excluded clauses (all of them,
    without folding any text, when it has none: folding every candidate's text cost a long query
    on a 14k-chunk table a tenth of its time)."""
    if not parsed.constrains:
        return rows
    return [r for r in rows if parsed.accepts(folded_text(r))]


def joined_words(parsed: ParsedQuery) -> str | None:
    """The query's words as one match query's text, when the query is words only (no phrases).

    A match query's default operator is OR and its score is the sum of its tokens' BM25: the
    same scores as the boolean query of one optional match query per word, repeated and
    same-stem words included (pinned by ``test_search_package.py``), in a third to two thirds
    of its time on a 100k-chunk table (one posting-list union instead of a sub-query per word)."""
    if parsed.phrases or len(parsed.words) < 2:
        return None
    return " ".join(parsed.words)


class TermWeights:
    """Each term's ``W_term`` (its best whole-document BM25 under a filter), per table version (BM25
    depends on every row): an LRU of ``size`` entries shared by a searcher's queries, thread-safe.
    Entries of older versions are never read again and age out."""

    def __init__(self, size: int = 4096) -> None:
        import threading
        from collections import OrderedDict

        self.size = size
        self._items: OrderedDict[tuple[int, str, str], float] = OrderedDict()
        self._lock = threading.Lock()

    def at(self, version: int) -> VersionWeights:
        """The weights measured on ``version`` of the table."""
        return VersionWeights(self, version)

    def get(self, version: int, term: str, where: str | None) -> float | None:
        key = (version, term, where or "")
        with self._lock:
            w = self._items.get(key)
            if w is not None:
                self._items.move_to_end(key)
            return w

    def put(self, version: int, term: str, where: str | None, weight: float) -> None:
        key = (version, term, where or "")
        with self._lock:
            self._items[key] = weight
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


@dataclass(frozen=True)
class VersionWeights:
    """``TermWeights`` for one table version: what the full-text leg of one query reads and fills."""

    cache: TermWeights
    version: int

    def get(self, term: str, where: str | None) -> float | None:
        return self.cache.get(self.version, term, where)

    def put(self, term: str, where: str | None, weight: float) -> None:
        self.cache.put(self.version, term, where, weight)


# A document-level leg keeps one summed score per document and chunk under this key.
SUM_KEY = "\0sum"
_POOL: Any = None


def _term_pool() -> Any:
    """Threads for the per-term queries (LanceDB releases the GIL while it searches)."""
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memory-fts-term")
    return _POOL


def _sql_list(values: Iterable[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def _fold_words(text: str) -> list[str]:
    from memory_pipeline.search.folding import TERM_RE, fold

    return TERM_RE.findall(fold(text))
