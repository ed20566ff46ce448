"""Runs over some shards: the ranges a shard set becomes, and their summaries added up."""

from __future__ import annotations

import pytest

from memory_pipeline.discovery import SHARD_KEYS
from memory_pipeline.runner import _checked_shards, _ranges, _span, shards_of
from memory_pipeline.stages.report import RunSummary


@pytest.mark.parametrize(
    ("shards", "ranges"),
    [
        (["03"], [("03", "03")]),
        (["03", "04", "05"], [("03", "05")]),
        (["00", "02", "0f"], [("00", "00"), ("02", "02"), ("0f", "0f")]),
        (["0e", "0f", "01", "00"], [("00", "01"), ("0e", "0f")]),
        (list(SHARD_KEYS), [("00", "0f")]),
    ],
)
def test_ranges_cover_exactly_the_shards(shards, ranges):
    wanted = _checked_shards(shards)
    assert _ranges(wanted) == ranges
    assert sorted(s for a, b in ranges for s in _span(a, b)) == sorted(set(shards))


def test_checked_shards_refuses_unknown_or_none():
    assert _checked_shards(None) == list(SHARD_KEYS)
    with pytest.raises(ValueError):
        _checked_shards(["10"])
    with pytest.raises(ValueError):
        _checked_shards([])


def test_shards_of_is_the_stable_hash():
    from memory_pipeline.discovery import shard_of

    files = [("mem", "a.md"), ("mem", "b/c.md"), ("other", "a.md")]
    assert shards_of(files) == sorted({shard_of(s, p) for s, p in files})


def test_combined_adds_counts_and_keeps_the_last_table():
    a = RunSummary(files_seen=3, files_changed=1, rows_written=2, table_rows=10, shards=["01"], coverage=1.0, run_id="a")
    b = RunSummary(files_seen=4, files_changed=2, rows_written=5, rows_deleted=1, table_rows=14, shards=["05"], coverage=0.9, run_id="b")
    both = RunSummary.combined([a, b])
    assert (both.files_seen, both.files_changed, both.rows_written, both.rows_deleted) == (7, 3, 7, 1)
    assert (both.table_rows, both.coverage, both.run_id, both.shards) == (14, 0.9, "b", ["01", "05"])
    assert RunSummary.combined([a]) is a
