"""Hybrid search over the memory table: vector + native full-text, fused.

Scores are in [0, 1] in every mode:

* vector similarity ``sv`` = cosine similarity of the query and the chunk, clipped at 0;
* text score ``st`` = ``coverage * (0.6 + 0.4 * bm25 / (bm25 + 3))`` where coverage is the
  share of the query's terms (stop words aside) present in the chunk: a chunk holding
  every term scores at least 0.6, one matching a single word of four stays low;
* hybrid = ``1 - (1 - sv)**(wv/w) * (1 - st)**(wt/w)`` with ``w = max(wv, wt)``: a weighted
  "noisy OR". Either leg alone can make a result relevant (a paraphrase that shares
  no word; an id, a name or a CJK phrase the English model does not understand), so
  a strong keyword hit is never drowned by a weak vector leg; agreement raises the
  score; the lighter-weighted leg counts for less. With equal weights it is the plain
  noisy OR; it never exceeds 1 and is 0 only when both legs are.

Every candidate from either leg gets both scores (the vector of an FTS hit is
compared with the query exactly), so fusion never guesses a missing leg.
``min_score`` drops weak results: a query about nothing in memory returns nothing.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from memory_pipeline.discovery import glob_match
from memory_pipeline.errors import ConfigError, ProviderError
from memory_pipeline.providers.registry import query_provider
from memory_pipeline.settings import Settings, load_settings
from memory_pipeline.stores import generations
from memory_pipeline.stores.lance import FTS_COLUMN, VectorStore

MODES = ("hybrid", "vector", "fts")
log = logging.getLogger("memory_pipeline.search")
BM25_HALF = 3.0
_COLUMNS = [
    "chunk_id", "source", "path", "locator", "line_start", "line_end", "heading", "text",
    "modality", "mime_type", "memory_type", "original_file_path", "media_type",
]  # fmt: skip
# --type values: a media modality, or "text" for notes and transcripts.
RESULT_TYPES = ("image", "audio", "video", "pdf", "document", "text")


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
    media_type: str = ""

    def to_json(self) -> dict:
        return asdict(self)


_STOP = frozenset(
    "a an and are as at be by did do does for from had has have how i in is it its me my of on or "
    "our the their there this to was we were what when where which who why will with you your".split()
)
_TERM_RE = re.compile(r"[^\W_]+", re.UNICODE)


def _fold(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", text.lower()) if not unicodedata.combining(c))


def query_terms(query: str) -> list[str]:
    """Content terms of a query, folded; a light stem so plural/verb forms still match."""
    terms = []
    for term in _TERM_RE.findall(_fold(query)):
        if term in _STOP:
            continue
        terms.append(term[: max(4, len(term) - 2)] if term.isascii() and len(term) > 5 else term)
    return terms


def term_coverage(terms: list[str], text: str) -> float:
    if not terms:
        return 0.0
    folded = _fold(text)
    return sum(1 for t in terms if t in folded) / len(terms)


def _snippet(text: str, query: str, max_chars: int = 320) -> str:
    terms = [t.lower() for t in re.findall(r"\w+", query) if len(t) > 2]
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if not lines:
        return ""
    best = 0
    if terms:
        scores = [sum(t in ln.lower() for t in terms) for ln in lines]
        best = int(np.argmax(scores)) if max(scores) > 0 else 0
    out = " ".join(lines[best:])
    if best > 0:
        out = "… " + out
    return out if len(out) <= max_chars else out[: max_chars - 1].rstrip() + "…"


def _where(source: str | None, types: Sequence[str] | None) -> str | None:
    """The SQL filter for ``--source`` and ``--type`` (pdf and document are modalities; text is memory_type)."""
    clauses = []
    if source:
        clauses.append(f"source = '{source.replace(chr(39), chr(39) * 2)}'")
    if types:
        bad = [t for t in types if t not in RESULT_TYPES]
        if bad:
            raise ConfigError(f"--type must be one of {', '.join(RESULT_TYPES)}, got {bad[0]!r}", key="type")
        parts = [f"modality IN ({', '.join(repr(t) for t in types if t != 'text')})"] if set(types) - {"text"} else []
        if "text" in types:
            parts.append("memory_type = 'text'")
        clauses.append("(" + " OR ".join(parts) + ")")
    return " AND ".join(clauses) or None


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
    types: Sequence[str] | None = None,
) -> list[SearchResult]:
    """Search the memory index; results best first, each above ``min_score``."""
    settings = settings or load_settings(config)
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}", key="mode")
    query = query.strip()
    if not query:
        return []
    max_results = max_results or settings.query.max_results
    min_score = settings.query.min_score if min_score is None else min_score
    # The current generation: while a new model's generation builds, this is still the old one,
    # and the query is embedded by the provider that built it.
    table_name, record = generations.current(settings)
    store = VectorStore(settings.lancedb_uri, table_name)
    table = store.open()
    if table is None or table.count_rows() == 0:
        return []
    dims = store.dims()
    provider = query_provider(settings, record) if dims else None
    if mode == "vector" and provider is None:
        raise ConfigError("vector search needs an embedding provider; this index is full-text only", key="mode")
    if provider is None:
        mode = "fts"
    where = _where(source, types)
    pool = max(max_results * 5, 30)

    qvec = None
    if provider is not None and mode != "fts":
        try:
            qvec = provider.embed_query(query)
        except ProviderError as err:
            # The provider is down or refuses: full-text still answers, and says so.
            if mode == "vector":
                raise
            log.warning("the query could not be embedded (%s); answering with full-text search only", err)
            mode = "fts"
    terms = query_terms(query)
    candidates: dict[str, dict] = {}
    if mode in ("hybrid", "vector") and qvec is not None:
        q = table.search(qvec, vector_column_name="vector").distance_type("cosine").limit(pool)
        if where:
            q = q.where(where, prefilter=True)
        for row in q.select(_COLUMNS + ["_distance"]).to_list():
            row["sv"] = max(0.0, 1.0 - float(row["_distance"]))
            row["st"] = 0.0
            candidates[row["chunk_id"]] = row
    if mode in ("hybrid", "fts"):
        q = table.search(query, query_type="fts", fts_columns=FTS_COLUMN).limit(pool)
        if where:
            q = q.where(where, prefilter=True)
        cols = _COLUMNS + ["_score"] + (["vector"] if qvec is not None else [])
        try:
            fts_rows = q.select(cols).to_list()
        except Exception as err:  # no FTS index yet on an empty or fresh table
            if "index" not in str(err).lower():
                raise
            fts_rows = []
        for row in fts_rows:
            bm25 = float(row.get("_score", 0.0))
            coverage = term_coverage(terms, row["text"] + "\n" + (row["heading"] or "") + "\n" + row["path"])
            st = coverage * (0.6 + 0.4 * bm25 / (bm25 + BM25_HALF)) if bm25 > 0 else 0.0
            existing = candidates.get(row["chunk_id"])
            if existing is not None:
                existing["st"] = st
                continue
            vec = row.pop("vector", None)
            row["sv"] = max(0.0, float(np.dot(np.asarray(vec, dtype=np.float32), qvec))) if vec is not None and qvec is not None else 0.0
            row["st"] = st
            candidates[row["chunk_id"]] = row

    wv, wt = settings.query.vector_weight, settings.query.text_weight
    top = max(wv, wt) or 1.0
    ev, et = wv / top, wt / top
    results: list[SearchResult] = []
    for row in candidates.values():
        if path_glob and not glob_match(row["path"], path_glob):
            continue
        sv, st = row["sv"], row["st"]
        if mode == "vector":
            score = sv
        elif mode == "fts":
            score = st
        else:
            score = 1.0 - (1.0 - sv) ** ev * (1.0 - min(st, 0.999999)) ** et
        if score < min_score:
            continue
        results.append(
            SearchResult(
                path=row["original_file_path"] or str(Path(row["path"])),
                source=row["source"],
                locator=row["locator"],
                score=round(float(score), 4),
                snippet=_snippet(row["text"], query),
                modality=row["modality"],
                mime_type=row["mime_type"],
                line_start=int(row["line_start"]),
                line_end=int(row["line_end"]),
                heading=row["heading"] or "",
                memory_type=row["memory_type"] or "text",
                vector_score=round(float(sv), 4),
                text_score=round(float(st), 4),
                chunk_id=row["chunk_id"],
                media_type=row.get("media_type") or "",
            )
        )
    results.sort(key=lambda r: (-r.score, r.path, r.line_start))
    return results[:max_results]
