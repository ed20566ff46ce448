"""The full-text index of one table version in memory: BM25 without a query to LanceDB.

A long-lived searcher (``memory serve``, ``memory mcp``, ``memory eval``) asks many questions of
one table version. The document-level full-text leg costs three to four LanceDB round trips per
question (the summed query on the document column, each new word's best score, the vector hits'
sums, the chunk to show); on SciFact at ``memory eval``'s depth they were 40 ms of a 57 ms
query, where plain LanceDB hybrid search answers in 15. ``TextIndex`` holds the same BM25
statistics in two sparse matrices (documents x terms, chunks x terms), each posting already
weighed by BM25, so a query's scores over every document are a sum of a few column slices
(under a millisecond at 5,000 documents).

The scores are LanceDB's own on a table whose FTS index is up to date and compacted, to float
rounding: the same analysis as the table's FTS index
(``VectorStore.ensure_fts``: ICU word segmentation, lower case, tokens of 40 UTF-8 bytes and more
dropped, the language's Snowball stemmer, then ASCII folding, in that order; pinned by
``test_text_index.py`` against LanceDB on the same rows) and the same BM25 (k1 1.2, b 0.75,
``idf = ln(1 + (N - n + 0.5) / (n + 0.5))``, N and the average length over the rows holding a
token). After edits they are the exact BM25 of the rows the table holds, where LanceDB's drift until
the next compaction: its index keeps counting deleted rows in N, the average length and each term's
document frequency, and scores rows not yet folded into the index by the index's statistics (a
review measured 1 % on raw scores and a changed top-10 order in 31 of 67 queries after 8 of 300
notes were edited; none on a fresh table).
ICU segments the scripts written without spaces (Chinese, Japanese, Thai, Lao, Khmer, Burmese)
with dictionaries no Python package here reproduces: a table holding them is not indexed here
(the searcher asks LanceDB, as before), nor is a query written in them.

What the index answers is what ``doc_text_leg`` answers for a query of plain words with no
filter, no phrase and no required or excluded clause; anything else goes to LanceDB.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_pipeline.search.fulltext import SUM_KEY, DocQuery, TextLeg, absent_weight

K1, B = 1.2, 0.75
MAX_TOKEN_BYTES = 40  # LanceDB's default ``max_token_length``: a token this long or longer is dropped
# Scripts ICU segments with a dictionary (no spaces between words): not reproduced here.
DICTIONARY_SCRIPTS = re.compile(
    "[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]"
)
# A word of Unicode's word segmentation (UAX #29, as ICU applies it): letters, decimal digits,
# underscores and combining marks; a character of the other numbers (the subscript of H₂O, the ²
# of m²) is a token of its own, then folded (h, 2, o; m, 2); a full
# stop or apostrophe joins two letters (e.g, don't, U.S.A), a full stop, comma, semicolon or
# apostrophe two digits (3.14, 1,000). Colons and hyphens split. Built once (``_word``).
_WORD_PATTERN = r"{start}{w}*(?:(?:(?<=[^\W\d_])[.'\u2018\u2019\u2024\ufe52\uff07\uff0e\u00b7\u0387\u05f4\u2027\ufe13\ufe55\uff1a](?={l})|(?<=\d)[.,;'\u2018\u2019\u2024\ufe52\uff07\uff0e\u037e\u0589\u060c\u060d\u066c\u07f8\u2044\ufe10\ufe14\ufe50\ufe54\uff0c\uff1b](?=\d)){w}+)*|[{no}]"


@functools.cache
def _word() -> re.Pattern[str]:
    """``_WORD_PATTERN`` with its character class: Python's ``\\w`` less the other numbers (``No``), plus
    the marks (``M*``), over the Basic Multilingual Plane (30 ms, once)."""
    no, marks = [], []
    for cp in range(0x10000):
        cat = unicodedata.category(chr(cp))
        if cat == "No":
            no.append(cp)
        elif cat[0] == "M" or (cat == "Cf" and cp != 0x200B):  # marks and format characters (soft hyphen, ZWJ, bidi marks) stay inside a word
            marks.append(cp)

    def ranges(cps: list[int]) -> str:
        out, start = [], None
        for i, cp in enumerate(cps):
            if start is None:
                start = cp
            if i + 1 == len(cps) or cps[i + 1] != cp + 1:
                out.append(f"\\u{start:04x}" + (f"-\\u{cp:04x}" if cp != start else ""))
                start = None
        return "".join(out)

    start = f"(?:[^\\W{ranges(no)}]|[\\u24b6-\\u24e9])"  # a word begins with a letter, digit or underscore (circled letters are letters)
    w = f"(?:[^\\W{ranges(no)}]|[\\u24b6-\\u24e9{ranges(marks)}])"
    letter = f"(?:[^\\W\\d_{ranges(no)}]|[\\u24b6-\\u24e9])"
    return re.compile(_WORD_PATTERN.format(start=start, w=w, l=letter, no=ranges(no)))


# ASCII folding of letters NFKD does not decompose (Lucene's ASCIIFoldingFilter, the common ones).
_FOLD_SPECIAL = {"ß": "ss", "æ": "ae", "ø": "o", "œ": "oe", "đ": "d", "ł": "l", "þ": "th", "ð": "d", "ı": "i", "ħ": "h", "ŧ": "t", "ŋ": "n", "ĸ": "k", "ŀ": "l"}
_LANGUAGES = {
    "arabic", "danish", "dutch", "english", "finnish", "french", "german", "greek", "hungarian",
    "italian", "norwegian", "portuguese", "romanian", "russian", "spanish", "swedish", "tamil", "turkish",
}  # fmt: skip


def _fold_char(ch: str) -> str:
    special = _FOLD_SPECIAL.get(ch)
    if special is not None:
        return special
    base = "".join(c for c in unicodedata.normalize("NFKD", ch) if not unicodedata.combining(c))
    if unicodedata.category(ch) == "No":  # a number sign: its ASCII digits (½ -> 12, ⑴ -> 1, ² -> 2), as LanceDB's filter leaves it
        digits = "".join(c for c in base if c.isascii() and c.isalnum())
        return digits or ch
    # Only to ASCII: a Cyrillic й or a Greek ά keeps its mark (the filter folds to ASCII or not at all).
    return base if base and base.isascii() else ch


class Analyzer:
    """The table's full-text analysis (see the module docstring), a token's term cached."""

    def __init__(self, *, language: str = "English", stem: bool = True, ascii_folding: bool = True) -> None:
        self.language = language.lower()
        if stem and self.language not in _LANGUAGES:
            raise ValueError(f"no stemmer for {language!r}")
        import Stemmer  # PyStemmer: the Snowball stemmers LanceDB's index uses

        self._stemmer = Stemmer.Stemmer(self.language) if stem else None
        self._fold = ascii_folding
        self.analysis = (language, stem, ascii_folding)
        self._terms: dict[str, str | None] = {}

    def term(self, token: str) -> str | None:
        """The indexed term of one word of the segmentation, or None (too long)."""
        got = self._terms.get(token, "")
        if got != "":
            return got
        term: str | None = None
        if len(token.encode("utf-8")) < MAX_TOKEN_BYTES:
            low = token.lower() if token.isascii() else "".join(c.lower() for c in token)  # char by char: ΟΔΟΣ -> οδοσ, as LanceDB
            if self._stemmer is not None:
                low = str(self._stemmer.stemWord(low))
            if self._fold and not low.isascii():
                low = "".join(_fold_char(c) for c in low)
            term = low
        if len(self._terms) > 2_000_000:
            self._terms.clear()  # a long-lived server's vocabulary drifts: start over rather than grow
        self._terms[token] = term
        return term

    def terms(self, text: str) -> list[str]:
        """The terms of ``text``, in order, repeats included."""
        return [t for w in _word().findall(text) if (t := self.term(w)) is not None]


@dataclass
class _Column:
    """One full-text column: a (rows x terms) matrix of BM25 weights, stored by term."""

    rows: np.ndarray  # positions (into the index's rows) of the rows holding text
    indptr: np.ndarray  # term t's postings are [indptr[t], indptr[t + 1])
    posting_rows: np.ndarray  # index into ``rows``
    weights: np.ndarray  # each posting's BM25

    @classmethod
    def build(cls, rows: np.ndarray, encoded: Sequence[tuple[np.ndarray, np.ndarray, int]], vocab_size: int) -> _Column:
        n = len(encoded)
        if n == 0:
            return cls(rows, np.zeros(vocab_size + 1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32))
        lengths = np.fromiter((e[2] for e in encoded), np.float64, n)
        counts = np.fromiter((len(e[0]) for e in encoded), np.int64, n)
        term_ids = np.concatenate([e[0] for e in encoded]) if n else np.zeros(0, np.int32)
        tf = np.concatenate([e[1] for e in encoded]).astype(np.float64) if n else np.zeros(0)
        owner = np.repeat(np.arange(n, dtype=np.int32), counts)
        # N and the average length count the rows holding a token (LanceDB leaves the others out).
        n_docs = int(np.count_nonzero(lengths))
        avgdl = float(lengths.sum()) / n_docs if n_docs else 1.0
        df = np.bincount(term_ids, minlength=vocab_size).astype(np.float64)
        idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
        norm = K1 * (1.0 - B + B * lengths / max(avgdl, 1e-9))
        w = idf[term_ids] * tf * (K1 + 1.0) / (tf + norm[owner])
        order = np.argsort(term_ids, kind="stable")
        indptr = np.zeros(vocab_size + 1, np.int64)
        np.cumsum(np.bincount(term_ids, minlength=vocab_size), out=indptr[1:])
        return cls(rows, indptr, owner[order], w[order].astype(np.float32))

    def scores(self, term_ids: Iterable[int]) -> np.ndarray:
        """Each row's BM25 sum over ``term_ids`` (repeats count again, as LanceDB's match query does)."""
        out = np.zeros(len(self.rows), np.float32)
        for t in term_ids:
            if t + 1 < len(self.indptr):
                lo, hi = self.indptr[t], self.indptr[t + 1]
                out[self.posting_rows[lo:hi]] += self.weights[lo:hi]  # a row appears once per term
        return out


@dataclass
class TextIndex:
    """BM25 over the chunk column and the document column of one table version (see the module
    docstring). Rows are those of the table at ``version``: ``chunk_ids``, ``doc_ids`` and
    LanceDB's ``row_ids`` (the searcher takes the rows it keeps by them)."""

    version: int
    analyzer: Analyzer
    vocab: dict[str, int]
    chunk_ids: list[str]
    doc_ids: list[str]
    row_ids: np.ndarray
    chunks: _Column
    docs: _Column  # rows: the first chunk of each document (it carries the document's text)
    doc_position: dict[str, int] = field(default_factory=dict)  # document id -> index into ``docs.rows``
    chunks_of: dict[str, np.ndarray] = field(default_factory=dict)  # document id -> its chunks' positions

    @classmethod
    def build(cls, table: Any, version: int, *, chunk_column: str, doc_column: str, analyzer: Analyzer, cache: EncodeCache | None = None) -> TextIndex | None:
        """The index of ``table`` as it is at ``version``, or None when it cannot be (the handle
        moved to another version while it was read, or the table holds a dictionary script).
        ``cache`` keeps each text's encoding between versions: a new version costs the reading
        of its texts and the encoding of the new ones only."""
        if int(table.version) != version:
            return None
        found = table.search().with_row_id(True).select(["chunk_id", "doc_id", chunk_column, doc_column]).limit(None).to_arrow()
        if int(table.version) != version:
            return None
        chunk_ids = found.column("chunk_id").to_pylist()
        doc_ids = [d or c for d, c in zip(found.column("doc_id").to_pylist(), chunk_ids)]
        texts = found.column(chunk_column).to_pylist()
        doc_texts = found.column(doc_column).to_pylist()
        cache = cache if cache is not None else EncodeCache(analyzer)
        vocab = cache.vocab
        encoded_chunks = []
        for text in texts:
            enc = cache.encode(text or "")
            if enc is None:
                return None
            encoded_chunks.append(enc)
        doc_rows, encoded_docs = [], []
        for i, text in enumerate(doc_texts):
            if text:
                enc = cache.encode(text)
                if enc is None:
                    return None
                doc_rows.append(i)
                encoded_docs.append(enc)
        cache.keep_only([*texts, *doc_texts])
        rows = np.arange(len(chunk_ids), dtype=np.int32)
        index = cls(
            version, analyzer, vocab, chunk_ids, doc_ids, found.column("_rowid").to_numpy(),
            _Column.build(rows, encoded_chunks, len(vocab)), _Column.build(np.asarray(doc_rows, np.int32), encoded_docs, len(vocab)),
        )  # fmt: skip
        index.doc_position = {doc_ids[r]: i for i, r in enumerate(doc_rows)}
        groups: dict[str, list[int]] = {}
        for i, d in enumerate(doc_ids):
            groups.setdefault(d, []).append(i)
        index.chunks_of = {d: np.asarray(p, np.int32) for d, p in groups.items()}
        return index

    def term_ids(self, text: str) -> list[int] | None:
        """The query text's term ids (unknown terms left out), or None when the index cannot
        analyse it as LanceDB would (a dictionary script)."""
        if DICTIONARY_SCRIPTS.search(text):
            return None
        return [self.vocab[t] for t in self.analyzer.terms(text) if t in self.vocab]

    def doc_scores(self, term_ids: Sequence[int]) -> np.ndarray:
        return self.docs.scores(term_ids)

    def chunk_scores(self, term_ids: Sequence[int]) -> np.ndarray:
        return self.chunks.scores(term_ids)

    def row(self, position: int, row_of: Callable[[str], dict | None] | None = None) -> dict:
        """What a light full-text hit carries (``_IDS`` and the row id; the ranking columns too
        when ``row_of`` has them)."""
        cid = self.chunk_ids[position]
        row: dict | None = row_of(cid) if row_of is not None else None
        if row is None:
            row = {"chunk_id": cid, "doc_id": self.doc_ids[position]}
        row["_rowid"] = int(self.row_ids[position])
        return row


