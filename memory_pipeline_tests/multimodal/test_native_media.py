"""Native media vectors through the real google-genai SDK against the fake Gemini server (127.0.0.1)."""

from __future__ import annotations

import hashlib
import shutil

import lancedb
from PIL import Image

from memory_pipeline_tests import sample_media as sm
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.fakes.gemini_server import GeminiFake, decode_bytes
from memory_pipeline_tests.helpers import run_json

FAST = {"backoff_base_ms": 10, "backoff_max_ms": 500, "timeout_ms": 5000, "query_timeout_ms": 5000}


def test_media_requests_carry_inline_bytes_and_label(tmp_path, media):
    mem = tmp_path / "mem"
    (mem / "media").mkdir(parents=True)
    (mem / "notes.md").write_text("# Notes\n\nThe espresso machine at the office was serviced in November.\n")
    receipt = mem / "media" / "receipt.jpg"
    shutil.copy(media["receipt"], receipt)
    sm.write_note(receipt, "Vendor receipt from Acme Corp meeting")
    shutil.copy(media["voice_mp3"], mem / "media" / "voice.mp3")
    shutil.copy(media["docx"], mem / "media" / "handbook.docx")
    with GeminiFake() as fake:
        # what the fake "sees" in the photo: words found nowhere in its derived text or label
        # (said several times: the label now also carries the photo's OCR text, and the fake's vector is a bag of words)
        fake.media_words[hashlib.sha256(receipt.read_bytes()).hexdigest()] = " ".join(["cappuccino invoice crema"] * 6)
        cfg = write_config(
            tmp_path / "memory_pipeline.yaml",
            provider="gemini",
            model="gemini-embedding-2-preview",
            dims=768,
            remote={"base_url": fake.base_url, **FAST},
            multimodal={"native": True},
        )
        env = {"GEMINI_API_KEY": fake.api_key}
        out = run_json("index", "--config", str(cfg), "--json", env=env)
        assert out["errors"] == [] and out["provider"] == "gemini"

        contents = []
        for req in fake.embed_requests():
            for r in req.body.get("requests", [req.body]):
                contents.append(r["content"]["parts"])
        inline = [parts for parts in contents if any("inlineData" in p or "inline_data" in p for p in parts)]
        by_mime = {}
        for parts in inline:
            data_part = next(p.get("inlineData") or p.get("inline_data") for p in parts if "inlineData" in p or "inline_data" in p)
            label = " ".join(p["text"] for p in parts if "text" in p)
            by_mime[data_part.get("mimeType") or data_part.get("mime_type")] = (decode_bytes(data_part["data"]), label)
        # media files only, each once, with its bytes and a label naming it (and its note)
        assert set(by_mime) == {"image/jpeg", "audio/mpeg"}  # a .docx is a document: text only
        data, label = by_mime["image/jpeg"]
        assert data == receipt.read_bytes()
        assert label.startswith("receipt.jpg") and "Vendor receipt from Acme Corp meeting" in label
        assert by_mime["audio/mpeg"][0] == (mem / "media" / "voice.mp3").read_bytes()
        # markdown (and the note file, and the docx) never go the media path
        texts = [" ".join(p.get("text", "") for p in parts) for parts in contents if parts not in inline]
        assert any("espresso machine at the office" in t for t in texts)

        db = lancedb.connect(str(tmp_path / "index" / "lancedb"))
        rows = db.open_table("memory_vectors").search().select(["path", "locator", "memory_type"]).limit(1000).to_arrow().to_pylist()
        assert {"media", "note", "ocr"} <= {r["locator"] for r in rows if r["path"] == "media/receipt.jpg"}

        # the native vector finds the photo by what it shows, not by any of its text
        hits = run_json("search", "--config", str(cfg), "--json", "cappuccino crema", "--min-score", "0", "--mode", "vector", env=env)["results"]
        assert hits and hits[0]["path"].endswith("receipt.jpg") and hits[0]["locator"] == "media"

        # query by a photo with no text in it: its own bytes, embedded natively, find the receipt
        photo = tmp_path / "query.png"
        Image.new("RGB", (96, 64), "white").save(photo)
        fake.media_words[hashlib.sha256(photo.read_bytes()).hexdigest()] = "cappuccino crema invoice"
        n = len(fake.embed_requests())
        hits = run_json("search", "--config", str(cfg), "--json", "--image", str(photo), "--min-score", "0", env=env)["results"]
        assert hits and hits[0]["path"].endswith("receipt.jpg") and hits[0]["locator"] == "media"
        sent = [
            decode_bytes((p.get("inlineData") or p.get("inline_data"))["data"])
            for req in fake.embed_requests()[n:]
            for r in req.body.get("requests", [req.body])
            for p in r["content"]["parts"]
            if "inlineData" in p or "inline_data" in p
        ]
        assert sent == [photo.read_bytes()]

        # a second run sends nothing: media vectors come from the cache
        n = len(fake.embed_requests())
        run_json("index", "--config", str(cfg), "--json", "--force", env=env)
        assert not any(
            "inlineData" in p or "inline_data" in p
            for req in fake.embed_requests()[n:]
            for r in req.body.get("requests", [req.body])
            for p in r["content"]["parts"]
        )


def test_media_the_model_cannot_take_natively_fall_back_to_derived_text_and_say_why(tmp_path):
    mem = tmp_path / "mem"
    (mem / "media").mkdir(parents=True)
    sm.text_image(mem / "media" / "banner.gif", ["Harbour festival", "Saturday at noon"], fmt="GIF")
    sm.text_pdf(mem / "media" / "manual.pdf", [[f"Chapter {i}", f"Boiler maintenance step {i}"] for i in range(1, 8)])
    sm.text_pdf(mem / "media" / "flyer.pdf", [["Bake sale", "Friday"]])
    with GeminiFake() as fake:
        cfg = write_config(
            tmp_path / "memory_pipeline.yaml",
            provider="gemini",
            model="gemini-embedding-2-preview",
            dims=768,
            remote={"base_url": fake.base_url, **FAST},
            multimodal={"native": True},
        )
        out = run_json("index", "--config", str(cfg), "--json", env={"GEMINI_API_KEY": fake.api_key})
        reasons = {e["path"].rsplit("/", 1)[-1]: (e["status"], e["reason"]) for e in out["errors"]}
        assert reasons["banner.gif"][0] == "partial" and "image/gif is not a type the model takes natively" in reasons["banner.gif"][1]
        assert reasons["manual.pdf"][0] == "partial" and "7 pages, over the model's native limit of 6" in reasons["manual.pdf"][1]
        assert "flyer.pdf" not in reasons  # within the limits: sent natively, nothing to report
        sent = {
            (p.get("inlineData") or p.get("inline_data")).get("mimeType") or (p.get("inlineData") or p.get("inline_data")).get("mime_type")
            for req in fake.embed_requests()
            for r in req.body.get("requests", [req.body])
            for p in r["content"]["parts"]
            if "inlineData" in p or "inline_data" in p
        }
        assert sent == {"application/pdf"}
        # Both are still found, by their derived text.
        for query, name in (("harbour festival", "banner.gif"), ("boiler maintenance", "manual.pdf")):
            hits = run_json("search", "--config", str(cfg), "--json", query, "--mode", "fts", env={"GEMINI_API_KEY": fake.api_key})["results"]
            assert hits and hits[0]["path"].endswith(name)
