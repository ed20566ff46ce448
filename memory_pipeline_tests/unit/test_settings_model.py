"""The pydantic model behind memory_pipeline.settings: the dataclass API, error wording, and a
property: whatever mapping the YAML file holds, the answer is Settings or one ConfigError line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_pipeline.errors import ConfigError
from memory_pipeline.settings import (
    AnnConfig,
    QueryConfig,
    Settings,
    SourceConfig,
    load_settings,
    settings_as_dict,
    settings_from_dict,
)

BASE = Path("/tmp/cfg")
SOURCES = [{"name": "notes", "path": "notes"}]


def _load(**raw) -> Settings:
    return settings_from_dict({"sources": SOURCES, **raw}, base_dir=BASE, config_path=BASE / "memory_pipeline.yaml")


def _error(**raw) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _load(**raw)
    return info.value


def test_classes_stay_frozen_dataclasses_validated_on_construction():
    """Other modules build, copy and convert these like dataclasses; a bad value is refused there too."""
    src = SourceConfig("s", Path("/x"), ("**/*.md",), ())
    assert src.path == Path("/x") and src.exclude == ()
    assert dataclasses.asdict(QueryConfig())["fusion"] == "weighted"
    s = Settings(data_dir=Path("/d"), sources=())
    assert dataclasses.replace(s, ann=dataclasses.replace(s.ann, min_rows=300)).ann.min_rows == 300
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.provider = "local"  # type: ignore[misc]
    with pytest.raises(ValueError):
        AnnConfig(min_rows=10)


@pytest.mark.parametrize(
    ("raw", "key", "message"),
    [
        ({"chunking": {"tokens": 16}}, "chunking.tokens", "chunking.tokens must be between 32 and 8192"),
        ({"query": {"max_results": 0}}, "query.max_results", "query.max_results must be >= 1"),
        ({"multimodal": {"timeout_seconds": 0}}, "multimodal.timeout_seconds", "multimodal.timeout_seconds must be > 0"),
        ({"query": {"min_score": float("nan")}}, "query.min_score", "query.min_score must be a finite number"),
        ({"chunking": {"tokens": "400"}}, "chunking.tokens", "chunking.tokens must be an integer, got '400'"),
        ({"cache": {"enabled": "yes"}}, "cache.enabled", "cache.enabled must be true or false, got 'yes'"),
        ({"query": {"fusion": "max"}}, "query.fusion", "query.fusion must be one of weighted, rrf, got 'max'"),
        ({"fallback": "none"}, "fallback", "fallback must be one of local, openai, gemini, voyage, mistral, ollama, got 'none'"),
        ({"ann": {"index_type": "HNSW"}}, "ann.index_type", "ann.index_type must be one of IVF_HNSW_SQ, IVF_PQ, IVF_FLAT"),
        ({"fts": {"colour": 1}}, "fts.colour", "unknown setting 'fts.colour' (allowed: ascii_folding, language, stem)"),
        ({"config_path": "/x"}, "config_path", "unknown setting 'config_path'"),
        ({"chunking": {3: 4}}, "chunking.3", "unknown setting 'chunking.3'"),
        ({"query": {"vector_weight": 0, "text_weight": 0}}, "query.vector_weight", "must not both be 0"),
    ],
)
def test_errors_name_the_key_in_one_line(raw, key, message):
    err = _error(**raw)
    assert err.key == key
    assert message in str(err) and "\n" not in str(err)
    assert str(err).startswith(str(BASE / "memory_pipeline.yaml") + ": ")


def test_null_means_default_for_sections_and_remote_values():
    s = _load(multimodal=None, remote={"base_url": None, "concurrency": None, "providers": {"openai": None}, "batch": None})
    assert s.multimodal.enabled and s.remote.base_url == "" and s.remote.concurrency == 4
    assert s.remote.providers["openai"].concurrency == 0


def test_ints_are_numbers_and_types_are_deduplicated():
    s = _load(query={"min_score": 0}, multimodal={"types": ["pdf", "pdf", "image"]})
    assert isinstance(s.query.min_score, float) and s.multimodal.types == ("pdf", "image")


def test_settings_as_dict_has_every_setting_and_round_trips(tmp_path: Path):
    s = _load(chunking={"tokens": 256})
    data = settings_as_dict(s)
    assert "config_path" not in data and data["chunking"] == {"tokens": 256, "overlap": 80}
    assert list(data)[:3] == ["data_dir", "sources", "provider"]
    path = tmp_path / "again.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert dataclasses.replace(load_settings(path), config_path=s.config_path) == s


# --- property: no traceback, whatever the mapping ------------------------------------------

KNOWN = {
    "": ["data_dir", "sources", "provider", "model", "dims", "fallback", "remote", "chunking", "cache", "query",
         "limits", "checks", "multimodal", "table_name", "ann", "fts"],
    "remote": ["base_url", "concurrency", "timeout_ms", "providers", "batch", "max_retries"],
    "chunking": ["tokens", "overlap"], "query": ["max_results", "min_score", "fusion", "mmr_lambda", "vector_weight"],
    "multimodal": ["enabled", "types", "native", "keyframe_seconds"], "ann": ["min_rows", "index_type"],
}  # fmt: skip
NAMES = st.sampled_from(sorted({k for ks in KNOWN.values() for k in ks} | set(KNOWN) - {""})) | st.text(max_size=8)
SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20) | st.sampled_from(["local", "gemini", "rrf", "IVF_PQ", "image", "http://h/v1", "notes", "**/*"])
)  # fmt: skip
KEYS = NAMES | st.integers(-3, 3) | st.none() | st.booleans()
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=12)
SECTIONS = st.fixed_dictionaries(
    {},
    optional={
        "sources": st.lists(st.fixed_dictionaries({"name": NAMES, "path": VALUES}, optional={"include": VALUES, "zz": VALUES}), max_size=3) | VALUES,
        **{name: st.dictionaries(st.sampled_from(keys) | NAMES, VALUES, max_size=4) | VALUES for name, keys in KNOWN.items() if name},
        **{name: VALUES for name in KNOWN[""] if name not in KNOWN and name != "sources"},
    },
)  # fmt: skip
# A valid file with a few settings changed: many of these load, so both outcomes are exercised.
SETTING = st.sampled_from([(section, key) for section, keys in KNOWN.items() if section for key in keys])
PLAUSIBLE = st.sampled_from([None, 0, 1, 64, 300, 0.5, True, False, "rrf", "IVF_PQ", "http://h/v1", ["pdf"], {}])
NEAR_VALID = st.lists(st.tuples(SETTING, PLAUSIBLE | SCALARS), max_size=3).map(
    lambda changes: {"sources": SOURCES, **{section: {key: value} for (section, key), value in changes}}
)  # fmt: skip
MAPPINGS = st.one_of(NEAR_VALID, SECTIONS, st.dictionaries(KEYS, VALUES, max_size=5), VALUES)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MAPPINGS)
def test_any_mapping_gives_settings_or_one_config_error_line(raw):
    try:
        result = settings_from_dict(raw, base_dir=BASE, config_path=BASE / "c.yaml")
    except ConfigError as err:
        assert str(err) and "\n" not in str(err)
        assert err.key is not None
    else:
        assert isinstance(result, Settings) and result.sources


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200) | VALUES.map(lambda v: yaml.safe_dump(v, default_flow_style=True)))
def test_any_file_text_gives_settings_or_one_config_error_line(text):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "memory_pipeline.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_settings(path)
        except ConfigError as err:
            assert str(err) and "\n" not in str(err)