class EncodeCache:
    """Each text's encoding (its term ids, their counts, its length in tokens) by the text's hash
    and length (the texts themselves are not kept), and the vocabulary of term ids, kept by a
    searcher from one table version to the next."""

    def __init__(self, analyzer: Analyzer) -> None:
        self.analyzer = analyzer
        self.vocab: dict[str, int] = {}
        self._enc: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray, int] | None:
        key = (hash(text), len(text))
        got = self._enc.get(key)
        if got is not None:
            return got
        if DICTIONARY_SCRIPTS.search(text):
            return None
        counts: dict[int, int] = {}
        vocab = self.vocab
        n = 0
        for term in self.analyzer.terms(text):
            tid = vocab.get(term)
            if tid is None:
                tid = vocab[term] = len(vocab)
            counts[tid] = counts.get(tid, 0) + 1
            n += 1
        enc = (np.fromiter(counts.keys(), np.int32, len(counts)), np.fromiter(counts.values(), np.float32, len(counts)), n)
        self._enc[key] = enc
        return enc

    def keep_only(self, texts: Iterable[str | None]) -> None:
        """Forget the encodings of texts not among ``texts`` (those of the version just indexed)."""
        keys = {(hash(t), len(t)) for t in texts if t}
        for k in [k for k in self._enc if k not in keys]:
            del self._enc[k]


