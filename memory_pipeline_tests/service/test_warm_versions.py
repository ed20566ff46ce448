"""The server's warm searcher waits out a table version whose new rows the indices lack.

Real `memory index` runs write a real LanceDB table; ``WarmSearcher`` (what `memory serve` searches
through) is driven in this process. A version with more unindexed rows than ``DEFER_ROWS`` (by
default any: a few hundred already double a search's CPU at 100k chunks) is
searched only once a fold covers it, or after ``MAX_LAG_SECONDS``; this server's own writes
(``invalidate``) are seen at once; the version searched meanwhile is the previous, whole one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_pipeline.service import warm
from memory_pipeline.service.warm import WarmSearcher
from memory_pipeline.settings import load_settings
from memory_pipeline.stores import generations
from memory_pipeline.stores.lance import VectorStore
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import run_json

NOTES = {
    "tides.md": "# Tides\nHigh tide at Terschelling is at 14:05 on Saturday.\n",
    "ferry.md": "# Ferry\nThe ferry to Vlieland leaves at seven from Harlingen.\n",
}
NEW = "# Lighthouse\nThe Brandaris lighthouse keeper logs the fog horn tests on Mondays.\n"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    mem = tmp_path / "mem"
    mem.mkdir()
    for name, text in NOTES.items():
        (mem / name).write_text(text)
    config = write_config(tmp_path / "memory_pipeline.yaml")
    run_json("index", "--config", str(config), "--json", cwd=tmp_path)
    return config


def _paths(searcher: WarmSearcher, query: str) -> set[str]:
    s = searcher.get()
    return {Path(r.path).name for r in s.search(query, s.options(min_score=0.0))}


def _write_unfolded(config: Path) -> None:
    """A new note indexed by another process (no server up: its few rows stay unindexed)."""
    (config.parent / "mem" / "lighthouse.md").write_text(NEW)
    run_json("index", "--config", str(config), "--json", cwd=config.parent)


def _fold(config: Path) -> None:
    settings = load_settings(config)
    VectorStore(settings.lancedb_uri, generations.current(settings)[0]).fold_new_rows()


def test_a_version_with_unindexed_rows_is_waited_out_until_a_fold(folder: Path):
    """By default, a handful of another process's unfolded rows too."""
    assert warm.DEFER_ROWS == 0
    searcher = WarmSearcher(load_settings(folder), refresh_seconds=0.0)
    assert "tides.md" in _paths(searcher, "Terschelling tide")
    before = int(searcher.get().table.version)
    _write_unfolded(folder)
    # The new note's rows are committed but not indexed: searches stay on the version before.
    assert "lighthouse.md" not in _paths(searcher, "Brandaris lighthouse fog horn")
    assert int(searcher.get().table.version) == before and searcher.deferred_version is not None
    assert "tides.md" in _paths(searcher, "Terschelling tide")  # the old version answers whole
    _fold(folder)
    assert "lighthouse.md" in _paths(searcher, "Brandaris lighthouse fog horn")
    assert searcher.deferred_version is None


def test_the_wait_is_bounded_and_the_servers_own_writes_are_seen_at_once(folder: Path, monkeypatch):
    searcher = WarmSearcher(load_settings(folder), refresh_seconds=0.0)
    _paths(searcher, "Terschelling tide")
    _write_unfolded(folder)
    assert "lighthouse.md" not in _paths(searcher, "Brandaris lighthouse fog horn")
    searcher.invalidate()  # this server wrote: its rows are searched at once, indexed or not
    assert "lighthouse.md" in _paths(searcher, "Brandaris lighthouse fog horn")

    (folder.parent / "mem" / "ferry.md").write_text("# Ferry\nThe ferry to Texel leaves from Den Helder every hour.\n")
    run_json("index", "--config", str(folder), "--json", cwd=folder.parent)
    monkeypatch.setattr(warm, "MAX_LAG_SECONDS", 0.0)  # waited long enough: the latest, unindexed or not
    assert "ferry.md" in _paths(searcher, "Texel Den Helder")


def test_unindexed_rows_under_the_threshold_are_searched_at_once(folder: Path, monkeypatch):
    monkeypatch.setattr(warm, "DEFER_ROWS", 100)
    searcher = WarmSearcher(load_settings(folder), refresh_seconds=0.0)
    _paths(searcher, "Terschelling tide")
    _write_unfolded(folder)  # a handful of rows: under the threshold
    assert "lighthouse.md" in _paths(searcher, "Brandaris lighthouse fog horn")
    assert searcher.deferred_version is None
