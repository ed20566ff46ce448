"""Table generations (real LanceDB on a temp dir) and provider selection (auto, fallback, keys)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from memory_pipeline.errors import ConfigError, ProviderUnavailable, StoreError
from memory_pipeline.providers import registry
from memory_pipeline.settings import settings_from_dict
from memory_pipeline.stores import generations
from memory_pipeline.stores.lance import VectorStore, table_schema
from memory_pipeline_tests.fakes.openai_server import OpenAIFake

KEYS = ("OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "VOYAGE_API_KEY", "MISTRAL_API_KEY", "OLLAMA_API_KEY")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    registry._CACHE.clear()


def settings(tmp_path: Path, **raw):
    (tmp_path / "mem").mkdir(exist_ok=True)
    return settings_from_dict({"sources": [{"name": "m", "path": "mem"}], "data_dir": "index", **raw}, base_dir=tmp_path)


def meta(model: str, dims: int, provider: str = "openai") -> dict:
    return {"provider": provider, "model": model, "dims": dims, "provider_key": f"{provider}-{model}-{dims}"}


def create(s, name: str, m: dict, rows: int = 0) -> None:
    store = VectorStore(s.lancedb_uri, name)
    store.ensure(m["dims"], m)
    if rows:
        schema = table_schema(m["dims"], m)
        data = {f.name: [None] * rows for f in schema}
        data["chunk_id"] = [f"c{i}" for i in range(rows)]
        data["vector"] = [[1.0] + [0.0] * (m["dims"] - 1)] * rows
        store.open().add(pa.Table.from_pydict(data, schema=schema))


def test_first_generation_keeps_the_table_name_and_a_change_builds_beside_it(tmp_path):
    s = settings(tmp_path)
    small, large = meta("small", 8), meta("large", 16)
    assert generations.write_target(s, small) == ("memory_vectors", False)
    create(s, "memory_vectors", small, rows=3)
    assert generations.write_target(s, small) == ("memory_vectors", False)
    assert generations.write_target(s, large) == ("memory_vectors__g2", True)
    assert generations.write_target(s, large) == ("memory_vectors__g2", True)  # the same build continues
    create(s, "memory_vectors__g2", large, rows=1)
    assert generations.current(s)[0] == "memory_vectors"  # searches keep the old one
    assert generations.table_for(s, large) == "memory_vectors__g2" and generations.table_for(s, small) == "memory_vectors"
    info = generations.describe(s)
    assert [(g["table"], g["role"], g["rows"]) for g in info["generations"]] == [
        ("memory_vectors", "current", 3), ("memory_vectors__g2", "building", 1)
    ]  # fmt: skip
    state = generations.switch(s, "memory_vectors__g2")
    assert state["current"] == "memory_vectors__g2" and state["previous"] == ["memory_vectors"] and state["building"] is None
    on_disk = json.loads((s.data_dir / "generations.json").read_text())
    assert on_disk["current"] == "memory_vectors__g2"


def test_an_abandoned_build_is_dropped_when_the_config_changes_again(tmp_path):
    s = settings(tmp_path)
    generations.write_target(s, meta("a", 8))
    create(s, "memory_vectors", meta("a", 8), rows=1)
    name_b, _ = generations.write_target(s, meta("b", 8))
    create(s, name_b, meta("b", 8), rows=1)
    name_c, building = generations.write_target(s, meta("c", 8))
    assert building and name_c == "memory_vectors__g3"
    assert not VectorStore(s.lancedb_uri, name_b).exists()
    assert [g["table"] for g in generations.describe(s)["generations"]] == ["memory_vectors", "memory_vectors__g3"]


def test_rollback_and_prune(tmp_path):
    s = settings(tmp_path)
    generations.write_target(s, meta("a", 8))
    create(s, "memory_vectors", meta("a", 8), rows=1)
    new, _ = generations.write_target(s, meta("b", 8))
    create(s, new, meta("b", 8), rows=2)
    generations.switch(s, new)
    assert generations.rollback(s)["current"] == "memory_vectors"
    assert generations.current(s)[1]["model"] == "a"
    generations.rollback(s)
    assert generations.prune(s) == ["memory_vectors"]
    assert not VectorStore(s.lancedb_uri, "memory_vectors").exists()
    with pytest.raises(StoreError, match="no previous generation"):
        generations.rollback(s)


def test_a_table_from_before_generations_is_adopted(tmp_path):
    s = settings(tmp_path)
    create(s, "memory_vectors", meta("old", 8), rows=2)
    assert not (s.data_dir / "generations.json").exists()
    assert generations.current(s)[1]["model"] == "old"
    assert generations.write_target(s, meta("new", 8)) == ("memory_vectors__g2", True)
    assert generations.current(s) == ("memory_vectors", generations.load(s)["generations"]["memory_vectors"])


# --- provider selection ---------------------------------------------------------------


def test_explicit_provider_without_key_is_a_clear_error(tmp_path):
    with pytest.raises(ProviderUnavailable, match="OPENAI_API_KEY is not set") as info:
        registry.resolve_provider(settings(tmp_path, provider="openai"))
    assert "export OPENAI_API_KEY" in info.value.hint


def test_auto_takes_local_first_when_its_model_is_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    assert registry.resolve_provider(settings(tmp_path, provider="auto")).actual == "local"


def test_auto_order_by_available_key(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_local", lambda model, *_a, **_k: (_ for _ in ()).throw(ProviderUnavailable("no model", provider="local")))
    s = settings(tmp_path, provider="auto")
    assert registry.resolve_provider(s).provider is None
    monkeypatch.setenv("MISTRAL_API_KEY", "m")
    assert registry.resolve_provider(s).actual == "mistral"
    monkeypatch.setenv("VOYAGE_API_KEY", "v")
    assert registry.resolve_provider(s).actual == "voyage"
    monkeypatch.setenv("GOOGLE_API_KEY", "g")
    assert registry.resolve_provider(s).actual == "gemini"
    monkeypatch.setenv("OPENAI_API_KEY", "o")
    resolved = registry.resolve_provider(s)
    assert resolved.actual == "openai" and resolved.provider.model == "text-embedding-3-small"


def test_fallback_when_the_primary_cannot_start_and_when_neither_can(tmp_path, monkeypatch):
    s = settings(tmp_path, provider="voyage", fallback="mistral")
    neither = registry.resolve_provider(s)  # full-text only, with the reason: never an error
    assert neither.provider is None and neither.fallback_from == "voyage"
    assert "fallback cannot start either" in neither.reason and neither.reason.endswith("full-text search only")
    monkeypatch.setenv("MISTRAL_API_KEY", "m")
    resolved = registry.resolve_provider(s)
    assert resolved.actual == "mistral" and resolved.fallback_from == "voyage" and "VOYAGE_API_KEY" in resolved.reason


def test_a_recorded_permanent_failure_selects_the_fallback_until_cleared(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    s = settings(tmp_path, provider="openai", fallback="local")
    assert registry.resolve_provider(s).actual == "openai"
    registry.mark_primary_failed(s, "openai", "HTTP 401: bad key")
    resolved = registry.resolve_provider(s)
    assert resolved.actual == "local" and "failed permanently" in resolved.reason and "HTTP 401" in resolved.reason
    # Another primary in the config is not held back by the old record.
    assert registry.resolve_provider(settings(tmp_path, provider="openai", model="text-embedding-3-large", fallback="local")).actual == "openai"
    assert registry.clear_primary_failure(s)
    assert registry.resolve_provider(s).actual == "openai"


def test_provider_key_is_an_identity_not_a_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-first-secret")
    with OpenAIFake() as fake:
        s = settings(tmp_path, provider="openai", remote={"base_url": fake.base_url})
        first = registry.resolve_provider(s).provider
        monkeypatch.setenv("OPENAI_API_KEY", "sk-rotated-secret")
        rotated = registry.resolve_provider(s).provider
        assert rotated is not first and rotated.provider_key == first.provider_key  # a rotated key keeps the vectors
        other = registry.resolve_provider(settings(tmp_path, provider="openai", remote={"base_url": fake.root_url + "/v2"})).provider
        assert other.provider_key != first.provider_key  # another endpoint does not
        for p in (first, rotated):
            assert "secret" not in p.provider_key and "secret" not in json.dumps(p.describe())


def test_query_provider_rebuilds_the_generations_provider(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    with OpenAIFake() as fake:
        old = settings(tmp_path, provider="openai", dims=256, remote={"base_url": fake.base_url})
        built = registry.resolve_provider(old).provider
        record = {"provider": "openai", "model": built.model, "dims": 256, "provider_key": built.provider_key}
        new = settings(tmp_path, provider="openai", model="text-embedding-3-large", remote={"base_url": fake.base_url})
        q = registry.query_provider(new, record)
        assert q.model == "text-embedding-3-small" and q.dims == 256 and q.provider_key == built.provider_key
        assert registry.query_provider(new, record | {"provider_key": "someone-else"}) is None


def test_dims_the_model_cannot_give_fail_at_selection(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "g")
    with pytest.raises(ConfigError, match="768, 1536, 3072"):
        registry.resolve_provider(settings(tmp_path, provider="gemini", dims=100))