def serves(parsed: Any, where: str | None) -> bool:
    """Whether the index answers this query's full-text leg: plain words (stop words and repeats as
    ``ParsedQuery.words`` keeps them), no filter, no phrase, prefix, required or excluded clause."""
    return where is None and bool(parsed.words) and not parsed.phrases and not parsed.prefixes and not parsed.constrains


def analysable(parsed: Any) -> bool:
    """Whether ``doc_leg`` answers this query (``serves`` holding): none of its words is in a script
    ICU segments by dictionary (those go to LanceDB)."""
    return not any(DICTIONARY_SCRIPTS.search(w) for w in parsed.words)


def doc_leg(index: TextIndex, parsed: Any, *, limit: int, row_of: Callable[[str], dict | None] | None = None) -> Any:
    """``fulltext.doc_text_leg`` answered from ``index`` (``serves`` must hold): the same
    ``TextLeg`` (the best ``limit`` documents by their whole-document BM25, each word's best
    score, the chunks to show) without a query to LanceDB, and every other document's exact sum
    (``TextLeg.complete``) from the same scores. None when the query cannot be analysed here.
    ``row_of`` (a chunk id's ranking columns, from the searcher's in-memory vectors of the same
    version) gives the hits those columns at once, so nothing is taken to rank them."""

    analysed = [index.term_ids(w) for w in parsed.words]
    words = [ids for ids in analysed if ids is not None]
    if len(words) != len(analysed):
        return None
    leg = TextLeg(doc_level=True, alternatives=parsed.alternatives)
    dq = DocQuery.of(None, parsed, column="", doc_column="")  # the terms' keys and text tests (no phrase: no table read)
    per_word = [index.doc_scores(ids) for ids in words]
    scores = per_word[0] if len(per_word) == 1 else np.sum(per_word, axis=0)
    missing = absent_weight(len(index.docs.rows))
    for (key, _, test), word_scores in zip(dq.terms, per_word):
        leg.presence[key] = test
        leg.weights[key] = float(word_scores.max(initial=0.0)) or missing
    hits = np.flatnonzero(scores > 0)
    if len(hits) > limit:
        hits = hits[np.argpartition(-scores[hits], limit - 1)[:limit]]
    hits = hits[np.lexsort((hits, -scores[hits]))]
    docs_rows = index.docs.rows
    doc_ids = [index.doc_ids[docs_rows[i]] for i in hits.tolist()]
    for d, s in zip(doc_ids, scores[hits].tolist()):
        leg._docs[d] = {SUM_KEY: s}
    position = index.doc_position
    leg._completer = lambda docs: {d: float(scores[p]) for d in docs if (p := position.get(d)) is not None and scores[p] > 0}
    padded = np.append(scores, np.float32(0.0))  # the last: a document the index does not hold

    def every_doc(docs: list[str]) -> list[float]:
        missing = len(scores)
        return padded[np.fromiter((position.get(d, missing) for d in docs), np.int64, len(docs))].tolist()

    leg._every_doc = every_doc
    if not doc_ids:
        return leg
    # The chunks to show: the best 2 x ``limit`` chunks of those documents by their own BM25.
    ids = [t for got in words for t in got]
    chunk_scores = index.chunk_scores(ids)
    chunks = np.concatenate([index.chunks_of[d] for d in doc_ids])
    chunks = chunks[chunk_scores[chunks] > 0]
    if len(chunks) > 2 * limit:
        chunks = chunks[np.argpartition(-chunk_scores[chunks], 2 * limit - 1)[: 2 * limit]]
    shown: set[str] = set()
    if len(chunks):
        leg.chunk_weights[SUM_KEY] = float(chunk_scores[chunks].max())
    for p, s in zip(chunks.tolist(), chunk_scores[chunks].tolist()):
        row = index.row(p, row_of)
        leg.rows.setdefault(row["chunk_id"], row)
        leg.chunk_terms.setdefault(row["chunk_id"], {})[SUM_KEY] = s
        shown.add(row["doc_id"])
    for d, i in zip(doc_ids, hits.tolist()):
        if d not in shown:  # none of its chunks holds a word on its own: shown by its first chunk
            row = index.row(int(docs_rows[i]), row_of)
            leg.rows.setdefault(row["chunk_id"], row)
    return leg
