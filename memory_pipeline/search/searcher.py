"""The searcher: one opened table and provider answering queries (``MemorySearcher``), and the
``search()`` function behind ``memory search`` and ``memory_pipeline.search(...)``.

A query runs two legs (vector and full-text) into one candidate pool, scores every candidate
(``scoring``), drops those below ``min_score``, orders the rest (``fusion``, recency, MMR) and
turns them into ``SearchResult`` rows with a snippet (``snippets``).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa

from memory_pipeline.errors import ConfigError, FullTextUnavailable, MemoryPipelineError, ProviderError, SearchError, StoreError
from memory_pipeline.providers.registry import query_provider
from memory_pipeline.search import lanceaio
from memory_pipeline.search.filters import SearchFilters, file_name_date, note_date, sql_str
from memory_pipeline.search.folding import identifier_terms, query_terms
from memory_pipeline.search.fulltext import DocQuery, TermWeights, TextLeg, doc_text_leg, text_leg
from memory_pipeline.search.fusion import fusion_for
from memory_pipeline.search.lanceaio import VectorQuery
from memory_pipeline.search.lru import LRU
from memory_pipeline.search.scoring import (
    Candidate,
    abstain,
    haystack,
    identifier_factor,
    mmr,
    recency_factor,
    relevance,
    relevances,
)
from memory_pipeline.search.snippets import make_snippet
from memory_pipeline.search.syntax import ParsedQuery, parse_query
from memory_pipeline.search.textindex import Analyzer, EncodeCache, TextIndex, analysable, doc_leg, serves
from memory_pipeline.settings import FUSIONS, Settings, load_settings
from memory_pipeline.stores import generations
from memory_pipeline.stores.lance import DOC_FTS_COLUMN, FTS_COLUMN, VectorStore

MODES = ("hybrid", "vector", "fts")
log = logging.getLogger(__name__)
MIN_POOL = 20
# A light ranking (``ranked(light=True)``) takes the rank columns of the candidates and then the
# whole rows of the results: one more round trip, worth it from about this many candidates on.
LIGHT_MIN_ROWS = 100
# A table whose vectors fit in this many bytes is searched exactly in memory (``FlatVectors``) by a
# searcher that answers more than one query: 43k chunks of 384 dimensions, 10k of 1,536.
FLAT_MAX_BYTES = 64 * 2**20
# A table of at most this many chunks (the default ``ann.min_rows``: the size up to which the vector
# leg is exact too) gets its full-text statistics in memory (``TextIndex``) once a searcher asks a
# second query of a version: at SciFact's 14k chunks (5k long documents) 3 s of one thread to build
# from nothing, a new version's new texts only after that.
TEXT_INDEX_MAX_ROWS = 50_000
_FLAT = "\0flat"  # on a row the in-memory vectors found: their version (the row ids are that version's)
_IDS = ["chunk_id", "doc_id"]  # what a leg reads of a row before the rows kept are taken whole
# What ranking reads of a row when nothing in the query needs its text (media notes, the order's
# ties, recency): a light ranking takes these of every candidate and the rest of the results only.
_RANK_COLUMNS = ["chunk_id", "doc_id", "source", "path", "line_start", "memory_type"]
_COLUMNS = [
    "chunk_id", "doc_id", "source", "path", "locator", "line_start", "line_end", "heading", "text",
    "modality", "mime_type", "memory_type", "original_file_path", "created_at", "media_type",
]  # fmt: skip


@dataclass(frozen=True)
class SearchResult:
    """One search result: where it is, how it scored, and the snippet that shows why."""

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


def _matrix(column: pa.ChunkedArray, dims: int) -> np.ndarray:
    """A fixed-size-list vector column as one (rows, dims) float32 matrix."""
    if len(column) == 0:
        return np.zeros((0, dims), dtype=np.float32)
    if column.null_count:  # rows without a vector (none in a table with a provider): zeros for them
        return np.stack([np.zeros(dims, np.float32) if v is None else np.asarray(v, np.float32) for v in column.to_pylist()])
    flat = pa.concat_arrays([chunk.flatten() for chunk in column.chunks]) if column.num_chunks > 1 else column.chunk(0).flatten()
    return np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(column), -1)


def _rows_of(found: pa.Table, dims: int) -> list[dict]:
    """Rows as dicts; a ``vector`` column as one float32 row of a matrix each (not Python floats)."""
    if "vector" not in found.column_names:
        return found.to_pylist()
    vecs = _matrix(found.column("vector"), dims)
    rows = found.drop_columns(["vector"]).to_pylist()
    for row, vec in zip(rows, vecs):
        row["vector"] = vec
    return rows


def _scores(c: Candidate) -> tuple[float, float, float]:
    return (-c.score, -c.st_chunk, -c.sv)


def _order(c: Candidate) -> tuple:
    """The order of results: score, the chunk's own text share, vector score, then path and line."""
    return (-c.score, -c.st_chunk, -c.sv, c.row["path"], c.row["line_start"])


def _found_the_same_way(old: dict, row: dict) -> dict:
    """``row`` (more columns of the same chunk) with how ``old`` was found: its row id and
    in-memory-vectors version, which a later take of more columns reads."""
    for key in ("_rowid", _FLAT):
        if key in old:
            row[key] = old[key]
    return row


def _is_note(c: Candidate) -> bool:
    from memory_pipeline.discovery import NOTE_SUFFIX

    return c.row["path"].endswith(NOTE_SUFFIX)


def _note_files_among(shown: list[Candidate], ranked: list[Candidate]) -> bool:
    """Whether the file a shown note is about may be among ``ranked``: its document id
    (``source:path`` without the note's suffix) is a candidate's, or a candidate's is not known."""
    from memory_pipeline.discovery import NOTE_SUFFIX, doc_id

    files = {doc_id(c.row["source"], c.row["path"][: -len(NOTE_SUFFIX)]) for c in shown if _is_note(c)}
    ids = {c.row.get("doc_id") for c in ranked}
    return None in ids or "" in ids or bool(files & ids)


def _without_media_notes(cands: list[Candidate]) -> list[Candidate]:
    """A media file's note (``<file>.note.md``) is part of the file's own rows (locator ``note``):
    when the file is among the candidates, the note file is not listed a second time."""
    from memory_pipeline.discovery import NOTE_SUFFIX

    media = {(c.row["source"], c.row["path"]) for c in cands if c.row.get("memory_type") == "media"}
    if not media:
        return cands
    return [c for c in cands if not (c.row["path"].endswith(NOTE_SUFFIX) and (c.row["source"], c.row["path"][: -len(NOTE_SUFFIX)]) in media)]


