"""`memory config show` and `memory config set`, run as a user runs them (the real CLI, in a subprocess)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from memory_pipeline_tests.helpers import REPO, run_cli

SECRET = "sk-proj-Zq8vW3kLmN0pR7sT2uX5yA9bC4dE6fG1hJ2kL3mN4pQ5"


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    """A copy of the shipped, commented memory_pipeline.yaml."""
    path = tmp_path / "memory_pipeline.yaml"
    shutil.copy(REPO / "memory_pipeline.yaml", path)
    return path


def config(*args: str, cfg: Path, **kwargs):
    return run_cli("config", *args, "--config", str(cfg), **kwargs)


def test_show_prints_every_setting_with_defaults_as_yaml_and_json(shipped: Path):
    proc = config("show", cfg=shipped)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"# effective configuration of {shipped}")
    shown = yaml.safe_load(proc.stdout)
    assert shown["data_dir"] == str(shipped.parent / "data" / "index")  # resolved against the file's folder
    assert shown["sources"][0]["path"] == str(shipped.parent / "data" / "sample")
    assert shown["remote"]["batch"]["poll_interval_ms"] == 30000  # a default: not in the file
    assert shown["multimodal"]["types"] == ["image", "audio", "video", "pdf", "document"]
    assert "config_path" not in shown
    as_json = json.loads(config("show", "--json", cfg=shipped).stdout)
    assert as_json == shown


def test_show_one_setting_or_section(shipped: Path):
    assert config("show", "chunking.tokens", cfg=shipped).stdout.strip() == "400"
    assert json.loads(config("show", "query", "--json", cfg=shipped).stdout)["fusion"] == "weighted"
    assert config("show", "sources[0].name", cfg=shipped).stdout.strip() == "sample"
    proc = config("show", "chunking.colour", cfg=shipped)
    assert proc.returncode == 2 and "no setting 'chunking.colour'" in proc.stderr


def test_show_keeps_environment_values_out(tmp_path: Path):
    """A path written with $VARIABLES is shown as written: the environment's value never appears."""
    cfg = tmp_path / "memory_pipeline.yaml"
    cfg.write_text("data_dir: $MEMORY_TEST_PRIVATE/index\nsources: [{name: m, path: mem}]\n")
    env = {"MEMORY_TEST_PRIVATE": str(tmp_path / "private-folder-name")}
    proc = config("show", cfg=cfg, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "private-folder-name" not in proc.stdout
    assert yaml.safe_load(proc.stdout)["data_dir"] == "$MEMORY_TEST_PRIVATE/index"


def test_set_changes_one_value_and_keeps_comments_and_order(shipped: Path):
    before = shipped.read_text()
    proc = config("set", "chunking.tokens", "256", cfg=shipped)
    assert proc.returncode == 0, proc.stderr
    assert "chunking.tokens: 256" in proc.stdout
    after = shipped.read_text()
    assert after == before.replace("  tokens: 400 ", "  tokens: 256 ")  # only that value changed, its comment kept
    assert config("show", "chunking.tokens", cfg=shipped).stdout.strip() == "256"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("multimodal.types", "[image, pdf]", ["image", "pdf"]),
        ("remote.base_url", "http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1"),
        ("remote.batch.enabled", "true", True),
        ("query.min_score", "0.25", 0.25),
        ("sources[0].exclude", '["**/.*"]', ["**/.*"]),
        ("model", "null", None),
        ("fts.language", "English", "English"),
    ],
)
def test_set_values_parsed_as_yaml(shipped: Path, key: str, value: str, expected):
    """New keys and sections are added under their section; every comment of the file stays."""
    comments = [line for line in shipped.read_text().splitlines() if line.lstrip().startswith("#")]
    proc = config("set", key, value, cfg=shipped)
    assert proc.returncode == 0, proc.stderr
    text = shipped.read_text()
    assert all(c in text for c in comments)
    assert json.loads(config("show", key, "--json", cfg=shipped).stdout) == expected
    assert list(yaml.safe_load(text))[:4] == ["data_dir", "sources", "provider", "model"]


@pytest.mark.parametrize(("key", "value"), [("query", "{}"), ("sources", "[{name: notes, path: notes}]"), ("chunking", "{tokens: 256}")])
def test_set_of_a_whole_section_keeps_every_other_comment(shipped: Path, key: str, value: str):
    """``config set query '{}'`` wrote the whole shipped file out again: every comment in it went,
    the commented-out ``remote:`` help included, with a [WARN]. Only the section's own text changes."""
    kept = [line for line in shipped.read_text().splitlines() if line.lstrip().startswith("#")]
    proc = config("set", key, value, cfg=shipped)
    assert proc.returncode == 0 and "[WARN]" not in proc.stderr, proc.stderr
    text = shipped.read_text()
    lost = [c for c in kept if c not in text]
    assert lost == [], lost
    assert yaml.safe_load(text)[key] == yaml.safe_load(value)
    assert list(yaml.safe_load(text))[:4] == ["data_dir", "sources", "provider", "model"]


