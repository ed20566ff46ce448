"""The AgentOS multimodal routes on a real server: ingest generated image/audio/PDF/DOCX, query by
text, image and audio in each retrieval mode, the asset lifecycle, bad uploads, a search racing an ingest."""

from __future__ import annotations

import threading

import pytest

from memory_pipeline_tests import sample_media as sm

pytestmark = pytest.mark.slow
RAG = "/api/agentos/rag/multimodal"
SPEECH = "The harbour crane inspection is booked for Tuesday morning."


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("upload")
    return {
        "image": sm.text_image(d / "receipt.png", sm.RECEIPT_LINES),
        "query_image": sm.text_image(d / "query.png", ["ACME CORP receipt"]),
        "audio": sm.speech_audio(d / "crane.wav", SPEECH),
        "pdf": sm.text_pdf(d / "contract.pdf", [["Courier services agreement", "Term: twelve months"], ["Penalty: 2 percent"]]),
        "docx": sm.docx_file(d / "handbook.docx", "On-call handbook", ["Page the secondary after fifteen minutes."]),
    }


@pytest.fixture(scope="module")
def ingested(server, files):
    out = {}
    resp = server.http.post(f"{RAG}/images/ingest", files={"image": ("receipt.png", files["image"].read_bytes(), "image/png")},
                            data={"tags": "receipts,acme", "metadata": '{"trip": "Rotterdam"}', "collectionId": "finance"})  # fmt: skip
    assert resp.status_code == 200, resp.text
    out["image"] = resp.json()
    resp = server.http.post(f"{RAG}/audio/ingest", files={"audio": ("crane.wav", files["audio"].read_bytes(), "audio/wav")},
                            data={"storePayload": "true", "tags": '["ops"]'})  # fmt: skip
    assert resp.status_code == 200, resp.text
    out["audio"] = resp.json()
    resp = server.http.post(f"{RAG}/documents/ingest", files={"document": ("../../contract.pdf", files["pdf"].read_bytes(), "text/plain")},
                            data={"collectionId": "legal", "storePayload": "true"})  # fmt: skip
    assert resp.status_code == 200, resp.text
    out["pdf"] = resp.json()
    resp = server.http.post(f"{RAG}/documents/ingest", files={"document": ("handbook.docx", files["docx"].read_bytes(), "application/octet-stream")},
                            data={"textRepresentation": "On-call handbook: page the secondary after fifteen minutes.", "collectionId": "legal"})  # fmt: skip
    assert resp.status_code == 200, resp.text
    out["docx"] = resp.json()
    return out


def test_ingest_answers_the_asset_record(ingested, memory_config):
    image = ingested["image"]
    assert image["modality"] == "image" and image["mimeType"] == "image/png" and image["collectionId"] == "finance"
    assert image["tags"] == ["receipts", "acme"] and image["metadata"] == {"trip": "Rotterdam"}
    assert "ACME" in image["derivedText"] and image["chunkCount"] >= 1 and len(image["assetId"]) == 24
    audio = ingested["audio"]
    assert audio["mimeType"].startswith("audio/") and "crane" in audio["derivedText"].lower() and audio["chunkCount"] >= 1
    pdf = ingested["pdf"]
    assert pdf["mimeType"] == "application/pdf" and pdf["originalFileName"] == "contract.pdf"  # sniffed; the name cannot escape
    assert "Courier" in pdf["derivedText"]
    assert ingested["docx"]["derivedText"].startswith("On-call handbook")
    mem = memory_config.parent / "mem"
    assert (mem / "agentos" / "legal" / pdf["assetId"] / "contract.pdf").is_file()  # the folder stays the source of truth
    assert (mem / "agentos" / "finance" / image["assetId"] / "asset.md").is_file()
    assert not (memory_config.parent / "contract.pdf").exists()


def test_same_bytes_same_asset(server, files, ingested):
    resp = server.http.post(f"{RAG}/images/ingest", files={"image": ("again.png", files["image"].read_bytes(), "image/png")},
                            data={"collectionId": "finance"})  # fmt: skip
    assert resp.status_code == 200 and resp.json()["assetId"] == ingested["image"]["assetId"]


def test_get_asset_and_content(server, files, ingested):
    audio = ingested["audio"]
    got = server.http.get(f"{RAG}/assets/{audio['assetId']}").json()
    assert got["assetId"] == audio["assetId"] and got["chunkCount"] == audio["chunkCount"]
    content = server.http.get(f"{RAG}/assets/{audio['assetId']}/content")
    assert content.status_code == 200 and content.content == files["audio"].read_bytes()
    assert content.headers["content-type"].startswith("audio/") and content.headers["x-content-type-options"] == "nosniff"
    assert server.http.get(f"{RAG}/assets/{ingested['image']['assetId']}/content").status_code == 404  # no payload stored
    for bad in ("0" * 24, "..%2F..%2Fetc", "not-an-id"):
        assert server.http.get(f"{RAG}/assets/{bad}").status_code == 404


