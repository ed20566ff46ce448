"""`benchmarks/search_cpu.py` (the README's "where a search's CPU goes") runs on a real index and
charges the searches' CPU to LanceDB's calls; a bad config is one clear line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memory_pipeline.runner import run_index
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import write_config

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "search_cpu.py"


def test_search_cpu_reports_each_lance_call(tmp_path):
    mem = tmp_path / "mem"
    mem.mkdir()
    for i in range(6):
        (mem / f"n{i}.md").write_text(f"# Note {i}\n\nThe harbour crane {i} was inspected; the pilot signed the review.\n\n## Later\n\nBudget {i}.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    run_index(load_settings(cfg))
    queries = tmp_path / "queries.txt"
    queries.write_text("harbour crane\npilot review\n\nbudget\n")
    out = tmp_path / "cpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", str(cfg), "--queries", str(queries), "--seconds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["searches"] > 0 and got["cpu_ms_per_search"] > 0
    # A table this small has its full-text statistics in memory (loaded at start-up, as the server does).
    text = got["parts"]["full text in memory (TextIndex)"]
    assert text["calls_per_search"] >= 1 and text["cpu_ms_per_search"] > 0
    assert "full text on doc_search_text" not in got["parts"]
    assert "VectorQuery" not in got["parts"]  # a full-text-only index: no vector leg
    assert f"{got['searches']} searches" in proc.stdout


def test_search_cpu_bad_config_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", str(tmp_path / "missing.yaml")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("[ERROR] ") and "Traceback" not in proc.stderr


def test_bench_ann_segments_compares_the_two_index_shapes(tmp_path):
    """`benchmarks/bench_ann_segments.py` (the README's numbers for the segment folds) builds the
    index both ways through the product's calls and measures each; small sizes here."""
    script = SCRIPT.parent / "bench_ann_segments.py"
    out = tmp_path / "ann.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--rows", "3000", "--segment-rows", "1000", "--min-rows", "1000", "--slice-rows", "500",
         "--work-dir", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    whole, segments = got["whole"], got["segments"]
    assert whole["delta_indices"] == 1 and whole["index_steps"] == 1 and whole["indexed_rows"] == 3000
    # Built over the first 1,000 rows, then a delta per later segment, each over just its rows.
    assert segments["delta_indices"] == 3 and segments["index_steps"] == 3 and segments["indexed_rows"] == 3000
    assert [s["ann"] for s in segments["steps"]] == ["built", "folded", "folded"]
    for shape in (whole, segments):
        assert shape["search"]["recall_at_10"] >= 0.9 and shape["search"]["p50_ms"] > 0 and shape["peak_mb"] > 0
