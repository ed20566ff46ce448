"""Switching the local model's runtime goes through blue/green table generations, as a user does it.

`memory index` with ``local.runtime: torch``, then the config says ``onnx``: the rebuild is a
new generation, search keeps answering from the torch table (embedding the query with torch)
until the build completes and switches, and the two tables hold the same chunks with the same
vectors (fp32 ONNX is the same math). A damaged export is a one-line error, not a traceback.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import lancedb
import numpy as np
import pytest

from memory_pipeline.providers import runtimes
from memory_pipeline.providers.local import default_model_path
from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import run_cli, run_json

pytestmark = pytest.mark.slow

QUERY = "Stripe webhook deliveries got HTTP 502 Bad Gateway"
EXPECTED = "memory/2026-10-06.md"


@pytest.fixture
def mem(tmp_path: Path) -> Path:
    shutil.copytree(SAMPLE, tmp_path / "mem", ignore=TEXT_ONLY)
    return tmp_path


@pytest.fixture(scope="module")
def exported() -> Path:
    """The shipped model's fp32 and fused exports, made once in the default cache (where every
    other test's runs find them; the export itself is tested in unit/test_runtimes.py)."""
    model_path = default_model_path()
    assert model_path is not None
    return runtimes.exported_model(model_path, "all-MiniLM-L6-v2", "none", fused=True).parent


def seeded_cache(tmp_path: Path, exported: Path) -> dict:
    """A private model cache holding a copy of the exports: this test's runs (and damage) stay in it."""
    models = tmp_path / "models"
    shutil.copytree(exported, models / exported.name, ignore=shutil.ignore_patterns(".lock", "model-*int8*"))
    return {"MEMORY_PIPELINE_MODEL_CACHE": str(models)}


def _vectors(root: Path, table: str) -> dict[str, np.ndarray]:
    rows = lancedb.connect(str(root / "index" / "lancedb")).open_table(table).to_arrow().select(["chunk_id", "vector"]).to_pylist()
    return {r["chunk_id"]: np.asarray(r["vector"], dtype=np.float32) for r in rows}


def test_a_runtime_switch_builds_a_new_generation_and_search_follows_it(mem: Path, tmp_path: Path, exported: Path):
    env = seeded_cache(tmp_path, exported)
    cfg = write_config(mem / "memory_pipeline.yaml", local={"runtime": "torch"})
    first = run_json("index", "--config", str(cfg), "--json", env=env)
    assert first["table"] == "memory_vectors" and first["chunks_embedded"] > 0

    write_config(cfg, local={"runtime": "onnx", "quantize": "none"})  # fp32: equal to torch
    killed = run_cli("index", "--config", str(cfg), env=env, kill_at="write_after_first_commit")
    assert killed.returncode == -9
    status = run_json("status", "--config", str(cfg), "--json", env=env)
    gens = {g["table"]: g for g in status["generations"]["generations"]}
    assert gens["memory_vectors"]["role"] == "current" and gens["memory_vectors__g2"]["role"] == "building"
    assert gens["memory_vectors"]["provider_key"] != gens["memory_vectors__g2"]["provider_key"]
    # The torch table still answers, its queries embedded by torch (the configured runtime cannot).
    hits = run_json("search", QUERY, "--config", str(cfg), "--json", env=env)
    assert hits["results"][0]["path"].endswith(EXPECTED) and hits["results"][0]["vector_score"] > 0

    second = run_json("index", "--config", str(cfg), "--json", env=env)
    assert second["generation"] == "switched" and second["table"] == "memory_vectors__g2"
    assert second["table_rows"] == first["table_rows"]
    hits = run_json("search", QUERY, "--config", str(cfg), "--json", env=env)
    assert hits["results"][0]["path"].endswith(EXPECTED) and hits["results"][0]["vector_score"] > 0

    old, new = _vectors(mem, "memory_vectors"), _vectors(mem, "memory_vectors__g2")
    assert old.keys() == new.keys()
    ids = sorted(old)
    cos = np.einsum("ij,ij->i", np.stack([old[i] for i in ids]), np.stack([new[i] for i in ids]))
    assert cos.min() > 0.9999

    # A second run with the same runtime embeds nothing (the export is reused, nothing re-made).
    third = run_json("index", "--config", str(cfg), "--json", env=env)
    assert third["chunks_embedded"] == 0


def test_a_damaged_export_is_one_error_line(mem: Path, tmp_path: Path, exported: Path):
    env = seeded_cache(tmp_path, exported)
    models = tmp_path / "models"
    cfg = write_config(mem / "memory_pipeline.yaml", local={"runtime": "onnx", "quantize": "none"})
    run_json("index", "--config", str(cfg), "--json", env=env)
    damaged = sorted(models.rglob("*.onnx"))  # the plain export and the fused graph the session loads
    assert {p.name for p in damaged} >= {"model.onnx", "model-fused.onnx"}
    for path in damaged:
        path.write_bytes(b"\0" * 64)
    (mem / "mem" / "new-note.md").write_text("# A new note\n\nWritten after the export was damaged.\n")
    proc = run_cli("index", "--config", str(cfg), env=env)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "delete it to export again" in proc.stderr, proc.stderr
