"""Unit tests for memory_pipeline.settings: loading, path resolution, validation, secret refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from memory_pipeline.errors import ConfigError
from memory_pipeline.settings import CONFIG_ENV_VAR, load_settings, resolve_config_path

SECRET = "sk-proj-Zq8vW3kLmN0pR7sT2uX5yA9bC4dE6fG1"


def base_config() -> dict:
    """A minimal valid config mapping."""
    return {"sources": [{"name": "notes", "path": "notes"}]}


def write_config(folder: Path, raw: dict | str) -> Path:
    """Write a mapping (as YAML) or raw text to folder/memory_pipeline.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "memory_pipeline.yaml"
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw), encoding="utf-8")
    return path


def load_error(tmp_path: Path, raw: dict | str) -> ConfigError:
    """Load a config expected to be invalid and return the ConfigError."""
    with pytest.raises(ConfigError) as info:
        load_settings(write_config(tmp_path, raw))
    return info.value


def test_valid_config_loads_with_values_and_defaults(tmp_path):
    """A full config is parsed into the right values; omitted sections get defaults."""
    raw = base_config() | {
        "provider": "local",
        "model": "some/model",
        "chunking": {"tokens": 256, "overlap": 32},
        "query": {"max_results": 3, "min_score": 0},
        "table_name": "mem_v2",
    }
    s = load_settings(write_config(tmp_path, raw))
    assert s.provider == "local" and s.model == "some/model"
    assert (s.chunking.tokens, s.chunking.overlap) == (256, 32)
    assert s.query.max_results == 3 and s.query.min_score == 0.0 and isinstance(s.query.min_score, float)
    assert s.cache.enabled is True and s.cache.max_entries == 200_000
    assert s.table_name == "mem_v2"
    assert [src.name for src in s.sources] == ["notes"]
    assert s.sources[0].include == ("**/*",)
    assert "**/.*" in s.sources[0].exclude


def test_relative_paths_resolve_against_config_folder(tmp_path, monkeypatch):
    """Relative data_dir and source paths are anchored at the config file, not the cwd."""
    cfg_dir = tmp_path / "cfg"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    raw = {"data_dir": "out/index", "sources": [{"name": "a", "path": "../notes"}, {"name": "b", "path": str(tmp_path / "abs")}]}
    s = load_settings(write_config(cfg_dir, raw))
    assert s.data_dir == (cfg_dir / "out" / "index").resolve()
    assert s.sources[0].path == (tmp_path / "notes").resolve()
    assert s.sources[1].path == (tmp_path / "abs").resolve()
    assert s.config_path == (cfg_dir / "memory_pipeline.yaml").resolve()
    assert s.lancedb_uri == str(s.data_dir / "lancedb")


def test_env_var_used_when_no_explicit_path(tmp_path, monkeypatch):
    """MEMORY_PIPELINE_CONFIG is used when no path is passed; an explicit path wins over it."""
    env_cfg = write_config(tmp_path / "env", base_config() | {"table_name": "from_env"})
    explicit = write_config(tmp_path / "explicit", base_config() | {"table_name": "from_arg"})
    monkeypatch.setenv(CONFIG_ENV_VAR, str(env_cfg))
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path() == env_cfg.resolve()
    assert load_settings().table_name == "from_env"
    assert load_settings(explicit).table_name == "from_arg"


def test_default_path_is_cwd_when_env_unset(tmp_path, monkeypatch):
    """Without a path or env var, ./memory_pipeline.yaml in the cwd is used."""
    monkeypatch.delenv(CONFIG_ENV_VAR, raising=False)
    write_config(tmp_path, base_config() | {"table_name": "from_cwd"})
    monkeypatch.chdir(tmp_path)
    assert load_settings().table_name == "from_cwd"


def _with(**changes) -> dict:
    return base_config() | changes


