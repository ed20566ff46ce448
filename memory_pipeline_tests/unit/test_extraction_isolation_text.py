"""What every extractor's output goes through: control characters, redaction, output caps; and the
in-process text extractors' own bounds: broken JSONL lines reported, NUL bytes past the sniffed 8 KB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory_pipeline.discovery import SNIFF_BYTES, sniff_file
from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction import ExtractionWorker, MediaOptions, extract
from memory_pipeline.extraction.output import clean_label, clean_text
from memory_pipeline.models import Segment

TOKEN = "ghp_" + "K7mPq2RxT9vWb4NzH6cYd8FjL3sGe5UaXw2R"


def write(tmp_path: Path, name: str, data: bytes | str) -> str:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def msg(text: str, **extra) -> str:
    return json.dumps({"role": "user", "content": text, **extra})


# --- broken JSONL lines -----------------------------------------------------------------------


def test_broken_jsonl_lines_are_reported_with_their_numbers(tmp_path):
    lines = [msg(f"m{i}") for i in range(1, 13)]
    for n in (4, 9, 12):
        lines[n - 1] = lines[n - 1][:-5]  # cut short, as a crash mid-write leaves it
    segments = extract(write(tmp_path, "s.jsonl", "\n".join(lines) + "\n"), "session")
    assert [s.line_start for s in segments] == [1, 2, 3, 5, 6, 7, 8, 10, 11]
    assert segments.warning == "3 lines are not valid JSON: 4, 9, 12"


def test_many_broken_lines_list_is_capped(tmp_path):
    lines = [msg("kept")] + ["{oops"] * 25 + ['"a string"', "[1]"]
    segments = extract(write(tmp_path, "s.jsonl", "\n".join(lines)), "session")
    assert len(segments) == 1
    assert segments.warning == ("25 lines are not valid JSON: 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, …; 2 lines are JSON but not an object: 27, 28")


def test_one_broken_line_is_singular_and_clean_files_have_no_warning(tmp_path):
    assert extract(write(tmp_path, "a.jsonl", msg("a") + "\n{"), "session").warning == "1 line is not valid JSON: 2"
    assert extract(write(tmp_path, "b.jsonl", msg("a") + "\n"), "session").warning == ""


@pytest.mark.parametrize("stamp", [10**400, 1e308, float("inf"), -(10**30), "9" * 5000, {"a": 1}])
def test_session_odd_timestamps_never_crash(tmp_path, stamp):
    line = (
        json.dumps({"role": "user", "content": "hi", "timestamp": stamp})
        if stamp != float("inf")
        else '{"role": "user", "content": "hi", "timestamp": Infinity}'
    )
    (seg,) = extract(write(tmp_path, "s.jsonl", line), "session")
    assert seg.text == "hi" and "\n" not in seg.label


def test_session_deep_nesting_and_huge_numbers_are_broken_lines(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    digits = '{"n": ' + "1" * 5000 + "}"
    segments = extract(write(tmp_path, "s.jsonl", "\n".join([msg("ok"), deep, digits])), "session")
    assert [s.text for s in segments] == ["ok"]
    assert segments.warning == "2 lines are not valid JSON: 2, 3"


# --- NUL bytes and control characters -----------------------------------------------------------


def test_nul_bytes_past_the_sniffed_head_are_removed_keeping_lines(tmp_path):
    head = ("clean line of text\n" * 600).encode()
    assert len(head) > SNIFF_BYTES
    path = write(tmp_path, "n.md", head + b"tail \x00with\x00 nuls\nlast\n")
    assert sniff_file(path, "n.md") == ("text/markdown", "markdown")
    (seg,) = segments = extract(path, "markdown")
    assert "\x00" not in seg.text and seg.text.endswith("tail with nuls\nlast\n")
    assert seg.line_end == 602
    assert segments.warning == "removed 2 control character(s) (NUL and the like), which are not text"


def test_binary_behind_a_text_head_fails(tmp_path):
    path = write(tmp_path, "n.txt", b"looks like text\n" * 600 + b"\x00\x00\x01\x00data" * 2000)
    with pytest.raises(ExtractionError, match=r"binary data: \d+ NUL bytes"):
        extract(path, "text")


def test_terminal_escapes_are_removed_from_every_text(tmp_path):
    evil = "title\x1b]0;pwned\x07 \x1b[2J\x1b[31mred\x9b31m\rover\x08x\ttab"
    (seg,) = extract(write(tmp_path, "n.md", evil + "\n"), "markdown")
    assert seg.text == "title]0;pwned [2J[31mred31m\nover" + "x\ttab\n"
    (seg,) = extract(write(tmp_path, "s.jsonl", json.dumps({"role": "user", "content": evil, "timestamp": "2026\x1b[1m-11"})), "session")
    assert not any(c in seg.text + seg.label for c in "\x1b\x07\x08\x9b\r")
    assert seg.label == "user:"  # a "timestamp" that is no time (an escape in it) is not shown at all
    (seg,) = extract(write(tmp_path, "s.jsonl", json.dumps({"role": "user", "content": "x", "timestamp": "2026-11-02T10:15:00\x1b[1mZ"})), "session")
    assert seg.label == "user:", seg.label


def test_clean_text_keeps_tabs_newlines_and_unicode_separators():
    assert clean_text("a\tb\nc\u2028d\u0085e\x00\x7f") == ("a\tb\nc\u2028d\u0085e", 2)
    assert clean_label(" [x]\n\tuser:\x1b ") == "[x] user:"
    # A form feed, vertical tab or separator character separates words (removed, "two\fstill" read "twostill").
    assert clean_text("page two\x0cstill two\x0bthree\x1ffour\x1e") == ("page two still two three four ", 0)


# --- redaction and cleanup happen centrally, for media too ------------------------------------------


def noisy_media(src, mime, options):
    """A media extractor whose output carries a token and escapes (as OCR or a transcript might)."""
    from memory_pipeline.extraction.media import Segments

    out = Segments([Segment(f"slide shows {TOKEN}\x1b[0m", 1, 1, label=f"frame {TOKEN}\x07", kind="ocr")])
    out.warning = "from the extractor"
    return out


def test_media_output_is_redacted_and_cleaned_in_one_place(tmp_path):
    img = write(tmp_path, "x.png", b"\x89PNG\r\n\x1a\n")
    write(tmp_path, "x.png.note.md", f"note with {TOKEN}\x00\n")
    worker = ExtractionWorker()
    try:
        segments = extract(img, "image", "image/png", worker=worker, extractor=noisy_media)
    finally:
        worker.close()
    assert [s.kind for s in segments] == ["note", "ocr"]
    everything = " ".join(s.text + s.label for s in segments)
    assert TOKEN not in everything and "\x1b" not in everything and "\x00" not in everything
    assert segments[0].text == "note with [REDACTED:github-token]"
    assert segments[1].label == "frame [REDACTED:github-token]"
    assert segments.warning == "from the extractor"


@pytest.mark.parametrize(
    ("name", "mime", "data"),
    [
        ("t.md", "", f"key {TOKEN}\n"),
        ("s.jsonl", "", json.dumps({"role": "user", "content": f"key {TOKEN}", "timestamp": TOKEN})),
        ("d.html", "text/html", f"<html><title>{TOKEN}</title><p>key {TOKEN}</p></html>"),
        ("d.csv", "text/csv", f"name,key\nci,{TOKEN}\n"),
        ("d.json", "application/json", json.dumps({"ci": {"key": TOKEN}})),
        ("d.xml", "application/xml", f"<?xml version='1.0'?><c><key v='{TOKEN}'>{TOKEN}</key></c>"),
    ],
)
def test_every_text_format_is_redacted(tmp_path, name, mime, data):
    path = write(tmp_path, name, data)
    modality = {"md": "markdown", "jsonl": "session"}.get(name.split(".")[-1], "document")
    segments = extract(path, modality, mime)
    assert segments and not any(TOKEN in s.text or TOKEN in s.label for s in segments)
    assert any("[REDACTED:github-token]" in s.text for s in segments)


# --- output caps -----------------------------------------------------------------------------------


def test_text_over_max_chars_is_indexed_in_part_at_a_line_end(tmp_path):
    path = write(tmp_path, "big.md", "".join(f"line {i:04d}\n" for i in range(1, 1001)))  # 10 chars a line
    (seg,) = segments = extract(path, "markdown", options=MediaOptions(max_chars=95))
    assert seg.text == "".join(f"line {i:04d}\n" for i in range(1, 10))
    assert (seg.line_start, seg.line_end) == (1, 9)
    assert "indexed the first" in segments.warning and "max_chars=95" in segments.warning


def test_text_read_limit_cuts_a_character_cleanly(tmp_path):
    """Only max_chars*4 bytes are read; a multi-byte character split by the cut is dropped, not an error."""
    path = write(tmp_path, "big.md", "é" * 100)  # 200 bytes
    (seg,) = segments = extract(path, "markdown", options=MediaOptions(max_chars=25))  # reads 100 bytes
    assert seg.text == "é" * 25 and "max_chars=25" in segments.warning


def test_session_over_max_segments(tmp_path):
    path = write(tmp_path, "s.jsonl", "\n".join(msg(f"m{i}") for i in range(50)))
    segments = extract(path, "session", options=MediaOptions(max_segments=10))
    assert len(segments) == 10 and segments.warning == "indexed the messages of the first 10 lines (max_segments=10)"


def test_csv_and_json_over_their_caps(tmp_path):
    csv_path = write(tmp_path, "t.csv", "a,b\n" + "".join(f"{i},x\n" for i in range(100)))
    rows = extract(csv_path, "document", "text/csv", MediaOptions(max_segments=20))
    # The description, the header and 17 rows: room is kept for a note, and one cap speaks, precisely.
    assert len(rows) == 19 and rows.warning == "indexed the first 17 rows (max_segments=20)"
    json_path = write(tmp_path, "t.json", json.dumps({"a": [1] * 250}, separators=(",", ":")))  # 508 bytes
    doc = extract(json_path, "document", "application/json", MediaOptions(max_chars=200))
    assert sum(len(s.text) for s in doc) <= 200 and "max_chars=200" in doc.warning
    with pytest.raises(ExtractionError, match="JSON file is over 400 bytes"):  # read no further than 4 bytes a char
        extract(json_path, "document", "application/json", MediaOptions(max_chars=100))


def test_deeply_nested_json_fails_with_a_reason(tmp_path):
    path = write(tmp_path, "t.json", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(ExtractionError, match="nested too deeply|not valid JSON"):
        extract(path, "document", "application/json")
