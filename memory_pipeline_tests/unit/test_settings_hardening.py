"""Hardening of memory_pipeline.settings: hostile YAML (aliases, size, depth) and secrets pasted into fields.

A pasted key must never come back in an error message (or, through a loaded config,
in `memory status`): each such error names the key at fault but not the value.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from memory_pipeline.errors import ConfigError
from memory_pipeline.settings import MAX_CONFIG_BYTES, Settings, load_settings
from memory_pipeline_tests.unit.test_settings import load_error, write_config

# Fake values of real shapes.
PASTED = {
    "openai": "sk-proj-Zq8vW3kLmN0pR7sT2uX5yA9bC4dE6fG1hJ2kL3mN4pQ5",
    "google": "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
    "github": "ghp_Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb3d",
}


def base() -> dict:
    return {"sources": [{"name": "notes", "path": "notes"}]}


write = write_config  # the helpers of the settings tests, shared


def shown(err: ConfigError) -> str:
    """Everything a user could see of the error."""
    return " ".join([str(err), err.hint, err.key, err.path, repr(err), *map(str, err.args)])


# --- hostile YAML ------------------------------------------------------------------------------

BILLION_LAUGHS = textwrap.dedent(
    """\
    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
    b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
    c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
    d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
    e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
    f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
    g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
    h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
    i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
    sources: [{name: notes, path: notes}]
    """
)


def test_billion_laughs_fails_fast_in_a_subprocess(tmp_path: Path) -> None:
    """Nested aliases (9^9 nodes once expanded) are refused at the first anchor, in well under the timeout."""
    path = write(tmp_path, BILLION_LAUGHS)
    program = (
        "import sys\n"
        "from memory_pipeline.errors import ConfigError\n"
        "from memory_pipeline.settings import load_settings\n"
        "try:\n"
        f"    load_settings({str(path)!r})\n"
        "except ConfigError as err:\n"
        "    print(err)\n"
        "    sys.exit(3)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30
    assert done.returncode == 3, done.stderr
    assert "may not use YAML anchors/aliases" in done.stdout
    assert "line 1" in done.stdout


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {tokens: 400}\nchunking: *b\nsources: [{name: a, path: x}]\n",
        "sources: [{name: a, path: x}]\nchunking:\n  <<: *b\n",
        "sources: &s [{name: a, path: x}]\n",
    ],
    ids=["anchor and alias", "merge key alias", "anchor alone"],
)
def test_anchors_and_aliases_are_refused(tmp_path: Path, text: str) -> None:
    err = load_error(tmp_path, text)
    assert "may not use YAML anchors/aliases" in str(err)
    assert isinstance(err.__cause__, yaml.YAMLError)


def test_oversized_config_is_refused_before_parsing(tmp_path: Path) -> None:
    """A config over 1 MiB is refused with the limit in the message, whatever it holds."""
    text = yaml.safe_dump(base()) + "# padding\n" * (MAX_CONFIG_BYTES // 10 + 1)
    started = time.monotonic()
    err = load_error(tmp_path, text)
    assert time.monotonic() - started < 5
    assert "larger than 1 MiB" in str(err)


def test_config_just_under_the_cap_loads(tmp_path: Path) -> None:
    text = yaml.safe_dump(base())
    text += "#" * (MAX_CONFIG_BYTES - len(text.encode()) - 1) + "\n"
    assert len(text.encode()) == MAX_CONFIG_BYTES
    assert load_settings(write(tmp_path, text)).sources[0].name == "notes"


def test_deeply_nested_yaml_is_a_config_error(tmp_path: Path) -> None:
    """Nesting past the interpreter's recursion limit is a ConfigError, not a RecursionError traceback."""
    err = load_error(tmp_path, "sources: " + "[" * 20_000 + "]" * 20_000 + "\n")
    assert "nested too deeply" in str(err)


