"""Hybrid search over the memory table: vector + native full-text, fused, diversified, dated.

Scores are in [0, 1] in every mode and fusion:

* vector similarity ``sv`` = cosine similarity of the query and the chunk, clipped at 0;
* text score ``st`` = ``coverage**2 * (0.6 + 0.4 * bm25 / (bm25 + 3))`` where coverage is the
  share of the query's terms (stop words aside) present in the chunk: a chunk holding
  every term scores at least 0.6, one matching a single word of four stays low (1/16 of
  that: a partial keyword hit is weak evidence, and the embedding already saw the word);
* identifiers: a query token holding a digit (ERR_PAYMENT_4471, PAY-2291, 1.47.0) is a
  hard fact; a chunk missing its digit runs keeps only ``0.25 + 0.75 * found / all`` of its
  relevance, however close its vector (the model sees 4417 and 4471 as near twins);
* ``relevance`` (what ``min_score`` compares, so abstention is the same in every fusion):
  vector mode ``sv``, fts mode ``st``, hybrid ``1 - (1 - sv)**(wv/w) * (1 - st)**(wt/w)``
  with ``w = max(wv, wt)``: a weighted "noisy OR". Either leg alone can make a result
  relevant (a paraphrase that shares no word; an id, a name or a CJK phrase the English
  model does not understand), so a strong keyword hit is never drowned by a weak vector
  leg; agreement raises the score; the lighter-weighted leg counts for less.
* ``score`` (what results are ordered by): with ``fusion: weighted`` the relevance; with
  ``fusion: rrf`` reciprocal rank fusion ``sum_l w_l / (k + rank_l)`` divided by its maximum
  ``sum_l w_l / (k + 1)``, so 1.0 means first in both legs. Ranks are taken over the union
  of both candidate pools with both scores computed for every candidate (the vector of an
  FTS hit is compared with the query exactly), so a candidate missing from one pool is
  ranked by its real score there, not dropped to "unranked", and the pools are sized from
  ``max_results`` (a deep pool lets weak vector neighbours outvote a strong keyword hit).
* recency (``recency_half_life_days`` > 0): a dated note (``YYYY-MM-DD`` at the start of its
  file name) has its score multiplied by ``0.5 ** (age_days / half_life)``; relevance and
  undated notes are untouched.
* MMR (``mmr``): results are picked greedily by ``lambda * score - (1 - lambda) * max_sim``
  where ``max_sim`` is the cosine similarity (term overlap without vectors) to the results
  already picked, so five chunks of one note do not crowd out the rest.

``min_score`` drops weak results: a query about nothing in memory returns nothing.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from memory_pipeline.errors import ConfigError, ProviderError
from memory_pipeline.providers.registry import query_provider
from memory_pipeline.settings import FUSIONS, Settings, load_settings
from memory_pipeline.stores import generations
from memory_pipeline.stores.lance import FTS_COLUMN, VectorStore, ann_query

MODES = ("hybrid", "vector", "fts")
log = logging.getLogger("memory_pipeline.search")
BM25_HALF = 3.0
MIN_POOL = 20
_COLUMNS = [
    "chunk_id", "doc_id", "source", "path", "locator", "line_start", "line_end", "heading", "text",
    "modality", "mime_type", "memory_type", "original_file_path", "created_at", "media_type",
]  # fmt: skip
# --type values: a media modality, or "text" for notes and transcripts.
RESULT_TYPES = ("image", "audio", "video", "pdf", "document", "text")
# A dated note: YYYY-MM-DD at the start of its file name (memory/2026-10-14.md, 2026-10-14-deploy.jsonl).
_DATED_RE = re.compile(r"(?:^|/)(\d{4}-\d{2}-\d{2})[^/]*$")


@dataclass(frozen=True)
class SearchResult:
    path: str
    source: str
    locator: str
    score: float
    snippet: str
    modality: str
    mime_type: str
    line_start: int
    line_end: int
    heading: str
    memory_type: str
    vector_score: float
    text_score: float
    chunk_id: str
    relevance: float = 0.0  # the calibrated evidence min_score compares (== score with weighted fusion)
    doc_id: str = ""
    date: str = ""  # the note's date: from a dated file name, else the file's mtime (YYYY-MM-DD)
    snippet_locator: str = ""  # the lines the snippet shows (L14-L16), else the chunk's locator
    highlights: tuple[tuple[int, int], ...] = ()  # [start, end) character spans of matched terms in snippet
    media_type: str = ""  # image | audio | video | document for media rows

    def to_json(self) -> dict:
        out = asdict(self)
        out["highlights"] = [list(h) for h in self.highlights]
        return out


@dataclass(frozen=True)
class SearchFilters:
    """Which rows may be returned; applied inside LanceDB before ranking (prefilter)."""

    source: str | None = None
    modality: tuple[str, ...] = ()
    path_glob: str | None = None
    since: date | None = None  # inclusive, on the note's date
    until: date | None = None  # inclusive
    types: tuple[str, ...] = ()  # --type: media modalities, or "text" (notes and transcripts)

    def where(self) -> str | None:
        parts = []
        if self.types:
            bad = [t for t in self.types if t not in RESULT_TYPES]
            if bad:
                raise ConfigError(f"--type must be one of {', '.join(RESULT_TYPES)}, got {bad[0]!r}", key="type")
            media = [t for t in self.types if t != "text"]
            either = [f"modality IN ({', '.join(_sql_str(t) for t in media)})"] if media else []
            if "text" in self.types:
                either.append("memory_type = 'text'")
            parts.append(" OR ".join(either))
        if self.source:
            parts.append(f"source = {_sql_str(self.source)}")
        if self.modality:
            parts.append(f"modality IN ({', '.join(_sql_str(m) for m in self.modality)})")
        if self.path_glob:
            parts.append(f"regexp_like(path, {_sql_str(glob_to_rust_regex(self.path_glob))})")
        if self.since or self.until:
            parts.append(_date_range_sql(self.since, self.until))
        return " AND ".join(f"({p})" for p in parts) or None


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def glob_to_rust_regex(pattern: str) -> str:
    """A path glob (``**`` spans folders, as in the sources' include globs) as an anchored regex
    for LanceDB's SQL ``regexp_like`` (Rust syntax: no lookarounds, ``\\Z`` spelled ``$``)."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] in "*?":
            out.append("[^/]*" if pattern[i] == "*" else "[^/]")
            i += 1
        else:
            ch = pattern[i]
            out.append("\\" + ch if ch in _RUST_META else ch)
            i += 1
    return "^" + "".join(out) + "$"


_RUST_META = set("\\.+*?()|[]{}^$#&-~")


def _date_range_sql(since: date | None, until: date | None) -> str:
    """Dated notes by the date in their file name, other files by their mtime."""
    lo = since or date.min
    hi = until or date.max
    if lo > hi:
        raise ConfigError(f"the date range is empty: since {lo} is after until {hi}", key="since")
    dated = r"(^|/)\d{4}-\d{2}-\d{2}[^/]*$"
    in_range = "(^|/)(" + "|".join(date_range_regex(lo, hi)) + r")[^/]*$"
    mtime = []
    if since:
        mtime.append(f"created_at >= TIMESTAMP '{since.isoformat()} 00:00:00'")
    if until:
        mtime.append(f"created_at < TIMESTAMP '{(until + timedelta(days=1)).isoformat()} 00:00:00'")
    return (
        f"(regexp_like(path, {_sql_str(in_range)})) OR "
        f"(NOT regexp_like(path, {_sql_str(dated)}) AND {' AND '.join(mtime)})"
    )


def date_range_regex(lo: date, hi: date) -> list[str]:
    """Regex alternatives matching exactly the ISO dates ``lo..hi`` (inclusive), compact for any
    range (open ends included): whole years, whole months and day runs as digit ranges."""
    if lo > hi:
        return []
    if lo.year == hi.year:
        out = []
        for month in range(lo.month, hi.month + 1):
            first = lo.day if month == lo.month else 1
            last = hi.day if month == hi.month else _month_days(lo.year, month)
            days = r"\d{2}" if (first, last) == (1, _month_days(lo.year, month)) else _alt(_digit_range(f"{first:02d}", f"{last:02d}"))
            out.append(f"{lo.year:04d}-{month:02d}-{days}")
        return out
    out = date_range_regex(lo, date(lo.year, 12, 31))
    if hi.year - lo.year > 1:
        out.append(_alt(_digit_range(f"{lo.year + 1:04d}", f"{hi.year - 1:04d}")) + r"-\d{2}-\d{2}")
    return out + date_range_regex(date(hi.year, 1, 1), hi)


def _month_days(year: int, month: int) -> int:
    return ((date(year, 12, 31) if month == 12 else date(year, month + 1, 1) - timedelta(days=1))).day


def _alt(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _digit_range(a: str, b: str) -> list[str]:
    """Regexes matching exactly the equal-width digit strings from ``a`` to ``b``."""
    if a == b:
        return [a]
    if len(a) == 1:
        return [f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + rest for rest in _digit_range(a[1:], b[1:])]
    width = len(a) - 1
    out = [a[0] + rest for rest in _digit_range(a[1:], "9" * width)]
    if int(b[0]) - int(a[0]) > 1:
        out.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}]" + r"\d" * width)
    return out + [b[0] + rest for rest in _digit_range("0" * width, b[1:])]


