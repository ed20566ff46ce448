"""Stage 5, ``memory_vectors``: the LanceDB table agents search.

Takes the manifests, the chunks and the embeddings (shard -> frame, each read when its
shard comes up). Each changed file's rows are replaced in one commit, deleted files' rows
removed, the full-text and ANN indices kept current. What the table holds is recorded per shard
(``memory_vectors/<shard>.state``) only after the commit: a run killed before that is
simply redone by the next one (rows are keyed by chunk id, vectors come from the cache).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory_pipeline import progress, storage
from memory_pipeline.allocator import trim_heap
from memory_pipeline.changes import EmbeddingIdentity, chunk_budget, fingerprint
from memory_pipeline.discovery import MEDIA_MODALITIES, SHARD_KEYS
from memory_pipeline.errors import StoreError
from memory_pipeline.models import (
    CHUNKS_SCHEMA,
    DELETIONS_SCHEMA,
    EXTRACTION_STATUS_SCHEMA,
    INDEXED_STATE_SCHEMA,
    KEPT,
    MANIFEST_SCHEMA,
    embeddings_schema,
)
from memory_pipeline.service import serverfile
from memory_pipeline.settings import Settings
from memory_pipeline.stages import shards
from memory_pipeline.stages.hooks import NO_HOOKS, StageHooks
from memory_pipeline.stores import generations
from memory_pipeline.stores.lance import (
    DOC_FTS_COLUMN,
    FTS_COLUMN,
    SEGMENT_ROWS,
    WRITE_CACHE_MIB,
    VectorStore,
    WriteCounts,
    document_texts,
    file_name_words,
    table_schema,
)

if TYPE_CHECKING:
    import polars as pl


def give_back_memory() -> int:
    """Return memory this process freed but still holds to the system (Python's cycles collected,
    Arrow's pool's unused pages, glibc's heap trimmed); the resident megabytes given back (0 where
    ``/proc`` or glibc is missing: nothing here is worth failing a run for).

    Writing the shards leaves freed frames and row batches in the allocators' free lists, and
    LanceDB's full-text and vector index builds that follow are the run's peak: at 100k chunks
    (10,000 notes, the process's resident size polled) 604 -> 470 MB before the full-text
    build and 652 -> 485 MB before the ANN build; the run's peak 978 -> 756-774 MB (two runs each)."""
    import gc

    before = _resident_mb()
    gc.collect()
    try:
        pa.default_memory_pool().release_unused()
    except Exception:  # noqa: BLE001 - an allocator without the call
        pass
    trim_heap()
    after = _resident_mb()
    return max(0, before - after) if before and after else 0


def _resident_mb() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        pass
    return 0


log = logging.getLogger(__name__)


@dataclass
class WriteStats:
    files_replaced: int = 0
    files_deleted: int = 0
    rows_written: int = 0
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    commits: int = 0
    table_rows: int = 0
    fts: str = ""
    table: str = ""
    generation: str = ""  # current | building | switched (the new generation became current)
    files_pending: int = 0  # files whose vectors are still in a running batch job
    ann: str = ""  # exact (below ann.min_rows), built, folded (new rows added as a delta index), current
    generation_waits_for: list[str] = field(default_factory=list)  # a building generation: files it lacks (the first 5)
    ann_folds: int = 0  # delta indices this run added (one per SEGMENT_ROWS rows it wrote, and its rest)


class _Segments:
    """Folds the rows a run writes into the vector index every SEGMENT_ROWS rows
    (``VectorStore.fold_segment``), so no index build holds more than a segment of them.

    A table without its vector index gets it as soon as it holds ``ann.min_rows`` rows (at the end of
    the group of pieces that crossed them), not a segment of the run's rows later: the first build
    covers every row of the table, and a table that already held nearly ``ann.min_rows`` rows (a
    small memory, grown by an archive) would otherwise build over those and a whole segment, in two
    IVF partitions once that reaches twice ``HNSW_PARTITION_ROWS``, which the next fold merges (see
    ``VectorStore.ensure_ann``)."""

    def __init__(self, store: VectorStore, settings: Settings, *, force: bool = False) -> None:
        self.store, self.settings, self.force = store, settings, force
        self.pending = 0
        self.folds = 0
        self.ann = ""
        # Whether the first build may still come before a segment is pending: None until asked
        # (a table with vectors but no vector index), False once a fold was tried (None again if
        # it failed) or when the index was there.
        self.early: bool | None = None

    def wrote(self, counts: WriteCounts) -> None:
        """Count a commit's rows; the fold waits for :meth:`fold_if_due`, called where the stage holds
        no rows of its own (between two groups of a shard's pieces), unless the rows waiting reach two
        segments (a shard read as one piece, written before pieces, is one group): then it runs now."""
        self.pending += counts.inserted + counts.updated
        if self.pending >= 2 * SEGMENT_ROWS:
            self.fold_if_due()

    def _due(self) -> bool:
        if self.pending >= SEGMENT_ROWS:
            return True
        if not self.pending or self.early is False:
            return False
        if self.early is None:
            self.early = self.store.dims() > 0 and self.store.vector_index() is None
        return self.early and self.store.count_rows() >= self.settings.ann.min_rows

    def fold_if_due(self) -> None:
        if not self._due():
            return
        self.pending = 0
        self.early = False
        give_back_memory()
        try:
            done = self.store.fold_segment(self.settings.ann, retrain=self.force).get("ann", "")
        except StoreError as err:
            # Index upkeep, not the write: the shard's rows are committed and its record follows;
            # the run's end folds what is left (other writers' commits kept conflicting).
            log.warning("%s; the rows are folded at the end of the run", err)
            self.early = None  # asked again at the next group's end: a failed first build is tried again
            return
        if done in ("built", "folded"):
            self.folds += done == "folded"
            self.ann = first_built(self.ann, done)


def first_built(earlier: str, later: str) -> str:
    """What a run did to the vector index, from what its folds did (``earlier``: built or folded)
    and then its end (``later``): "built" if either built it, else what the folds did."""
    return "built" if "built" in (earlier, later) else earlier or later


def write_vectors(
    settings: Settings,
    ident: EmbeddingIdentity,
    *,
    manifests: Mapping[str, pl.DataFrame],
    chunks: Mapping[str, pl.DataFrame],
    embeddings: Mapping[str, pl.DataFrame],
    recreate: bool = False,
    force: bool = False,
    hooks: StageHooks = NO_HOOKS,
    per_shard: dict[str, dict[str, int]] | None = None,
) -> WriteStats:
    """Replace each changed file's rows in one commit, remove deleted files, keep FTS current.

    Works through the shards of ``chunks``, one at a time. A forced run replaces its
    shards whole, which also repairs what no per-file write can see (duplicated ids,
    rows of files the index lost track of). ``per_shard``: filled in with what each shard's
    commit did (files, rows, commits).
    """
    data = storage.of(settings)
    stats = WriteStats()
    # A changed model/provider/dims writes a new generation; searches keep the current one meanwhile.
    table_name, building = generations.write_target(settings, ident.meta())
    stats.table, stats.generation = table_name, "building" if building else "current"
    store = VectorStore(data.lancedb_uri, table_name, cache_mib=WRITE_CACHE_MIB)
    store.ensure(ident.dims, ident.meta(), recreate=recreate)
    fp = fingerprint(settings, ident)
    now = datetime.now(UTC)
    per_shard = per_shard if per_shard is not None else {}
    segments = _Segments(store, settings, force=force)
    for done, shard in enumerate(chunks, start=1):
        before = shards.additive(stats)
        # Of each file, only what the shard's record needs (its content hash), not a dict of every
        # column: those are held through the shard's commits and folds.
        hashes = _arrow(manifests, shard, _HASH_SCHEMA)
        sha256_of = dict(zip(hashes.column("doc_id").to_pylist(), hashes.column("sha256").to_pylist()))
        # Files kept unseen (a folder that cannot be listed, a missing source): a forced run keeps
        # their rows and records, so it cannot clear the shard and write it again whole.
        keeps = KEPT in hashes.column("walk_status").to_pylist()
        del hashes
        # The side records are read where they are (the stages before amended them in place).
        ext_status = data.read("extracted_content", shard, EXTRACTION_STATUS_SCHEMA, ".status")
        replaced = [d for d, s in zip(ext_status.column("doc_id").to_pylist(), ext_status.column("status").to_pylist()) if s == "ok"]
        del ext_status
        deleted = data.read("source_files", shard, DELETIONS_SCHEMA, ".deletions").column("doc_id").to_pylist()
        # Which files wait for vectors, from the two files' keys alone (no vector and no text read).
        keys = _arrow(chunks, shard, _KEYS_SCHEMA)
        vectors = _ShardPieces(chunks, embeddings, shard, ident, keys.num_rows)
        waiting = vectors.waiting(keys)
        if waiting:
            # Their vectors are in a batch job still running: they keep their current rows until it is in.
            replaced = [d for d in replaced if d not in waiting]
            stats.files_pending += len(waiting)
        per_doc: dict[str, int] = defaultdict(int)
        for d in keys.column("doc_id").to_pylist():
            per_doc[d] += 1
        del keys

        # The rows are built and committed a slice of files at a time, never the whole shard at
        # once: a shard holds a sixteenth of the folder, and at 1M chunks one shard's rows built
        # at once took the run's resident size from ~900 MB to ~1,580 MB at each shard's write.
        whole = force and not waiting and not keeps
        if whole:
            every_file = _row_parts(vectors, waiting, settings, ident, now, lambda piece, _last: piece.column("doc_id").to_pylist())
            counts = store.replace_shard((part for _, part in every_file), shard)
            del every_file, vectors
            segments.wrote(counts)
            segments.fold_if_due()
        else:
            counts = WriteCounts()
            # A fold is due at most once a group of pieces, and runs between two groups, when the
            # stage holds none of their rows (a group's rows and their table rows are each ~16k
            # rows with their vectors).
            for docs, part in _row_parts(vectors, waiting, settings, ident, now, _Remaining(set(replaced) | set(deleted)), between=segments.fold_if_due):
                done_part = store.replace_docs(part, docs)
                del part
                counts.add(done_part)
                segments.wrote(done_part)
            del vectors
        hooks.at("write_after_first_commit")
        stats.files_replaced += len(replaced)
        stats.files_deleted += len(deleted)
        stats.rows_inserted += counts.inserted
        stats.rows_updated += counts.updated
        stats.rows_written += counts.inserted + counts.updated
        stats.rows_deleted += counts.deleted
        stats.commits += counts.commits
        # Record what the table now holds, only after the commit succeeded.
        state = {} if whole else {r["doc_id"]: r for r in data.read("memory_vectors", shard, INDEXED_STATE_SCHEMA, ".state").to_pylist()}
        for d in deleted:
            state.pop(d, None)
        for d in replaced:
            state[d] = {"doc_id": d, "sha256": sha256_of[d], "fingerprint": fp, "chunks": per_doc.get(d, 0)}
        data.write_rows(sorted(state.values(), key=lambda r: r["doc_id"]), INDEXED_STATE_SCHEMA, "memory_vectors", shard, ".state")
        per_shard[shard] = {k: v for k, v in shards.delta(before, stats).items() if k not in ("table_rows", "ann_folds")}  # run-level numbers
        progress.report("write", done, len(chunks), "partitions")
    if stats.commits or force:
        # The index builds are the run's peak: what the shards' frames and commits freed goes back
        # to the system first, not under them.
        give_back_memory()
        lacking = store.vector_unindexed()
        # A server for this folder (not this run's own) searches meanwhile: fold this run's rows now.
        stats.fts = store.ensure_fts(settings.fts, rebuild=force, fold=serverfile.serving_elsewhere(data.root)).get("fts", "")
        # Its ``optimize`` (a fold, or the compaction of many fragments) folds every index: the
        # vector index's rows too, as one more delta.
        fts_folded = bool(lacking) and (store.vector_unindexed() or 0) < lacking
        give_back_memory()
        # A forced run that folded nothing (its table has a full-text index) trains the vector
        # index again, as it rebuilds the full-text one: its rows were all replaced, and a changed
        # ``ann.index_type`` takes effect.
        ann = store.ensure_ann(settings.ann, rebuild=force and not segments.ann, fold_rest=bool(segments.ann)).get("ann", "")
        stats.ann_folds = segments.folds + (ann == "folded")
        if fts_folded and ann != "built":  # a retrain replaced that delta
            stats.ann_folds += 1
            ann = "folded"
        stats.ann = first_built(segments.ann, ann) if segments.ann else ann
    else:
        stats.fts = "unchanged"
        stats.ann = "unchanged"
    stats.table_rows = store.count_rows()
    if building:
        stats.generation_waits_for = build_waits_for(settings, fp)
        if not stats.generation_waits_for:
            generations.switch(settings, table_name)
            stats.generation = "switched"
    return stats


def build_waits_for(settings: Settings, fp: str, limit: int = 5) -> list[str]:
    """Up to ``limit`` files a building generation of fingerprint ``fp`` still lacks (``source:path``).

    A file to index that is not in it yet; and a file that cannot be indexed now while the current
    generation (the one searched) holds its rows: its folder cannot be listed (:data:`KEPT`), its
    source folder is missing, or it fails (the rows of its last good version are kept). Switching
    without those would drop them from every search; the switch waits until they can be read (or
    are deleted) instead. A failing file whose rows no served table holds (a generation rolled back
    from, or pruned) is not waited for.
    """
    return [f"{r['source']}:{r['path']}" for r in waiting_rows(settings, fp, limit)]


def waiting_rows(settings: Settings, fp: str, limit: int | None = None) -> list[dict]:
    """The manifest rows :func:`build_waits_for` names (all of them when ``limit`` is None)."""
    data = storage.of(settings)
    waiting: list[dict] = []
    maybe: list[dict] = []  # cannot be indexed now: waited for if the current generation holds rows of it
    for shard in SHARD_KEYS:
        state = {r["doc_id"]: r["fingerprint"] for r in data.read("memory_vectors", shard, INDEXED_STATE_SCHEMA, ".state").to_pylist()}
        status = data.read("extracted_content", shard, EXTRACTION_STATUS_SCHEMA, ".status").to_pylist()
        failed = {r["doc_id"] for r in status if r["status"] == "failed"}
        for row in data.read("source_files", shard, MANIFEST_SCHEMA).to_pylist():
            got = state.get(row["doc_id"])
            if got == fp or not row["path"] or row["path"].endswith("/"):
                continue
            if row["status"] == "ok" and row["doc_id"] not in failed and row["walk_status"] != KEPT:
                waiting.append(row)
                if limit is not None and len(waiting) >= limit:
                    return waiting
            elif got is not None and (row["walk_status"] == KEPT or row["status"] == "failed" or row["doc_id"] in failed):
                maybe.append(row)
    if maybe:
        held = _held_by_current(settings, [r["doc_id"] for r in maybe])
        waiting += [r for r in maybe if r["doc_id"] in held]
    return waiting if limit is None else waiting[:limit]


def _held_by_current(settings: Settings, docs: list[str]) -> set[str]:
    """Which of ``docs`` have rows in the generation searches read."""
    current, _ = generations.current(settings)
    return VectorStore(storage.of(settings).lancedb_uri, current).docs_present(docs)


def reset_index_state(settings: Settings) -> None:
    """Forget what the table holds (it is being rebuilt), so every shard re-indexes."""
    storage.of(settings).drop("memory_vectors", ".state")


def _row_parts(
    vectors: _ShardPieces,
    waiting: set[str],
    settings: Settings,
    ident: EmbeddingIdentity,
    now: datetime,
    docs_of: Callable[[pa.Table, bool], Sequence[str]],
    between: Callable[[], None] = lambda: None,
) -> Iterator[tuple[list[str], pa.Table]]:
    """A shard's table rows in slices of whole files, read a piece at a time (``storage.PIECE_ROWS``
    chunks; the whole shard when it was written as one), each piece with its vectors, the files in
    ``waiting`` left out. ``docs_of(piece, last)``: the files whose rows a piece's commits replace.
    ``between()`` runs after each group's slices, once the group is let go (the caller lets go of
    each part it was given before asking for the next)."""
    for (group, group_vectors), last in vectors.pieces(waiting):
        part = None
        for docs, part in doc_slices(group, docs_of(group, last)):
            yield docs, table_rows(part, settings, ident, now, group_vectors)
        del group, group_vectors, part
        between()


class _Remaining:
    """The files a shard's commits replace, each once, a piece at a time: a piece's own files, and
    with the last piece every file left, also those without rows now (deleted, or nothing left to
    index): its commit removes their rows. A shard of one piece is committed as before pieces."""

    def __init__(self, docs: set[str]) -> None:
        self.todo = docs

    def __call__(self, piece: pa.Table, last: bool) -> list[str]:
        mine = sorted(self.todo if last else self.todo.intersection(piece.column("doc_id").to_pylist()))
        self.todo.difference_update(mine)
        return mine


class _ShardPieces:
    """A shard's chunks with their vectors, a piece at a time (``storage.PIECE_ROWS`` chunks), the
    pieces taken together up to ``SLICE_ROWS`` rows (a commit's worth, as before pieces).

    When the embed stage wrote the shard's vectors in the chunks' pieces (one row group for each,
    in order: it does whenever each piece got vectors), a piece's vectors are read with it, so the
    stage holds a piece's, not a shard's (at a million chunks a shard's are 96 MB). Otherwise (a
    shard written whole, vectors still in a batch job for a whole piece, files on object storage)
    the shard's vectors are read once for all its pieces (:class:`ShardVectors`), and so they are
    the first time a piece lacks a vector it should have.
    """

    def __init__(self, chunks: Mapping[str, pl.DataFrame], embeddings: Mapping[str, pl.DataFrame], shard: str, ident: EmbeddingIdentity, rows: int) -> None:
        self.chunks, self.embeddings, self.shard, self.ident = chunks, embeddings, shard, ident
        self.has_vectors = ident.dims > 0 and rows > 0  # a shard without an embeddings file has no vector at all
        n, m = _row_groups(chunks, shard), _row_groups(embeddings, shard)
        self.aligned = self.has_vectors and n is not None and n >= 1 and n == m
        self._whole: ShardVectors | None = None

    def waiting(self, keys: pa.Table) -> set[str]:
        """Files of the shard with a chunk that has no vector yet (a ``wait: false`` batch still
        running): from the vectors' content hashes alone when the pieces line up, else from the
        shard's vectors, which the pieces will read anyway (one read, one version of the file)."""
        if not self.has_vectors:
            return set()
        if self.aligned:
            schema = pa.schema([embeddings_schema(self.ident.dims).field("content_hash")])
            have: Container[str] = set(_arrow(self.embeddings, self.shard, schema).column("content_hash").to_pylist())
        else:
            have = self.whole().row_of
        return {d for d, h in zip(keys.column("doc_id").to_pylist(), keys.column("content_hash").to_pylist()) if h not in have}

    def whole(self) -> ShardVectors:
        if self._whole is None:
            self._whole = ShardVectors.read(self.embeddings, self.shard, self.ident)
        return self._whole

    def pieces(self, waiting: set[str]) -> Iterator[tuple[tuple[pa.Table, ShardVectors | None], bool]]:
        """``(chunks, their vectors, last)`` per group of pieces, the files in ``waiting`` left out.
        Always one at least (empty for a shard without chunks). A file whose chunks run on into the
        next piece (a file written before pieces, in row groups cut by row count) takes that piece
        into its group: a file's rows are never split between two groups."""
        chunk_pieces = storage.pieces(self.chunks, self.shard, ROW_SOURCE_SCHEMA)
        vector_pieces = storage.pieces(self.embeddings, self.shard, embeddings_schema(self.ident.dims)) if self.aligned else None
        group: list[pa.Table] = []
        group_vectors: list[pa.Table | None] = []
        size = 0
        piece: pa.Table | None = next(chunk_pieces)
        for after in itertools.chain(chunk_pieces, [None]):  # one piece read ahead: which is the last, and where files end
            assert piece is not None
            group.append(piece)
            size += piece.num_rows
            if vector_pieces is not None:
                group_vectors.append(next(vector_pieces, None))
            runs_on = after is not None and piece.num_rows > 0 and after.num_rows > 0 and after.column("doc_id")[0] == piece.column("doc_id")[-1]
            if after is None or (size >= SLICE_ROWS and not runs_on):
                # _group empties the lists: while the consumer works on the group (and folds after
                # it), this frame holds only the piece read ahead
                piece = None
                yield self._group(group, group_vectors, waiting), after is None
                size = 0
            piece = after

    def _group(self, pieces: list[pa.Table], vector_pieces: list[pa.Table | None], waiting: set[str]) -> tuple[pa.Table, ShardVectors | None]:
        """The group's rows and their vectors; both lists are emptied (the group is the caller's)."""
        rows = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
        pieces.clear()
        found = [v for v in vector_pieces if v is not None]
        complete = len(found) == len(vector_pieces)
        vector_pieces.clear()
        if waiting:
            # pyarrow.compute's functions are generated at import time: its stubs do not list them
            rows = rows.filter(pc.invert(pc.is_in(rows.column("doc_id"), pa.array(sorted(waiting), type=pa.string()))))  # pyright: ignore[reportAttributeAccessIssue]
        if not self.has_vectors:
            return rows, None
        if not found or not complete:
            return rows, self.whole()  # no vectors piece for each chunks piece: the shard's vectors
        vectors = ShardVectors.of_table(found[0] if len(found) == 1 else pa.concat_tables(found), self.ident.dims)
        if not all(h in vectors.row_of for h in rows.column("content_hash").to_pylist()):
            vectors = self.whole()  # pieces that do not line up after all: the shard's vectors
        return rows, vectors


def _row_groups(frames: Mapping[str, pl.DataFrame], shard: str) -> int | None:
    return frames.row_groups(shard) if isinstance(frames, storage.LazyFrames) else None


# The chunks' columns the table's rows are made of (not the text as embedded, nor the media file).
ROW_SOURCE_SCHEMA = pa.schema([f for f in CHUNKS_SCHEMA if f.name not in ("embed_text", "media_file")])
# The manifest's columns the shard's record takes: which file, its content hash.
_HASH_SCHEMA = pa.schema([MANIFEST_SCHEMA.field("doc_id"), MANIFEST_SCHEMA.field("sha256"), MANIFEST_SCHEMA.field("walk_status")])
# The chunks' keys: which file, which text.
_KEYS_SCHEMA = pa.schema([CHUNKS_SCHEMA.field("doc_id"), CHUNKS_SCHEMA.field("content_hash")])


def _arrow(frames: Mapping[str, pl.DataFrame], shard: str, schema: pa.Schema) -> pa.Table:
    """A shard of an asset as Arrow in ``schema``: read straight from its file with only those
    columns when the frames are the IO manager's (``LazyFrames``), else converted."""
    if isinstance(frames, storage.LazyFrames):
        return frames.table(shard, schema)
    return storage.conform(frames[shard].to_arrow(), schema)  # a frame without columns reads empty


def _search_text(heading: str, text: str, path: str) -> str:
    return "\n".join(p for p in (heading, text, file_name_words(path)) if p)


def _media_type(modality: str) -> str | None:
    if modality not in MEDIA_MODALITIES:
        return None
    return modality if modality in ("image", "audio", "video") else "document"


# A slice of a shard's files whose rows are built and committed together: at most this many
# files (one commit each, as ``VectorStore.replace_docs`` commits) and, past the first file, rows.
SLICE_FILES = 500
SLICE_ROWS = 16_384


def doc_slices(chunks: pa.Table, doc_ids: Sequence[str], *, max_files: int = SLICE_FILES, max_rows: int = SLICE_ROWS) -> Iterator[tuple[list[str], pa.Table]]:
    """``doc_ids`` (sorted, once each) in slices of whole files, each with its files' rows of
    ``chunks`` (in ``chunks``' order): at most ``max_files`` files, and no more than ``max_rows``
    rows unless one file alone has more (a file's rows are never split between commits). A file
    without rows (deleted, or nothing left to index) still belongs to a slice: its commit removes
    its rows."""
    docs = sorted(set(doc_ids))
    if not docs:
        return
    column = chunks.column("doc_id")
    per_doc: dict[str, int] = defaultdict(int)
    for d in column.to_pylist():
        per_doc[d] += 1
    batch: list[str] = []
    rows = 0
    for d in docs:
        n = per_doc.get(d, 0)
        if batch and (len(batch) >= max_files or rows + n > max_rows):
            yield batch, _rows_of(chunks, column, batch)
            batch, rows = [], 0
        batch.append(d)
        rows += n
    yield batch, _rows_of(chunks, column, batch)


def _rows_of(chunks: pa.Table, column: pa.ChunkedArray, docs: list[str]) -> pa.Table:
    if chunks.num_rows == 0:
        return chunks
    # pyarrow.compute's functions are generated at import time: its stubs do not list them
    return chunks.filter(pc.is_in(column, pa.array(docs, type=pa.string())))  # pyright: ignore[reportAttributeAccessIssue]


@dataclass
class ShardVectors:
    """A shard's vectors from ``chunk_embeddings``, read once for all its slices: a (rows, dims)
    matrix and each content hash's row in it."""

    matrix: np.ndarray
    row_of: dict[str, int]

    @classmethod
    def read(cls, embeddings: Mapping[str, pl.DataFrame], shard: str, ident: EmbeddingIdentity) -> ShardVectors:
        return cls.of_table(_arrow(embeddings, shard, embeddings_schema(ident.dims)), ident.dims)  # no file: no vector at all

    @classmethod
    def of_table(cls, emb: pa.Table, dims: int) -> ShardVectors:
        """The vectors of a ``chunk_embeddings`` table (a shard's, or a piece's)."""
        row_of = {h: i for i, h in enumerate(emb.column("content_hash").to_pylist())}
        matrix = emb.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, dims)
        return cls(np.ascontiguousarray(matrix, dtype=np.float32), row_of)

    def of(self, hashes: Sequence[str]) -> pa.FixedSizeListArray:
        take = np.fromiter((self.row_of[h] for h in hashes), dtype=np.int64, count=len(hashes))
        dims = self.matrix.shape[1]
        return pa.FixedSizeListArray.from_arrays(pa.array(self.matrix[take].reshape(-1), type=pa.float32()), dims)


