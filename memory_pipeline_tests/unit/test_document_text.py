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
        (["a b c d e f", "d e f\ng h", "g h\ni j"], "a b c d e f\n\ng h\n\ni j"),  # a long line's last words, carried as a line
        (["line1\nline2\nline3", "line3\nline4"], "line1\nline2\nline3\n\nline4"),  # line overlap
        (["abc the", "then xyz"], "abc the\nthen xyz"),  # 'the' is not a word-aligned overlap of 'then'
        (["the", "the"], "the\nthe"),  # a chunk repeated whole is the document's own repetition
        (["a x", "x\n"], "a x\nx\n"),  # so is a chunk that would be all overlap
        (["yes\nok  no  ", "no  no  ok"], "yes\nok  no  \nno  no  ok"),  # words repeated, nothing carried (no line break after them)
        (["pump 10 10 10 10 ", "10 10\n10 10 times"], "pump 10 10 10 10 \n\n10 10 times"),  # a repeated word: only the carried run
        (["", "solo"], "solo"),
    ],
)
def test_join_chunks_counts_overlap_once(chunks, joined):
    assert join_chunks(chunks) == joined


def test_document_text_goes_on_each_documents_first_chunk():
    texts = document_texts(["x", "y", "x"], [1, 0, 0], ["two\nthree", "solo", "one two"], ["p/a-b_c.md", "q.md", "p/a-b_c.md"])
    assert texts == ["", "solo\nq", "one two\n\nthree\na b c"]


def test_overlap_that_differs_from_the_chunk_before_in_spaces_only_is_counted_once():
    # A split long line: the first piece keeps the space before the cut, the carried overlap is a
    # line of its own without it (what the chunker writes; SciFact abstracts are such lines).
    chunks = ["Title\n\nalpha beta gamma delta ", "gamma delta\nepsilon zeta"]
    assert join_chunks(chunks) == "Title\n\nalpha beta gamma delta \n\nepsilon zeta"
    assert join_chunks(["a b  c\td ", "c\td\ne"]) == "a b  c\td \n\ne"
    assert join_chunks(["- - - - - ", "- - -\nx"]) == "- - - - - \n\nx"  # one word repeated: the run carried
    assert join_chunks(["x a b a b a", "a b a\nb y"]) == "x a b a b a\n\nb y"
    assert join_chunks(["x ab", "b\ny"]) == "x ab\nb\ny"  # "b" ends "ab" but not at a word's start


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
    assert terms(join_chunks([c.text for c in chunks], overlap)) == terms(text)
    assert terms(join_chunks([c.text for c in chunks])) == terms(text)  # the overlap unknown (a table upgraded in place)


@pytest.mark.parametrize(
    ("text", "budget", "overlap"),
    [
        ("yes\nok  no  no  no  ok", 12, 4),  # nothing carried: the repeated "no" is the note's
        ("x\nThe pump ran " + "10 " * 26 + "times", 16, 4),  # a number repeated across the pieces of a line
        ("a\n" + "\n".join(["same line"] * 12) + "\nend", 16, 8),  # a line repeated across a boundary
    ],
)
def test_repeated_words_at_a_boundary_are_the_documents_own(text, budget, overlap):
    """The overlap is what the chunker carried (a run of lines ending the chunk before, followed by a
    line break, fitting the overlap), not any words the two chunks happen to share: a note that
    repeats itself keeps its counts. (Word matching alone lost a real "no" and counted "10" 10
    times of 26; the character match before it counted it 31 times.)"""
    chunks = chunk_segments("text", [Segment(text, 1, text.count("\n") + 1)], budget=budget, overlap=overlap)
    assert len(chunks) > 1
    terms = Analyzer(stem=False).terms
    assert terms(join_chunks([c.text for c in chunks], overlap)) == terms(text)