_STOP = frozenset(
    "a an and are as at be by did do does for from had has have how i in is it its me my of on or "
    "our the their there this to was we were what when where which who why will with you your "
    "about am been can could he her him his if into just not she so than that them then they us would".split()
)
_TERM_RE = re.compile(r"[^\W_]+", re.UNICODE)


def _fold(text: str) -> str:
    if text.isascii():
        return text.lower()
    return "".join(c for c in unicodedata.normalize("NFKD", text.lower()) if not unicodedata.combining(c))


def _fold_with_map(text: str) -> tuple[str, list[int]]:
    """The folded text and, for each folded character, the index of its original character."""
    chars: list[str] = []
    origin: list[int] = []
    for i, ch in enumerate(text):
        for f in _fold(ch):
            chars.append(f)
            origin.append(i)
    return "".join(chars), origin


_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def query_terms(query: str) -> list[str]:
    """Content terms of a query, folded; a light stem so plural/verb forms still match.

    CJK runs (no spaces between words) become character bigrams, so 团建预算 is matched
    by a note holding 团建 and 预算 apart.
    """
    terms = []
    for term in _TERM_RE.findall(_fold(query)):
        if term in _STOP:
            continue
        if _CJK_RE.search(term):
            terms.extend([term] if len(term) < 2 else [term[i : i + 2] for i in range(len(term) - 1)])
            continue
        terms.append(term[: max(4, len(term) - 2)] if term.isascii() and len(term) > 5 else term)
    return terms


