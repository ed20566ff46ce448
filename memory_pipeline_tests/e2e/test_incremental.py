"""Incremental indexing: nothing twice, only what changed, deletions and renames."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memory_pipeline.runner import run_index
from memory_pipeline.search import search
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.helpers import table_rows


@pytest.fixture
def indexed(sample_config: Path):
    settings = load_settings(sample_config)
    first = run_index(settings)
    return settings, first


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


def test_editing_one_note_reembeds_only_its_changed_chunks(indexed, sample_dir: Path):
    settings, first = indexed
    note = sample_dir / "memory" / "2026-10-22.md"
    before = {r["chunk_id"]: r for r in table_rows(settings.data_dir)}
    note.write_text(note.read_text() + "\n## Follow-up\nThe leak came back after the v2.15 deploy; pinned GOMAXPROCS to 2.\n")
    result = run_index(settings)
    assert result["files_changed"] == 1
    assert 1 <= result["chunks_embedded"] <= 2
    assert result["chunks_cached"] == result["chunks_total"] - result["chunks_embedded"]
    after = {r["chunk_id"]: r for r in table_rows(settings.data_dir)}
    other = {k for k, r in before.items() if not r["path"].endswith("2026-10-22.md")}
    assert other <= set(after)  # nobody else's rows moved
    hits = search("GOMAXPROCS pinned after the leak returned", settings=settings)
    assert hits and hits[0].path.endswith("2026-10-22.md")


def test_deleting_a_note_removes_its_rows(indexed, sample_dir: Path):
    settings, _ = indexed
    (sample_dir / "memory" / "2026-10-11.md").unlink()
    result = run_index(settings)
    assert result["files_deleted"] == 1 and result["rows_deleted"] > 0
    assert not any(r["path"].endswith("2026-10-11.md") for r in table_rows(settings.data_dir))
    assert not any(h.path.endswith("2026-10-11.md") for h in search("sourdough starter hydration", settings=settings))


def test_renaming_moves_rows_without_reembedding(indexed, sample_dir: Path):
    settings, _ = indexed
    old_rows = [r for r in table_rows(settings.data_dir) if r["path"] == "memory/2026-10-08.md"]
    shutil.move(sample_dir / "memory" / "2026-10-08.md", sample_dir / "memory" / "vector-db-choice.md")
    result = run_index(settings)
    assert result["files_changed"] == 1 and result["files_deleted"] == 1
    assert result["chunks_embedded"] == 0 and result["chunks_cached"] == len(old_rows)
    rows = table_rows(settings.data_dir)
    assert not any(r["path"] == "memory/2026-10-08.md" for r in rows)
    moved = [r for r in rows if r["path"] == "memory/vector-db-choice.md"]
    assert sorted(r["content_hash"] for r in moved) == sorted(r["content_hash"] for r in old_rows)


def test_force_reindexes_from_cache(indexed):
    settings, first = indexed
    result = run_index(settings, force=True)
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