class VectorCache:
    """Stored vectors of chunks a searcher took from the table, by chunk id, least recently used
    out past ``max_bytes``; thread-safe (a server's threads share a searcher).

    A chunk's vector never changes under its id: the id hashes the chunk's source, path, locator
    and the exact text embedded (``changes.chunk_id``), and one table holds the vectors of one
    model and runtime (another is another table, another searcher). So a vector taken once serves
    every later query of this searcher, whatever the table's version; a chunk gone from the table
    is never asked for (only the legs' hits of the version searched are). On a table too large for
    ``FlatVectors`` the full-text leg's hits cost a take of their vectors per query (0.5 a query,
    2.3 ms of CPU, at 100k chunks); the hits of an agent's memory recur across its queries."""

    def __init__(self, max_bytes: int = 16 * 2**20) -> None:
        self._lru: LRU[str, np.ndarray] = LRU(max_bytes, cost=lambda v: v.nbytes)

    def get_many(self, chunk_ids: Iterable[str]) -> dict[str, np.ndarray]:
        return self._lru.get_many(chunk_ids)

    def put_many(self, vectors: Mapping[str, np.ndarray]) -> None:
        own = {c: np.array(v, dtype=np.float32, copy=True) for c, v in vectors.items()}  # not views keeping a take alive
        for v in own.values():
            v.setflags(write=False)
        self._lru.put_many(own.items())

    def __len__(self) -> int:
        return len(self._lru)


