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

``text_leg`` is what the searcher runs on a table without document texts: the parsed query
(``syntax``) as one BM25 query per word and per phrase, so that a document's evidence is summed
over its chunks (see ``TextLeg``), with the query's required and excluded clauses as a prefilter
and checked again on every row; ``doc_text_leg`` scores whole documents. Queries go to LanceDB
in batches, one round trip each (``lanceaio``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memory_pipeline.errors import FullTextUnavailable, SearchError
from memory_pipeline.search import lanceaio
from memory_pipeline.search.lanceaio import TextQuery
from memory_pipeline.search.syntax import ParsedQuery, Term


def is_phrase_query(query: str) -> bool:
    """Whether LanceDB reads ``query`` as a phrase: the whole string in double quotes."""
    return len(query) >= 2 and query.startswith('"') and query.endswith('"')


def fts_rows(table: Any, query: Any, *, column: str, where: str | None, limit: int, columns: list[str]) -> list[dict]:
    """The rows of ``table`` matching ``query`` (a string or a LanceDB full-text query object) in
    ``column``, best BM25 first (``_score``)."""
    return fts_batch(table, [TextQuery(query, column, columns, limit, where)])[0]


def fts_batch(table: Any, queries: Sequence[TextQuery]) -> list[list[dict]]:
    """Several full-text queries in one round trip (``lanceaio``): each one's rows, in order. A
    failure is translated as for one query (the first failing query's)."""
    # The raw text goes to the index's own tokenizer: ERR_PAYMENT_4471 and mon-03.fra.internal
    # stay whole tokens there, so splitting them here would lose the exact match.
    try:
        found = lanceaio.run(table, queries)
    except (ValueError, RuntimeError, OSError) as err:  # what LanceDB raises (see above)
        q = queries[lanceaio.failed_query(err)]
        text = q.query if isinstance(q.query, str) else str(getattr(q.query, "query", ""))
        phrase = is_phrase_query(q.query) if isinstance(q.query, str) else type(q.query).__name__ == "PhraseQuery"
        reason = unavailable_reason(table, text, q.column, phrase=phrase)
        if reason:
            raise FullTextUnavailable(reason, query=text) from err
        raise SearchError(f"full-text search failed: {err}", query=text) from err
    return [t.to_pylist() for t in found]


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
    alternatives: tuple[tuple[str, ...], ...] = ()  # the term keys of each ``A OR B`` clause (``ParsedQuery.alternatives``)
    _completer: Callable[..., dict[str, float]] | None = None
    # Document level, answered in memory (``textindex.doc_leg``): every document's summed score at
    # once, so ``strengths`` reads any candidate's without ``complete``.
    _every_doc: Callable[[list[str]], list[float]] | None = None

    @property
    def scores_every_document(self) -> bool:
        return self._every_doc is not None

    @property
    def total(self) -> float:
        """The sum of the terms' ``W``, a clause of alternatives (``A OR B``) counted once, as its
        heaviest term: holding either in full is one full match of the clause."""
        w = self.weights
        total = sum(w.values())
        for group in self.alternatives:  # disjoint (``ParsedQuery.alternatives``)
            present = [w[k] for k in group if k in w]
            if len(present) > 1:
                total -= sum(present) - max(present)
        return max(total, max(w.values(), default=0.0))

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

    def strengths(self, items: Iterable[tuple[str, str]]) -> list[tuple[float, float]]:
        """``(strength(doc), chunk_strength(chunk))`` of each ``(chunk id, document id)``, the
        totals summed once (a query at ``memory eval``'s depth scores about a thousand candidates)."""
        total = self.total
        chunk_weights = self.chunk_weights or self.weights
        chunk_total = sum(chunk_weights.values())
        docs, chunks, weights, doc_level = self._docs, self.chunk_terms, self.weights, self.doc_level
        if self._every_doc is not None:
            items = list(items)
            sums = self._every_doc([doc for _, doc in items])
            cw = chunk_weights.get(SUM_KEY, 0.0)
            out = []
            for (cid, _), got in zip(items, sums):
                own = chunks.get(cid)
                sc = min(1.0, min(own.get(SUM_KEY, 0.0), cw) / chunk_total) if own and chunk_total > 0 else 0.0
                out.append((min(1.0, got / total) if total > 0 and got > 0 else 0.0, sc))
            return out
        out = []
        for cid, doc in items:
            got = docs.get(doc)
            if not got or total <= 0:
                st = 0.0
            elif doc_level:
                st = min(1.0, sum(got.values()) / total)
            else:
                st = min(1.0, sum(min(v, weights[t]) for t, v in got.items()) / total)
            own = chunks.get(cid)
            sc = min(1.0, sum(min(v, chunk_weights.get(t, 0.0)) for t, v in own.items()) / chunk_total) if own and chunk_total > 0 else 0.0
            out.append((st, sc))
        return out

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

    def complete(self, doc_ids: Iterable[str], *, known: Mapping[str, float] | None = None, asked: Collection[str] = ()) -> None:
        """Document level: the exact score of each of ``doc_ids`` for every term whose hit list was
        cut at the limit (one query per such term, restricted to the documents lacking it). A term
        whose list was complete is, for a document not in it, absent (score 0): so every document
        asked about gets its whole-document BM25, whether a term query or the vector leg found it.

        ``known`` (document level): the summed scores of the documents ``asked`` about, measured
        beforehand by ``DocQuery.sums`` (an asked document missing from it holds no term)."""
        if self._completer is None:
            return
        docs = list(dict.fromkeys(doc_ids))
        if self.doc_level:  # one summed query for the documents not scored yet
            known = known or {}
            for d in asked:
                if d not in self._docs:
                    self._docs[d] = {SUM_KEY: known[d]} if known.get(d) else {}
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
    leg = TextLeg(alternatives=parsed.alternatives)
    constraint = parsed.sql_filter(column)
    full_where = " AND ".join(f"({w})" for w in (where, constraint) if w) or None
    # A term found in no row weighs what BM25's IDF gives a term in none: ln(1 + (N + 0.5) / 0.5).
    absent = absent_weight(total_rows)
    cols = columns + ["_score"]

    from lancedb.query import MatchQuery, PhraseQuery

    terms: list[tuple[str, Any, Callable[[str], bool]]] = []
    for word in parsed.words:
        test = Term("word", tuple(_fold_words(word)) or (word.lower(),)).matches
        terms.append((word, MatchQuery(word, column), test))  # pyright: ignore[reportCallIssue] - lancedb's query models have defaults its stubs hide
    phrases_ok = phrase_ready(table, column) if parsed.phrases else True
    for term in parsed.phrases:
        key = '"' + term.text + '"'
        if phrases_ok:
            terms.append((key, PhraseQuery(term.text, column), term.matches))  # pyright: ignore[reportCallIssue] - see MatchQuery above
        else:
            # No positions in this index: every word must be there; adjacency is checked on the text.
            terms.append((key, MatchQuery(term.text, column, operator="AND"), term.matches))  # pyright: ignore[reportCallIssue] - see above
    # Every term's query in one round trip.
    try:
        lists = fts_batch(table, [TextQuery(q, column, cols, limit, full_where) for _, q, _ in terms])
    except SearchError:
        if constraint is None:
            raise
        # A prefilter LanceDB refuses (an odd regex): search without it, check on the text.
        lists = fts_batch(table, [TextQuery(q, column, cols, limit, where) for _, q, _ in terms])
    for (term_key, _, test), rows in zip(terms, lists):
        rows = accepted(parsed, rows, folded_text)
        best = max((float(r.get("_score") or 0.0) for r in rows), default=0.0)
        floor = min((float(r.get("_score") or 0.0) for r in rows), default=0.0) if len(rows) >= limit else 0.0
        leg.presence[term_key] = test
        leg.add(term_key, rows, best if best > 0 else absent, floor)

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
    query: DocQuery | None = None,
    row_ids: bool = False,
) -> TextLeg:
    """The full-text leg at document level: documents ranked by BM25 over their whole text
    (``doc_column``, one row per document), each result pointing at its best chunk.

    LanceDB scores a query of several terms (a boolean query whose terms are all optional) as the
    sum of each term's BM25, so a document's whole-document score over the query is one query:

    1. the query's words and phrases as one such query on ``doc_column`` (the filters apply; the
       syntax's required/excluded clauses are checked on the chunks below): the best ``limit``
       documents with their exact BM25 sums;
    2. each term alone with limit 1, in the same round trip (``fts_batch``): the best score any
       document reaches for it (``W_term``, the denominator of ``TextLeg.strength``);
    3. a document another leg found (the vector leg) gets its exact sum from one more such
       query restricted to those documents (``DocQuery.sums``: the searcher sends it as soon as
       the vector leg has answered, ``TextLeg.complete`` otherwise);
    4. the same query on the chunk column, restricted to the best documents and to the syntax's
       clauses, finds the chunk to show (a document none of whose chunks it reached is shown by
       its first chunk, when that passes the clauses).

    Three round trips whatever the length of the query (the per-term lists of earlier versions
    cost three queries per term, sent one by one). ``term_weights`` (a long-lived searcher's)
    keeps each term's ``W_term`` for the table version and filters it was measured on, so a
    word asked about again costs no query.

    ``columns`` may be a few (ids): with ``row_ids`` each row carries its ``_rowid``, and the
    searcher takes the rest of the rows it keeps in one round trip (LanceDB materialises columns
    in a full-text query at several times the cost of a take by row id). A query with required or
    excluded clauses needs the rows' text here (``accepted``).

    Queries of prefixes only have no BM25 term: ``text_leg`` answers those.
    """
    leg = TextLeg(doc_level=True, alternatives=parsed.alternatives)
    absent = absent_weight(total_docs)
    dq = query if query is not None else DocQuery.of(table, parsed, column=column, doc_column=doc_column)
    terms, summed = dq.terms, dq.summed
    if not terms:
        return leg

    def restricted(extra: str, docs: list[str]) -> str:
        return " AND ".join(f"({w})" for w in (extra, f"doc_id IN ({_sql_list(docs)})") if w)

    # One round trip: the summed query, and each term alone whose best score is not known yet.
    known = {key: w for key, _, _ in terms if (w := term_weights.get(key, where)) is not None} if term_weights is not None and len(terms) > 1 else {}
    unknown = [(key, make) for key, make, _ in terms if key not in known] if len(terms) > 1 else []
    found = fts_batch(
        table,
        [TextQuery(summed(doc_column), doc_column, columns + ["_score"], limit, where, row_ids)]
        + [TextQuery(make(doc_column), doc_column, ["doc_id", "_score"], 1, where) for _, make in unknown],
    )
    rows, best = found[0], {key: max((float(r.get("_score") or 0.0) for r in got), default=0.0) for (key, _), got in zip(unknown, found[1:])}
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
            w = best[key]
            if term_weights is not None:
                term_weights.put(key, where, w)
        else:
            w = max((d[SUM_KEY] for d in leg._docs.values()), default=0.0)
        leg.weights[key] = w or absent

    leg._completer = lambda docs: dq.sums(docs, where)
    # The chunks to show: those of the best ``limit`` documents (the others rank below any result asked for).
    docs = sorted(leg._docs, key=lambda d: -leg._docs[d][SUM_KEY])[:limit]
    if not docs:
        return leg
    constraint = parsed.sql_filter(column)
    parts = [docs[i : i + 1000] for i in range(0, len(docs), 1000)]

    def chunk_queries(extra: str) -> list[TextQuery]:
        return [TextQuery(summed(column), column, columns + ["_score"], 2 * limit, restricted(extra, part), row_ids) for part in parts]

    try:
        lists = fts_batch(table, chunk_queries(" AND ".join(f"({w})" for w in (where, constraint) if w)))
    except SearchError:
        if constraint is None:
            raise
        lists = fts_batch(table, chunk_queries(where or ""))  # a prefilter LanceDB refuses: checked on the text
    shown: set[str] = set()
    for found in lists:
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