def test_query_by_text(server, ingested):
    resp = server.http.post(f"{RAG}/query", json={"query": "ACME vendor receipt total"})
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert results and results[0]["assetId"] == ingested["image"]["assetId"]
    assert {"score", "snippet", "locator", "modality", "collectionId"} <= set(results[0])
    only_docs = server.http.post(f"{RAG}/query", json={"query": "ACME vendor receipt total", "modalities": "document", "topK": 3}).json()
    assert all(r["modality"] == "document" for r in only_docs["results"])
    legal = server.http.post(f"{RAG}/query", json={"query": "courier agreement penalty", "collectionIds": ["legal"]}).json()
    assert legal["results"] and all(r["collectionId"] == "legal" for r in legal["results"])
    assert legal["results"][0]["assetId"] == ingested["pdf"]["assetId"]
    crane = server.http.post(f"{RAG}/query", json={"query": "harbour crane inspection", "modalities": '["audio"]'}).json()
    assert crane["results"][0]["assetId"] == ingested["audio"]["assetId"]


@pytest.mark.parametrize("mode", ["auto", "text"])
def test_query_by_image(server, files, ingested, mode):
    resp = server.http.post(f"{RAG}/images/query", files={"image": ("q.png", files["query_image"].read_bytes(), "image/png")},
                            data={"retrievalMode": mode, "topK": "3"})  # fmt: skip
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["results"][0]["assetId"] == ingested["image"]["assetId"]
    assert body["nativeUsed"] is False and "ACME" in body["query"]


@pytest.mark.parametrize("mode", ["auto", "text"])
def test_query_by_audio(server, files, ingested, mode):
    resp = server.http.post(f"{RAG}/audio/query", files={"audio": ("q.wav", files["audio"].read_bytes(), "audio/wav")}, data={"retrievalMode": mode})
    assert resp.status_code == 200, resp.text
    assert resp.json()["results"][0]["assetId"] == ingested["audio"]["assetId"]


@pytest.mark.parametrize("mode", ["native", "hybrid"])
def test_native_modes_need_native_vectors(server, files, mode):
    resp = server.http.post(f"{RAG}/images/query", files={"image": ("q.png", files["query_image"].read_bytes(), "image/png")}, data={"retrievalMode": mode})
    assert resp.status_code == 422 and resp.json()["field"] == "retrievalMode"
    assert "native media vectors" in resp.json()["error"]
    resp = server.http.post(
        f"{RAG}/images/query", files={"image": ("q.png", files["query_image"].read_bytes(), "image/png")}, data={"retrievalMode": "psychic"}
    )
    assert resp.status_code == 422 and resp.json()["field"] == "retrievalMode"


def test_bad_uploads(server, files):
    wrong_kind = server.http.post(f"{RAG}/images/ingest", files={"image": ("fake.png", b"just some text, not a picture", "image/png")})
    assert wrong_kind.status_code == 415 and wrong_kind.json()["field"] == "image"
    audio_as_image = server.http.post(f"{RAG}/images/query", files={"image": ("x.png", files["audio"].read_bytes(), "image/png")})
    assert audio_as_image.status_code == 415
    missing = server.http.post(f"{RAG}/images/ingest", data={"tags": "x"})
    assert missing.status_code == 422 and missing.json()["field"] == "image"
    empty = server.http.post(f"{RAG}/images/ingest", files={"image": ("e.png", b"", "image/png")})
    assert empty.status_code == 422
    for field, value in (("collectionId", "../../etc"), ("metadata", "{not json"), ("metadata", "[1, 2]"), ("tags", "[1, 2]")):
        resp = server.http.post(f"{RAG}/images/ingest", files={"image": ("r.png", files["image"].read_bytes(), "image/png")}, data={field: value})
        assert resp.status_code == 422 and resp.json()["field"] == field, (field, resp.text)
    malformed = server.http.post(f"{RAG}/images/ingest", content=b"--xyz\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\nabc",
                                 headers={"content-type": "multipart/form-data; boundary=xyz"})  # fmt: skip
    assert 400 <= malformed.status_code < 500 and "Traceback" not in malformed.text
    no_boundary = server.http.post(f"{RAG}/images/ingest", content=b"abc", headers={"content-type": "multipart/form-data"})
    assert 400 <= no_boundary.status_code < 500
    bad_query = server.http.post(f"{RAG}/query", json={"query": "x", "modalities": ["smell"]})
    assert bad_query.status_code == 422 and bad_query.json()["field"] == "modalities"
    assert server.http.post(f"{RAG}/query", json={"query": "x", "topK": 0}).json()["field"] == "topK"