@pytest.mark.parametrize(
    ("layout", "key", "value"),
    [
        ("sources:\n- name: notes  # a compact list\n  path: notes\nprovider: local  # kept\n", "sources", "[{name: mem, path: notes}]"),
        ("sources:\n  - name: notes\n    path: >-\n      notes\nprovider: local  # kept\n", "sources", "[{name: mem, path: notes}]"),
        ("sources:\n  - name: notes\n    path: notes\nquery:\n  min_score: 0.4\n  mmr_lambda: 0.5\nmodel: null  # kept\n", "query", "{}"),
    ],
)
def test_set_of_a_section_in_other_layouts_keeps_the_comments(tmp_path: Path, layout: str, key: str, value: str):
    """A compact list (``sources:`` then ``- name``) or a section that ends in a block scalar gave
    YAML that did not parse (``sources:\n[...]``, ``{}provider:``), so the file was written out again."""
    cfg = tmp_path / "memory_pipeline.yaml"
    (tmp_path / "notes").mkdir()
    cfg.write_text(layout)
    proc = config("set", key, value, cfg=cfg)
    assert proc.returncode == 0 and "[WARN]" not in proc.stderr, proc.stderr
    text = cfg.read_text()
    assert "# kept" in text, text
    assert yaml.safe_load(text)[key] == yaml.safe_load(value)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("chunking.tokens", "10", "chunking.tokens must be between 32 and 8192"),
        ("chunking.tokens", "many", "chunking.tokens must be an integer, got 'many'"),
        ("chunking.colour", "1", "unknown setting 'chunking.colour'"),
        ("provider", "magic", "provider must be one of"),
        ("sources[3].path", "x", "sources[3] does not exist"),
        ("chunking..tokens", "1", "is not a setting name"),
        ("chunking.tokens", "[1, ", "not valid YAML"),
        ("provider.name", "x", "provider is not a mapping"),
        ("model", SECRET, "model: looks like an API key or secret"),
        ("openai.api_key", SECRET, "looks like a secret"),
    ],
)
def test_set_refuses_bad_keys_and_values_with_one_line_exit_2(shipped: Path, key: str, value: str, fragment: str):
    before = shipped.read_text()
    proc = config("set", key, value, cfg=shipped)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memory config: error:") and fragment in lines[0], proc.stderr
    assert SECRET not in proc.stderr + proc.stdout and SECRET[8:24] not in proc.stderr
    assert shipped.read_text() == before  # nothing written
    assert not [p for p in shipped.parent.iterdir() if p.name != shipped.name]  # no temporary file left


def test_set_creates_a_missing_file(tmp_path: Path):
    cfg = tmp_path / "new.yaml"
    refused = config("set", "provider", "local", cfg=cfg)
    assert refused.returncode == 2 and "'sources' must be a non-empty list" in refused.stderr and not cfg.exists()
    proc = config("set", "sources", "[{name: notes, path: notes}]", cfg=cfg)
    assert proc.returncode == 0, proc.stderr
    assert config("set", "provider", "local", cfg=cfg).returncode == 0
    data = yaml.safe_load(cfg.read_text())
    assert data == {"sources": [{"name": "notes", "path": "notes"}], "provider": "local"}
    assert cfg.read_text().startswith("# memory_pipeline configuration")


def test_set_rewrites_flow_style_files_keeping_keys_and_order(tmp_path: Path):
    """A file that cannot be edited in place (a flow mapping at the top) is written again, same keys, same order."""
    cfg = tmp_path / "memory_pipeline.yaml"
    cfg.write_text("# mine\n{table_name: t1, sources: [{name: m, path: mem}], provider: local}\n")
    proc = config("set", "chunking.overlap", "40", cfg=cfg)
    assert proc.returncode == 0, proc.stderr
    text = cfg.read_text()
    assert text.startswith("# mine\n")
    assert list(yaml.safe_load(text)) == ["table_name", "sources", "provider", "chunking"]
    assert yaml.safe_load(text)["chunking"] == {"overlap": 40}


def test_broken_file_is_an_error_exit_1(tmp_path: Path):
    cfg = tmp_path / "memory_pipeline.yaml"
    cfg.write_text("sources: [unclosed\n")
    for args in (("show",), ("set", "provider", "local")):
        proc = config(*args, cfg=cfg)
        assert proc.returncode == 1 and "not valid YAML" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_config_help_has_examples():
    for args in (("config", "--help"), ("config", "show", "--help"), ("config", "set", "--help")):
        proc = run_cli(*args)
        assert proc.returncode == 0 and "Example:\n  memory config" in proc.stdout, args
