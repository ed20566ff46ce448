"""The asset graph materialized in-process with real resources on temp dirs."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from memory_pipeline.definitions import defs
from memory_pipeline.defs.partitions import FULL_RANGE_TAGS, MAINTENANCE_TAG, shard_partitions
from memory_pipeline.defs.resources import index_resources
from memory_pipeline.defs.schedules import nightly_reconciliation_schedule
from memory_pipeline.defs.sensors import memory_files_sensor
from memory_pipeline.discovery import shard_of
from memory_pipeline.search import search
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.helpers import asset_metadata, materialize, memory_instance, table_rows


def test_definitions_load_and_name_everything():
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {"source_files", "extracted_content", "memory_chunks", "chunk_embeddings", "memory_vectors", "index_coverage"} | {
        "file_deletions",
        "extraction_status",
        "indexed_state",
    }  # the side files, so that lineage shows them
    assert repo.has_job("index_job")
    assert {s.name for s in repo.sensor_defs} == {"memory_files_sensor", "batch_jobs_sensor", "coverage_automation_sensor"}
    assert {s.name for s in repo.schedule_defs} == {"nightly_reconciliation_schedule"}
    assert len(shard_partitions.get_partition_keys()) == 16


def test_whole_graph_on_sample_then_paraphrase_search(sample_config: Path):
    with memory_instance() as instance:
        result = materialize(sample_config, instance, tags=dict(FULL_RANGE_TAGS))
        assert result.success
        src = asset_metadata(result, "source_files")
        emb = asset_metadata(result, "chunk_embeddings")
        vec = asset_metadata(result, "memory_vectors")
    assert src["files_seen"] == 17 and src["files_changed"] == 17 and src["files_failed"] == 0
    assert emb["embedded"] > 40 and emb["dims"] == 384 and emb["model"] == "all-MiniLM-L6-v2"
    assert vec["rows_written"] == vec["table_rows"] == emb["chunks"]
    settings = load_settings(sample_config)
    # Paraphrases that share (almost) no words with their notes.
    cases = {
        "bread dough water ratio and baking heat": "2026-10-11.md",
        "getting paid back for conference travel costs": "2026-10-27.md",
        "which embedding search engine did we pick for the help bot": "2026-10-08.md",
        "service kept running out of RAM, threads never exited": "2026-10-22.md",
    }
    for query, expected in cases.items():
        results = search(query, settings=settings)
        assert results, query
        assert Path(results[0].path).name == expected, (query, [(r.path, r.score) for r in results])
    # The Chinese note by a Chinese query, through full-text search alone.
    fts = search("数据库备份", settings=settings, mode="fts")
    assert fts and Path(fts[0].path).name == "2026-11-12-zh.md"


def test_single_partition_run_touches_only_its_files(tmp_path: Path, sample_config: Path, sample_dir: Path):
    settings = load_settings(sample_config)
    files = sorted(p.relative_to(sample_dir).as_posix() for p in sample_dir.rglob("*") if p.is_file())
    shard = shard_of("mem", files[0])
    expected = {f for f in files if shard_of("mem", f) == shard}
    with memory_instance() as instance:
        result = materialize(sample_config, instance, partition_key=shard)
        assert result.success
    indexed = {r["path"] for r in table_rows(settings.data_dir)}
    assert indexed == expected


def test_sensor_requests_only_changed_shards(sample_config: Path, sample_dir: Path):
    with memory_instance() as instance:
        assert materialize(sample_config, instance, tags=dict(FULL_RANGE_TAGS)).success
        resources = index_resources(str(sample_config))
        # The embedder resource has a tear-down: a sensor context with it is opened as a context manager.
        with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
            first = list(memory_files_sensor(ctx))
            cursor = ctx.cursor
        assert all(isinstance(r, dg.SkipReason) for r in first), first  # nothing changed since the run
        note = sample_dir / "memory" / "2026-10-11.md"
        note.write_text(note.read_text() + "\n## Update\nTried a rye flour blend today.\n")
        with dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor) as ctx:
            requests = [r for r in memory_files_sensor(ctx) if isinstance(r, dg.RunRequest)]
        assert [r.partition_key for r in requests] == [shard_of("mem", "memory/2026-10-11.md")]
        # The requested run indexes the change.
        result = materialize(sample_config, instance, partition_key=requests[0].partition_key)
        assert asset_metadata(result, "source_files")["files_changed"] == 1
        assert asset_metadata(result, "chunk_embeddings")["embedded"] >= 1


def test_nightly_schedule_runs_every_shard_in_one_run_and_maintains_the_table(sample_config: Path):
    ctx = dg.build_schedule_context()
    request = nightly_reconciliation_schedule(ctx)
    assert request.tags == {**FULL_RANGE_TAGS, MAINTENANCE_TAG: "true"}
    with memory_instance() as instance:
        result = materialize(sample_config, instance, tags=request.tags)
        assert result.success
        assert asset_metadata(result, "source_files")["partitions"] == 16
        vec = asset_metadata(result, "memory_vectors")
        assert vec["maintenance"] == "optimized" and vec["unindexed_rows_after"] == 0
    hits = search("恢复演练", settings=load_settings(sample_config), mode="fts")
    assert hits and hits[0].path.endswith("2026-11-12-zh.md")  # the folded index still answers


def test_metadata_never_carries_secrets(sample_config: Path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-value-1234567890abcdef")
    with memory_instance() as instance:
        result = materialize(sample_config, instance, tags=dict(FULL_RANGE_TAGS))
        text = json.dumps([{k: str(v) for k, v in e.event_specific_data.materialization.metadata.items()} for e in result.get_asset_materialization_events()])
    assert "SECRET-value" not in text
    # The transcript's pasted key was redacted before it reached the table.
    rows = table_rows(load_settings(sample_config).data_dir)
    assert not any("sk-proj-AbCdEf" in r["text"] for r in rows)
    assert any("[REDACTED:openai-key]" in r["text"] for r in rows)
