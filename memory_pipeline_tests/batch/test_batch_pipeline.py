"""The asset graph with remote.batch on: real Dagster materializations, real LanceDB, the real openai SDK
against the fake's Batch API."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import lancedb
import numpy as np

from memory_pipeline.batching.jobs import JobStore, store_path
from memory_pipeline.defs.partitions import FULL_RANGE_TAGS
from memory_pipeline.defs.resources import index_resources
from memory_pipeline.defs.sensors import batch_jobs_sensor
from memory_pipeline.search import search
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.batch.conftest import batch_config
from memory_pipeline_tests.helpers import asset_metadata, materialize, memory_instance


def _vectors(config: Path) -> dict[str, np.ndarray]:
    settings = load_settings(config)
    db = lancedb.connect(settings.lancedb_uri)
    names = db.list_tables().tables
    (name,) = [n for n in names if n.startswith(settings.table_name)]
    rows = db.open_table(name).to_arrow().select(["chunk_id", "vector"]).to_pylist()
    return {r["chunk_id"]: np.asarray(r["vector"], dtype=np.float32) for r in rows}


def test_batched_index_is_identical_to_live(tmp_path, sample_dir, openai_fake):
    batched_cfg = batch_config(tmp_path / "batched.yaml", openai_fake, data_dir="idx_batch")
    live_cfg = batch_config(tmp_path / "live.yaml", openai_fake, enabled=False, data_dir="idx_live")
    with memory_instance() as instance:
        result = materialize(batched_cfg, instance, tags=dict(FULL_RANGE_TAGS))
        assert result.success
        emb = asset_metadata(result, "chunk_embeddings")
        live_docs_during_batch = len(openai_fake.live_texts())
        live = materialize(live_cfg, instance, tags=dict(FULL_RANGE_TAGS))
        assert live.success
    # Corpus-wide: one job for every unique chunk of all files, nothing embedded live.
    assert emb["batch_jobs_submitted"] == 1 and openai_fake.batches_created() == 1
    assert emb["batch_requests"] == emb["unique"] == emb["batched"] == emb["embedded"] > 20
    assert emb["live_fallbacks"] == 0 and live_docs_during_batch == 0
    assert emb["batch_tokens"] > 0 and 0 < emb["estimated_cost_usd"] < emb["live_cost_usd"]
    assert emb["batch"]["jobs_collected"] == 1 and emb["cache_hits"] == 0
    (batch,) = openai_fake.batches.values()
    assert all(line["body"]["dimensions"] == 256 and line["url"] == "/v1/embeddings" for line in batch["lines"])
    assert batch["req"]["completion_window"] == "24h"
    # The same rows and the same vectors as the live path.
    a, b = _vectors(batched_cfg), _vectors(live_cfg)
    assert set(a) == set(b) and len(a) == emb["chunks"]
    for cid in a:
        np.testing.assert_allclose(a[cid], b[cid], atol=1e-6)
    hits = search("which vector database did we choose for the support bot", config=str(batched_cfg), max_results=3, min_score=0)
    assert hits and "2026-10" in hits[0].path or "support" in hits[0].snippet.lower()


def test_wait_false_then_the_sensor_completes_the_graph(tmp_path, sample_dir, openai_fake):
    cfg = batch_config(tmp_path / "memory_pipeline.yaml", openai_fake, wait=False)
    openai_fake.batch_faults = ["hold"]
    openai_fake.held = True
    resources = index_resources(str(cfg))
    with memory_instance() as instance:
        first = materialize(cfg, instance, tags=dict(FULL_RANGE_TAGS))
        assert first.success
        emb, vec = asset_metadata(first, "chunk_embeddings"), asset_metadata(first, "memory_vectors")
        # Submitted, not waited for: every file waits for its vectors, none is half-written.
        assert emb["batch_jobs_submitted"] == 1 and emb["batch_jobs_pending"] == 1 and emb["pending"] == emb["unique"]
        assert vec["files_pending"] > 10 and vec["rows_written"] == 0
        with JobStore(store_path(load_settings(cfg).data_dir)) as store:
            (job,) = store.open_jobs()
        assert job.state == "submitted" and job.remote_id and len(job.shards) > 3

        with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
            ticks = list(batch_jobs_sensor(ctx))
        assert len(ticks) == 1 and isinstance(ticks[0], dg.SkipReason)  # still running

        openai_fake.held = False
        requests = []
        for _tick in range(5):  # the job finishes over a few more status polls
            with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
                requests = [r for r in batch_jobs_sensor(ctx) if isinstance(r, dg.RunRequest)]
            if requests:
                break
        assert sorted(r.partition_key for r in requests) == sorted(job.shards)
        for req in requests:  # what the daemon would launch
            run = materialize(cfg, instance, partition_key=req.partition_key, tags=req.tags)
            assert run.success
    assert openai_fake.batches_created() == 1  # resumed, never resubmitted
    assert len(openai_fake.live_texts()) == 0
    with JobStore(store_path(load_settings(cfg).data_dir)) as store:
        assert store.open_jobs() == [] and store.get(job.local_id).state == "collected"
    rows = _vectors(cfg)
    assert len(rows) == emb["chunks"]


def test_failed_and_unavailable_batches_fall_back_live_and_disable(tmp_path, sample_dir, openai_fake):
    cfg = batch_config(tmp_path / "memory_pipeline.yaml", openai_fake)
    openai_fake.batch_faults = ["unavailable"]
    with memory_instance() as instance:
        result = materialize(cfg, instance, tags=dict(FULL_RANGE_TAGS))
    assert result.success
    emb = asset_metadata(result, "chunk_embeddings")
    assert emb["live_fallbacks"] == emb["unique"] == emb["embedded"] and emb["batch"]["disabled"]
    assert "unavailable" in emb["batch"]["disabled_reason"]
    assert len(set(openai_fake.live_texts())) == emb["unique"]
    assert len(_vectors(cfg)) == emb["chunks"]
