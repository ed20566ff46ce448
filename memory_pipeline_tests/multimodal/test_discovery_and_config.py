"""Media discovery by content, media chunk locators, and the multimodal configuration."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from memory_pipeline.chunking import chunk_segments, locator_for
from memory_pipeline.discovery import DOCX_MIME, classify, sniff, sniff_file
from memory_pipeline.errors import ConfigError
from memory_pipeline.models import Segment
from memory_pipeline.settings import MEDIA_TYPES, settings_from_dict


@pytest.mark.parametrize(
    ("head", "name", "mime", "modality"),
    [
        (b"\x89PNG\r\n\x1a\n....", "photo.jpg", "image/png", "image"),  # a PNG renamed .jpg
        (b"\xff\xd8\xff\xe0..JFIF", "x.png", "image/jpeg", "image"),
        (b"GIF89a....", "a.gif", "image/gif", "image"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "a.webp", "image/webp", "image"),
        (b"\x00\x00\x00\x18ftypheic\x00\x00", "a.heic", "image/heic", "image"),
        (b"\x00\x00\x00\x18ftypmif1\x00\x00", "a.heif", "image/heif", "image"),
        (b"ID3\x04\x00\x00\x00", "a.mp3", "audio/mpeg", "audio"),
        (b"\xff\xfb\x90\x00", "a.mp3", "audio/mpeg", "audio"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", "a.wav", "audio/wav", "audio"),
        (b"OggS\x00\x02" + b"\x00" * 22 + b"\x13OpusHead", "a.opus", "audio/opus", "audio"),
        (b"OggS\x00\x02" + b"\x00" * 22 + b"\x01vorbis", "a.ogg", "audio/ogg", "audio"),
        (b"\x00\x00\x00\x20ftypM4A \x00\x00", "a.m4a", "audio/mp4", "audio"),
        (b"\xff\xf1\x50\x80", "a.aac", "audio/aac", "audio"),
        (b"fLaC\x00\x00\x00\x22", "a.flac", "audio/flac", "audio"),
        (b"\x00\x00\x00\x20ftypisom\x00\x00", "a.mp4", "video/mp4", "video"),
        (b"\x00\x00\x00\x14ftypqt  \x00\x00", "a.mov", "video/quicktime", "video"),
        (b"\x1aE\xdf\xa3\x9fB\x86\x81\x01B\xf7\x81\x01B\xf2\x81\x04B\xf3\x81\x08B\x82\x84webm", "a.webm", "video/webm", "video"),
        (b"%PDF-1.7\n", "scan.txt.bin", "application/pdf", "pdf"),
        (b"<!DOCTYPE html><html><body>hi", "page.htm", "text/html", "document"),
        (b"<?xml version='1.0'?><a/>", "feed.rss", "application/xml", "document"),
        (b"a,b\n1,2\n", "t.csv", "text/csv", "document"),
        (b'{"a": 1}', "t.json", "application/json", "document"),
        (b"# title", "t.md", "text/markdown", "markdown"),
        (b"", "empty.mp3", "audio/mpeg", "audio"),  # not read (empty): typed by name for the reports
    ],
)
def test_sniff_by_content(head, name, mime, modality):
    assert sniff(head, name) == (mime, modality)


def test_docx_is_told_from_other_zips(tmp_path: Path, media):
    assert sniff_file(str(media["docx"]), "handbook.docx") == (DOCX_MIME, "document")
    other = tmp_path / "archive.docx"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("readme.txt", "not a word document")
    assert sniff_file(str(other), "archive.docx") == ("application/zip", "binary")
    broken = tmp_path / "broken.docx"
    broken.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    assert sniff_file(str(broken), "broken.docx")[1] == "binary"


def test_classify_follows_multimodal_types():
    assert classify("image/png", "image", "a.png", MEDIA_TYPES) == ("ok", "")
    status, reason = classify("image/png", "image", "a.png", ("pdf",))
    assert status == "skipped" and "multimodal" in reason
    # media content behind a text name is a failure, whatever is enabled
    assert classify("image/png", "image", "a.md", MEDIA_TYPES)[0] == "failed"


def _cfg(**kw):
    return settings_from_dict({"sources": [{"name": "m", "path": "m"}], **kw}, base_dir=Path("/tmp"))


def test_multimodal_settings_validated():
    s = _cfg(multimodal={"types": ["image", "pdf"], "pdf_max_pages": 3, "keyframe_seconds": 2})
    assert s.multimodal.types == ("image", "pdf") and s.multimodal.pdf_max_pages == 3
    assert s.multimodal.max_file_bytes == 20 * 1024 * 1024
    for bad, key in (
        ({"types": ["smell"]}, "multimodal.types"),
        ({"max_file_bytes": 0}, "multimodal.max_file_bytes"),
        ({"timeout_seconds": 0}, "multimodal.timeout_seconds"),
        ({"ocr_language": "deu"}, "multimodal.ocr_language"),
    ):
        with pytest.raises(ConfigError) as err:
            _cfg(multimodal=bad)
        assert err.value.key == key


@pytest.mark.parametrize("provider", ["openai", "local", "voyage", "auto", "none"])
def test_native_media_needs_gemini_embedding_2(provider):
    with pytest.raises(ConfigError) as err:
        _cfg(provider=provider, multimodal={"native": True})
    assert str(err.value) == f"Multimodal embedding requires gemini-embedding-2-preview. Current provider: {provider}"
    # derived text works with every provider: no error without `native`
    if provider in ("local", "auto", "none"):
        assert _cfg(provider=provider).multimodal.native is False


def test_native_media_refuses_other_gemini_models():
    with pytest.raises(ConfigError, match="Current provider: gemini \\(gemini-embedding-001\\)"):
        _cfg(provider="gemini", model="gemini-embedding-001", multimodal={"native": True})


@pytest.mark.parametrize(
    ("kind", "start", "end", "expected"),
    [
        ("page", 3, 3, "p.3"),
        ("page", 3, 5, "p.3-5"),
        ("time", 12_400, 75_000, "00:12-01:15"),
        ("time", 3_600_000, 3_725_000, "1:00:00-1:02:05"),
        ("frame", 10_000, 10_000, "frame 00:10"),
        ("frame", 0, 20_000, "frames 00:00-00:20"),
        ("para", 2, 9, "para 2-9"),
        ("row", 4, 4, "rows 4"),
        ("note", 0, 0, "note"),
        ("ocr", 1, 4, "ocr"),
        ("text", 3, 9, "L3-L9"),
    ],
)
def test_media_locators(kind, start, end, expected):
    assert locator_for("audio", start, end, kind) == expected


def test_media_chunks_keep_one_kind_and_its_range():
    segments = [
        Segment("Standup recording from Monday", 0, 0, kind="note"),
        Segment("Audio recording standup.m4a (audio/mp4, 1:00 long).", 0, 0, kind="media"),
        Segment("We shipped the routing fix.", 0, 4_000, kind="time"),
        Segment("Next, the courier app release.", 4_000, 9_500, kind="time"),
        Segment("SPRINT 42", 0, 20_000, kind="frame"),
    ]
    chunks = chunk_segments("audio", segments, budget=200, overlap=20, title="standup.m4a")
    kinds = [c.kind for c in chunks]
    assert kinds == ["note", "media", "time", "frame"]
    transcript = chunks[2]
    assert (transcript.line_start, transcript.line_end) == (0, 9_500)
    assert "routing fix" in transcript.text and "courier app" in transcript.text
    assert transcript.heading == "standup.m4a — transcript"
    assert [c.index for c in chunks] == [0, 1, 2, 3]
