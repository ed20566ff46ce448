"""Media the multimodal tests share, generated once per session with the sample-media functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_pipeline_tests import sample_media as sm

VOICE = "The quarterly budget review moved to Thursday afternoon because the finance team is travelling."


@pytest.fixture(scope="session")
def media(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("media")
    out = {
        "receipt": sm.text_image(d / "receipt.jpg", sm.RECEIPT_LINES, exif={306: "2026:11:05 14:12:00", 271: "Google", 272: "Pixel 8"}),
        "whiteboard": sm.text_image(d / "whiteboard.png", sm.WHITEBOARD_LINES),
        "png_as_jpg": sm.text_image(d / "screenshot.jpg", ["Build 7731 failed", "flaky test in checkout"], fmt="PNG"),
        "voice_mp3": sm.speech_audio(d / "voice.mp3", VOICE),
        "voice_wav": sm.speech_audio(d / "voice.wav", VOICE),
        "voice_ogg": sm.speech_audio(d / "voice.ogg", VOICE),
        "voice_m4a": sm.speech_audio(d / "voice.m4a", VOICE),
        "voice_flac": sm.speech_audio(d / "voice.flac", VOICE),
        "video": sm.video(d / "demo.mp4", sm.DEMO_SPEECH, ["NEW DASHBOARD", "Live delivery map"]),
        "silent_video": sm.video(d / "silent.mov", None, ["QUARTERLY TARGETS", "Revenue up 12 percent"], seconds=3),
        "pdf": sm.text_pdf(d / "contract.pdf", [["Courier services agreement", "Term: twelve months"], ["Service levels", "Penalty: 2 percent"]]),
        "scanned_pdf": sm.scanned_pdf(d / "scan.pdf", ["INVOICE 2291", "Harbour storage rent", "Due 2026-12-15"]),
        "docx": sm.docx_file(
            d / "handbook.docx", "On-call handbook", ["Page the secondary after fifteen minutes."], [["Service", "Owner"], ["routing-api", "Dana"]]
        ),
    }
    return out
