"""The stages work through a shard in pieces (issue 16): extraction, chunking, embedding and the
table write each hold a piece of a shard (``storage.PIECE_ROWS`` rows of whole files), not the
shard, so their memory does not grow with the folder.

Here ``PIECE_ROWS`` is made small, so a folder of notes has shards of many pieces, and every
outcome is compared with the same folder indexed without pieces: the same chunk ids, texts and
vectors in the table, the same per-file records and counts, across changes, deletions and a
forced run. The stages are called directly with the deterministic test embedder, as in
test_stages.py; their files are written and read through the storage layer as the IO manager does.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from memory_pipeline import storage
from memory_pipeline.changes import EmbeddingIdentity
from memory_pipeline.models import INDEXED_STATE_SCHEMA, SEGMENTS_SCHEMA, Segment
from memory_pipeline.providers.registry import ResolvedProvider
from memory_pipeline.settings import load_settings
from memory_pipeline.stages import chunk as chunk_stage
from memory_pipeline.stages import write as write_stage
from memory_pipeline.stores.lance import VectorStore
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.embedder import HashEmbedder
from memory_pipeline_tests.unit.test_stages import SHARDS, _frames, _run

WORDS = "heron pond dawn kettle ledger violin harbour lantern quarry meadow cipher bramble".split()


def _note(i: int, version: int = 0) -> str:
    """A note of 1 to 9 paragraphs (so of 1 to about 9 chunks of 64 tokens); every seventh shares
    its text with another (one content hash in two files, often two pieces)."""
    if i % 7 == 3:
        i -= 1
    paragraphs = [f"Paragraph {p} of note {i} (v{version}): " + " ".join(WORDS[(i + p + k) % len(WORDS)] for k in range(40)) for p in range(1 + i % 9)]
    return f"# Note {i}\n\n" + "\n\n".join(paragraphs) + "\n"


def _folder(root: Path, n: int = 90) -> Path:
    mem = root / "mem"
    mem.mkdir(parents=True)
    for i in range(n):
        (mem / f"note-{i:03d}.md").write_text(_note(i))
    return write_config(root / "memory_pipeline.yaml", chunking={"tokens": 64, "overlap": 8})


@pytest.fixture
def two(tmp_path: Path):
    """The same folder twice: ``whole`` indexed as before pieces, ``pieced`` in pieces of 5 rows."""
    embedder = HashEmbedder()
    ident = EmbeddingIdentity.of(ResolvedProvider("test", embedder))
    whole = load_settings(_folder(tmp_path / "whole"))
    pieced = load_settings(_folder(tmp_path / "pieced"))
    return whole, pieced, embedder, ident


def _in_pieces(monkeypatch, rows: int = 5) -> None:
    """Pieces of ``rows`` rows, and the write stage's commits of about two pieces (``SLICE_ROWS``)."""
    monkeypatch.setattr(storage, "PIECE_ROWS", rows)
    monkeypatch.setattr(write_stage, "SLICE_ROWS", 2 * rows)


def _table(settings) -> list[tuple]:
    table = VectorStore(settings.lancedb_uri, settings.table_name).open()
    got = table.search().select(["chunk_id", "doc_id", "chunk_index", "text", "content_hash", "vector"]).limit(None).to_arrow()
    rows = zip(*(got.column(c).to_pylist() for c in ("chunk_id", "doc_id", "chunk_index", "text", "content_hash", "vector")), strict=True)
    return sorted(rows)


def _state(settings) -> list[dict]:
    data = storage.of(settings)
    rows = [r for s in SHARDS for r in data.read("memory_vectors", s, INDEXED_STATE_SCHEMA, ".state").to_pylist()]
    return sorted(({k: r[k] for k in ("doc_id", "sha256", "chunks")} for r in rows), key=lambda r: r["doc_id"])


def _row_groups(settings, asset: str) -> dict[str, int]:
    data = storage.of(settings)
    return {s: data.row_groups(asset, s) or 0 for s in SHARDS}


def _numbers(results) -> tuple:
    return (results.chunk.files, results.chunk.chunks, results.embed.chunks, results.write.rows_inserted, results.write.rows_updated,
            results.write.rows_deleted, results.write.files_replaced, results.write.files_deleted)  # fmt: skip