def table_rows(chunks: pa.Table, settings: Settings, ident: EmbeddingIdentity, now: datetime, vectors: ShardVectors | None) -> pa.Table:
    """The table rows of chunks (whole files of one shard), with their vectors from ``vectors``
    (the shard's ``chunk_embeddings``; None without vectors)."""
    schema = table_schema(ident.dims, ident.meta())
    if chunks.num_rows == 0:
        return schema.empty_table()
    n = chunks.num_rows
    # Joined as strings: pathlib interns every part of every path it parses, and the interpreter's
    # table of interned strings never shrinks (tracemalloc over the writes of a 300k-chunk run: its
    # largest lasting allocation, 3.7 MB, grown by this line; everything else it kept, 1-2 MB).
    src_roots = {s.name: str(s.path) for s in settings.sources}
    c = chunks.to_pydict()
    cols = {
        "chunk_id": c["chunk_id"],
        "doc_id": c["doc_id"],
        "source": c["source"],
        "path": c["path"],
        "shard": c["shard"],
        "chunk_index": c["chunk_index"],
        "heading": c["heading"],
        "text": c["text"],
        FTS_COLUMN: [_search_text(h, t, p) for h, t, p in zip(c["heading"], c["text"], c["path"])],
        # Written with the chunks, in the same commit: a reader never sees a file's chunks without it.
        DOC_FTS_COLUMN: document_texts(c["doc_id"], c["chunk_index"], c["text"], c["path"], max_overlap=chunk_budget(settings, ident)[1]),
        "content_hash": c["content_hash"],
        "line_start": c["line_start"],
        "line_end": c["line_end"],
        "locator": c["locator"],
        "tokens": c["tokens"],
        "modality": c["modality"],
        "mime_type": c["mime_type"],
        "memory_type": ["media" if m in MEDIA_MODALITIES else "text" for m in c["modality"]],
        "media_type": [_media_type(m) for m in c["modality"]],
        "original_file_path": [os.path.join(src_roots[s], p) for s, p in zip(c["source"], c["path"])],
        "file_sha256": c["file_sha256"],
        "created_at": [datetime.fromtimestamp(m / 1e9, UTC) for m in c["file_mtime_ns"]],
        "indexed_at": [now] * n,
        "embedding_model": [ident.model] * n,
    }
    if ident.dims > 0 and vectors is not None:
        cols["vector"] = vectors.of(c["content_hash"])
    return pa.table(cols, schema=schema)


__all__ = ["ShardVectors", "WriteStats", "build_waits_for", "waiting_rows", "doc_slices", "reset_index_state", "table_rows", "write_vectors"]