INVALID = [
    ("unknown top-level key", _with(colour="blue"), "colour"),
    ("unknown nested key", _with(chunking={"foo": 1}), "chunking.foo"),
    ("unknown source key", {"sources": [{"name": "a", "path": "x", "glob": "*"}]}, "sources[0].glob"),
    ("sources missing", {"provider": "local"}, "sources"),
    ("sources empty", {"sources": []}, "sources"),
    ("sources not a list", {"sources": {"name": "a", "path": "x"}}, "sources"),
    ("source not a mapping", {"sources": ["notes"]}, "sources[0]"),
    ("duplicate source name", {"sources": [{"name": "a", "path": "x"}, {"name": "a", "path": "y"}]}, "sources[1].name"),
    ("bad source name", {"sources": [{"name": "my notes", "path": "x"}]}, "sources[0].name"),
    ("source name not a string", {"sources": [{"name": 3, "path": "x"}]}, "sources[0].name"),
    ("missing path", {"sources": [{"name": "a"}]}, "sources[0].path"),
    ("empty path", {"sources": [{"name": "a", "path": ""}]}, "sources[0].path"),
    ("bad include", {"sources": [{"name": "a", "path": "x", "include": [3]}]}, "sources[0].include"),
    ("absolute include", {"sources": [{"name": "a", "path": "x", "include": ["/home/me/notes/*.md"]}]}, "sources[0].include"),
    ("include through ./", {"sources": [{"name": "a", "path": "x", "include": ["./**/*.md"]}]}, "sources[0].include"),
    ("exclude through ..", {"sources": [{"name": "a", "path": "x", "exclude": ["../**"]}]}, "sources[0].exclude"),
    ("data_dir is a source folder", {"data_dir": "notes", "sources": [{"name": "a", "path": "notes"}]}, "data_dir"),
    ("provider unknown", _with(provider="magic"), "provider"),
    ("fallback unknown", _with(fallback="magic"), "fallback"),
    ("fallback same as provider", _with(provider="local", fallback="local"), "fallback"),
    ("dims zero", _with(dims=0), "dims"),
    ("dims not an int", _with(dims="768"), "dims"),
    ("remote not a mapping", _with(remote="fast"), "remote"),
    ("remote unknown key", _with(remote={"speed": 1}), "remote.speed"),
    ("remote base_url not a URL", _with(remote={"base_url": "api.openai.com"}), "remote.base_url"),
    ("remote base_url with credentials", _with(remote={"base_url": "https://u:p@host/v1"}), "remote.base_url"),
    ("remote concurrency zero", _with(remote={"concurrency": 0}), "remote.concurrency"),
    ("remote rpm negative", _with(remote={"requests_per_minute": -1}), "remote.requests_per_minute"),
    ("remote provider unknown", _with(remote={"providers": {"local": {}}}), "remote.providers.local"),
    ("remote provider key unknown", _with(remote={"providers": {"openai": {"colour": 1}}}), "remote.providers.openai.colour"),
    ("remote batch key wrong type", _with(remote={"batch": {"enabled": "yes"}}), "remote.batch.enabled"),
    ("model not a string", _with(model=5), "model"),
    ("tokens too small", _with(chunking={"tokens": 16}), "chunking.tokens"),
    ("tokens too large", _with(chunking={"tokens": 100_000}), "chunking.tokens"),
    ("overlap equals tokens", _with(chunking={"tokens": 64, "overlap": 64}), "chunking.overlap"),
    ("overlap negative", _with(chunking={"overlap": -1}), "chunking.overlap"),
    ("tokens wrong type", _with(chunking={"tokens": "big"}), "chunking.tokens"),
    ("tokens bool", _with(chunking={"tokens": True}), "chunking.tokens"),
    ("tokens float", _with(chunking={"tokens": 400.5}), "chunking.tokens"),
    ("chunking not a mapping", _with(chunking="big"), "chunking"),
    ("cache.enabled wrong type", _with(cache={"enabled": "yes"}), "cache.enabled"),
    ("cache.max_entries zero", _with(cache={"max_entries": 0}), "cache.max_entries"),
    ("min_score above 1", _with(query={"min_score": 1.5}), "query.min_score"),
    ("min_score negative", _with(query={"min_score": -0.1}), "query.min_score"),
    ("max_results zero", _with(query={"max_results": 0}), "query.max_results"),
    ("max_file_bytes zero", _with(limits={"max_file_bytes": 0}), "limits.max_file_bytes"),
    ("table_name with dash", _with(table_name="my-table"), "table_name"),
    ("data_dir not a string", _with(data_dir=["a"]), "data_dir"),
]


