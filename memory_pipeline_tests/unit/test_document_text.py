"""The document column's text: chunks joined with the chunker's overlap counted once, on the first
chunk of each document only (issue 13)."""

from __future__ import annotations

import pytest

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
