"""Unit tests for memory_pipeline.extraction: text files, session transcripts, redaction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction import extract
from memory_pipeline.extraction.markdown import extract_text_file
from memory_pipeline.extraction.redact import redact
from memory_pipeline.extraction.session import extract_session


def write(tmp_path: Path, name: str, data: bytes | str) -> str:
    """Write bytes or UTF-8 text to tmp_path/name and return its path."""
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return str(p)


TEXT_FILES = [
    ("plain with final newline", b"a\nb\n", "a\nb\n", 2),
    ("no final newline", b"a\nb", "a\nb", 2),
    ("bom stripped", b"\xef\xbb\xbf# Title\nbody\n", "# Title\nbody\n", 2),
    ("crlf normalized", b"a\r\nb\r\nc\r\n", "a\nb\nc\n", 3),
    ("lone cr normalized", b"a\rb\r", "a\nb\n", 2),
    ("blank lines counted", b"a\n\n\nb\n", "a\n\n\nb\n", 4),
    ("utf8 multibyte", "caf\u00e9 \u4e2d\u6587 \U0001f642\n".encode(), "caf\u00e9 \u4e2d\u6587 \U0001f642\n", 1),
]


@pytest.mark.parametrize(("data", "text", "lines"), [t[1:] for t in TEXT_FILES], ids=[t[0] for t in TEXT_FILES])
def test_text_file_one_segment(tmp_path, data, text, lines):
    """A text file is one segment: BOM dropped, newlines normalized, line_end = number of lines."""
    (seg,) = extract_text_file(write(tmp_path, "n.md", data))
    assert (seg.text, seg.line_start, seg.line_end, seg.label) == (text, 1, lines, "")


@pytest.mark.parametrize("data", [b"", b"   \n\n\t\n", b"\xef\xbb\xbf"])
def test_blank_text_file_has_no_segments(tmp_path, data):
    """Empty or whitespace-only files yield no segments."""
    assert extract_text_file(write(tmp_path, "n.md", data)) == []


@pytest.mark.parametrize(
    ("data", "offset", "byte"),
    [(b"abc\xffdef", 3, "ff"), (b"\xe9t\xe9", 0, "e9"), (b"ok\n" * 10 + b"\xc3\x28", 30, "c3")],
)
@pytest.mark.parametrize("reader", [extract_text_file, extract_session])
def test_not_utf8_reports_offset(tmp_path, data, offset, byte, reader):
    """Non-UTF-8 bytes raise ExtractionError naming UTF-8, the byte and its offset."""
    path = write(tmp_path, "bad.jsonl", data)
    with pytest.raises(ExtractionError) as info:
        reader(path)
    assert info.value.path == path
    assert "UTF-8" in info.value.reason
    assert f"offset {offset}" in info.value.reason and f"0x{byte}" in info.value.reason


def test_extract_dispatch(tmp_path):
    """extract() routes by modality and refuses modalities it has no extractor for."""
    md = write(tmp_path, "a.md", "# x\n")
    assert extract(md, "markdown")[0].text == "# x\n"
    assert extract(md, "text")[0].line_end == 1
    with pytest.raises(ExtractionError, match="no extractor for binary"):
        extract(md, "binary")
    with pytest.raises(ExtractionError, match="not a readable image"):  # media extractors read bytes, not names
        extract(md, "image", "image/png")
    with pytest.raises(ExtractionError, match="vanished"):
        extract(str(tmp_path / "gone.md"), "markdown")


def jsonl(*records: object) -> str:
    """JSONL text: dicts are dumped, strings kept verbatim (for garbage lines)."""
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def test_session_shapes_lines_and_labels(tmp_path):
    """User/assistant messages in common shapes become segments with JSONL line numbers and labels."""
    text = jsonl(
        {"type": "session", "id": "abc", "timestamp": "2026-11-02T10:00:00Z"},  # 1 header
        {"role": "system", "content": "You are a helpful agent."},  # 2
        {"role": "user", "content": "Where did we put the receipts?", "timestamp": "2026-11-02T10:15:42Z"},  # 3
        "",  # 4 blank
        {  # 5 envelope with content parts
            "type": "message",
            "timestamp": "2026-11-02T10:16:05.123Z",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "In the finance folder."}, {"type": "tool_use", "name": "ls"}]},
        },
        {"type": "message", "message": {"role": "toolResult", "content": [{"type": "text", "text": "ls output"}]}},  # 6
        {"role": "tool", "content": "tool output"},  # 7
        {"role": "user", "content": [{"type": "tool_result", "content": "result"}]},  # 8 only a tool result
        {"role": "human", "content": "thanks"},  # 9 alias, no timestamp
        {"type": "assistant", "message": {"content": [{"type": "output_text", "text": "You're welcome."}]}},  # 10
    )
    segs = extract_session(write(tmp_path, "s.jsonl", text))
    assert [(s.line_start, s.line_end, s.label, s.text) for s in segs] == [
        (3, 3, "[2026-11-02 10:15] user:", "Where did we put the receipts?"),
        (5, 5, "[2026-11-02 10:16] assistant:", "In the finance folder."),
        (9, 9, "user:", "thanks"),
        (10, 10, "assistant:", "You're welcome."),
    ]


def test_session_multi_part_content_joined(tmp_path):
    """Several text parts of one message are joined with newlines; empty messages are dropped."""
    text = jsonl(
        {"role": "assistant", "content": [{"type": "text", "text": "one"}, "two", {"type": "input_text", "text": "three"}]},
        {"role": "user", "content": "   "},
    )
    (seg,) = extract_session(write(tmp_path, "s.jsonl", text))
    assert seg.text == "one\ntwo\nthree"


def test_session_content_of_other_shapes_is_read_or_reported_and_bad_times_are_not_shown(tmp_path):
    """A message whose content is one text part as an object is read; content that is a number or
    an object without text was dropped in silence (now its line is reported); null content (an
    assistant's tool call) stays silent. A timestamp that is no time (an object, "99999-99-99")
    was shown in the label as text."""
    text = jsonl(
        {"role": "user", "content": {"type": "text", "text": "the wombat census"}, "timestamp": {"a": 1}},  # 1
        {"role": "user", "content": 123},  # 2 reported
        {"role": "assistant", "content": {"tool": "search"}},  # 3 reported
        {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]},  # 4 silent
        {"role": "user", "content": "a real question", "timestamp": "99999-99-99T99:99"},  # 5
        {"role": "user", "content": "a timed one", "timestamp": "2026-11-02T10:15:00Z"},  # 6
        {"role": "user", "content": "epoch text", "timestamp": "1733000000"},  # 7
        {"role": "user", "content": "utc suffix", "timestamp": "2024-12-01 10:15:30 UTC"},  # 8
    )
    segs = extract_session(write(tmp_path, "s.jsonl", text))
    assert [(s.line_start, s.label, s.text) for s in segs] == [
        (1, "user:", "the wombat census"),
        (5, "user:", "a real question"),
        (6, "[2026-11-02 10:15] user:", "a timed one"),
        (7, "[2024-11-30 20:53] user:", "epoch text"),
        (8, "[2024-12-01 10:15] user:", "utc suffix"),
    ]
    assert segs.warning == "2 lines are messages whose content is not text: 2, 3", segs.warning


def test_a_text_part_that_is_not_a_string_is_reported_and_the_others_kept(tmp_path):
    """A text part whose `text` is an object was dropped without a word."""
    text = "\n".join(
        json.dumps(r)
        for r in (
            {"role": "assistant", "content": [{"type": "text", "text": "nested part"}, {"type": "text", "text": {"nested": "deeper"}}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "a picture"}]},
        )
    )
    segs = extract_session(write(tmp_path, "s.jsonl", text))
    assert [(s.line_start, s.text) for s in segs] == [(1, "nested part"), (2, "a picture")]
    assert segs.warning == "1 line is messages with a text part that is not a string (their other parts are indexed): 1", segs.warning


def test_session_messages_are_redacted(tmp_path):
    """Secrets in transcript messages never reach the segment text."""
    key = "sk-proj-" + "A1b2C3d4" * 4
    (seg,) = extract_session(write(tmp_path, "s.jsonl", jsonl({"role": "user", "content": f"my key is {key}"})))
    assert key not in seg.text and "[REDACTED:openai-key]" in seg.text


@pytest.mark.parametrize(
    "text",
    ["not json at all\n{broken\n", '[1, 2]\n"a string"\n42\n', "\x00\x01garbage\n"],
    ids=["prose", "json non-objects", "control bytes"],
)
def test_session_of_garbage_fails(tmp_path, text):
    """A .jsonl file without a single JSON object is an ExtractionError, not an empty transcript."""
    with pytest.raises(ExtractionError, match="not a JSONL transcript"):
        extract_session(write(tmp_path, "s.jsonl", text))


def test_session_some_garbage_lines_tolerated(tmp_path):
    """Broken lines among valid records are skipped; line numbers of the rest are kept."""
    text = "{truncated\n" + jsonl({"role": "user", "content": "kept"})
    (seg,) = extract_session(write(tmp_path, "s.jsonl", text))
    assert (seg.text, seg.line_start) == ("kept", 2)


def test_session_empty_file_has_no_segments(tmp_path):
    """An empty transcript has no segments and no error."""
    assert extract_session(write(tmp_path, "s.jsonl", "")) == []


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085"])
def test_session_unicode_line_separator_inside_string(tmp_path, sep):
    """JSON strings may hold raw U+2028 etc.; only '\\n' ends a JSONL record, so numbering stays right."""
    text = json.dumps({"role": "user", "content": f"first{sep}second"}, ensure_ascii=False) + "\n"
    text += jsonl({"role": "assistant", "content": "reply"})
    segs = extract_session(write(tmp_path, "s.jsonl", text))
    assert [(s.line_start, s.text) for s in segs] == [(1, f"first{sep}second"), (2, "reply")]


def test_session_epoch_millis_timestamp_label(tmp_path):
    """An epoch-milliseconds timestamp is rendered as [YYYY-MM-DD HH:MM] like an ISO one."""
    ms = 1793614500000  # 2026-11-02 10:15:00 UTC
    (seg,) = extract_session(write(tmp_path, "s.jsonl", jsonl({"role": "user", "content": "hi", "timestamp": ms})))
    assert seg.label == "[2026-11-02 10:15] user:"


SECRETS = [
    ("openai project", "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8t" * 2, "openai-key"),
    ("openai legacy", "sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4", "openai-key"),
    ("anthropic", "sk-ant-api03-" + "Xy7_Zq-" * 6, "anthropic-key"),
    ("aws", "AKIAIOSFODNN7EXAMPLE", "aws-access-key"),
    ("github", "ghp_" + "a1B2c3D4e5" * 4, "github-token"),
    ("github fine-grained", "github_pat_" + "11ABCDEFG0" * 5, "github-token"),
    ("google", "AIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"[:35], "google-api-key"),
    ("slack", "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp", "slack-token"),
    ("stripe", "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "stripe-key"),
]


@pytest.mark.parametrize(("secret", "kind"), [s[1:] for s in SECRETS], ids=[s[0] for s in SECRETS])
def test_redact_known_token_formats(secret, kind):
    """Each known key format is replaced by [REDACTED:kind] and disappears from the text."""
    text, n = redact(f"config line: use {secret} for prod\nnext line")
    assert secret not in text
    assert f"[REDACTED:{kind}]" in text
    assert n >= 1
    assert text.startswith("config line: use ") and text.endswith(" for prod\nnext line")


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("password = hunter2hunter2", "hunter2hunter2"),
        ('"api_key": "q9w8e7r6t5y4u3i2"', "q9w8e7r6t5y4u3i2"),
        ("DB_PASSWORD: s3cr3tP4ss!", "s3cr3tP4ss!"),
        ("client_secret=Zx81Lm02Qa77", "Zx81Lm02Qa77"),
        ("Authorization: Bearer abcdefghijklmnop1234.xyz", "abcdefghijklmnop1234.xyz"),
        ("authorization: bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlX3Zh", "eyJhbGciOiJIUzI1NiJ9"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAAKC\n-----END RSA PRIVATE KEY-----", "MIIEow"),
    ],
)
def test_redact_assignments_and_headers(line, secret):
    """key=value secrets, bearer tokens and PEM keys are redacted; the secret is gone."""
    text, n = redact(line)
    assert secret not in text and "[REDACTED:" in text and n >= 1


@pytest.mark.parametrize(
    "line",
    [
        "We decided to use LanceDB for the vector store.",
        "The password policy requires at least 12 characters.",
        "Reset your password: see the wiki page.",
        "Risk-assessment-for-the-quarter-is-done and task-1234567890abcdefghijk too",
        "Token budget: 400 tokens per chunk, overlap 80.",
        "Meeting with Ana about the secret santa on 2026-12-01.",
        "",
    ],
)
def test_redact_leaves_ordinary_text(line):
    """Ordinary prose, including words like password and token, is unchanged."""
    assert redact(line) == (line, 0)


def test_redact_google_key_ending_with_dash():
    """A Google API key whose last character is '-' is still redacted."""
    key = "AIza" + "SyD9tSrke72PouQMnMXa7eZSW0jkFMBWYq-"
    assert len(key) == 39
    text, _ = redact(f"GOOGLE key {key} in notes")
    assert key not in text
