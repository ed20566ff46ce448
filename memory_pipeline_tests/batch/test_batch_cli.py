"""`memory index` with batching, in real processes: killed after submission, resumed; failures,
disable, `status` and `doctor --reset-batch`."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from memory_pipeline_tests.batch.conftest import batch_config
from memory_pipeline_tests.helpers import run_cli, run_json

pytestmark = pytest.mark.slow


def _grep(folder: Path, needle: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_killed_after_submission_resumes_the_same_job(tmp_path, sample_dir, openai_fake):
    cfg = batch_config(tmp_path / "memory_pipeline.yaml", openai_fake)
    env = {"OPENAI_API_KEY": openai_fake.api_key}
    killed = run_cli("index", "--config", str(cfg), "--json", env=env, kill_at="batch_after_submit")
    assert killed.returncode == -signal.SIGKILL
    assert openai_fake.batches_created() == 1

    status = run_json("status", "--config", str(cfg), "--json", env=env)
    (pending,) = status["batch"]["pending_jobs"]
    assert pending["provider"] == "openai" and pending["job_id"] in openai_fake.batches and pending["requests"] > 20

    summary = run_json("index", "--config", str(cfg), "--json", env=env)
    b = summary["batch"]
    assert openai_fake.batches_created() == 1  # no second submission: the job was resumed
    assert b["jobs_resumed"] == 1 and b["jobs_submitted"] == 0 and b["requests_collected"] == pending["requests"]
    assert b["live_fallbacks"] == 0 and openai_fake.live_texts() == []
    assert summary["table_rows"] == summary["chunks_total"] > 20 and summary["files_pending"] == 0
    assert summary["chunks_embedded"] == pending["requests"]
    assert b["estimated_cost_usd"] is not None and b["estimated_cost_usd"] < b["live_cost_usd"]
    assert run_json("status", "--config", str(cfg), "--json", env=env)["batch"]["pending_jobs"] == []
    assert _grep(tmp_path / "index", openai_fake.api_key) == []


def test_two_failed_jobs_disable_batching_until_reset(tmp_path, sample_dir, openai_fake):
    cfg = batch_config(tmp_path / "memory_pipeline.yaml", openai_fake)
    env = {"OPENAI_API_KEY": openai_fake.api_key}
    openai_fake.batch_faults = ["fail", "fail"]
    first = run_json("index", "--config", str(cfg), "--json", env=env)
    assert first["batch"]["jobs_failed"] == 1 and first["batch"]["live_fallbacks"] == first["chunks_embedded"] > 20
    assert first["table_rows"] == first["chunks_total"]  # complete through the live fallback

    (sample_dir / "memory" / "2026-12-01.md").write_text("# Standup\n\nWe moved the billing cron to Fridays.\n")
    second = run_json("index", "--config", str(cfg), "--json", env=env)
    assert second["batch"]["disabled"] and second["batch"]["live_fallbacks"] >= 1
    status = run_cli("status", "--config", str(cfg), env=env)
    assert status.returncode == 0 and "batching DISABLED" in status.stdout and "--reset-batch" in status.stdout
    created = openai_fake.batches_created()

    (sample_dir / "memory" / "2026-12-02.md").write_text("# Standup\n\nThe billing cron moved back to Mondays.\n")
    third = run_json("index", "--config", str(cfg), "--json", env=env)
    assert openai_fake.batches_created() == created and third["batch"]["live_fallbacks"] >= 1

    reset = run_cli("doctor", "--config", str(cfg), "--reset-batch", env=env)
    assert "batching re-enabled for: openai" in reset.stderr
    assert run_json("status", "--config", str(cfg), "--json", env=env)["batch"]["providers"] == {}
    (sample_dir / "memory" / "2026-12-03.md").write_text("# Standup\n\nBilling cron: Wednesdays from now on.\n")
    fourth = run_json("index", "--config", str(cfg), "--json", env=env)
    assert openai_fake.batches_created() == created + 1 and fourth["batch"]["jobs_collected"] == 1
    assert fourth["batch"]["live_fallbacks"] == 0
