"""A run killed with SIGKILL mid-embedding or mid-write, then re-run, equals a clean run."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import run_cli, run_json, table_rows

pytestmark = pytest.mark.slow
COLUMNS = ("chunk_id", "path", "text", "content_hash", "locator", "vector")


def _rows(data_dir: Path) -> list[dict]:
    return table_rows(data_dir, columns=COLUMNS)


@pytest.fixture(scope="module")
def clean_rows(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("clean")
    shutil.copytree(SAMPLE, root / "mem", ignore=TEXT_ONLY)
    cfg = write_config(root / "memory_pipeline.yaml")
    run_json("index", "--config", str(cfg), "--json")
    return _rows(root / "index")


@pytest.mark.parametrize("fault", ["embed_after_first_batch", "write_after_first_commit"])
def test_killed_run_then_rerun_equals_clean_run(tmp_path: Path, clean_rows: list[dict], fault: str):
    shutil.copytree(SAMPLE, tmp_path / "mem", ignore=TEXT_ONLY)
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    killed = run_cli(
        "index", "--config", str(cfg), "--json",
        kill_at=fault, embed_slice=16,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    partial = _rows(tmp_path / "index")
    assert len(partial) < len(clean_rows)  # the kill really interrupted the work

    summary = run_json("index", "--config", str(cfg), "--json")
    if fault == "embed_after_first_batch":
        assert summary["chunks_cached"] >= 16  # the vectors computed before the kill were kept
    rows = _rows(tmp_path / "index")
    assert len(rows) == len({r["chunk_id"] for r in rows})  # no duplicates
    key = lambda r: (r["chunk_id"], r["path"], r["text"], r["content_hash"], r["locator"])  # noqa: E731
    assert [key(r) for r in rows] == [key(r) for r in clean_rows]
    for got, want in zip(rows, clean_rows):
        np.testing.assert_allclose(got["vector"], want["vector"], atol=1e-4)

    # And a further run has nothing left to do.
    again = run_json("index", "--config", str(cfg), "--json")
    assert again["files_changed"] == 0 and again["rows_written"] == 0


def test_a_killed_runs_dagster_run_is_closed_by_the_next_run(tmp_path: Path):
    """A `memory index` killed mid-run left its Dagster run STARTED for ever (the UI showed it in
    progress after later runs had finished). The next run marks it failed, saying why."""
    import dagster as dg

    shutil.copytree(SAMPLE, tmp_path / "mem", ignore=TEXT_ONLY)
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    killed = run_cli("index", "--config", str(cfg), "--json", kill_at="write_after_first_commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    home = str(tmp_path / "index" / "dagster")
    with dg.DagsterInstance.from_config(home) as instance:
        stuck = [r.run_id for r in instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))]
    assert len(stuck) == 1
    run_json("index", "--config", str(cfg), "--json")
    with dg.DagsterInstance.from_config(home) as instance:
        run = instance.get_run_by_id(stuck[0])
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
        assert not instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
        messages = [e.message or "" for e in instance.all_logs(stuck[0])]
    assert any("ended without finishing the run (killed)" in m for m in messages), messages[-3:]