@pytest.mark.parametrize(("raw", "key"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_config_names_the_key(tmp_path, raw, key):
    """Each validation failure raises ConfigError whose .key names the offending setting."""
    err = load_error(tmp_path, raw)
    assert err.key == key
    assert err.path.endswith("memory_pipeline.yaml") and str(err).startswith(err.path)


def test_top_level_must_be_mapping(tmp_path):
    """A YAML list at top level is refused."""
    err = load_error(tmp_path, "- a\n- b\n")
    assert "mapping" in str(err)


SECRETS = [
    ("top-level api_key", _with(api_key=SECRET), "api_key"),
    ("nested under mapping", _with(openai={"api_key": SECRET}), "openai.api_key"),
    ("nested deep", _with(remote={"auth": {"token": SECRET}}), "remote.auth.token"),
    ("inside a source", {"sources": [{"name": "a", "path": "x", "password": SECRET}]}, "sources[0].password"),
    ("mixed case key", _with(OPENAI_API_KEY=SECRET), "OPENAI_API_KEY"),
    ("client secret", _with(gemini={"client_secret": SECRET}), "gemini.client_secret"),
]


@pytest.mark.parametrize(("raw", "key"), [c[1:] for c in SECRETS], ids=[c[0] for c in SECRETS])
def test_secret_in_yaml_refused_without_echoing_it(tmp_path, raw, key):
    """A secret written in the file is refused; the error names the key but never the value."""
    err = load_error(tmp_path, raw)
    assert err.key == key
    assert SECRET not in str(err) and SECRET not in err.hint
    assert "environment" in str(err)


def test_empty_secret_key_and_token_counts_are_allowed(tmp_path):
    """An empty api_key is not a secret, and chunking.tokens is not mistaken for one."""
    err = load_error(tmp_path, _with(api_key=""))
    assert err.key == "api_key"  # refused as unknown, not as a secret
    assert "unknown" in str(err)
    assert load_settings(write_config(tmp_path, _with(chunking={"tokens": 128}))).chunking.tokens == 128


def test_missing_file(tmp_path):
    """A missing config file is a ConfigError carrying the path and a hint."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_settings(missing)
    assert str(missing) in str(info.value)
    assert CONFIG_ENV_VAR in info.value.hint


@pytest.mark.parametrize(
    "text",
    ["sources: [\n", "a: b: c\n", "sources:\n  - name: a\n   path: x\n", "\tsources: x\n"],
    ids=["unclosed flow", "nested colon", "bad indent", "tab"],
)
def test_invalid_yaml(tmp_path, text):
    """Unparseable YAML becomes a ConfigError chained to the YAML error."""
    err = load_error(tmp_path, text)
    assert "not valid YAML" in str(err)
    assert isinstance(err.__cause__, yaml.YAMLError)


def test_not_utf8(tmp_path):
    """A config that is not UTF-8 is a ConfigError."""
    path = tmp_path / "c.yaml"
    path.write_bytes(b"sources: \xff\xfe\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_settings(path)


def test_invalid_yaml_does_not_echo_secret(tmp_path):
    """A typo on a secret's line (unclosed quote) must not copy the secret into the error."""
    text = f'sources:\n  - name: a\n    path: x\nopenai:\n  api_key: "{SECRET}\n'
    err = load_error(tmp_path, text)
    assert SECRET[8:24] not in str(err)  # PyYAML's snippet truncates long lines, so check a middle part


def test_remote_settings_resolve_per_provider(tmp_path):
    """remote.* is the default for every provider; remote.providers.<name> overrides one; base_url is the primary's."""
    path = tmp_path / "memory_pipeline.yaml"
    path.write_text(yaml.safe_dump(_with(
        provider="openai", fallback="gemini", dims=512,
        remote={"base_url": "http://127.0.0.1:9/v1", "concurrency": 3, "requests_per_minute": 100,
                "providers": {"gemini": {"base_url": "http://127.0.0.1:8", "tokens_per_minute": 5000}},
                "batch": {"enabled": True, "poll_interval_ms": 1000}},
    )))  # fmt: skip
    s = load_settings(path)
    assert s.fallback == "gemini" and s.dims == 512
    primary = s.remote.for_provider("openai", primary=True)
    assert primary.base_url == "http://127.0.0.1:9/v1" and primary.concurrency == 3 and primary.requests_per_minute == 100
    fb = s.remote.for_provider("gemini", primary=False)
    assert fb.base_url == "http://127.0.0.1:8" and fb.tokens_per_minute == 5000 and fb.requests_per_minute == 100
    assert s.remote.for_provider("voyage", primary=False).base_url == ""
    assert s.remote.batch.enabled and s.remote.batch.poll_interval_ms == 1000


def test_an_empty_config_path_or_a_folder_is_refused_not_replaced(tmp_path: Path, monkeypatch):
    """``--config "$CFG"`` with CFG unset fell back to ./memory_pipeline.yaml without a word; a folder
    was "not found"."""
    write_config(tmp_path, base_config())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="path is empty"):
        load_settings("")
    with pytest.raises(ConfigError, match="is a folder"):
        load_settings(str(tmp_path))
    assert load_settings(None).config_path == (tmp_path / "memory_pipeline.yaml").resolve()