def identifier_terms(query: str) -> list[str]:
    """The parts of a query that name one thing exactly: tokens holding a digit (codes,
    ids, versions, hosts: ERR_PAYMENT_4471, PAY-2291, db-07, 1.47.0), as their digit runs."""
    out = []
    for token in query.split():
        if any(ch.isdigit() for ch in token):
            out.extend(run for run in re.findall(r"\d+", token) if len(run) >= 2)
    return out


def identifier_factor(ids: list[str], text: str) -> float:
    """1 when every identifier of the query is in the text; down to 0.25 when none is.

    An id is a hard fact: a note about ERR_PAYMENT_4417 does not answer ERR_PAYMENT_9999
    however similar the two look to an embedding model.
    """
    if not ids:
        return 1.0
    found = sum(1 for i in ids if i in text)
    return 0.25 + 0.75 * found / len(ids)


def term_coverage(terms: list[str], text: str) -> float:
    if not terms:
        return 0.0
    folded = _fold(text)
    return sum(1 for t in terms if t in folded) / len(terms)


def file_name_date(path: str) -> date | None:
    """``YYYY-MM-DD`` at the start of the file name (a dated note), else None."""
    m = _DATED_RE.search(path)
    try:
        return date.fromisoformat(m.group(1)) if m else None
    except ValueError:
        return None


def note_date(path: str, created_at: datetime | None) -> date | None:
    """The date a note is about: from a dated file name, else the file's mtime."""
    return file_name_date(path) or (created_at.date() if created_at is not None else None)


def _term_spans(folded: str, terms: Sequence[str]) -> list[tuple[int, int]]:
    spans = []
    for t in set(terms):
        # ASCII terms match at a word start (a stem matches its longer forms); CJK anywhere.
        pattern = re.escape(t) + r"\w*" if t.isascii() else re.escape(t)
        prefix = r"(?<![^\W_])" if t.isascii() else ""
        spans.extend((m.start(), m.end()) for m in re.finditer(prefix + pattern, folded))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged


