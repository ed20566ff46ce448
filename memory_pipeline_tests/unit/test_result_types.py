"""`--type`: `document` includes PDFs; comma-separated lists are accepted; a bad type is a usage error."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_any_type_argument_parses_or_is_a_usage_error(value):
    """Hostile --type values: a list of known types, or argparse's usage error (exit 2); never a traceback."""
    import argparse

    from memory_pipeline.cli import _result_types
    from memory_pipeline.search.filters import RESULT_TYPES

    try:
        types = _result_types(value)
    except argparse.ArgumentTypeError as err:
        assert "invalid type" in str(err)
    else:
        assert types and all(t in RESULT_TYPES for t in types)
