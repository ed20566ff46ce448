"""End to end through the `memory` command: media are discovered, stored, indexed, found and reported.

One memory folder is built for the module (a daily note, a voice note, a whiteboard
photo, a PNG named .jpg and corrupt media); the receipt and the demo video are added
with `memory store`. Everything is real: tesseract, Whisper, LanceDB, Dagster.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import lancedb
import pytest

from memory_pipeline_tests import sample_media as sm
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import run_cli, run_json

from .test_extractors import corrupt_media

NOTE = """# 2026-11-05

## Acme Corp meeting
Met the Acme Corp vendor team in Rotterdam about servicing the office espresso machine.
I paid the descaling myself; expense the vendor receipt this week.
"""


@pytest.fixture(scope="module")
def memory(tmp_path_factory, media):
    root = tmp_path_factory.mktemp("mm")
    mem = root / "mem"
    (mem / "memory").mkdir(parents=True)
    (mem / "memory" / "2026-11-05.md").write_text(NOTE)
    (mem / "media").mkdir()
    shutil.copy(media["voice_mp3"], mem / "media" / "voice.mp3")
    shutil.copy(media["whiteboard"], mem / "media" / "whiteboard.png")
    shutil.copy(media["png_as_jpg"], mem / "media" / "screenshot.jpg")
    bad = corrupt_media(mem / "bad", media)
    outside = root / "inbox"
    outside.mkdir()
    shutil.copy(media["receipt"], outside / "receipt.jpg")
    shutil.copy(media["video"], outside / "demo.mp4")
    cfg = write_config(root / "memory_pipeline.yaml", multimodal={"keyframe_seconds": 2})
    first = run_json("index", "--config", str(cfg), "--json")
    return {"root": root, "mem": mem, "cfg": cfg, "outside": outside, "bad": bad, "first": first}


def _search(memory, *args) -> dict:
    return run_json("search", "--config", str(memory["cfg"]), "--json", *args)


def _rows(memory) -> list[dict]:
    db = lancedb.connect(str(memory["root"] / "index" / "lancedb"))
    cols = ["path", "memory_type", "media_type", "mime_type", "original_file_path", "file_sha256", "locator", "created_at", "text", "modality"]
    return db.open_table("memory_vectors").search().select(cols).limit(10_000).to_arrow().to_pylist()


def test_corrupt_media_reported_and_nothing_else_lost(memory):
    errors = {Path(e["path"]).name: e for e in memory["first"]["errors"]}
    import re

    for name, (_, reason) in memory["bad"].items():
        assert name in errors, f"{name} not reported: {sorted(errors)}"
        assert re.search(reason, errors[name]["reason"]), (name, errors[name])
    assert errors["broken-xref.pdf"]["status"] == "partial"  # repaired and indexed, with the reason
    indexed = {Path(r["path"]).name for r in _rows(memory)}
    assert {"2026-11-05.md", "voice.mp3", "whiteboard.png", "screenshot.jpg", "broken-xref.pdf"} <= indexed
    assert not indexed & {"truncated.jpg", "garbage.pdf", "empty.mp3", "noise.mp3", "bomb.png"}


def test_store_copies_indexes_and_marks_media(memory):
    receipt = memory["outside"] / "receipt.jpg"
    proc = run_cli("store", "--config", str(memory["cfg"]), "--file", str(receipt), "--note", "Vendor receipt from Acme Corp meeting")
    assert proc.returncode == 0, proc.stderr[-2000:]
    stored = memory["mem"] / "media" / "receipt.jpg"
    assert stored.read_bytes() == receipt.read_bytes()
    assert (memory["mem"] / "media" / "receipt.jpg.note.md").read_text().strip() == "Vendor receipt from Acme Corp meeting"
    rows = [r for r in _rows(memory) if r["path"] == "media/receipt.jpg"]
    assert rows and {r["memory_type"] for r in rows} == {"media"}
    assert {r["media_type"] for r in rows} == {"image"} and {r["mime_type"] for r in rows} == {"image/jpeg"}
    assert {r["original_file_path"] for r in rows} == {str(stored)}
    import hashlib

    assert {r["file_sha256"] for r in rows} == {hashlib.sha256(stored.read_bytes()).hexdigest()}
    assert {"note", "media", "ocr"} <= {r["locator"] for r in rows}
    assert all(r["created_at"] is not None for r in rows)
    # text stays text
    note_rows = [r for r in _rows(memory) if r["path"] == "memory/2026-11-05.md"]
    assert {r["memory_type"] for r in note_rows} == {"text"} and {r["media_type"] for r in note_rows} == {None}
    # The stored file's note is listed once, with its media result: not a second time as a note file.
    hits = _search(memory, "vendor receipt Acme Corp meeting", "--max-results", "10", "--min-score", "0")["results"]
    paths = [h["path"] for h in hits]
    assert str(stored) in paths and str(stored) + ".note.md" not in paths, paths
    # the video, with its note
    proc = run_cli("store", "--config", str(memory["cfg"]), "--file", str(memory["outside"] / "demo.mp4"),
                   "--note", "Product demo showing new dashboard feature")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_scan_lists_media_with_sniffed_types(memory):
    proc = run_cli("scan", "--config", str(memory["cfg"]), "--verbose")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()

    def line_for(name):
        return next(line for line in lines if line.rstrip().endswith("/" + name) or f"/{name}  [" in line)

    assert line_for("screenshot.jpg").startswith("image/png")  # a PNG renamed .jpg
    assert line_for("voice.mp3").startswith("audio/mpeg")
    assert line_for("whiteboard.png").split()[2] == str((memory["mem"] / "media" / "whiteboard.png").stat().st_size)
    assert "empty file" in line_for("empty.mp3")
    out = run_json("scan", "--config", str(memory["cfg"]), "--json")
    n_media = sum(1 for f in out["files"] if f["status"] == "ok" and f["modality"] in ("image", "audio", "video", "pdf", "document"))
    n_text = sum(1 for f in out["files"] if f["status"] == "ok" and f["modality"] in ("markdown", "text", "session"))
    assert f"Found {n_text} text files, {n_media} media files" in proc.stdout
    assert n_media >= 9  # voice, whiteboard, screenshot, receipt, demo and the media that fail only when read


def test_search_sections_note_and_receipt(memory):
    proc = run_cli("search", "--config", str(memory["cfg"]), "Acme Corp vendor receipt")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "— Text Results —" in out and "— Media Results —" in out
    text_part, media_part = out.split("— Media Results —")
    assert "2026-11-05.md" in text_part
    assert "receipt.jpg  score" in media_part and "image/jpeg" in media_part
    assert str(memory["mem"] / "media" / "receipt.jpg") in media_part
    # a query that only the OCR text on the receipt answers
    hits = _search(memory, "espresso machine descaling 42.00 total", "--type", "image")["results"]
    assert hits and hits[0]["path"].endswith("receipt.jpg") and hits[0]["locator"] == "ocr"


def test_video_found_by_its_note_and_voice_by_a_paraphrase(memory):
    hits = _search(memory, "dashboard feature presentation")["results"]
    assert hits[0]["path"].endswith("demo.mp4") or any(h["path"].endswith("demo.mp4") for h in hits[:2])
    media = [h for h in hits if h["memory_type"] == "media"]
    assert media[0]["path"].endswith("demo.mp4") and media[0]["media_type"] == "video"
    # the voice note has no note: only its real transcript can match a paraphrase
    hits = _search(memory, "budget meeting rescheduled since finance people are away")["results"]
    voice = [h for h in hits if h["path"].endswith("voice.mp3")]
    assert voice and voice[0] == [h for h in hits if h["memory_type"] == "media"][0]
    assert voice[0]["locator"].startswith("00:00-00:0")


def test_type_filter(memory):
    hits = _search(memory, "quarterly budget review Thursday", "--type", "image", "--min-score", "0")["results"]
    assert hits and all(h["modality"] == "image" for h in hits)
    hits = _search(memory, "quarterly budget review Thursday", "--type", "audio")["results"]
    assert hits and all(h["modality"] == "audio" for h in hits)
    hits = _search(memory, "Acme Corp", "--type", "text")["results"]
    assert hits and all(h["memory_type"] == "text" for h in hits)
    assert run_cli("search", "--config", str(memory["cfg"]), "x", "--type", "smell").returncode == 2


def test_query_by_image_and_audio(memory, tmp_path):
    photo = sm.text_image(tmp_path / "photo-of-receipt.png", ["ACME CORP", "Espresso machine descaling", "TOTAL EUR 42.00"], size=(700, 400))
    hits = _search(memory, "--image", str(photo))["results"]
    media = [h for h in hits if h["memory_type"] == "media"]
    assert media and media[0]["path"].endswith("receipt.jpg")
    clip = sm.speech_audio(tmp_path / "ask.wav", "budget review moved to Thursday")
    hits = _search(memory, "--audio", str(clip))["results"]
    assert any(h["path"].endswith("voice.mp3") for h in hits[:3])
    proc = run_cli("search", "--config", str(memory["cfg"]), "--image", str(clip))
    assert proc.returncode == 1 and "not an image" in proc.stderr


def test_size_limit_and_native_guard(memory, tmp_path):
    big = tmp_path / "huge.jpg"
    with open(big, "wb") as fh:
        fh.write(memory["outside"].joinpath("receipt.jpg").read_bytes()[:1024])
        fh.truncate(25 * 1024 * 1024)
    proc = run_cli("store", "--config", str(memory["cfg"]), "--file", str(big))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"[ERROR] File {big} exceeds 20971520 bytes limit for embedding")
    assert not (memory["mem"] / "media" / "huge.jpg").exists()
    cfg = write_config(tmp_path / "native.yaml", provider="openai", multimodal={"native": True})
    for cmd in (["index"], ["store", "--file", str(memory["outside"] / "receipt.jpg")]):
        proc = run_cli(*cmd, "--config", str(cfg))
        assert proc.returncode == 1
        assert proc.stderr == "[ERROR] Multimodal embedding requires gemini-embedding-2-preview. Current provider: openai\n"


def test_note_edit_reindexes_the_media_file(memory):
    note = memory["mem"] / "media" / "whiteboard.png.note.md"
    note.write_text("Photo of the roadmap whiteboard from the offsite in Utrecht\n")
    before = {r["path"] for r in _rows(memory)}
    run_json("index", "--config", str(memory["cfg"]), "--json")
    assert "media/whiteboard.png.note.md" in {r["path"] for r in _rows(memory)} - before  # the note, as a note
    rows = [r for r in _rows(memory) if r["path"] == "media/whiteboard.png" and r["locator"] == "note"]
    assert rows and "Utrecht" in rows[0]["text"]
