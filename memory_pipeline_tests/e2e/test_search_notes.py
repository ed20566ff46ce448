"""A note shown among the results is ranked once: the second ranking (which drops a media file's
note when the file is a result too) runs only when the note's own file is among the candidates."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_pipeline.runner import run_index
from memory_pipeline.search import MemorySearcher
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    root = tmp_path_factory.mktemp("notes")
    mem = root / "mem"
    (mem / "photos").mkdir(parents=True)
    # A note whose file is not in the memory (removed, or excluded): an ordinary note.
    (mem / "photos" / "lake.jpg.note.md").write_text("Kayak rental at the lake pier, booked for Saturday.\n")
    (mem / "2026-11-02.md").write_text("# Monday\n\nThe kayak club meets at the boathouse.\n")
    for i, topic in enumerate(("printer toner order", "quarterly budget review", "coffee machine descaling")):
        (mem / f"other{i}.md").write_text(f"# Note {i}\n\nAbout the {topic}.\n")
    s = load_settings(write_config(root / "memory_pipeline.yaml", provider="none"))
    run_index(s)
    return s


def test_a_note_without_its_file_is_ranked_once(settings, monkeypatch):
    searcher = MemorySearcher(settings)
    calls = []
    ranked = searcher.ranked
    monkeypatch.setattr(searcher, "ranked", lambda *a, **k: calls.append(k) or ranked(*a, **k))
    opts = searcher.options(mode="fts", min_score=0.0, max_results=3)
    results = searcher.search("kayak lake pier", opts)
    assert Path(results[0].path).name == "lake.jpg.note.md"
    assert {Path(r.path).name for r in results} >= {"lake.jpg.note.md", "2026-11-02.md"}
    assert len(calls) == 1  # no second ranking: no candidate is the note's file
    # The same results as a ranking that reads every candidate's columns (no shortcut).
    full = searcher._shown(ranked("kayak lake pier", opts, light=True), opts)
    assert [c.row["chunk_id"] for c in full] == [r.chunk_id for r in results]
