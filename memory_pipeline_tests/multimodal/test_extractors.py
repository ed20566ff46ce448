"""Real extraction of generated media: OCR (tesseract), EXIF, Whisper transcripts, PDF pages, documents,
and corrupt media that must fail with a reason."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from memory_pipeline.discovery import sniff_file
from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction import MediaOptions, extract
from memory_pipeline_tests import sample_media as sm

from .conftest import VOICE


def _extract(path: Path, **options):
    mime, modality = sniff_file(str(path), path.name)
    return extract(str(path), modality, mime, MediaOptions(**options))


def _kinds(segments, kind):
    return [s for s in segments if s.kind == kind]


def _words(text: str) -> set[str]:
    return {w.strip(".,").lower() for w in text.split()}


def test_image_ocr_exif_and_note(media, tmp_path):
    img = tmp_path / "receipt.jpg"
    img.write_bytes(media["receipt"].read_bytes())
    sm.write_note(img, "Vendor receipt from Acme Corp meeting")
    segments = _extract(img)
    assert segments[0].kind == "note" and segments[0].text == "Vendor receipt from Acme Corp meeting"
    about = _kinds(segments, "media")[0].text
    assert "JPEG, 900x600" in about and "Taken 2026-11-05 14:12:00" in about and "Camera: Google Pixel 8" in about
    ocr = " ".join(s.text for s in _kinds(segments, "ocr"))
    assert "ACME CORP" in ocr and "Espresso machine descaling" in ocr and "42.00" in ocr


def test_png_named_jpg_is_read_as_png(media):
    segments = _extract(media["png_as_jpg"])
    assert "(PNG," in _kinds(segments, "media")[0].text
    assert "Build 7731 failed" in " ".join(s.text for s in _kinds(segments, "ocr"))


@pytest.mark.parametrize("key", ["voice_mp3", "voice_wav", "voice_ogg", "voice_m4a", "voice_flac"])
def test_audio_transcript_with_time_ranges(media, key):
    segments = _extract(media[key])
    spoken = _kinds(segments, "time")
    assert spoken, "no transcript"
    text = " ".join(s.text for s in spoken)
    # tiny.en on espeak speech: most words right, not all
    assert len(_words(text) & _words(VOICE)) >= 8, text
    assert spoken[0].line_start >= 0 and spoken[-1].line_end > spoken[0].line_start
    assert spoken[-1].line_end <= 8_000  # milliseconds, within the ~6 s clip


def test_audio_the_decoder_cannot_read_is_transcoded(media, tmp_path, monkeypatch):
    # PyAV refusing the file (as it does for some containers) must fall back to the ffmpeg program.
    import faster_whisper

    def refuse(*a, **k):
        raise ValueError("unsupported container")

    monkeypatch.setattr(faster_whisper, "decode_audio", refuse)
    segments = _extract(media["voice_ogg"])
    assert len(_words(" ".join(s.text for s in _kinds(segments, "time"))) & _words(VOICE)) >= 8


def test_video_transcript_and_keyframe_ocr(media):
    segments = _extract(media["video"], keyframe_seconds=2)
    spoken = " ".join(s.text for s in _kinds(segments, "time"))
    assert "dashboard" in spoken.lower()
    frames = _kinds(segments, "frame")
    assert frames and "NEW DASHBOARD" in frames[0].text
    # the same slide on every keyframe is one segment spanning their times
    assert len(frames) == 1 and frames[0].line_end >= 2_000


def test_silent_video_is_indexed_by_its_frames(media):
    segments = _extract(media["silent_video"], keyframe_seconds=1)
    assert "no sound" in _kinds(segments, "media")[0].text
    assert not _kinds(segments, "time")
    assert "QUARTERLY TARGETS" in _kinds(segments, "frame")[0].text


def test_pdf_text_per_page_and_page_cap(media, tmp_path):
    segments = _extract(media["pdf"])
    pages = _kinds(segments, "page")
    assert [(p.line_start, p.line_end) for p in pages] == [(1, 1), (2, 2)]
    assert "Courier services agreement" in pages[0].text and "Penalty" in pages[1].text
    many = sm.text_pdf(tmp_path / "long.pdf", [[f"Chapter {i} about topic {i}"] for i in range(1, 8)])
    capped = _extract(many, pdf_max_pages=3)
    assert [p.line_start for p in _kinds(capped, "page")] == [1, 2, 3]
    assert capped.warning == "indexed the first 3 of 7 pages (multimodal.pdf_max_pages)"


def test_image_only_pdf_is_ocred(media):
    segments = _extract(media["scanned_pdf"])
    page = _kinds(segments, "page")[0]
    assert page.line_start == 1 and "INVOICE 2291" in page.text and "Harbour storage rent" in page.text
    assert "scanned page read by OCR" in _kinds(segments, "media")[0].text


def test_pdf_without_any_text_fails_never_empty(tmp_path):
    blank = sm.text_pdf(tmp_path / "blank.pdf", [[]])
    with pytest.raises(ExtractionError, match="PDF yields no text .*not indexed empty"):
        _extract(blank)


def test_documents_as_readable_text(media, tmp_path):
    docx = _extract(media["docx"])
    paras = _kinds(docx, "para")
    assert paras[0].text == "On-call handbook" and "routing-api | Dana" in [p.text for p in paras]
    html = tmp_path / "page.html"
    html.write_text("<!doctype html><html><head><title>Team wiki</title><script>var x=1;</script></head>"
                    "<body><h1>Deploys</h1><p>Deploy on <b>Tuesdays</b> only.</p></body></html>")  # fmt: skip
    text = " ".join(s.text for s in _kinds(_extract(html), "text"))
    assert "Team wiki" in text and "Deploy on Tuesdays only." in text and "var x" not in text
    csv_file = tmp_path / "expenses.csv"
    csv_file.write_text("date,vendor,amount\n2026-11-05,Acme Corp,42.00\n2026-11-06,Snelkoerier,18.50\n")
    rows = _kinds(_extract(csv_file), "row")
    assert rows[1].text == "date: 2026-11-05; vendor: Acme Corp; amount: 42.00" and rows[1].line_start == 2
    js = tmp_path / "settings.json"
    js.write_text('{"editor": {"theme": "gruvbox", "font": "Iosevka"}, "api_key": "sk-abcdefghijklmnopqrstuvwx"}')
    text = _kinds(_extract(js), "text")[0].text
    assert "editor.theme: gruvbox" in text and "sk-abcdefghijklmnopqrstuvwx" not in text
    xml = tmp_path / "feed.xml"
    xml.write_text("<?xml version='1.0'?><feed><entry id='7'><title>Release 2.4 shipped</title></entry></feed>")
    assert "title: Release 2.4 shipped" in _kinds(_extract(xml), "text")[0].text


def _bomb_png(path: Path, side: int) -> Path:
    """A tiny PNG that claims side x side pixels (a decompression bomb)."""
    raw = zlib.compress(b"\x00" * (side // 8 + 1), 9)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)) + chunk(b"IDAT", raw) + chunk(b"IEND", b""))
    return path


def corrupt_media(folder: Path, media) -> dict[str, tuple[Path, str]]:
    """Corrupt files and the reason each must be reported with (a regex)."""
    folder.mkdir(parents=True, exist_ok=True)
    jpg = media["receipt"].read_bytes()
    (folder / "truncated.jpg").write_bytes(jpg[: len(jpg) // 3])
    pdf = media["pdf"].read_bytes()
    (folder / "garbage.pdf").write_bytes(b"%PDF-1.4\n" + bytes(range(256)) * 8)
    xref = pdf.index(b"xref\n")
    broken = pdf[:xref] + b"xref\n0 7\n0000000000 65535 f \n" + b"9999999999 00000 n \n" * 6 + pdf[pdf.index(b"trailer") :]
    (folder / "broken-xref.pdf").write_bytes(broken)
    (folder / "empty.mp3").write_bytes(b"")
    (folder / "noise.mp3").write_bytes(b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\x13\x37" * 500)
    _bomb_png(folder / "bomb.png", 100_000)
    return {
        "truncated.jpg": (folder / "truncated.jpg", "image is corrupt or truncated"),
        "garbage.pdf": (folder / "garbage.pdf", "PDF (is corrupt|has no pages|yields no text)"),
        "broken-xref.pdf": (folder / "broken-xref.pdf", "broken cross-reference table"),
        "empty.mp3": (folder / "empty.mp3", "empty file"),
        "noise.mp3": (folder / "noise.mp3", "cannot decode the audio|no audio samples"),
        "bomb.png": (folder / "bomb.png", "decompression bomb"),
    }


def test_corrupt_media_fail_with_reasons(media, tmp_path):
    cases = corrupt_media(tmp_path / "bad", media)
    for name in ("truncated.jpg", "garbage.pdf", "noise.mp3", "bomb.png"):
        path, reason = cases[name]
        with pytest.raises(ExtractionError, match=reason):
            _extract(path)
    repaired = _extract(cases["broken-xref.pdf"][0])
    assert "Courier services agreement" in _kinds(repaired, "page")[0].text
    assert "broken cross-reference table" in repaired.warning


def test_extraction_timeout_is_a_reason(media):
    with pytest.raises(ExtractionError, match=r"timed out after 0.001s .*multimodal.timeout_seconds"):
        _extract(media["voice_wav"], timeout_seconds=0.001)
