"""The Python API promised in the README: ``memory_pipeline.search()`` works on every call."""

from __future__ import annotations

from pathlib import Path

import memory_pipeline
from memory_pipeline.display import shown
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import write_config


def test_search_is_callable_again_after_its_module_was_imported(tmp_path: Path):
    (tmp_path / "mem").mkdir()
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml"))
    first = memory_pipeline.search("anything at all", settings=settings)
    # The first call imports memory_pipeline.search, which rebinds the package attribute.
    second = memory_pipeline.search("anything at all", settings=settings)
    assert first == second == []
    from memory_pipeline import search as module_or_function

    assert module_or_function("anything", settings=settings) == []


def test_file_names_are_printed_as_data():
    assert shown("notes/2026-11-01.md") == "notes/2026-11-01.md"
    assert shown("evil\nname\x1b[2J.md") == "evil\\nname\\x1b[2J.md"
    assert "\n" not in shown("a\rb\u2028c\x00d")


def test_a_query_that_is_not_valid_unicode_is_a_clear_error(tmp_path: Path):
    """``search('LanceDB\\udcff')`` (bytes that are not UTF-8, decoded with surrogateescape) reached
    the tokenizer and raised ``TypeError: TextEncodeInput must be …``."""
    import pytest

    from memory_pipeline.errors import ConfigError

    (tmp_path / "mem").mkdir()
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml"))
    with pytest.raises(ConfigError, match="not valid Unicode") as info:
        memory_pipeline.search("LanceDB\udcff", settings=settings)
    assert info.value.key == "query"
