"""Real media through the worker: secrets in OCR, notes, PDF pages and documents are redacted centrally,
and the external tools read the opened file by descriptor (``/proc/self/fd/N``), in the worker or not."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_pipeline.discovery import sniff_file
from memory_pipeline.extraction import MediaOptions, extract
from memory_pipeline_tests import sample_media as sm

from .conftest import VOICE

TOKEN = "ghp_" + "K7mPq2RxT9vWb4NzH6cYd8FjL3sGe5UaXw2R"


def _extract(path: Path, root: Path | None = None, **kw):
    mime, modality = sniff_file(str(path), path.name, root)
    return extract(str(path), modality, mime, MediaOptions(), root, **kw)


def _words(text: str) -> set[str]:
    return {w.strip(".,").lower() for w in text.split()}


def test_token_in_a_screenshot_is_redacted_after_real_ocr(tmp_path):
    """Tesseract reads the token off the image (it really is there), and it never leaves extract()."""
    from PIL import Image

    from memory_pipeline.extraction.media import Deadline, ocr_image

    shot = sm.text_image(tmp_path / "ci.png", ["Deploy settings for CI", f"token {TOKEN} here", "rotate monthly"], size=(1300, 300))
    with Image.open(shot) as img:
        raw = " ".join(ocr_image(img, Deadline(str(shot), 60)))
    assert "ghp_" in raw  # the OCR itself read a token
    segments = _extract(shot)
    ocr = " ".join(s.text for s in segments if s.kind == "ocr")
    assert "rotate monthly" in ocr and "[REDACTED:github-token]" in ocr
    assert "ghp_" not in " ".join(s.text for s in segments)


def test_note_pdf_and_docx_secrets_are_redacted(tmp_path):
    img = sm.text_image(tmp_path / "board.png", ["Q1 ROADMAP"])
    sm.write_note(img, f"whiteboard photo, CI token {TOKEN}")
    pdf = sm.text_pdf(tmp_path / "runbook.pdf", [["Runbook", f"token {TOKEN}"]])
    docx = sm.docx_file(tmp_path / "handbook.docx", "Handbook", [f"Use {TOKEN} for the deploy bot."], [["bot", TOKEN]])
    for path in (img, pdf, docx):
        segments = _extract(path, tmp_path)
        text = " ".join(s.text for s in segments)
        assert TOKEN not in text and "[REDACTED:github-token]" in text, path.name


def refuse_pyav_then_extract_audio(src, mime, options):
    """In the worker: PyAV refuses the file, so the ffmpeg program must read the descriptor it inherits."""
    import faster_whisper

    def refuse(*a, **k):
        raise ValueError("unsupported container")

    faster_whisper.decode_audio = refuse
    from memory_pipeline.extraction.audio import extract_audio

    return extract_audio(src, mime, options)


@pytest.mark.parametrize("isolate", [True, False], ids=["in the worker", "in-process"])
def test_ffmpeg_reads_the_opened_file_not_the_path(media, tmp_path, monkeypatch, isolate):
    """The ffmpeg fallback is given /proc/self/fd/N, the descriptor it inherits, never the path."""
    voice = tmp_path / "voice.ogg"
    voice.write_bytes(media["voice_ogg"].read_bytes())
    if isolate:
        segments = _extract(voice, tmp_path, extractor=refuse_pyav_then_extract_audio)
    else:
        import faster_whisper

        def refuse(*a, **k):
            raise ValueError("unsupported container")

        monkeypatch.setattr(faster_whisper, "decode_audio", refuse)
        segments = _extract(voice, tmp_path, isolate=False)
    spoken = " ".join(s.text for s in segments if s.kind == "time")
    assert len(_words(spoken) & _words(VOICE)) >= 8, spoken