@dataclass(frozen=True)
class DocQuery:
    """A parsed query's words and phrases as LanceDB full-text queries on a chunk or document column:
    each term alone (``terms``: key, query maker, test on folded text) and all of them summed."""

    table: Any
    doc_column: str
    terms: list[tuple[str, Callable[[str], Any], Callable[[str], bool]]]
    joined: str | None

    @classmethod
    def of(cls, table: Any, parsed: ParsedQuery, *, column: str, doc_column: str) -> DocQuery:
        from lancedb.query import MatchQuery, PhraseQuery

        phrases_ok = not parsed.phrases or (phrase_ready(table, column) and phrase_ready(table, doc_column))
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
        return cls(table, doc_column, terms, joined_words(parsed))

    def summed(self, col: str) -> Any:
        """Every term, each optional: LanceDB's score is the sum of the terms' BM25."""
        from lancedb.query import BooleanQuery, MatchQuery, Occur

        if len(self.terms) == 1:
            return self.terms[0][1](col)
        if self.joined is not None:
            return MatchQuery(self.joined, col)  # pyright: ignore[reportCallIssue] - see above
        return BooleanQuery([(Occur.SHOULD, make(col)) for _, make, _ in self.terms])  # pyright: ignore[reportCallIssue] - see above

    def sums(self, docs: list[str], where: str | None) -> dict[str, float]:
        """The exact whole-document score of each of ``docs`` (those holding no term: absent)."""
        if not docs or not self.terms:
            return {}
        scope = " AND ".join(f"({w})" for w in (where, f"doc_id IN ({_sql_list(docs)})") if w)
        got = fts_rows(self.table, self.summed(self.doc_column), column=self.doc_column, where=scope, limit=len(docs), columns=["doc_id", "_score"])
        return {r["doc_id"]: float(r.get("_score") or 0.0) for r in got}


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
        from memory_pipeline.search.lru import LRU

        self.size = size
        self._items: LRU[tuple[int, str, str], float] = LRU(size)

    def at(self, version: int) -> VersionWeights:
        """The weights measured on ``version`` of the table."""
        return VersionWeights(self, version)

    def get(self, version: int, term: str, where: str | None) -> float | None:
        return self._items.get((version, term, where or ""))

    def put(self, version: int, term: str, where: str | None, weight: float) -> None:
        self._items.put((version, term, where or ""), weight)


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


def absent_weight(n: int) -> float:
    """BM25's IDF of a term in none of ``n`` rows, ``ln(1 + (N + 0.5) / 0.5)``: what a word found nowhere weighs."""
    return math.log(1.0 + (max(n, 1) + 0.5) / 0.5)


def _sql_list(values: Iterable[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def _fold_words(text: str) -> list[str]:
    from memory_pipeline.search.folding import TERM_RE, fold

    return TERM_RE.findall(fold(text))