def _spy_whole_reads(monkeypatch) -> list[str]:
    """The shards whose vectors the write stage read whole (not a piece at a time)."""
    reads: list[str] = []
    real = write_stage.ShardVectors.read.__func__

    def read(cls, embeddings, shard, ident):
        reads.append(shard)
        return real(cls, embeddings, shard, ident)

    monkeypatch.setattr(write_stage.ShardVectors, "read", classmethod(read))
    return reads


def test_a_folder_indexed_in_pieces_equals_the_folder_indexed_whole(two, monkeypatch):
    whole, pieced, embedder, ident = two
    first_whole = _run(whole, embedder, ident)
    _in_pieces(monkeypatch)
    whole_reads = _spy_whole_reads(monkeypatch)
    first_pieced = _run(pieced, embedder, ident)

    chunks = _row_groups(pieced, "memory_chunks")
    assert max(chunks.values()) >= 4 and max(_row_groups(pieced, "extracted_content").values()) >= 2  # shards of many pieces (a note is a segment)
    assert _row_groups(pieced, "chunk_embeddings") == chunks  # a vectors piece for each chunks piece
    assert max(_row_groups(whole, "memory_chunks").values()) == 1
    assert whole_reads == []  # every shard's vectors read a piece at a time
    assert _table(pieced) == _table(whole) and len(_table(whole)) == first_whole.chunk.chunks > 200
    assert _state(pieced) == _state(whole)
    assert _numbers(first_pieced) == _numbers(first_whole)
    assert first_pieced.write.commits >= first_whole.write.commits

    # Changed, deleted and new notes: each file's rows replaced, wherever its piece falls.
    for settings in (whole, pieced):
        mem = settings.sources[0].path
        for i in range(0, 90, 9):
            (mem / f"note-{i:03d}.md").write_text(_note(i, version=1))
        for i in range(5, 90, 11):
            (mem / f"note-{i:03d}.md").unlink()
        for i in range(90, 96):
            (mem / f"note-{i:03d}.md").write_text(_note(i))
    again_whole = _run(whole, embedder, ident)
    _in_pieces(monkeypatch)
    again_pieced = _run(pieced, embedder, ident)
    assert again_pieced.write.files_deleted == 8 and again_pieced.write.rows_deleted > 0
    assert _numbers(again_pieced) == _numbers(again_whole)
    assert _table(pieced) == _table(whole)
    assert _state(pieced) == _state(whole)

    # A forced run replaces each shard whole from its pieces.
    _run(pieced, embedder, ident, force=True)
    assert _table(pieced) == _table(whole)
    assert whole_reads == []


def test_vectors_that_do_not_line_up_with_the_chunks_are_read_whole(two, monkeypatch):
    """A shard whose vectors file is not in the chunks' pieces (written whole, as before pieces, or
    another run's) is written from the shard's vectors read once: the same table."""
    whole, pieced, embedder, ident = two
    _run(whole, embedder, ident)
    _in_pieces(monkeypatch)
    data = storage.of(pieced)
    _run(pieced, embedder, ident)  # a first run, for the files; then the same vectors rewritten whole and the table written again
    for s in SHARDS:
        path = data.asset("chunk_embeddings", s)
        if path.is_file():
            storage.write_parquet(pq.read_table(path), path)
    reads = _spy_whole_reads(monkeypatch)
    inputs = {"manifests": _frames(pieced, "source_files"), "chunks": _frames(pieced, "memory_chunks"), "embeddings": _frames(pieced, "chunk_embeddings")}
    write_stage.write_vectors(pieced, ident, **inputs, force=True)
    assert sorted(reads) == sorted(s for s, n in _row_groups(pieced, "memory_chunks").items() if n > 1)  # a shard of one piece lines up
    assert _table(pieced) == _table(whole)


