"""`dagster dev` loads the definitions through workspace.yaml and serves them on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memory_pipeline_tests.helpers import REPO, default_sigint, free_port, graphql, stop_group

pytestmark = pytest.mark.slow


def test_dagster_dev_serves_the_asset_graph(tmp_path: Path, sample_config: Path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "MEMORY_PIPELINE_CONFIG": str(sample_config), "DAGSTER_DISABLE_TELEMETRY": "1"}
    dagster = Path(sys.executable).parent / "dagster"
    proc = subprocess.Popen(
        [str(dagster), "dev", "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so the whole tree can be stopped
        preexec_fn=default_sigint,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        data = None
        while time.monotonic() < deadline:
            try:
                data = graphql(port, "{ assetNodes { assetKey { path } groupName partitionDefinition { description } } }")
                if data.get("data", {}).get("assetNodes"):
                    break
            except OSError:
                pass
            time.sleep(1)
        assert data and data["data"]["assetNodes"], data
        keys = {n["assetKey"]["path"][0] for n in data["data"]["assetNodes"]}
        assert keys == {"source_files", "extracted_content", "memory_chunks", "chunk_embeddings", "memory_vectors", "index_coverage"} | {
            "file_deletions",
            "extraction_status",
            "indexed_state",
        }  # the side files, so that lineage shows them
        assert {n["groupName"] for n in data["data"]["assetNodes"]} == {"memory_index"}
        jobs = graphql(port, "{ repositoriesOrError { ... on RepositoryConnection { nodes { jobs { name } sensors { name } schedules { name } } } } }")
        repo = jobs["data"]["repositoriesOrError"]["nodes"][0]
        assert "index_job" in {j["name"] for j in repo["jobs"]}
        assert {s["name"] for s in repo["sensors"]} == {"memory_files_sensor", "batch_jobs_sensor", "coverage_automation_sensor"}
        assert {s["name"] for s in repo["schedules"]} == {"nightly_reconciliation_schedule"}
    finally:
        stop_group(proc, timeout=30)
