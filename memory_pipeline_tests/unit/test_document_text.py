"""The document column's text: chunks joined with the chunker's overlap counted once, on the first
chunk of each document only (issue 13)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_pipeline.chunking import chunk_segments
from memory_pipeline.models import Segment
from memory_pipeline.search.textindex import Analyzer
from memory_pipeline.stores.lance import document_texts, join_chunks


@pytest.mark.parametrize(
    ("chunks", "joined"),
    [
        (["a b c d e f", "d e f g h", "g h i j"], "a b c d e f\n g h\n i j"),  # word overlap
        (["line1\nline2\nline3", "line3\nline4"], "line1\nline2\nline3\n\nline4"),  # line overlap
        (["abc the", "then xyz"], "abc the\nthen xyz"),  # 'the' is not a word-aligned overlap of 'then'
        (["the", "the"], "the\nthe"),  # a chunk repeated whole is the document's own repetition
        (["", "solo"], "solo"),
    ],
)
def test_join_chunks_counts_overlap_once(chunks, joined):
    assert join_chunks(chunks) == joined


def test_document_text_goes_on_each_documents_first_chunk():
    texts = document_texts(["x", "y", "x"], [1, 0, 0], ["two three", "solo", "one two"], ["p/a-b_c.md", "q.md", "p/a-b_c.md"])
    assert texts == ["", "solo\nq", "one two\n three\na b c"]


def test_overlap_that_differs_from_the_chunk_before_in_spaces_only_is_counted_once():
    # A split long line: the first piece keeps the space before the cut, the carried overlap is a
    # line of its own without it (what the chunker writes; SciFact abstracts are such lines).
    chunks = ["Title\n\nalpha beta gamma delta ", "gamma delta\nepsilon zeta"]
    assert join_chunks(chunks) == "Title\n\nalpha beta gamma delta \n\nepsilon zeta"
    assert join_chunks(["a b  c\td", "c d e"]) == "a b  c\td\n e"
    assert join_chunks(["- - - - -", "- - - x"]) == "- - - - -\n x"  # one word repeated: the longest run that fits
    assert join_chunks(["x a b a b a", "a b a b y"]) == "x a b a b a\n b y"  # a run that restarts inside itself


def _numbered(shape: list[list[int]], seps: list[str]) -> str:
    """Lines of distinct words (so no run of words repeats by chance: where the document itself
    repeats the words at a chunk boundary, no one can tell them from the overlap), of varied lengths
    and spacing."""
    forms = ("w{}", "CK-{}-x", "word{}.", "{}", "alpha-beta-gamma-{}")
    n = 0
    lines = []
    for lengths in shape:
        words = []
        for k in lengths:
            words.append(forms[k % len(forms)].format(n))
            n += 1
        lines.append(seps[len(lines) % len(seps)].join(words))
    return "\n".join(lines)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.lists(st.lists(st.integers(0, 4), max_size=90), min_size=1, max_size=12),
    seps=st.lists(st.sampled_from([" ", "  ", "\t", " - "]), min_size=1, max_size=3),
    budget=st.sampled_from([24, 40, 64]),
    overlap=st.sampled_from([0, 4, 8, 16]),
)
def test_document_text_holds_the_files_words_once_whatever_the_chunking(shape, seps, budget, overlap):
    """Chunked by the real chunker (long lines split in pieces, overlap carried inside them), the
    document text's words are the file's words, each occurrence once: its BM25 term frequencies
    and length are the document's. (Before: an overlap carried inside a split line differed from
    the chunk before in a space and was counted twice; a chunk could be nothing but overlap.)"""
    text = _numbered(shape, seps)
    chunks = chunk_segments("text", [Segment(text, 1, len(shape))], budget=budget, overlap=overlap)
    terms = Analyzer(stem=False).terms  # the words full-text search counts (a line cut at a hyphen still has them)
    assert terms(join_chunks([c.text for c in chunks])) == terms(text)