def test_unreadable_config_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError while reading (permissions, I/O) is a ConfigError naming the file, not a traceback."""
    path = write(tmp_path, base())

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(ConfigError, match="cannot read the config file \\(Permission denied\\)") as info:
        load_settings(path)
    assert info.value.path == str(path)


# --- secrets pasted into fields -----------------------------------------------------------------


def _set(raw: dict, dotted: str, value: object) -> dict:
    """raw with the setting at ``dotted`` (a.b, sources[0].name, x.y[0]) set to value."""
    tokens = re.findall(r"\[\d+\]|[^.\[]+", dotted)
    node: Any = raw
    for i, token in enumerate(tokens):
        last = i == len(tokens) - 1
        fresh: Any = value if last else ([] if tokens[i + 1].startswith("[") else {})
        if token.startswith("["):
            index = int(token[1:-1])
            while len(node) <= index:
                node.append(None)
            if last or node[index] is None:
                node[index] = fresh
            node = node[index]
        else:
            if last or not isinstance(node.get(token), (dict, list)):
                node[token] = fresh
            node = node[token]
    return raw


FIELDS = [
    "provider", "model", "fallback", "table_name", "data_dir", "sources[0].name", "sources[0].path",
    "sources[0].include[0]", "sources[0].exclude[0]", "remote.base_url", "remote.providers.openai.base_url",
    "query.fusion", "ann.index_type", "fts.language", "multimodal.types[0]", "chunking.tokens",
]  # fmt: skip


@pytest.mark.parametrize("kind", list(PASTED))
@pytest.mark.parametrize("field", FIELDS)
def test_pasted_key_is_refused_without_echoing_it(tmp_path: Path, field: str, kind: str) -> None:
    """A key pasted into any string field fails with an error naming the field, never the value."""
    secret = PASTED[kind]
    err = load_error(tmp_path, _set(base(), field, secret))
    assert err.key == field
    assert "looks like an API key or secret" in str(err) and "value not shown" in str(err)
    assert "environment" in str(err)
    assert secret not in shown(err) and secret[4:20] not in shown(err)


@pytest.mark.parametrize("kind", list(PASTED))
def test_pasted_key_as_a_setting_name_is_refused_without_echoing_it(tmp_path: Path, kind: str) -> None:
    secret = PASTED[kind]
    err = load_error(tmp_path, base() | {"remote": {secret: 1}})
    assert err.key == "remote"
    assert "looks like an API key or secret" in str(err)
    assert secret not in shown(err)


def test_pasted_key_inside_a_url_is_refused(tmp_path: Path) -> None:
    url = "https://api.example.com/v1?key=" + PASTED["google"]
    err = load_error(tmp_path, base() | {"remote": {"base_url": url}})
    assert err.key == "remote.base_url" and PASTED["google"] not in shown(err)


def test_wrong_type_error_does_not_echo_a_secret(tmp_path: Path) -> None:
    """Even an error about a value's type masks a secret nested in it (the value is a list here)."""
    err = load_error(tmp_path, base() | {"query": {"max_results": ["x", PASTED["openai"]]}})
    assert PASTED["openai"] not in shown(err)


def test_unknown_provider_still_names_a_harmless_value(tmp_path: Path) -> None:
    err = load_error(tmp_path, base() | {"provider": "openaii"})
    assert err.key == "provider"
    assert "'openaii'" in str(err)


def test_unknown_source_name_is_masked_when_it_looks_like_a_key(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, base()))
    assert isinstance(settings, Settings)
    with pytest.raises(ConfigError) as info:
        settings.source(PASTED["github"])
    assert PASTED["github"] not in shown(info.value)
    with pytest.raises(ConfigError, match="'journal'"):
        settings.source("journal")


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("local", "all-MiniLM-L6-v2"),
        ("local", "sentence-transformers/all-MiniLM-L6-v2"),
        ("local", "/models/my-model"),
        ("local", "BAAI/bge-large-en-v1.5"),
        ("openai", "text-embedding-3-small"),
        ("openai", "text-embedding-3-large"),
        ("gemini", "gemini-embedding-2-preview"),
        ("gemini", "gemini-embedding-001"),
        ("voyage", "voyage-4-large"),
        ("voyage", "voyage-3.5-lite"),
        ("mistral", "mistral-embed"),
        ("ollama", "nomic-embed-text:latest"),
    ],
)
def test_ordinary_model_names_still_load(tmp_path: Path, provider: str, model: str) -> None:
    settings = load_settings(write(tmp_path, base() | {"provider": provider, "model": model}))
    assert (settings.provider, settings.model) == (provider, model)


def test_ordinary_config_values_still_load(tmp_path: Path) -> None:
    """Paths, globs, URLs and names of an ordinary config are not mistaken for secrets."""
    raw = {
        "data_dir": "~/.memory/index-3f2a9c7e1b4d5f6a8c9e0b1d2f3a4c5e",
        "sources": [
            {"name": "agent-notes_2026", "path": "/srv/agents/123e4567-e89b-12d3-a456-426614174000/memory", "include": ["**/*.md", "**/*.jsonl"]},
            {"name": "secrets-policy", "path": "docs/security/passwords"},
        ],
        "provider": "openai",
        "model": "text-embedding-3-small",
        "fallback": "local",
        "remote": {"base_url": "http://127.0.0.1:8080/v1", "providers": {"gemini": {"base_url": "https://generativelanguage.googleapis.com"}}},
        "table_name": "memory_vectors_v2",
    }  # fmt: skip
    settings = load_settings(write(tmp_path, raw))
    assert [s.name for s in settings.sources] == ["agent-notes_2026", "secrets-policy"]
