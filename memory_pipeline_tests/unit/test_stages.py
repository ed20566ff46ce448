"""The stages called directly, as plain functions, with a deterministic test embedder: no Dagster, no model.

The stages take their inputs as mappings shard -> polars DataFrame and yield their outputs one
shard at a time; here the files between them are written and read through the storage layer,
as the IO manager does in a Dagster run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memory_pipeline import storage
from memory_pipeline.changes import EmbeddingIdentity, fingerprint, manifest_fingerprints, shard_fingerprints
from memory_pipeline.defs.io_managers import _by_shard
from memory_pipeline.discovery import SHARD_KEYS, assess, walk_all
from memory_pipeline.models import INDEXED_STATE_SCHEMA, MANIFEST_SCHEMA, SEGMENTS_SCHEMA, asset_schema, frame_of
from memory_pipeline.providers.registry import ResolvedProvider
from memory_pipeline.settings import load_settings
from memory_pipeline.stages import (
    NO_HOOKS,
    ChunkCounts,
    DiscoverCounts,
    EmbedCounts,
    ExtractCounts,
    RunResults,
    RunSummary,
    StageHooks,
    discover,
    embed_chunks,
    extract_content,
    make_chunks,
    run_errors,
    settled_summary,
    write_vectors,
)
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.embedder import HashEmbedder
from memory_pipeline_tests.helpers import table_rows

SHARDS = list(SHARD_KEYS)


@pytest.fixture
def memory(tmp_path: Path):
    mem = tmp_path / "mem"
    (mem / "notes").mkdir(parents=True)
    (mem / "notes" / "a.md").write_text("# Garden\n\nPlanted tomatoes and basil by the fence.\n")
    (mem / "notes" / "b.md").write_text("# Trip\n\nBooked the train to Lisbon for the retreat.\n")
    (mem / "notes" / "c.txt").write_text("Ordered a new bike chain.\n")
    (mem / "blob.bin").write_bytes(b"\x7fELF" + os.urandom(64))
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml"))
    embedder = HashEmbedder()
    ident = EmbeddingIdentity.of(ResolvedProvider("test", embedder))
    return mem, settings, embedder, ident


def _store(settings, asset: str, stream) -> None:
    """Write a stage's frames, one shard at a time, a shard's pieces (consecutive frames of it) as
    the row groups of its one file (what the IO manager does)."""
    data = storage.of(settings)
    for shard, frames in _by_shard(stream):
        data.write_pieces((f.to_arrow().select(asset_schema(asset, f).names).cast(asset_schema(asset, f)) for f in frames), asset, shard)


def _frames(settings, asset: str):
    """An asset's shards as a stage's input: read when looked up (what the IO manager loads)."""
    return storage.of(settings).frames(asset, SHARDS, asset_schema(asset))


def _run(settings, embedder, ident, *, force=False, hooks: StageHooks = NO_HOOKS) -> RunResults:
    results = RunResults(discover=DiscoverCounts(), extract=ExtractCounts(), chunk=ChunkCounts(), embed=EmbedCounts())
    _store(settings, "source_files", discover(settings, SHARDS, force=force, fp=fingerprint(settings, ident), ident=ident, counts=results.discover))
    _store(settings, "extracted_content", extract_content(settings, _frames(settings, "source_files"), results.extract))
    _store(
        settings,
        "memory_chunks",
        make_chunks(settings, _frames(settings, "source_files"), _frames(settings, "extracted_content"), embedder, ident, results.chunk),
    )
    _store(settings, "chunk_embeddings", embed_chunks(settings, _frames(settings, "memory_chunks"), embedder, ident, hooks=hooks, counts=results.embed))
    inputs = {"manifests": _frames(settings, "source_files"), "chunks": _frames(settings, "memory_chunks"), "embeddings": _frames(settings, "chunk_embeddings")}
    results.write = write_vectors(settings, ident, **inputs, force=force, hooks=hooks)
    return results


def test_a_stage_takes_frames_and_yields_frames_without_files(memory):
    """make_chunks over frames built in memory: its chunks come back per shard, nothing is written."""
    mem, settings, embedder, ident = memory
    path = mem / "notes" / "a.md"
    row = {"doc_id": "mem:notes/a.md", "source": "mem", "path": "notes/a.md", "abs_path": str(path), "shard": "00", "size": path.stat().st_size}
    row |= {"mtime_ns": 1, "inode": 1, "sha256": "ab" * 32, "mime_type": "text/markdown", "modality": "markdown", "status": "ok", "action": "index"}
    manifests = {"00": frame_of([row], MANIFEST_SCHEMA)}
    segments = {
        "00": frame_of(
            [{"doc_id": row["doc_id"], "seg_index": 0, "text": path.read_text(), "line_start": 1, "line_end": 3, "label": "", "kind": ""}], SEGMENTS_SCHEMA
        )
    }
    counts = ChunkCounts()
    out = dict(make_chunks(settings, manifests, segments, embedder, ident, counts))
    assert list(out) == ["00"] and out["00"].height == counts.chunks >= 1
    assert out["00"]["path"].to_list()[0] == "notes/a.md" and "tomatoes" in out["00"]["text"].to_list()[0]
    assert not (settings.data_dir / "assets" / "memory_chunks").exists()


def test_each_stage_returns_its_counts_and_a_second_run_does_nothing(memory):
    mem, settings, embedder, ident = memory
    first = _run(settings, embedder, ident)
    assert first.discover.files_seen == 4 and first.discover.files_changed == 3 and first.discover.files_skipped == 1
    assert first.extract.extracted == 3 and first.extract.failed == 0
    assert first.chunk.files == 3 and first.chunk.chunks >= 3
    assert first.embed.embedded == first.embed.unique and first.embed.cached == 0
    assert first.write.rows_written == first.chunk.chunks == first.write.table_rows
    assert {r["path"] for r in table_rows(settings.data_dir)} == {"notes/a.md", "notes/b.md", "notes/c.txt"}

    again = _run(settings, embedder, ident)
    assert again.discover.files_changed == 0 and again.discover.files_unchanged == 3
    assert again.extract.files == 0 and again.embed.chunks == 0 and again.write.rows_written == 0
    assert settled_summary(settings, ident) is not None  # the no-op check agrees


def test_a_change_and_a_delete_touch_only_their_files(memory):
    mem, settings, embedder, ident = memory
    _run(settings, embedder, ident)
    time.sleep(0.01)
    (mem / "notes" / "a.md").write_text("# Garden\n\nPlanted tomatoes, basil and chives by the fence.\n")
    (mem / "notes" / "c.txt").unlink()
    assert settled_summary(settings, ident) is None
    run = _run(settings, embedder, ident)
    assert run.discover.files_changed == 1 and run.discover.files_deleted == 1
    assert run.write.files_replaced == 1 and run.write.files_deleted == 1
    paths = [r["path"] for r in table_rows(settings.data_dir, columns=("path", "text"))]
    assert "notes/c.txt" not in paths and paths.count("notes/b.md") >= 1
    assert any("chives" in r["text"] for r in table_rows(settings.data_dir, columns=("path", "text")))


def test_vectors_come_from_the_cache_after_a_forced_run(memory):
    mem, settings, embedder, ident = memory
    _run(settings, embedder, ident)
    calls = len(embedder.calls)
    forced = _run(settings, embedder, ident, force=True)
    assert forced.discover.files_changed == 3
    assert forced.embed.cached == forced.embed.unique and forced.embed.embedded == 0
    assert len(embedder.calls) == calls  # nothing sent to the embedder again


def test_embedding_is_sliced_by_the_injected_hooks(memory):
    mem, settings, embedder, ident = memory
    for i in range(20):
        (mem / "notes" / f"n{i}.md").write_text(f"# Note {i}\n\nItem number {i} in the list of things.\n")
    passed: list[str] = []

    class Recording(StageHooks):
        def at(self, point: str) -> None:
            passed.append(point)

    _run(settings, embedder, ident, hooks=Recording(embed_slice=5))
    assert embedder.calls and max(embedder.calls) <= 5
    assert passed.count("embed_after_first_batch") == len(embedder.calls)
    assert "write_after_first_commit" in passed


def test_a_run_stopped_after_a_commit_is_completed_by_the_next(memory):
    mem, settings, embedder, ident = memory

    class Stop(Exception):
        pass

    class StopAfterCommit(StageHooks):
        def at(self, point: str) -> None:
            if point == "write_after_first_commit":
                raise Stop

    with pytest.raises(Stop):
        _run(settings, embedder, ident, hooks=StopAfterCommit())
    # The commit happened, its record did not: the next run redoes that file, never duplicates it.
    run = _run(settings, embedder, ident)
    rows = table_rows(settings.data_dir, columns=("chunk_id", "path"))
    assert len(rows) == len({r["chunk_id"] for r in rows}) == run.write.table_rows
    assert {r["path"] for r in rows} == {"notes/a.md", "notes/b.md", "notes/c.txt"}


def test_the_summary_is_built_from_the_stage_results(memory):
    mem, settings, embedder, ident = memory
    results = _run(settings, embedder, ident)
    results.coverage = 0.75
    summary = RunSummary.of(settings, results, run_id="r1", seconds=1.23456)
    assert summary.files_changed == 3 and summary.chunks_total == results.chunk.chunks
    assert summary.rows_written == results.write.rows_written and summary.table_rows == results.write.table_rows
    assert summary.coverage == 0.75 and summary.seconds == 1.235 and summary.run_id == "r1"
    assert [e["path"] for e in summary.errors] == [str(mem / "blob.bin")]
    # Read as a mapping: the keys and values of `index --json`.
    assert summary["files_changed"] == 3 and dict(summary) == summary.as_dict()
    assert run_errors(settings, SHARDS) == summary.errors


def test_scan_and_index_classify_every_file_the_same(memory):
    mem, settings, embedder, ident = memory
    (mem / "notes" / "fake.md").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 32)  # a PNG named .md
    (mem / "empty.md").write_text("")
    _store(settings, "source_files", discover(settings, SHARDS, force=False, fp=fingerprint(settings, ident), ident=None))
    data = storage.of(settings)
    indexed = {r["abs_path"]: (r["status"], r["reason"], r["modality"]) for s in SHARDS for r in data.read("source_files", s, MANIFEST_SCHEMA).to_pylist()}
    scanned = {}
    for f in walk_all(settings):
        facts = assess(f, settings, read_content=False)
        scanned[f.abs_path] = (facts.status, facts.reason, facts.modality)
    assert scanned == indexed
    assert indexed[str(mem / "notes" / "fake.md")][0] == "failed"


def test_the_walk_status_is_stored_so_the_sensor_digest_needs_no_reason_text(memory):
    mem, settings, embedder, ident = memory
    (mem / "big.md").write_text("x" * 100)
    settings = load_settings(write_config(settings.config_path, limits={"max_file_bytes": 50}))
    _store(settings, "source_files", discover(settings, SHARDS, force=False, fp=fingerprint(settings, ident), ident=None))
    rows = [r for s in SHARDS for r in storage.of(settings).read("source_files", s, MANIFEST_SCHEMA).to_pylist()]
    assert {r["path"]: r["walk_status"] for r in rows}["big.md"] == "skipped"
    assert shard_fingerprints(settings) == manifest_fingerprints(settings, SHARDS)


def test_storage_reads_an_older_file_without_a_new_column_and_sets_a_damaged_one_aside(tmp_path: Path):
    data = storage.DataStore(tmp_path)
    old_schema = pa.schema([f for f in MANIFEST_SCHEMA if f.name != "walk_status"])
    row = {f.name: ("x" if pa.types.is_string(f.type) else 1) for f in old_schema}
    path = data.asset("source_files", "00")
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([row], schema=old_schema), path)
    table = data.read("source_files", "00", MANIFEST_SCHEMA)
    assert table.schema == MANIFEST_SCHEMA and table.column("walk_status").to_pylist() == [""]

    state = data.asset("memory_vectors", "00", ".state")
    state.parent.mkdir(parents=True)
    state.write_bytes(b"PAR1 not really")
    assert data.read("memory_vectors", "00", INDEXED_STATE_SCHEMA, ".state").num_rows == 0
    assert not state.exists() and list(state.parent.glob("00.state.parquet.corrupt-*"))
    with pytest.raises(ValueError):
        data.asset("memory_vectors", "00", ".bogus")


def test_the_write_gives_freed_memory_back_before_each_index_build_and_only_when_it_wrote(memory, monkeypatch):
    """The index builds are a run's peak of memory: the write stage hands what it freed back to the
    system before the full-text build and before the vector index build, not on a run with nothing
    to write."""
    from memory_pipeline.stages import write as write_mod
    from memory_pipeline.stores.lance import VectorStore

    mem, settings, embedder, ident = memory
    calls: list[str] = []
    real_give = write_mod.give_back_memory
    monkeypatch.setattr(write_mod, "give_back_memory", lambda: calls.append("give back") or real_give())
    for name in ("ensure_fts", "ensure_ann"):
        real = getattr(VectorStore, name)
        monkeypatch.setattr(VectorStore, name, lambda self, *a, _r=real, _n=name, **k: calls.append(_n) or _r(self, *a, **k))
    _run(settings, embedder, ident)
    assert calls == ["give back", "ensure_fts", "give back", "ensure_ann"]
    calls.clear()
    _run(settings, embedder, ident)  # nothing changed: no commit, no index work
    assert calls == []


def test_giving_memory_back_never_fails_a_run(monkeypatch):
    """Without glibc (``malloc_trim``) or ``/proc`` the call does what it can and reports 0."""
    import builtins
    import ctypes

    from memory_pipeline.stages.write import give_back_memory

    blob = [bytearray(1 << 20) for _ in range(64)]  # 64 MB freed just before
    del blob
    assert give_back_memory() >= 0

    def no_libc(*_a, **_k):
        raise OSError("no libc.so.6 here")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    real_open = builtins.open
    monkeypatch.setattr(
        builtins, "open", lambda f, *a, **k: (_ for _ in ()).throw(OSError("no /proc")) if str(f).startswith("/proc/") else real_open(f, *a, **k)
    )
    assert give_back_memory() == 0


def test_a_runs_walk_lets_go_of_its_name_checks_but_a_sensors_walks_keep_them(memory, monkeypatch):
    """The names a walk checked for secrets are cached (a path is redacted once per process), and a
    run's discover stage lets go of them once it has walked: the stages after it need none, and at
    65,536 paths they are about 11 MB held through the write stage. The sensor's walks
    (``shard_fingerprints``) keep theirs. A file whose name holds a secret is refused either way."""
    from memory_pipeline import discovery
    from memory_pipeline.discovery import _secret_in_name

    mem, settings, embedder, ident = memory
    # a one-shot process (a server built earlier in this test process keeps its names)
    monkeypatch.setattr(discovery, "_keep_name_checks", False)
    (mem / "notes" / "password=hunter2hunter2.md").write_text("leaked\n")
    _secret_in_name.cache_clear()
    shard_fingerprints(settings)
    walked = _secret_in_name.cache_info().currsize
    assert walked >= 4
    shard_fingerprints(settings)
    assert _secret_in_name.cache_info().currsize == walked and _secret_in_name.cache_info().hits >= walked
    manifests = list(discover(settings, SHARDS, force=False, fp=fingerprint(settings, ident), ident=None))
    assert _secret_in_name.cache_info().currsize == 0
    rows = [r for _, frame in manifests for r in frame.to_dicts()]
    assert {r["path"] for r in rows if r["status"] == "ok"} == {"notes/a.md", "notes/b.md", "notes/c.txt"}
    refused = [r for r in rows if "secret" in (r["reason"] or "")]
    assert len(refused) == 1 and "hunter2" not in str(refused[0])


def test_a_servers_runs_keep_their_name_checks(memory, monkeypatch):
    """``memory serve`` walks the folder at every request (``keep_name_checks``, called by the server
    and its index worker): its runs keep the names they checked, so the next walk redacts none."""
    from memory_pipeline import discovery

    mem, settings, embedder, ident = memory
    monkeypatch.setattr(discovery, "_keep_name_checks", False)  # restored after the test
    discovery._secret_in_name.cache_clear()
    from memory_pipeline.service.core import MemoryService

    service = MemoryService(settings, index_worker=False)  # what `memory serve` builds
    try:
        assert discovery._keep_name_checks
    finally:
        service.close()
    list(discover(settings, SHARDS, force=False, fp=fingerprint(settings, ident), ident=None))
    kept = discovery._secret_in_name.cache_info()
    assert kept.currsize >= 4
    list(discover(settings, SHARDS, force=False, fp=fingerprint(settings, ident), ident=None))
    again = discovery._secret_in_name.cache_info()
    assert again.currsize == kept.currsize and again.misses == kept.misses and again.hits >= kept.hits + 4