@functools.cache
def _one_blas_thread() -> None:
    """NumPy's BLAS on one thread in a process that holds vectors in memory (``FlatVectors``). A
    query's product over them is bound by memory, not arithmetic: on SciFact's 13,987 vectors a
    second thread saved 0.5 ms of a query's 17 at memory eval's depth (three runs each,
    embedding excluded) and doubled its CPU (17 -> 30-37 ms), its threads spinning after every
    product on the cores a server's other searches need."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # scikit-learn's dependency, pinned in requirements.lock; without it the default stays
        return
    threadpool_limits(1, user_api="blas")


@dataclass(frozen=True)
class FlatVectors:
    """Every chunk vector of one table version in one (rows, dims) matrix: the vector leg's exact
    nearest chunks by one matrix product, and any chunk's vector without a query.

    LanceDB without an ANN index scans the table's vectors for every query: 18–25 ms on a
    14k-chunk table, where the product over the same vectors in memory takes under 1 ms and the
    rows of the nearest chunks are taken by their row ids in about 3 ms more. The result is the
    same exact cosine ranking (stored vectors are unit length)."""

    version: int
    ids: list[str]
    position: dict[str, int]
    matrix: np.ndarray
    row_ids: np.ndarray  # LanceDB's row ids (stable within a version): the rows are taken, not looked up
    doc_ids: list[str] = field(default_factory=list)  # each chunk's document (the full-text leg asks by document)
    # The other ``_RANK_COLUMNS`` of every chunk: a light ranking reads them here, not from the table.
    rank_columns: dict[str, list] = field(default_factory=dict)

    @classmethod
    def load(cls, table, version: int, dims: int) -> FlatVectors:
        _one_blas_thread()
        extra = [c for c in _RANK_COLUMNS if c not in ("chunk_id", "doc_id")]
        found = table.search().with_row_id(True).select(["chunk_id", "doc_id", "vector", *extra]).limit(None).to_arrow()
        ids = found.column("chunk_id").to_pylist()
        matrix = _matrix(found.column("vector"), dims)
        matrix.setflags(write=False)  # candidates hold rows of it: shared by every query
        docs = [d or c for d, c in zip(found.column("doc_id").to_pylist(), ids)]
        ranks = {c: found.column(c).to_pylist() for c in extra}
        return cls(version, ids, {c: i for i, c in enumerate(ids)}, matrix, found.column("_rowid").to_numpy(), docs, ranks)

    @cached_property
    def _rank_rows(self) -> list[dict]:
        """Each chunk's ``_RANK_COLUMNS`` as a dict, made once: a query copies those of its
        candidates (about a thousand at memory eval's depth; 13,987 dicts of 6 keys for SciFact)."""
        names = list(self.rank_columns)
        return [dict(zip(names, values), chunk_id=c, doc_id=d) for c, d, *values in zip(self.ids, self.doc_ids, *self.rank_columns.values())]

    def rank_row(self, chunk_id: str) -> dict | None:
        """The chunk's ``_RANK_COLUMNS``, when they were loaded with the vectors."""
        i = self.position.get(chunk_id)
        if i is None or not self.rank_columns:
            return None
        return self._rank_rows[i].copy()

    def row_at(self, position: int) -> dict:
        """The ``_RANK_COLUMNS`` of the chunk at ``position`` (``rank_columns`` must be loaded)."""
        return self._rank_rows[position].copy()

    def similarities(self, qvec: np.ndarray) -> np.ndarray:
        """The cosine of ``qvec`` and every chunk, by position."""
        return self.matrix @ np.asarray(qvec, dtype=np.float32)

    def nearest(self, qvec: np.ndarray, k: int, *, sims: np.ndarray | None = None) -> list[tuple[int, float]]:
        """(position, cosine) of the ``k`` chunks nearest ``qvec``, nearest first (``sims``: its
        ``similarities``, when computed already)."""
        n = len(self.ids)
        if n == 0 or k <= 0:
            return []
        if sims is None:
            sims = self.similarities(qvec)
        k = min(k, n)
        if k < n:  # the k best; of those tied with the k-th, the first by position
            kth = np.partition(sims, n - k)[n - k]
            above = np.flatnonzero(sims > kth)
            top = np.concatenate([above, np.flatnonzero(sims == kth)[: k - len(above)]])
        else:
            top = np.arange(n)
        top = top[np.lexsort((top, -sims[top]))]  # best first; ties by position, as a scan would meet them
        return [(int(i), float(sims[i])) for i in top]

    def vector(self, chunk_id: str) -> np.ndarray | None:
        i = self.position.get(chunk_id)
        return None if i is None else self.matrix[i]


_LANCE_ERROR = re.compile(r"lance|object.?store|\.lance\b|_versions|manifest", re.IGNORECASE)


def _table_errors(method):
    """LanceDB's errors reading the table (``RuntimeError``/``OSError`` from its Rust core: a data
    file truncated or missing) as a ``StoreError``: the index cannot answer (HTTP 503, one line on
    the command line), not a bug in the caller's query."""

    @functools.wraps(method)
    def reading(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except (RuntimeError, OSError) as err:
            # Only LanceDB's own (its messages name it): a model's error (torch's out of memory is a
            # RuntimeError) or a query image that cannot be opened is not a damaged table.
            if isinstance(err, MemoryPipelineError) or not _LANCE_ERROR.search(str(err)):
                raise
            raise StoreError(f"the table could not be read: {err}", hint="if its files are damaged, rebuild it: memory index --force") from err

    return reading


class MemorySearcher:
    """The table and provider opened once; each ``search`` is one query (what eval and benchmarks reuse)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._roots = {s.name: str(s.path) for s in settings.sources}
        # The current generation: while a new model's generation builds, this is still the old one,
        # and the query is embedded by the provider that built it.
        table_name, record = generations.current(settings)
        self.store = VectorStore(settings.lancedb_uri, table_name)
        self.table = self.store.open()
        self.dims = self.store.dims() if self.table is not None else 0
        self.provider = query_provider(settings, record) if self.dims else None
        self.has_ann = self.store.vector_index() is not None if self.dims else False
        self._pool: ThreadPoolExecutor | None = None
        # In-memory full-text legs running on the pool at once; past this a query runs its own (``ranked``).
        self._leg_slots = threading.BoundedSemaphore(2)
        self._layout: tuple[int, int, int] | None = None  # (table version, rows, documents with a document text)
        self._layout_lock = threading.Lock()  # one count of a new version's rows at a time (a server's threads share a searcher)
        self._term_weights = TermWeights()  # the full-text leg's per-term weights, for the table version searched
        self._flat: FlatVectors | None = None
        self._flat_lock = threading.Lock()  # one load of the vectors at a time (a server's threads share a searcher)
        self._asked: tuple[int, int] = (-1, 0)  # (table version, queries asked of it)
        self._flat_failed = -1  # a table version whose vectors could not be read or taken
        self._taken_vectors = VectorCache()  # vectors taken from the table (tables over FLAT_MAX_BYTES)
        self._text: TextIndex | None = None  # the full-text statistics of one table version in memory
        self._text_lock = threading.Lock()  # one build at a time
        self._text_asked: tuple[int, int] = (-1, 0)  # (table version, queries asked of it) for the full-text index
        self._text_failed = -1  # a table version whose texts could not be read (or cannot be analysed here)
        self._text_cache: EncodeCache | None = None  # each text's terms, from one version's build to the next
        self._text_thread: threading.Thread | None = None
        self._text_build_lock = threading.Lock()  # one build at a time: builds share the encodings and term ids

    def warm(self) -> None:
        """Load now what a long-lived searcher otherwise loads from its second query of a table
        version: the vectors in memory (``FlatVectors``) and the full-text statistics
        (``TextIndex``), each when the table fits them. ``memory eval`` calls it before timing
        queries, the server at start-up."""
        if self.table is None:
            return
        layout = self._table_layout()
        if self.dims:
            self._asked = (layout[0], max(self._asked[1], 1) if self._asked[0] == layout[0] else 1)
            self._flat_vectors(layout)
        self._build_text(layout)

    def _text_index(self, layout: tuple[int, int, int]) -> TextIndex | None:
        """The in-memory full-text statistics of this table version, when they are loaded; from the
        second query asked of a version on, their build starts in the background (queries ask
        LanceDB meanwhile, and always on a table over ``TEXT_INDEX_MAX_ROWS`` or without document
        texts). Like ``FlatVectors``, a one-query searcher (the CLI's) never builds them."""
        version, rows, docs = layout
        index = self._text
        if index is not None and index.version == version:
            return index
        if not docs or rows > TEXT_INDEX_MAX_ROWS or version == self._text_failed:
            return None
        with self._text_lock:
            asked_version, asked = self._text_asked
            if asked_version > version:
                return None
            self._text_asked = (version, asked + 1 if asked_version == version else 1)
            if self._text_asked[1] < 2 or (self._text_thread is not None and self._text_thread.is_alive()):
                return None
            thread = threading.Thread(target=self._build_text, args=(layout,), name="memory-text-index", daemon=True)
            self._text_thread = thread
        thread.start()
        return None

    def _build_text(self, layout: tuple[int, int, int]) -> None:
        """Build the ``TextIndex`` of ``layout``'s version (see ``_text_index``); a failure leaves the
        searcher asking LanceDB for that version."""
        version, rows, docs = layout
        if self.table is None or not docs or rows > TEXT_INDEX_MAX_ROWS:
            return
        with self._text_build_lock:  # ``warm`` and a query's background build may meet
            self._build_text_locked(version)

    def _build_text_locked(self, version: int) -> None:
        assert self.table is not None
        index = self._text
        if index is not None and index.version >= version:
            return
        try:
            # The analysis of the table's own FTS index (a config changed since without a rebuild
            # is not the index's), and a handle of its own pinned to ``version``: the build runs in
            # the background, and whoever holds ``self.table`` may check it out at another version
            # meanwhile (the server does not since it hands later searches a copy of the searcher
            # on a handle of its own, ``service/warm.py``; a Python API caller may).
            details = next((getattr(i, "index_details", None) or {} for i in self.table.list_indices() if list(i.columns) == [DOC_FTS_COLUMN]), None)
            if details is None:
                raise ValueError("the document column has no full-text index")
            analysis = (str(details.get("language", "English")), bool(details.get("stem", True)), bool(details.get("ascii_folding", True)))
            if self._text_cache is None or self._text_cache.analyzer.analysis != analysis:
                self._text_cache = EncodeCache(Analyzer(language=analysis[0], stem=analysis[1], ascii_folding=analysis[2]))
            pinned = VectorStore(self.store.uri, self.store.table_name).open()
            if pinned is None:
                return
            pinned.checkout(version)
            built = TextIndex.build(
                pinned, version, chunk_column=FTS_COLUMN, doc_column=DOC_FTS_COLUMN, analyzer=self._text_cache.analyzer, cache=self._text_cache
            )
        except Exception as err:  # noqa: BLE001 - a background thread: any failure leaves this version to LanceDB, said once
            log.info("the table's full-text statistics could not be loaded into memory (%s): asking LanceDB", err)
            self._text_failed = version
            return
        if built is None:  # texts this index cannot analyse
            self._text_failed = version
            return
        index = self._text
        if index is None or index.version < version:
            self._text = built

    def options(self, **kw) -> QueryOptions:
        """One query's options: the knobs given (None means unset), the rest from ``settings.query``."""
        q = self.settings.query
        return QueryOptions(
            max_results=kw.pop("max_results", None) or q.max_results,
            min_score=q.min_score if kw.get("min_score") is None else kw["min_score"],
            mode=kw.get("mode") or "hybrid",
            fusion=kw.get("fusion") or q.fusion,
            mmr=q.mmr if kw.get("mmr") is None else kw["mmr"],
            mmr_lambda=q.mmr_lambda if kw.get("mmr_lambda") is None else kw["mmr_lambda"],
            recency_half_life_days=(q.recency_half_life_days if kw.get("recency_half_life_days") is None else kw["recency_half_life_days"]),
            filters=kw.get("filters") or SearchFilters(),
            now=kw.get("now"),
            query_media=tuple(kw.get("query_media") or ()),
        )

    @_table_errors
    def search(self, query: str, opts: QueryOptions) -> list[SearchResult]:
        """The best ``opts.max_results`` results of one query."""
        terms = parse_query(query).highlight_terms or query_terms(query)
        ranked = self.ranked(query, opts, light=True, top=opts.max_results)
        bare = any("path" not in c.row for c in ranked)
        shown = self._shown(ranked, opts)
        if bare and any(_is_note(c) for c in shown) and _note_files_among(shown, ranked):
            # A media file's note is dropped when the file is a candidate too, which only the
            # candidates' paths tell: ranked again on them. Only when a shown note's own file is
            # among the candidates (by document id; or a candidate's is unknown), not for every
            # note shown (each ranking costs the whole search again).
            shown = self._shown(self.ranked(query, opts, light=True), opts)
        return [self._result(c, terms, self._roots) for c in shown]

    def _shown(self, ranked: list[Candidate], opts: QueryOptions) -> list[Candidate]:
        """The best ``opts.max_results`` of ``ranked`` with their whole rows, in the results' order."""
        shown: list[Candidate] = []
        start = 0
        while len(shown) < opts.max_results and start < len(ranked):
            # A chunk gone from the table between the ranking and the take leaves a hole: the next
            # ones fill it. Those tied with the last one taken come too (ties go by path and line).
            end = start + opts.max_results - len(shown)
            while end < len(ranked) and _scores(ranked[end]) == _scores(ranked[end - 1]):
                end += 1
            part = ranked[start:end]
            start = end
            shown += self.materialize(part)
        if not opts.mmr:
            shown.sort(key=_order)  # a no-op unless ranking left ties in any order
        return shown[: opts.max_results]

    @_table_errors
    def ranked(self, query: str, opts: QueryOptions, *, pool: int | None = None, light: bool = False, top: int | None = None) -> list[Candidate]:
        """Every candidate above ``min_score``, best first (MMR order when on).

        ``light``: when nothing of this query needs a candidate's text to rank or keep it, the
        candidates carry ``_RANK_COLUMNS`` only and their relevance still lacks the identifier
        factor (``Candidate.pending_ids``): ``materialize`` completes the ones shown. (Weighted
        and RRF fusion order by the legs' scores; the identifier factor only moves relevance, so
        it is read before the cut only when ``min_score`` drops candidates by relevance.) Taking
        every candidate's text cost a SciFact query at ``memory eval``'s depth (about a thousand
        candidates) a third of its time.

        ``top`` (with ``light``): the caller shows only the best ``top`` (``search``). When nothing
        else reads a candidate's columns either (no recency), ranking reads none: the candidates
        keep the ids the legs read, ties of the three scores are left in any order, media notes
        are not dropped, and ``search`` takes the whole rows of the best ``top`` and of those tied
        with the last of them, orders those as ranking whole rows would, and ranks again with
        the columns when one of them is a media note."""
        if opts.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {opts.mode!r}", key="mode")
        if opts.fusion not in FUSIONS:
            raise ConfigError(f"fusion must be one of {', '.join(FUSIONS)}, got {opts.fusion!r}", key="fusion")
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate (bytes that are not UTF-8, decoded by surrogateescape): the tokenizer raised TypeError
            raise ConfigError(f"the query is not valid Unicode (a lone surrogate at character {err.start})", key="query", hint=ConfigError.NO_HINT) from None
        wanted = opts.filters.source
        if wanted and all(s.name != wanted for s in self.settings.sources):
            # Not an empty answer: "nothing relevant" would be a wrong claim about a source that does not exist.
            names = ", ".join(s.name for s in self.settings.sources)
            raise ConfigError(f"unknown source {wanted!r}", key="source", hint=f"one of: {names}")
        query = query.strip()
        native = self._native_query_vector(opts.query_media) if opts.query_media and self.table is not None else None
        if opts.query_media and native is None and not query and self.table is not None and self.provider is None:
            # A file to search with by its own vector, and no provider to embed it (a missing key):
            # say so, rather than answer nothing.
            raise ConfigError(
                f"a native media query needs the {self.settings.provider} provider to embed the file, and it is not available here",
                key="retrieval_mode",
                hint="set the provider's API key in the environment (e.g. GEMINI_API_KEY), or search with the file's text: --retrieval-mode text",
            )
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
        parsed = parse_query(query)
        if query and not parsed.clauses and native is None:
            return []  # punctuation, operators or quotes alone: nothing to look for
        # The table version this query runs on, read once: each read of the handle's version is a
        # round trip through LanceDB's event loop (0.2 ms alone, 1.6 ms while the full-text leg
        # runs beside it, measured on SciFact at memory eval's depth).
        layout = self._table_layout()
        where = opts.filters.where()
        # Chunk vectors are needed to score FTS hits against the query (hybrid) and for MMR.
        want_vectors = self.provider is not None and (mode == "hybrid" or opts.mmr)
        # The full-text leg runs in a second thread while the query is embedded and the vector
        # leg searched (torch and LanceDB release the GIL): hybrid costs the slower leg, not both.
        # Both legs read ids and scores only where they can; the rows kept are taken afterwards
        # in one round trip by row id (``_full_rows``).
        # A query of plain words on a table whose full-text statistics are in memory: the whole
        # full-text leg there (``textindex``), no query to LanceDB.
        text_index = self._text_index(layout) if mode in ("hybrid", "fts") and serves(parsed, where) else None
        flat = self._flat
        rank_rows = flat.rank_row if flat is not None and flat.version == layout[0] and flat.rank_columns and light else None
        in_memory: TextLeg | None = None
        leg_future: Future | None = None
        if text_index is not None and analysable(parsed):
            # Hybrid: the in-memory leg on a worker thread while this one embeds the query and
            # scores the vectors (ONNX and BLAS release the interpreter lock): the two legs overlap.
            if mode == "hybrid" and self._leg_slots.acquire(blocking=False):
                leg_future = self._executor().submit(self._in_memory_leg, text_index, parsed, pool, rank_rows)
            else:  # full text alone, or every worker busy (a loaded server): here
                in_memory = doc_leg(text_index, parsed, limit=pool, row_of=rank_rows)
        on_lancedb = mode in ("hybrid", "fts") and in_memory is None and leg_future is None
        doc_query = self._doc_query(parsed, layout) if on_lancedb else None
        fts_future = self._executor().submit(self._fts, parsed, where, pool, layout, query=doc_query) if on_lancedb else None
        qvec = native
        vector_text = parsed.vector_text
        if qvec is None and self.provider is not None and mode != "fts" and vector_text:
            try:
                qvec = self.provider.embed_query(vector_text)
            except ProviderError as err:
                # The provider is down or refuses: full-text still answers, and says so.
                if mode == "vector":
                    raise
                log.warning("the query could not be embedded (%s); answering with full-text search only", err)
                mode = "fts"
        if qvec is None and mode == "hybrid":
            mode = "fts"  # nothing for the vector leg (a query of excluded words only)
        candidates: dict[str, Candidate] = {}

        sums: Future | None = None
        asked: list[str] = []
        flat_sims: np.ndarray | None = None  # the query's similarity to every chunk, when the in-memory vectors answered
        if mode in ("hybrid", "vector") and qvec is not None:
            # Hybrid: a quoted phrase shapes the full-text leg; the vector leg honours exclusions and operators.
            vector_clauses = parsed.vector_clauses if mode == "hybrid" else parsed
            rows, vecs, flat_sims = self._vector_rows(qvec, where, vector_clauses, pool, layout, with_vectors=opts.mmr)
            for row, vec in zip(rows, vecs):
                candidates[row["chunk_id"]] = Candidate(row, sv=max(0.0, 1.0 - float(row["_distance"])), vector=vec)
            if doc_query is not None and doc_query.terms and rows:  # a document query: the table has document texts
                # The vector hits' whole-document full-text scores, measured while the full-text
                # leg still runs (most of them are not among its documents).
                asked = list(dict.fromkeys(r.get("doc_id") or r["chunk_id"] for r in rows))
                sums = self._executor().submit(doc_query.sums, asked, where)

        leg: TextLeg | None = in_memory
        if leg_future is not None and (leg := leg_future.result()) is None:  # not for ``analysable`` queries: LanceDB answers
            try:
                leg = self._fts(parsed, where, pool, layout, query=self._doc_query(parsed, layout))
            except FullTextUnavailable as err:
                log.info("no full-text leg for this query: %s", err)
        if fts_future is not None:
            try:
                leg = fts_future.result()
            except FullTextUnavailable as err:
                log.info("no full-text leg for this query: %s", err)
                leg = None
        known: dict[str, float] | None = None
        if sums is not None:
            try:
                known = sums.result()
            except (FullTextUnavailable, SearchError) as err:
                log.info("the vector hits' full-text scores could not be read: %s", err)
                asked = []
        fts_only = [cid for cid in leg.rows if cid not in candidates] if leg is not None else []
        for cid in fts_only:
            candidates[cid] = Candidate(leg.rows[cid])  # pyright: ignore[reportOptionalMemberAccess] - fts_only is empty without a leg
        id_terms = identifier_terms(vector_text) if mode != "fts" else []
        # Text is read to rank: a leg scored per chunk estimates the vector hits' text scores from
        # it, MMR may compare texts, and abstention reads relevance with its identifier factor.
        needs_text = not light or opts.mmr or (leg is not None and not leg.doc_level) or bool(id_terms and opts.min_score > 0)
        # The kept rows (whole, or what ranking reads), and the vectors of the chunks only full
        # text found (hybrid scores them by their vector too), in one take. Ranking reads the rank
        # columns alone when the in-memory vectors hold them (no take at all) or when there are
        # more rows to take than a second take of the results' whole rows costs.
        flat = self._flat
        served = flat is not None and flat.version == layout[0] and bool(flat.rank_columns)
        # The full-text hits' vector scores from the similarities the vector leg computed over
        # every chunk: no vectors taken or stacked (only MMR compares the vectors themselves).
        if flat_sims is not None and flat is not None and flat.version == layout[0] and not opts.mmr:
            at = [flat.position.get(cid) for cid in fts_only]
            if None not in at:  # always, on one version's vectors
                for cid, sim in zip(fts_only, np.maximum(flat_sims[np.asarray(at, dtype=np.int64)], 0.0).tolist()):
                    candidates[cid].sv = sim
                want_vectors = False
        # Nothing read of the rows at all: a take of a few rows costs per column (at 100k chunks
        # 10.0 ms of CPU for 48 rows with every column, 5.7 ms for 6), so the shown rows alone are taken.
        bare = top is not None and not needs_text and not served and opts.recency_half_life_days <= 0
        if bare:
            vectors = self._vectors_taken(candidates, fts_only, layout[0]) if want_vectors else {}
        else:
            light_rows = not needs_text and (served or sum(1 for c in candidates.values() if "text" not in c.row) > LIGHT_MIN_ROWS)
            vectors = self._full_rows(candidates, fts_only if want_vectors else [], layout[0], _RANK_COLUMNS if light_rows else _COLUMNS)
        if want_vectors and (lacking := [cid for cid in fts_only if cid not in vectors]):
            vectors.update(self._vectors_of(lacking, layout[0]))
        if vectors and qvec is not None:  # the query's similarity to all of them in one product
            ids = list(vectors)
            sims = np.stack([vectors[c] for c in ids]) @ qvec
            for cid, sim in zip(ids, np.maximum(sims, 0.0).tolist()):
                if cid in candidates:
                    candidates[cid].sv = sim
        for cid, vec in vectors.items():
            if cid in candidates:
                candidates[cid].vector = vec
        if leg is not None:
            if leg.doc_level:
                # Every candidate gets its document's exact whole-document BM25, vector hits included
                # (an in-memory leg holds every document's already).
                if not leg.scores_every_document:
                    leg.complete((c.row.get("doc_id") or cid for cid, c in candidates.items()), known=known, asked=asked)
                pairs = [(cid, c.row.get("doc_id") or cid) for cid, c in candidates.items()]
                for cand, (st, st_chunk) in zip(candidates.values(), leg.strengths(pairs)):
                    cand.st, cand.st_chunk = st, st_chunk
            else:
                for cid, cand in candidates.items():
                    doc = cand.row.get("doc_id") or cid
                    if cid in leg.rows:
                        cand.st = leg.strength(doc)
                        cand.st_chunk = leg.chunk_strength(cid)
                    elif leg.doc_terms(doc):
                        cand.st = leg.strength(doc)  # another chunk of its document holds the words
                    else:
                        cand.st = leg.estimate(haystack(cand.row))
        elif mode == "fts":
            return []

        cands = list(candidates.values())
        self._score(cands, mode, opts, id_terms, with_ids=needs_text)
        cands = abstain(cands, opts.min_score)
        if not bare:
            cands = _without_media_notes(cands)
        if bare:  # ties by path and line among the shown ones (``search``)
            cands.sort(key=_scores)
        else:
            cands.sort(key=_order)
        if opts.mmr and len(cands) > 1:
            cands = mmr(cands, parsed.highlight_terms, opts.mmr_lambda, limit=len(cands))
        return cands

    def _vector_rows(
        self, qvec: np.ndarray, where: str | None, parsed: ParsedQuery, pool: int, layout: tuple[int, int, int], *, with_vectors: bool = True
    ) -> tuple[list[dict], Sequence[np.ndarray | None], np.ndarray | None]:
        """The vector leg: nearest chunks, within the filters and the query's required/excluded
        clauses; their vectors too when ``with_vectors`` (MMR compares them), else None each; and
        when the in-memory vectors answered, the query's similarity to every chunk of their version."""
        constraint = parsed.sql_filter(FTS_COLUMN)
        full_where = " AND ".join(f"({w})" for w in (where, constraint) if w) or None

        table = self.table
        assert table is not None  # ranked() returns early without a table
        flat = self._flat_vectors(layout) if full_where is None else None
        if flat is not None and (got := self._flat_rows(flat, qvec, pool)) is not None:
            return got

        # Ids and distances only (the rows kept are taken later, ``_full_rows``), unless the
        # query's clauses are checked on the text here.
        light = not parsed.constrains
        columns = (_IDS if light else _COLUMNS) + (["vector", "_distance"] if with_vectors else ["_distance"])

        def run(w: str | None) -> pa.Table:
            return lanceaio.run(table, [VectorQuery(qvec, "vector", columns, pool, w, self.settings.ann, row_id=light)])[0]

        try:
            found = run(full_where)
        except (ValueError, RuntimeError, OSError):
            if constraint is None:
                raise
            found = run(where)  # a regex LanceDB refuses: checked on the text below instead
        # The vectors as one float32 matrix (no Python float per dimension), the rest as dicts.
        rows = _rows_of(found, self.dims)
        vecs: list[np.ndarray | None] = [r.pop("vector", None) for r in rows]
        if not parsed.constrains:
            return rows, vecs, None
        keep = [i for i, r in enumerate(rows) if parsed.accepts(haystack(r))]
        return [rows[i] for i in keep], [vecs[i] for i in keep], None

    def _flat_vectors(self, layout: tuple[int, int, int]) -> FlatVectors | None:
        """The table's vectors in memory, for a table that fits ``FLAT_MAX_BYTES``, from the second
        query asked of a table version on (a one-query searcher, the CLI's, does not read them all).

        A server's threads share the searcher (later versions get a copy on a handle of its own,
        ``service/warm.py``); whoever holds the table handle may still move it: a query never
        waits for another's load (it scans meanwhile), never replaces newer vectors with older
        ones, keeps only vectors read at one version from start to end, and after a failed read
        or take does not try that version again."""
        assert self.table is not None
        version, rows, _ = layout
        flat = self._flat
        if flat is not None and flat.version == version:
            return flat
        if not self._flat_lock.acquire(blocking=False):
            return None  # another query is reading them: this one scans
        try:
            flat = self._flat
            if flat is not None and flat.version >= version:
                return flat if flat.version == version else None  # this query runs on an older version
            asked_version, asked = self._asked
            if asked_version > version:
                return None
            self._asked = (version, asked + 1 if asked_version == version else 1)
            if self._asked[1] < 2 or version == self._flat_failed or rows * self.dims * 4 > FLAT_MAX_BYTES:
                return None
            try:
                # Read through a handle of its own pinned to ``version``: the shared handle is not
                # this method's to move, and whoever holds it may check out another version.
                pinned = VectorStore(self.store.uri, self.store.table_name).open()
                if pinned is None:
                    return None
                pinned.checkout(version)
                flat = FlatVectors.load(pinned, version, self.dims)
            except (ValueError, RuntimeError, OSError) as err:
                log.info("the table's vectors could not be read into memory (%s): searching the table", err)
                self._flat_failed = version
                return None
            if int(self.table.version) != version:
                return None  # the handle moved on while they were read: not one version's vectors
            self._flat = flat
            return flat
        finally:
            self._flat_lock.release()

    def _flat_rows(self, flat: FlatVectors, qvec: np.ndarray, pool: int) -> tuple[list[dict], list[np.ndarray], np.ndarray] | None:
        """The vector leg from ``flat``: the nearest chunks as ids, row ids and distances (their
        rows are taken with the full-text leg's, ``_full_rows``), their vectors, and the query's
        similarity to every chunk (the full-text hits' vector scores are read there); None when
        the table handle moved to another version meanwhile (the row ids are ``flat``'s)."""
        sims = flat.similarities(qvec)
        hits = flat.nearest(qvec, pool, sims=sims)
        assert self.table is not None
        if int(self.table.version) != flat.version:
            return None
        # With the ranking columns when held (nothing is taken to rank these rows).
        rows: list[dict] = [{"chunk_id": flat.ids[i], "doc_id": flat.doc_ids[i]} if not flat.rank_columns else flat.row_at(i) for i, _ in hits]
        for row, (i, sim) in zip(rows, hits):
            row["_rowid"], row["_distance"], row[_FLAT] = int(flat.row_ids[i]), 1.0 - sim, flat.version
        return rows, [flat.matrix[i] for i, _ in hits], sims

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
        vecs = self.provider.embed_media(items)  # pyright: ignore[reportAttributeAccessIssue] - multimodal providers only (checked above)
        return normalize_vectors(vecs.mean(axis=0))[0]

    def _in_memory_leg(self, text_index: TextIndex, parsed: ParsedQuery, pool: int, rank_rows) -> TextLeg | None:
        """``doc_leg`` on a worker thread; frees its slot (``_leg_slots``) when done."""
        try:
            return doc_leg(text_index, parsed, limit=pool, row_of=rank_rows)
        finally:
            self._leg_slots.release()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memory-fts")
        return self._pool

    def _held_vectors(self, chunk_ids: Iterable[str], version: int) -> dict[str, np.ndarray]:
        """The vectors of these chunks this searcher holds without a query: the in-memory vectors
        when they are this ``version``'s, else those it took from the table before (``VectorCache``)."""
        flat = self._flat
        if flat is not None and flat.version == version:
            return {c: v for c in chunk_ids if (v := flat.vector(c)) is not None}
        return self._taken_vectors.get_many(chunk_ids)

    def _vectors_of(self, chunk_ids: list[str], version: int) -> dict[str, np.ndarray]:
        """The stored vectors of these chunks, in one query (the full-text leg reads no vectors:
        one BM25 query per word would fetch each row's vector again for every word)."""
        assert self.table is not None
        got = self._held_vectors(chunk_ids, version)
        lacking = [c for c in chunk_ids if c not in got]
        if not lacking:
            return got
        ids = ", ".join(sql_str(c) for c in lacking)
        found = self.table.search().where(f"chunk_id IN ({ids})").select(["chunk_id", "vector"]).limit(len(lacking)).to_arrow()
        taken = dict(zip(found.column("chunk_id").to_pylist(), _matrix(found.column("vector"), self.dims)))
        self._taken_vectors.put_many(taken)
        return got | taken

    def _full_rows(
        self, candidates: dict[str, Candidate], vector_ids: Sequence[str], version: int, columns: Sequence[str] = tuple(_COLUMNS)
    ) -> dict[str, np.ndarray]:
        """Candidates read as ids and scores get ``columns`` of their rows (whole rows by default,
        ``_RANK_COLUMNS`` for ranking alone), taken by row id in one round trip; with them the
        vectors of ``vector_ids`` (those held already from ``_held_vectors``; the others taken are kept).
        Row ids are a table version's: a row taken under another chunk id (the handle moved on,
        the table compacted) is looked up by chunk id instead, and a candidate whose chunk is gone
        from the table is dropped."""
        assert self.table is not None
        marker = "text" if "text" in columns else "path"  # a row read with ``columns`` has this
        light = [cid for cid, c in candidates.items() if marker not in c.row]
        flat = self._flat
        if flat is None or flat.version != version:
            flat = None
        wanted = set(vector_ids)
        vectors = self._held_vectors(wanted, version) if wanted else {}
        if flat is not None:
            if marker == "path":  # a light ranking: this version's rank columns are in memory
                for cid in light:
                    if (row := flat.rank_row(cid)) is not None:
                        candidates[cid].row = _found_the_same_way(candidates[cid].row, row)
                light = [cid for cid in light if marker not in candidates[cid].row]
        if not light:
            return vectors
        with_vec = bool(wanted - vectors.keys())
        columns = list(columns) + (["vector"] if with_vec else [])
        got: dict[str, dict] = {}
        taken = [cid for cid in light if candidates[cid].row.get("_rowid") is not None]
        if taken:
            try:
                found = lanceaio.run(self.table, [lanceaio.Take([int(candidates[c].row["_rowid"]) for c in taken], columns)])[0]
                got = {r["chunk_id"]: r for r in _rows_of(found, self.dims)}
            except (ValueError, RuntimeError, OSError) as err:
                # LanceDB leaves stale row ids out (checked by chunk id below); an error here is the
                # storage failing the read: the rows are looked up by chunk id instead.
                log.info("the candidates' rows could not be taken by row id (%s): looking them up", err)
                versions = {candidates[c].row.get(_FLAT) for c in taken} - {None}
                flat = self._flat
                if flat is not None and flat.version in versions:
                    # Those in-memory vectors' row ids do not serve: dropped, and not read again
                    # for their version (queries scan meanwhile). Newer ones another query loaded stay.
                    self._flat_failed = flat.version
                    self._flat = None
        missing = [cid for cid in light if cid not in got]
        for i in range(0, len(missing), 500):
            part = missing[i : i + 500]
            try:
                found = self.table.search().where(f"chunk_id IN ({', '.join(sql_str(c) for c in part)})").select(columns).limit(len(part)).to_arrow()
            except (ValueError, RuntimeError, OSError) as err:
                raise StoreError(f"the results' rows could not be read from the table: {err}") from err
            got.update((r["chunk_id"], r) for r in _rows_of(found, self.dims))
        fresh: dict[str, np.ndarray] = {}
        for cid in light:
            row = got.get(cid)
            if row is None:
                del candidates[cid]  # gone from the table since the legs read it
                continue
            vec = row.pop("vector", None)
            if cid in wanted and vec is not None and cid not in vectors:
                fresh[cid] = vec
            candidates[cid].row = _found_the_same_way(candidates[cid].row, row)
        if fresh:
            self._taken_vectors.put_many(fresh)
            vectors.update(fresh)
        return vectors

    def _vectors_taken(self, candidates: dict[str, Candidate], chunk_ids: Sequence[str], version: int) -> dict[str, np.ndarray]:
        """The vectors of ``chunk_ids`` (full-text hits) from the in-memory vectors, else one take by
        row id; any still lacking (stale row ids) are looked up by chunk id by the caller."""
        assert self.table is not None
        got = self._held_vectors(chunk_ids, version)
        taken = [c for c in chunk_ids if c not in got and candidates[c].row.get("_rowid") is not None]
        if taken:
            try:
                found = lanceaio.run(self.table, [lanceaio.Take([int(candidates[c].row["_rowid"]) for c in taken], ["chunk_id", "vector"])])[0]
            except (ValueError, RuntimeError, OSError) as err:
                log.info("the full-text hits' vectors could not be taken by row id (%s): looking them up", err)
            else:
                fresh = dict(zip(found.column("chunk_id").to_pylist(), _matrix(found.column("vector"), self.dims)))
                self._taken_vectors.put_many(fresh)
                got.update(fresh)
        return got

    def materialize(self, cands: list[Candidate]) -> list[Candidate]:
        """Candidates ranked on ``_RANK_COLUMNS`` (``ranked(..., light=True)``) with their whole
        rows, taken in one round trip, and their relevance's identifier factor (it reads the
        text); a candidate whose chunk has left the table since is dropped."""
        byid = {c.row["chunk_id"]: c for c in cands}
        if self.table is not None and any("text" not in c.row for c in cands):
            self._full_rows(byid, [], -1)
        kept = [c for c in cands if c.row["chunk_id"] in byid]
        for c in kept:
            if c.pending_ids:
                c.relevance *= identifier_factor(list(c.pending_ids), haystack(c.row))
                c.pending_ids = ()
        return kept

    def _table_layout(self) -> tuple[int, int, int]:
        """(table version, rows, documents scored by their whole text): the last is 0 unless every
        document of the table has its document text (a table written before ``DOC_FTS_COLUMN``
        existed, or one half-way through ``add_document_text``, is scored per chunk). Checked again
        when the table's version changes (a long-lived searcher sees the index grow)."""
        assert self.table is not None
        version = int(self.table.version)
        layout = self._layout
        if layout is not None and layout[0] == version:
            return layout
        # The counts read the document column of every row (40-75 ms of CPU at 100k chunks): when a
        # writer commits, the server's threads all meet the new version at once, and each counted it
        # again (16 threads beside a writer committing every 2 s: 27 -> 32.5 searches/s with one
        # count). One counts; the others wait for it.
        with self._layout_lock:
            layout = self._layout
            if layout is not None and layout[0] == version:
                return layout
            rows = self.table.count_rows()
            docs = 0
            if DOC_FTS_COLUMN in self.table.schema.names:
                docs = self.table.count_rows(f"{DOC_FTS_COLUMN} != ''")  # null or empty: no document text
                if docs and self.table.count_rows(f"chunk_index = 0 AND {DOC_FTS_COLUMN} IS NULL"):
                    docs = 0  # not every document has one yet
            layout = (version, rows, docs)
            if self._layout is None or self._layout[0] <= version:
                self._layout = layout
            return layout

    def _doc_query(self, parsed: ParsedQuery, layout: tuple[int, int, int]) -> DocQuery | None:
        """The query's terms for the document-level full-text leg, on a table that has one."""
        if self.table is None or not layout[2] or not (parsed.words or parsed.phrases):
            return None
        return DocQuery.of(self.table, parsed, column=FTS_COLUMN, doc_column=DOC_FTS_COLUMN)

    def _fts(self, parsed: ParsedQuery, where: str | None, pool: int, layout: tuple[int, int, int], *, query: DocQuery | None = None) -> TextLeg:
        assert self.table is not None  # ranked() returns early without a table
        version, rows, docs = layout
        if docs and (parsed.words or parsed.phrases):
            # Ids and scores only, unless the query's clauses are checked on the text there;
            # ``text_leg`` reads whole rows (it folds their text for its truncated lists).
            light = not parsed.constrains
            return doc_text_leg(
                self.table, parsed, column=FTS_COLUMN, doc_column=DOC_FTS_COLUMN, where=where, limit=pool,
                columns=_IDS if light else list(_COLUMNS), row_ids=light, folded_text=haystack, total_docs=docs, term_weights=self._term_weights.at(version), query=query,
            )  # fmt: skip
        return text_leg(
            self.table, parsed, column=FTS_COLUMN, where=where, limit=pool, columns=list(_COLUMNS),
            folded_text=haystack, total_rows=rows,
        )  # fmt: skip

    def _score(self, cands: list[Candidate], mode: str, opts: QueryOptions, ids: list[str], *, with_ids: bool = True) -> None:
        """Relevance, the fused score and recency; ``with_ids`` False leaves the identifier factor
        to ``materialize`` (the rows have no text yet)."""
        q = self.settings.query
        pending = tuple(ids) if not with_ids else ()
        if ids and with_ids:
            for c in cands:
                c.relevance = relevance(c.sv, c.st, mode, q.vector_weight, q.text_weight) * identifier_factor(ids, haystack(c.row))
                c.pending_ids = pending
        else:
            for c, rel in zip(cands, relevances(cands, mode, q.vector_weight, q.text_weight)):
                c.relevance = rel
                c.pending_ids = pending
        # One leg alone has nothing to fuse: its order is its relevance.
        fusion = fusion_for(opts.fusion if mode == "hybrid" else "weighted", q)
        for c, score in zip(cands, fusion.scores(cands)):
            c.score = score
        if opts.recency_half_life_days > 0:
            today = (opts.now or datetime.now(UTC)).date()
            for c in cands:
                day = file_name_date(c.row["path"])
                if day is None:
                    continue  # undated (evergreen) notes do not age
                c.score *= recency_factor(day, today, opts.recency_half_life_days)

    @staticmethod
    def _result(c: Candidate, terms: list[str], roots: dict[str, str] | None = None) -> SearchResult:
        row = c.row
        # The file where its source is now: a row keeps the path its source had when it was written,
        # and a source folder moved (or its ``path`` changed) leaves every file's content unchanged,
        # so nothing is written again and the stored path would name a folder that is gone.
        root = (roots or {}).get(row["source"])
        where = os.path.join(root, row["path"]) if root else row["original_file_path"] or str(Path(row["path"]))
        snippet, first, last, spans = make_snippet(row["text"], terms)
        line_start, line_end = int(row["line_start"]), int(row["line_end"])
        snippet_locator = row["locator"]
        n_lines = row["text"].count("\n") + 1
        if row["modality"] in ("markdown", "text") and n_lines == line_end - line_start + 1:
            snippet_locator = f"L{line_start + first}-L{line_start + last}"
        day = note_date(row["path"], row.get("created_at"))
        return SearchResult(
            path=where,
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
