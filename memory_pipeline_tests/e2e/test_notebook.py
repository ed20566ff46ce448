"""notebooks/coverage.ipynb runs against a real index and saves its charts as PNG."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import REPO, run_json

pytestmark = pytest.mark.slow
CHARTS = ("coverage_by_modality.png", "failures_by_reason.png", "index_growth.png")


def test_coverage_notebook_executes_and_saves_charts(tmp_path: Path, monkeypatch):
    shutil.copytree(SAMPLE, tmp_path / "mem", ignore=TEXT_ONLY)
    (tmp_path / "mem" / "broken.md").write_bytes(b"\xff\xfe not utf-8\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    run_json("index", "--config", str(cfg), "--json")
    (tmp_path / "mem" / "memory" / "extra.md").write_text("# Extra\nA second run grows the index.\n")
    run_json("index", "--config", str(cfg), "--json")

    nb = nbformat.read(REPO / "notebooks" / "coverage.ipynb", as_version=4)
    monkeypatch.setenv("MEMORY_PIPELINE_CONFIG", str(cfg))
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}})
    client.execute(env=dict(os.environ))

    outputs = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", []))
    assert "markdown" in outputs and "indexed 15/16" in outputs  # 14 notes + extra.md; broken.md failed
    assert "2 runs" in outputs
    for name in CHARTS:
        png = tmp_path / "index" / "charts" / name
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, name
