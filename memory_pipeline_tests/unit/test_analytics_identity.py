"""Which model `memory analytics` judges the table against: the one its generation names, not the
one this machine happens to resolve (a paid provider's key missing on an analyst's machine gives
the fallback's model, and every row would read as embedded with another model)."""

from __future__ import annotations

import json
from pathlib import Path

from memory_pipeline.settings import settings_from_dict
from memory_pipeline.stores.analytics import _identity


def _settings(tmp_path: Path, **extra):
    (tmp_path / "mem").mkdir(exist_ok=True)
    return settings_from_dict({"data_dir": "index", "sources": [{"name": "mem", "path": "mem"}], **extra}, base_dir=tmp_path)


def _generation(tmp_path: Path, model: str, provider: str, dims: int) -> None:
    (tmp_path / "index").mkdir(exist_ok=True)
    record = {"provider": provider, "model": model, "dims": dims, "provider_key": "", "number": 1, "created_at": "2026-12-01T00:00:00+00:00"}
    state = {"current": "memory_vectors", "building": None, "previous": [], "generations": {"memory_vectors": record}}
    (tmp_path / "index" / "generations.json").write_text(json.dumps(state))


def test_the_table_is_judged_against_its_generations_model_not_this_machines_fallback(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    _generation(tmp_path, "text-embedding-3-small", "openai", 1536)
    settings = _settings(tmp_path, provider="openai", fallback="local")
    model, table, index_fp = _identity(settings)
    assert (model, table) == ("text-embedding-3-small", "memory_vectors")
    assert index_fp is None  # this machine's identity is not the table's: no fingerprint to judge rows by


def test_the_runs_own_identity_gives_its_fingerprint(tmp_path: Path):
    from memory_pipeline.changes import EmbeddingIdentity, fingerprint
    from memory_pipeline.providers.registry import resolve_provider

    settings = _settings(tmp_path, provider="local")
    ident = EmbeddingIdentity.of(resolve_provider(settings))
    _generation(tmp_path, ident.model, ident.provider, ident.dims)
    assert _identity(settings) == (ident.model, "memory_vectors", fingerprint(settings, ident))