def test_pieces_that_cut_a_file_are_taken_together_by_the_write(two, monkeypatch):
    """A chunks file in row groups cut by row count (written before pieces, or by another tool):
    a file whose chunks run on into the next row group is written with them in one group, never
    split between two commits (the second would replace the first's rows)."""
    whole, pieced, embedder, ident = two
    _run(whole, embedder, ident)
    _in_pieces(monkeypatch)
    _run(pieced, embedder, ident)
    data = storage.of(pieced)
    cut = 0
    for s in SHARDS:
        path = data.asset("memory_chunks", s)
        table = pq.read_table(path)
        pq.write_table(table, path, row_group_size=3)
        docs = table.column("doc_id").to_pylist()
        cut += sum(1 for i in range(3, len(docs), 3) if docs[i] == docs[i - 1])
    assert cut >= 10  # files cut between row groups
    reads = _spy_whole_reads(monkeypatch)
    inputs = {"manifests": _frames(pieced, "source_files"), "chunks": _frames(pieced, "memory_chunks"), "embeddings": _frames(pieced, "chunk_embeddings")}
    write_stage.write_vectors(pieced, ident, **inputs, force=True)
    assert reads  # the vectors' pieces no longer line up: read whole
    assert _table(pieced) == _table(whole)
    write_stage.write_vectors(pieced, ident, **inputs)  # per file, too
    assert _table(pieced) == _table(whole)


def test_a_file_waiting_for_its_vectors_waits_in_its_piece_and_the_others_are_written(two, monkeypatch):
    """Vectors still in a batch job (``wait: false``): the files lacking one keep their rows; the
    other files of the same pieces are written, still a piece at a time."""
    _, pieced, embedder, ident = two
    _in_pieces(monkeypatch, 12)
    data = storage.of(pieced)
    settled = _run(pieced, embedder, ident)
    before = _table(pieced)
    # The vectors of the first file of a piece of several files are not in yet.
    keys = pa.schema([pa.field("doc_id", pa.string()), pa.field("content_hash", pa.string())])
    shard, piece = next(
        (s, c)
        for s in SHARDS
        if _row_groups(pieced, "memory_chunks")[s] > 1
        for c in data.read_pieces("memory_chunks", s, keys)
        if len(set(c.column("doc_id").to_pylist())) > 1
    )
    doc = piece.column("doc_id")[0].as_py()
    waiting_hashes = {h for d, h in zip(piece.column("doc_id").to_pylist(), piece.column("content_hash").to_pylist()) if d == doc}
    vectors = [
        t.filter(pa.compute.invert(pa.compute.is_in(t.column("content_hash"), pa.array(sorted(waiting_hashes)))))
        for t in data.read_pieces("chunk_embeddings", shard, pq.read_schema(data.asset("chunk_embeddings", shard)))
    ]
    assert all(v.num_rows for v in vectors)  # still a piece for each
    data.write_pieces(iter(vectors), "chunk_embeddings", shard)
    reads = _spy_whole_reads(monkeypatch)
    inputs = {"manifests": _frames(pieced, "source_files"), "chunks": _frames(pieced, "memory_chunks"), "embeddings": _frames(pieced, "chunk_embeddings")}
    stats = write_stage.write_vectors(pieced, ident, **inputs, force=True)
    assert stats.files_pending == 1 and reads == []
    assert [r for r in _table(pieced) if r[1] != doc] == [r for r in before if r[1] != doc]
    assert [r for r in _table(pieced) if r[1] == doc] == [r for r in before if r[1] == doc]  # kept its rows
    assert settled.write.files_pending == 0


def test_a_shard_with_only_deletions_in_pieces_removes_their_rows(two, monkeypatch):
    _, pieced, embedder, ident = two
    _in_pieces(monkeypatch)
    _run(pieced, embedder, ident)
    mem = pieced.sources[0].path
    gone = sorted(mem.glob("note-0[0-4]*.md"))
    for path in gone:
        path.unlink()
    results = _run(pieced, embedder, ident)
    assert results.write.files_deleted == len(gone) == 50
    names = {r[1].split("/")[-1] for r in _table(pieced)}
    assert not names & {p.name for p in gone} and len(names) == 40


