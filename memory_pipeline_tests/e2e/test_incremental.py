"""Incremental indexing: nothing twice, only what changed, deletions and renames."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memory_pipeline.discovery import SHARD_KEYS
from memory_pipeline.runner import run_index, shards_of
from memory_pipeline.search import search
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import table_rows


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, dict]:
    """The sample's text indexed once, by a first run; returns its folder and the run's summary."""
    root = tmp_path_factory.mktemp("incremental")
    shutil.copytree(SAMPLE, root / "mem", ignore=TEXT_ONLY)
    first = run_index(load_settings(write_config(root / "memory_pipeline.yaml")))
    return root, first


@pytest.fixture
def indexed(first_run):
    """The first run's index itself, for tests that change no file."""
    root, first = first_run
    return load_settings(root / "memory_pipeline.yaml"), dict(first)


@pytest.fixture
def indexed_copy(tmp_path: Path, first_run):
    """A private copy of the first run's folder and index, for tests that change files: (settings, first, mem)."""
    root, first = first_run
    dest = tmp_path / "copy"
    shutil.copytree(root, dest, symlinks=True)
    settings = load_settings(dest / "memory_pipeline.yaml")
    # The copy's files have new inodes: one settling run re-hashes them (same content, nothing re-indexed).
    settled = run_index(settings)
    assert settled["chunks_embedded"] == 0 and settled["table_rows"] == first["table_rows"]
    return settings, dict(first), dest / "mem"


def test_first_run_indexes_everything(indexed):
    settings, first = indexed
    assert first["files_seen"] == first["files_changed"] == 17
    assert first["chunks_embedded"] == first["chunks_total"] == first["rows_written"] == first["table_rows"]
    assert first["errors"] == []
    rows = table_rows(settings.data_dir)
    assert len({r["chunk_id"] for r in rows}) == len(rows)


def test_rerun_with_nothing_changed_embeds_and_writes_nothing(indexed):
    settings, first = indexed
    before = table_rows(settings.data_dir)
    again = run_index(settings)
    assert again["files_changed"] == 0
    assert again["chunks_embedded"] == again["chunks_cached"] == 0
    assert again["rows_written"] == again["rows_deleted"] == 0
    assert table_rows(settings.data_dir) == before


def test_editing_one_note_reembeds_only_its_changed_chunks(indexed_copy):
    settings, first, sample_dir = indexed_copy
    note = sample_dir / "memory" / "2026-10-22.md"
    before = {r["chunk_id"]: r for r in table_rows(settings.data_dir)}
    note.write_text(note.read_text() + "\n## Follow-up\nThe leak came back after the v2.15 deploy; pinned GOMAXPROCS to 2.\n")
    result = run_index(settings)
    assert result["files_changed"] == 1
    # Only the note's shard ran; the other files were seen by the stat walk, unchanged.
    assert result["shards"] == shards_of([("mem", "memory/2026-10-22.md")])
    assert result["files_seen"] == first["files_seen"]
    assert 1 <= result["chunks_embedded"] <= 2
    assert result["chunks_cached"] == result["chunks_total"] - result["chunks_embedded"]
    after = {r["chunk_id"]: r for r in table_rows(settings.data_dir)}
    other = {k for k, r in before.items() if not r["path"].endswith("2026-10-22.md")}
    assert other <= set(after)  # nobody else's rows moved
    hits = search("GOMAXPROCS pinned after the leak returned", settings=settings)
    assert hits and hits[0].path.endswith("2026-10-22.md")


def test_deleting_a_note_removes_its_rows(indexed_copy):
    settings, _, sample_dir = indexed_copy
    (sample_dir / "memory" / "2026-10-11.md").unlink()
    result = run_index(settings)
    assert result["shards"] == shards_of([("mem", "memory/2026-10-11.md")])
    assert result["files_deleted"] == 1 and result["rows_deleted"] > 0
    assert not any(r["path"].endswith("2026-10-11.md") for r in table_rows(settings.data_dir))
    assert not any(h.path.endswith("2026-10-11.md") for h in search("sourdough starter hydration", settings=settings))


def test_renaming_moves_rows_without_reembedding(indexed_copy):
    settings, _, sample_dir = indexed_copy
    old_rows = [r for r in table_rows(settings.data_dir) if r["path"] == "memory/2026-10-08.md"]
    shutil.move(sample_dir / "memory" / "2026-10-08.md", sample_dir / "memory" / "vector-db-choice.md")
    result = run_index(settings)
    # One run over the range from the first to the last shard of the two paths.
    ends = shards_of([("mem", "memory/2026-10-08.md"), ("mem", "memory/vector-db-choice.md")])
    assert result["shards"][0] == ends[0] and result["shards"][-1] == ends[-1]
    assert result["files_changed"] == 1 and result["files_deleted"] == 1
    assert result["chunks_embedded"] == 0 and result["chunks_cached"] == len(old_rows)
    rows = table_rows(settings.data_dir)
    assert not any(r["path"] == "memory/2026-10-08.md" for r in rows)
    moved = [r for r in rows if r["path"] == "memory/vector-db-choice.md"]
    assert sorted(r["content_hash"] for r in moved) == sorted(r["content_hash"] for r in old_rows)


def test_force_reindexes_from_cache(indexed_copy):
    settings, first, _ = indexed_copy
    result = run_index(settings, force=True)
    assert result["shards"] == list(SHARD_KEYS)
    assert result["files_changed"] == 17
    assert result["chunks_embedded"] == 0 and result["chunks_cached"] == first["chunks_total"]
    assert result["table_rows"] == first["table_rows"]


def test_chinese_note_found_by_chinese_query(indexed):
    settings, _ = indexed
    for mode in ("fts", "hybrid"):
        hits = search("恢复演练", settings=settings, mode=mode)
        assert hits and hits[0].path.endswith("2026-11-12-zh.md"), mode


def test_absent_topic_returns_nothing(indexed):
    settings, _ = indexed
    assert search("what is the capital of australia", settings=settings) == []