def test_search_racing_an_ingest_and_delete(server, files, ingested, memory_config):
    """Searches during an ingest and a delete of the same file: all answer 200, none sees a half-written asset."""
    errors, seen = [], []
    stop = threading.Event()

    def searcher():
        while not stop.is_set():
            resp = server.http.post(f"{RAG}/query", json={"query": "twelve handheld scanners warehouse pilot", "topK": 5})
            if resp.status_code != 200:
                errors.append(resp.text)
            else:
                seen.append(len(resp.json()["results"]))

    threads = [threading.Thread(target=searcher) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        body = b"Warehouse pilot: twelve handheld scanners arrive in Rotterdam on Monday.\n"
        resp = server.http.post(f"{RAG}/documents/ingest", files={"document": ("pilot.txt", body, "text/plain")}, data={"storePayload": "true"})
        assert resp.status_code == 200, resp.text
        asset = resp.json()
        found = server.http.post(f"{RAG}/query", json={"query": "twelve handheld scanners warehouse pilot"}).json()["results"]
        assert found and found[0]["assetId"] == asset["assetId"]
        deleted = server.http.delete(f"{RAG}/assets/{asset['assetId']}")
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors and seen
    assert server.http.get(f"{RAG}/assets/{asset['assetId']}").status_code == 404
    assert server.http.delete(f"{RAG}/assets/{asset['assetId']}").status_code == 404
    assert not (memory_config.parent / "mem" / "agentos" / "default" / asset["assetId"]).exists()
    after = server.http.post(f"{RAG}/query", json={"query": "twelve handheld scanners warehouse pilot"}).json()["results"]
    assert all(r["assetId"] != asset["assetId"] for r in after)


def test_a_described_payload_is_kept_and_served_but_not_derived_again(server, files, memory_config):
    """textRepresentation skips OCR: with storePayload the bytes are kept (in the asset's hidden
    .payload folder) and served, the index holds only the given text, and delete removes it all."""
    described = "Parking receipt from the Utrecht offsite, paid by card."
    resp = server.http.post(f"{RAG}/images/ingest", files={"image": ("parking.png", files["image"].read_bytes(), "image/png")},
                            data={"storePayload": "true", "textRepresentation": described, "collectionId": "described"})  # fmt: skip
    assert resp.status_code == 200, resp.text
    asset = resp.json()
    assert asset["storePayload"] is True and asset["derivedText"].strip() == described
    folder = memory_config.parent / "mem" / "agentos" / "described" / asset["assetId"]
    assert (folder / ".payload" / "parking.png").read_bytes() == files["image"].read_bytes()
    assert not (folder / "parking.png").exists() and not (folder / "parking.png.note.md").exists()
    content = server.http.get(f"{RAG}/assets/{asset['assetId']}/content")
    assert content.status_code == 200 and content.content == files["image"].read_bytes()
    # Only the given text is indexed: the receipt's OCR words ("ACME") are not in this asset's rows.
    rows = server.http.post("/api/memory/search", json={"query": "parking receipt Utrecht offsite", "min_score": 0, "max_results": 10}).json()["results"]
    mine = [r for r in rows if asset["assetId"] in r["path"]]
    assert mine and all(".payload" not in r["path"] for r in mine)
    assert not any("ACME" in r["snippet"] for r in mine)
    deleted = server.http.delete(f"{RAG}/assets/{asset['assetId']}")
    assert deleted.status_code == 200 and not folder.exists()


def test_an_assets_derived_text_comes_back_redacted(server, files):
    """The asset route read the record file back as written: a password the client put in the text
    representation came back in clear, while the query route showed it redacted."""
    resp = server.http.post(f"{RAG}/documents/ingest", files={"document": ("ops.docx", files["docx"].read_bytes(), "application/octet-stream")},
                            data={"textRepresentation": "Ops runbook; DB_PASSWORD=IngestLEAK7x9q and restart the queue.", "collectionId": "ops"})  # fmt: skip
    assert resp.status_code == 200, resp.text
    asset = resp.json()
    assert "IngestLEAK7x9q" not in resp.text and "[REDACTED:password]" in asset["derivedText"], asset["derivedText"]
    got = server.http.get(f"{RAG}/assets/{asset['assetId']}")
    assert got.status_code == 200 and "IngestLEAK7x9q" not in got.text and "restart the queue" in got.json()["derivedText"], got.text