def test_the_vector_index_folds_between_groups_of_pieces_holding_none_of_their_rows(two, monkeypatch):
    """A fold (the run's peak: LanceDB's delta index over a segment) runs when the write stage holds
    no rows of its own: every group of pieces it read and every slice of table rows it built is let
    go before ``fold_segment`` is called, and the folded table equals the folder indexed whole."""
    import gc
    import weakref

    whole, pieced, embedder, ident = two
    _run(whole, embedder, ident)
    _in_pieces(monkeypatch)
    monkeypatch.setattr(write_stage, "SEGMENT_ROWS", 25)
    held: list[weakref.ref] = []
    real_group, real_rows, real_fold = write_stage._ShardPieces._group, write_stage.table_rows, VectorStore.fold_segment

    def group(self, pieces, vector_pieces, waiting):
        rows, vectors = real_group(self, pieces, vector_pieces, waiting)
        held.extend([weakref.ref(rows), weakref.ref(vectors.matrix)] if vectors is not None else [weakref.ref(rows)])
        return rows, vectors

    def table_rows(*args, **kwargs):
        rows = real_rows(*args, **kwargs)
        held.append(weakref.ref(rows))
        return rows

    folds: list[int] = []  # per fold: the groups and slices still alive

    def fold_segment(self, ann, **kwargs):
        gc.collect()
        folds.append(sum(r() is not None for r in held))
        return real_fold(self, ann, **kwargs)

    monkeypatch.setattr(write_stage._ShardPieces, "_group", group)
    monkeypatch.setattr(write_stage, "table_rows", table_rows)
    monkeypatch.setattr(VectorStore, "fold_segment", fold_segment)
    _run(pieced, embedder, ident)
    assert len(folds) >= 5 and len(held) > 2 * len(folds), (folds, len(held))
    assert folds == [0] * len(folds)
    assert _table(pieced) == _table(whole)


def test_a_fold_waits_for_the_end_of_a_group_but_never_past_two_segments(tmp_path, monkeypatch):
    """Rows counted past ``SEGMENT_ROWS`` wait for the group's end; a group that alone holds two
    segments (a shard read as one piece, written before pieces) is folded as its commits go."""
    from types import SimpleNamespace

    from memory_pipeline.settings import AnnConfig
    from memory_pipeline.stores.lance import WriteCounts

    monkeypatch.setattr(write_stage, "SEGMENT_ROWS", 10)
    folds: list[int] = []
    monkeypatch.setattr(VectorStore, "fold_segment", lambda self, ann, **kwargs: folds.append(1) or {"ann": "folded"})
    segments = write_stage._Segments(VectorStore(str(tmp_path), "t"), SimpleNamespace(ann=AnnConfig()))  # pyright: ignore[reportArgumentType]
    segments.wrote(WriteCounts(inserted=15, commits=1))
    assert folds == []  # past a segment, but inside a group
    segments.fold_if_due()
    assert folds == [1] and segments.folds == 1
    segments.fold_if_due()
    assert folds == [1]  # nothing pending
    segments.wrote(WriteCounts(inserted=19, commits=1))
    assert folds == [1]
    segments.wrote(WriteCounts(updated=1, commits=1))  # two segments waiting: folded now
    assert folds == [1, 1]


@given(
    docs=st.lists(st.integers(min_value=1, max_value=6), min_size=0, max_size=25),
    cuts=st.lists(st.integers(min_value=0, max_value=150), max_size=12),
)
@hsettings(max_examples=150, deadline=None)
def test_a_files_segments_are_regrouped_whole_however_the_pieces_cut_them(docs, cuts):
    """``_documents``: each file's segments, in order, whichever row a piece boundary falls on."""
    rows = [
        {"doc_id": f"d{i}", "seg_index": j, "text": f"t{i}.{j}", "line_start": j, "line_end": j, "label": "", "kind": ""}
        for i, n in enumerate(docs)
        for j in range(n)
    ]
    table = pa.Table.from_pylist(rows, schema=SEGMENTS_SCHEMA)
    bounds = sorted({0, table.num_rows, *(c for c in cuts if c <= table.num_rows)})
    pieces = [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])] or [table]
    got = list(chunk_stage._documents(iter(pieces)))
    want = [(f"d{i}", [Segment(f"t{i}.{j}", j, j, "", "") for j in range(n)]) for i, n in enumerate(docs)]
    assert got == want