def make_snippet(
    text: str, terms: Sequence[str], *, max_lines: int = 3, max_chars: int = 320
) -> tuple[str, int, int, tuple[tuple[int, int], ...]]:
    """The best window of up to ``max_lines`` lines (most matched terms), with highlight spans.

    Returns (snippet, first line index, last line index within ``text``, spans).
    """
    lines = text.split("\n")
    nonblank = [i for i, ln in enumerate(lines) if ln.strip()]
    if not nonblank:
        return "", 0, 0, ()
    hits = []
    for ln in lines:
        folded = _fold(ln)
        hits.append({t for t in terms if t in folded})
    best_start, best_score = nonblank[0], -1
    for i in nonblank:
        window = [j for j in range(i, min(i + max_lines, len(lines)))]
        found = set().union(*(hits[j] for j in window))
        score = len(found)
        if score > best_score:
            best_start, best_score = i, score
    chosen = [j for j in range(best_start, min(best_start + max_lines, len(lines))) if lines[j].strip()]
    first, last = chosen[0], chosen[-1]
    snippet = " ".join(lines[j].strip() for j in chosen)
    if first > nonblank[0]:
        snippet = "… " + snippet
    if last < nonblank[-1]:
        snippet += " …"
    if len(snippet) > max_chars:
        # Keep the first highlight in view.
        folded, origin = _fold_with_map(snippet)
        spans = _term_spans(folded, terms)
        start = max(0, origin[spans[0][0]] - max_chars // 4) if spans else 0
        end = start + max_chars - 2
        snippet = ("… " if start else "") + snippet[start:end].strip() + " …"
    folded, origin = _fold_with_map(snippet)
    spans = tuple(
        (origin[s], origin[e - 1] + 1) for s, e in _term_spans(folded, terms)
    )
    return snippet, first, last, spans


def highlight(snippet: str, spans: Sequence[tuple[int, int]], *, before: str = "**", after: str = "**") -> str:
    out, pos = [], 0
    for s, e in spans:
        out.append(snippet[pos:s])
        out.append(f"{before}{snippet[s:e]}{after}")
        pos = e
    out.append(snippet[pos:])
    return "".join(out)


@dataclass
class Candidate:
    row: dict
    sv: float = 0.0
    st: float = 0.0
    relevance: float = 0.0
    score: float = 0.0
    vector: np.ndarray | None = None


@dataclass(frozen=True)
class QueryOptions:
    """One query's knobs; the defaults come from ``settings.query``."""

    max_results: int
    min_score: float
    mode: str = "hybrid"
    fusion: str = "weighted"
    mmr: bool = False
    mmr_lambda: float = 0.7
    recency_half_life_days: float = 0.0
    filters: SearchFilters = field(default_factory=SearchFilters)
    now: datetime | None = None
    query_media: tuple[tuple[str, str], ...] = ()  # (path, mime) embedded natively as the query vector


class MemorySearcher:
    """The table and provider opened once; each ``search`` is one query (what eval and benchmarks reuse)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # The current generation: while a new model's generation builds, this is still the old one,
        # and the query is embedded by the provider that built it.
        table_name, record = generations.current(settings)
        self.store = VectorStore(settings.lancedb_uri, table_name)
        self.table = self.store.open()
        self.dims = self.store.dims() if self.table is not None else 0
        self.provider = query_provider(settings, record) if self.dims else None
        self.has_ann = self.store.vector_index() is not None if self.dims else False
        self._pool: ThreadPoolExecutor | None = None

    def options(self, **kw) -> QueryOptions:
        q = self.settings.query
        return QueryOptions(
            max_results=kw.pop("max_results", None) or q.max_results,
            min_score=q.min_score if kw.get("min_score") is None else kw["min_score"],
            mode=kw.get("mode") or "hybrid",
            fusion=kw.get("fusion") or q.fusion,
            mmr=q.mmr if kw.get("mmr") is None else kw["mmr"],
            mmr_lambda=q.mmr_lambda if kw.get("mmr_lambda") is None else kw["mmr_lambda"],
            recency_half_life_days=(
                q.recency_half_life_days if kw.get("recency_half_life_days") is None else kw["recency_half_life_days"]
            ),
            filters=kw.get("filters") or SearchFilters(),
            now=kw.get("now"),
            query_media=tuple(kw.get("query_media") or ()),
        )

    def search(self, query: str, opts: QueryOptions) -> list[SearchResult]:
        terms = query_terms(query)
        return [self._result(c, terms) for c in self.ranked(query, opts)[: opts.max_results]]

    def ranked(self, query: str, opts: QueryOptions, *, pool: int | None = None) -> list[Candidate]:
        """Every candidate above ``min_score``, best first (MMR order when on)."""
        if opts.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {opts.mode!r}", key="mode")
        if opts.fusion not in FUSIONS:
            raise ConfigError(f"fusion must be one of {', '.join(FUSIONS)}, got {opts.fusion!r}", key="fusion")
        query = query.strip()
        native = self._native_query_vector(opts.query_media) if opts.query_media and self.table is not None else None
        if (not query and native is None) or self.table is None:
            return []
        mode = opts.mode
        if mode == "vector" and self.provider is None:
            raise ConfigError("vector search needs an embedding provider; this index is full-text only", key="mode")
        if self.provider is None:
            mode = "fts"
        if not query:
            mode = "vector"  # a file without text: its native vector alone
        pool = pool or max(opts.max_results * self.settings.query.candidate_multiplier, MIN_POOL)
        where = opts.filters.where()
        # Chunk vectors are needed to score FTS hits against the query (hybrid) and for MMR.
        want_vectors = self.provider is not None and (mode == "hybrid" or opts.mmr)
        # The full-text leg runs in a second thread while the query is embedded and the vector
        # leg searched (torch and LanceDB release the GIL): hybrid costs the slower leg, not both.
        fts_future = self._executor().submit(self._fts, query, where, pool, with_vectors=want_vectors) if mode in ("hybrid", "fts") else None
        qvec = native
        if qvec is None and self.provider is not None and mode != "fts":
            try:
                qvec = self.provider.embed_query(query)
            except ProviderError as err:
                # The provider is down or refuses: full-text still answers, and says so.
                if mode == "vector":
                    raise
                log.warning("the query could not be embedded (%s); answering with full-text search only", err)
                mode = "fts"
        terms = query_terms(query)
        candidates: dict[str, Candidate] = {}

        if mode in ("hybrid", "vector") and qvec is not None:
            q = ann_query(self.table.search(qvec, vector_column_name="vector").distance_type("cosine"), self.settings.ann)
            if where:
                q = q.where(where, prefilter=True)
            for row in q.select(_COLUMNS + ["vector", "_distance"]).limit(pool).to_list():
                vec = np.asarray(row.pop("vector"), dtype=np.float32)
                candidates[row["chunk_id"]] = Candidate(row, sv=max(0.0, 1.0 - float(row["_distance"])), vector=vec)

        fts_full = False
        min_bm25 = 0.0
        if fts_future is not None:
            fts_rows = fts_future.result()
            fts_full = len(fts_rows) >= pool
            if fts_rows:
                min_bm25 = min(float(r.get("_score", 0.0)) for r in fts_rows)
            for row in fts_rows:
                bm25 = float(row.get("_score", 0.0))
                st = _text_score(terms, row, bm25)
                vec = row.pop("vector", None)
                existing = candidates.get(row["chunk_id"])
                if existing is not None:
                    existing.st = st
                    continue
                cand = Candidate(row, st=st)
                if vec is not None:
                    cand.vector = np.asarray(vec, dtype=np.float32)
                    if qvec is not None:
                        cand.sv = max(0.0, float(np.dot(cand.vector, qvec)))
                candidates[row["chunk_id"]] = cand
            if fts_full and mode == "hybrid":
                # Vector-only candidates outside a full FTS pool: bm25 is at most the pool's lowest.
                in_fts = {r["chunk_id"] for r in fts_rows}
                for cand in candidates.values():
                    if cand.st == 0.0 and cand.row["chunk_id"] not in in_fts:
                        cand.st = _text_score(terms, cand.row, min_bm25)

        cands = list(candidates.values())
        self._score(cands, mode, opts, identifier_terms(query))
        cands = [c for c in cands if c.relevance >= opts.min_score]
        cands.sort(key=lambda c: (-c.score, c.row["path"], c.row["line_start"]))
        if opts.mmr and len(cands) > 1:
            cands = _mmr(cands, terms, opts.mmr_lambda, limit=len(cands))
        return cands

    def _native_query_vector(self, media: Sequence[tuple[str, str]]) -> np.ndarray | None:
        """The query files' own vector (media bytes embedded natively), when this index has native media vectors."""
        if self.provider is None or not getattr(self.provider, "supports_multimodal", False):
            return None
        if not (self.settings.multimodal.native and self.settings.multimodal.enabled):
            return None
        from memory_pipeline.providers.base import normalize_vectors
        from memory_pipeline.providers.gemini import MediaItem

        items = []
        for path, mime in media:
            with open(path, "rb") as fh:
                items.append(MediaItem(label=Path(path).name, data=fh.read(), mime_type=mime))
        vecs = self.provider.embed_media(items)
        return normalize_vectors(vecs.mean(axis=0))[0]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory-fts")
        return self._pool

    def _fts(self, query: str, where: str | None, pool: int, *, with_vectors: bool) -> list[dict]:
        cols = _COLUMNS + ["_score"] + (["vector"] if with_vectors else [])
        q = self.table.search(_fts_query_text(query), query_type="fts", fts_columns=FTS_COLUMN).limit(pool)
        if where:
            q = q.where(where, prefilter=True)
        try:
            return q.select(cols).to_list()
        except Exception as err:  # no FTS index yet on an empty or fresh table; a query of only punctuation
            text = str(err).lower()
            if "index" not in text and "query" not in text and "token" not in text:
                raise
            return []

    def _score(self, cands: list[Candidate], mode: str, opts: QueryOptions, ids: list[str]) -> None:
        q = self.settings.query
        top = max(q.vector_weight, q.text_weight) or 1.0
        ev, et = q.vector_weight / top, q.text_weight / top
        for c in cands:
            if mode == "vector":
                c.relevance = c.sv
            elif mode == "fts":
                c.relevance = c.st
            else:
                c.relevance = 1.0 - (1.0 - c.sv) ** ev * (1.0 - min(c.st, 0.999999)) ** et
            if ids and mode != "fts":
                c.relevance *= identifier_factor(ids, _haystack(c.row))
            c.score = c.relevance
        if mode == "hybrid" and opts.fusion == "rrf" and cands:
            k = q.rrf_k
            legs = ((q.vector_weight, "sv"), (q.text_weight, "st"))
            best = sum(w / (k + 1) for w, _ in legs)
            fused = {id(c): 0.0 for c in cands}
            for w, attr in legs:
                ranked = sorted((c for c in cands if getattr(c, attr) > 0), key=lambda c: -getattr(c, attr))
                for rank, c in enumerate(ranked, start=1):
                    fused[id(c)] += w / (k + rank)
            for c in cands:
                c.score = fused[id(c)] / best if best else 0.0
        if opts.recency_half_life_days > 0:
            today = (opts.now or datetime.now(timezone.utc)).date()
            for c in cands:
                day = file_name_date(c.row["path"])
                if day is None:
                    continue  # undated (evergreen) notes do not age
                age = max((today - day).days, 0)
                c.score *= 0.5 ** (age / opts.recency_half_life_days)

    @staticmethod
    def _result(c: Candidate, terms: list[str]) -> SearchResult:
        row = c.row
        snippet, first, last, spans = make_snippet(row["text"], terms)
        line_start, line_end = int(row["line_start"]), int(row["line_end"])
        snippet_locator = row["locator"]
        n_lines = row["text"].count("\n") + 1
        if row["modality"] in ("markdown", "text") and n_lines == line_end - line_start + 1:
            snippet_locator = f"L{line_start + first}-L{line_start + last}"
        day = note_date(row["path"], row.get("created_at"))
        return SearchResult(
            path=row["original_file_path"] or str(Path(row["path"])),
            source=row["source"],
            locator=row["locator"],
            score=round(float(c.score), 4),
            snippet=snippet,
            modality=row["modality"],
            mime_type=row["mime_type"],
            line_start=line_start,
            line_end=line_end,
            heading=row["heading"] or "",
            memory_type=row["memory_type"] or "text",
            vector_score=round(float(c.sv), 4),
            text_score=round(float(c.st), 4),
            chunk_id=row["chunk_id"],
            relevance=round(float(c.relevance), 4),
            doc_id=row.get("doc_id") or "",
            date=day.isoformat() if day else "",
            snippet_locator=snippet_locator,
            highlights=spans,
            media_type=row.get("media_type") or "",
        )


def _haystack(row: dict) -> str:
    return _fold(row["text"] + "\n" + (row["heading"] or "") + "\n" + row["path"])


def _text_score(terms: list[str], row: dict, bm25: float) -> float:
    if bm25 <= 0:
        return 0.0
    coverage = term_coverage(terms, _haystack(row))
    return coverage * coverage * (0.6 + 0.4 * bm25 / (bm25 + BM25_HALF))


def _fts_query_text(query: str) -> str:
    # The raw text, tokenized by the index's own tokenizer: ERR_PAYMENT_4471 and mon-03.fra.internal
    # stay whole tokens there, so splitting them here would lose the exact match.
    return query


def _mmr(cands: list[Candidate], terms: list[str], lam: float, *, limit: int) -> list[Candidate]:
    """Greedy maximal marginal relevance: ``lam * score - (1 - lam) * max similarity to the picked``."""
    use_vectors = all(c.vector is not None for c in cands)
    if use_vectors:
        mat = np.stack([c.vector for c in cands])
        sims = mat @ mat.T
    else:
        sets = [set(_TERM_RE.findall(_fold(c.row["text"]))) for c in cands]
        sims = np.array([[len(a & b) / max(len(a | b), 1) for b in sets] for a in sets], dtype=np.float32)
    scores = np.array([c.score for c in cands], dtype=np.float32)
    picked: list[int] = []
    max_sim = np.zeros(len(cands), dtype=np.float32)
    remaining = set(range(len(cands)))
    while remaining and len(picked) < limit:
        best = max(remaining, key=lambda i: (lam * scores[i] - (1 - lam) * max_sim[i], scores[i], -i))
        picked.append(best)
        remaining.discard(best)
        max_sim = np.maximum(max_sim, sims[best])
    return [cands[i] for i in picked]


def search(
    query: str,
    *,
    settings: Settings | None = None,
    config: str | None = None,
    max_results: int | None = None,
    min_score: float | None = None,
    mode: str = "hybrid",
    source: str | None = None,
    path_glob: str | None = None,
    modality: str | Sequence[str] | None = None,
    types: Sequence[str] | None = None,
    since: date | str | None = None,
    until: date | str | None = None,
    fusion: str | None = None,
    mmr: bool | None = None,
    mmr_lambda: float | None = None,
    recency_half_life_days: float | None = None,
    now: datetime | None = None,
    query_media: Sequence[tuple[str, str]] | None = None,
) -> list[SearchResult]:
    """Search the memory index; results best first, each with relevance above ``min_score``."""
    settings = settings or load_settings(config)
    searcher = MemorySearcher(settings)
    filters = SearchFilters(
        source=source,
        modality=(modality,) if isinstance(modality, str) else tuple(modality or ()),
        path_glob=path_glob,
        since=_as_date(since, "since"),
        until=_as_date(until, "until"),
        types=tuple(types or ()),
    )
    opts = searcher.options(
        max_results=max_results,
        min_score=min_score,
        mode=mode,
        fusion=fusion,
        mmr=mmr,
        mmr_lambda=mmr_lambda,
        recency_half_life_days=recency_half_life_days,
        filters=filters,
        now=now,
        query_media=query_media,
    )
    return searcher.search(query, opts)


def _as_date(value: date | str | None, key: str) -> date | None:
    if value is None or isinstance(value, date):
        return value
    try:
        return date.fromisoformat(value)
    except ValueError as err:
        raise ConfigError(f"{key} must be a date YYYY-MM-DD, got {value!r}", key=key) from err


class _CallableModule(type(logging)):
    """``memory_pipeline.search`` is both this module and the package's ``search()`` function:
    importing the module rebinds the package attribute to it, so the module answers calls too."""

    def __call__(self, query: str, **kwargs) -> list[SearchResult]:
        return search(query, **kwargs)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallableModule
