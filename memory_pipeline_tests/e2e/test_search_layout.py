"""A server's threads share one searcher: when a writer commits, the new table version's counts
(which read every row's document column) are taken once, not once per thread that meets it."""

from __future__ import annotations

import threading
import time

import pytest

from memory_pipeline.runner import run_index
from memory_pipeline.search import MemorySearcher
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import write_config

pytestmark = pytest.mark.slow


def test_a_new_version_is_counted_once_by_concurrent_queries(tmp_path):
    mem = tmp_path / "mem"
    mem.mkdir()
    for i in range(4):
        (mem / f"n{i}.md").write_text(f"# Note {i}\n\nThe harbour crane {i} was inspected.\n")
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml", provider="none"))
    run_index(settings)
    searcher = MemorySearcher(settings)
    first = searcher._table_layout()
    assert first[1] == 4 and first[2] == 4  # every row has its document text

    (mem / "n9.md").write_text("# Note 9\n\nA new note about the crane.\n")
    run_index(settings)  # another process's commit, seen by the searcher's handle below
    table = searcher.table
    assert table is not None
    table.checkout_latest()
    counted = []
    real = table.count_rows

    def slow_count(*args, **kwargs):
        counted.append(args)
        time.sleep(0.05)  # every thread meets the new version while the first still counts
        return real(*args, **kwargs)

    table.count_rows = slow_count  # pyright: ignore[reportAttributeAccessIssue] - an instance attribute shadows the method
    got = []
    threads = [threading.Thread(target=lambda: got.append(searcher._table_layout())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and got[0][0] > first[0] and got[0][1] == 5 and got[0][2] == 5
    assert len(counted) == 3  # rows, documents with a text, documents without one: once for all 8 threads
    results = searcher.search("crane", searcher.options(mode="fts", min_score=0.0))
    assert any(r.path.endswith("n9.md") for r in results)
