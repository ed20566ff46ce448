"""`--type`: `document` includes PDFs; comma-separated lists are accepted; a bad type is a usage error."""

from __future__ import annotations

import pytest

from memory_pipeline.cli import build_parser
from memory_pipeline.search.filters import SearchFilters


def test_document_includes_pdf_and_text_is_notes_and_transcripts():
    where = SearchFilters(types=("document",)).where()
    assert where == "(modality IN ('document', 'pdf'))"
    assert SearchFilters(types=("image", "text")).where() == "(modality IN ('image') OR memory_type = 'text')"


@pytest.mark.parametrize(
    ("argv", "types"),
    [
        (["--type", "image,audio"], [["image", "audio"]]),
        (["--type", "image", "--type", "pdf"], [["image"], ["pdf"]]),
        (["--type", " Document , text "], [["document", "text"]]),
    ],
)
def test_type_lists_parse(argv, types):
    args = build_parser().parse_args(["search", "q", *argv])
    assert args.type == types


@pytest.mark.parametrize("bad", ["imag", ",", "image,,gif"])
def test_a_bad_type_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["search", "q", "--type", bad])
    assert exit_.value.code == 2
    assert "invalid type" in capsys.readouterr().err
