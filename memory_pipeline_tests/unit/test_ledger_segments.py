"""Ledger segments on object storage (storage.segment_text / segment_entries): any line survives.

A segment holds lines merged from their one-object-per-line form; a line is whatever a writer
appended, so the format is fed arbitrary text here: tabs, newlines, line separators, NULs.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memory_pipeline.storage import segment_entries, segment_text

names = st.text(alphabet="0123456789abcdef-.json", min_size=1, max_size=40)


@given(st.lists(st.tuples(names, st.text()), max_size=20))
def test_a_segment_gives_back_exactly_its_lines(entries):
    assert segment_entries(segment_text(entries)) == entries


@given(st.lists(st.tuples(names, st.text()), min_size=1, max_size=10), st.integers(min_value=0))
def test_a_segment_cut_short_loses_only_its_last_row(entries, cut):
    text = segment_text(entries)
    got = segment_entries(text[: cut % (len(text) + 1)])
    assert got == entries[: len(got)]  # a prefix: never a changed or invented line
