"""`retrievalMode` native and hybrid on a real `memory serve` whose index has native media vectors
(provider gemini, gemini-embedding-2-preview, `multimodal.native: true`), embedded through the real
google-genai SDK by the fake Gemini server: query by image and by audio on the AgentOS routes and with
`memory search --retrieval-mode`, through the server and in-process.

The fake "sees" in a media file the words registered for its bytes (``media_words``), so a query
file can look like one asset while its text (OCR, transcript) names another: native vectors find the
first, derived text the second.
"""

from __future__ import annotations

import hashlib
import json
import wave

import pytest
from PIL import Image

from memory_pipeline_tests import sample_media as sm
from memory_pipeline_tests.fakes.gemini_server import GeminiFake
from memory_pipeline_tests.helpers import run_cli
from memory_pipeline_tests.service.conftest import Server, cli_env, make_memory

pytestmark = pytest.mark.slow
RAG = "/api/agentos/rag/multimodal"
FAST = {"backoff_base_ms": 10, "backoff_max_ms": 500, "timeout_ms": 10000, "query_timeout_ms": 10000}
SPEECH = "The harbour crane inspection is booked for Tuesday morning."
PHOTO_LOOK = "lighthouse cliff sunset"  # what the photo shows: no word of it in any text
AUDIO_SOUND = "foghorn seagull tugboat"  # what the recording sounds like: no word of it in any text


def _silence(path, seconds: float = 1.5, rate: int = 16000):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * int(seconds * rate))
    return path


def _look(fake: GeminiFake, path, words: str, times: int = 1) -> None:
    fake.media_words[hashlib.sha256(path.read_bytes()).hexdigest()] = " ".join([words] * times)


@pytest.fixture(scope="module")
def fake():
    with GeminiFake() as fake, pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMINI_API_KEY", fake.api_key)  # `memory serve` and `memory index` inherit it
        yield fake


def _config(fake, **multimodal) -> dict:
    return {
        "provider": "gemini",
        "model": "gemini-embedding-2-preview",
        "dims": 768,
        "remote": {"base_url": fake.base_url, **FAST},
        "multimodal": {"max_file_bytes": 2 * 1024 * 1024, **multimodal},
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory, fake):
    d = tmp_path_factory.mktemp("native-upload")
    out = {
        "photo": sm.text_image(d / "lighthouse.png", ["Coastal walk", "Day two of the trip"]),  # asset A
        "receipt": sm.text_image(d / "receipt.png", sm.RECEIPT_LINES),  # asset B
        "audio": sm.speech_audio(d / "crane.wav", SPEECH),  # asset C
        "blank": d / "blank.png",  # no text in it; looks like A
        "mixed": sm.text_image(d / "mixed.png", ["ACME CORP receipt"]),  # reads like B, looks like A
        "silence": _silence(d / "silence.wav"),  # no speech in it; sounds like C
    }
    Image.new("RGB", (120, 80), "white").save(out["blank"])
    # Stored media vectors: the look said several times (the label carries the file's name and OCR text too).
    _look(fake, out["photo"], PHOTO_LOOK, times=6)
    _look(fake, out["receipt"], "paper counter till", times=6)
    _look(fake, out["audio"], AUDIO_SOUND, times=6)
    _look(fake, out["blank"], PHOTO_LOOK)
    _look(fake, out["mixed"], PHOTO_LOOK)
    _look(fake, out["silence"], AUDIO_SOUND)
    return out


@pytest.fixture(scope="module")
def native_config(tmp_path_factory, fake):
    return make_memory(tmp_path_factory.mktemp("native"), **_config(fake, native=True))


@pytest.fixture(scope="module")
def native_server(native_config):
    srv = Server(native_config)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def assets(native_server, files):
    """A, B and C ingested with their payloads (so the indexer embeds their bytes natively)."""
    out = {}
    for key, field, mime in (("photo", "image", "image/png"), ("receipt", "image", "image/png"), ("audio", "audio", "audio/wav")):
        resp = native_server.http.post(f"{RAG}/{'images' if field == 'image' else 'audio'}/ingest",
                                       files={field: (files[key].name, files[key].read_bytes(), mime)}, data={"storePayload": "true"})  # fmt: skip
        assert resp.status_code == 200, resp.text
        out[key] = resp.json()["assetId"]
    return out


def _query(server, kind: str, path, mode: str, **data):
    field = "image" if kind == "images" else "audio"
    mime = "image/png" if field == "image" else "audio/wav"
    return server.http.post(f"{RAG}/{kind}/query", files={field: (path.name, path.read_bytes(), mime)}, data={"retrievalMode": mode, **data})


def _ids(resp) -> list[str]:
    assert resp.status_code == 200, resp.text
    return [r["assetId"] for r in resp.json()["results"]]


@pytest.mark.parametrize("mode", ["native", "hybrid", "auto"])
def test_image_without_text_finds_its_look_alike(native_server, files, assets, mode):
    resp = _query(native_server, "images", files["blank"], mode)
    ids = _ids(resp)
    body = resp.json()
    assert body["nativeUsed"] is True and body["retrievalMode"] == mode
    assert ids[0] == assets["photo"], body
    assert body["results"][0]["locator"] == "media" and body["results"][0]["modality"] == "image"


def test_a_file_without_text_has_nothing_to_search_with_in_text_mode(native_server, files, assets):
    """Its description ("Image blank.png (PNG, 120x80)") is not query text, as on the command line."""
    for kind, key, field, what in (("images", "blank", "image", "no text in the image"), ("audio", "silence", "audio", "no speech in the recording")):
        resp = _query(native_server, kind, files[key], "text")
        assert resp.status_code == 422 and resp.json()["field"] == field, resp.text
        assert what in resp.json()["error"]


def test_each_mode_searches_with_what_it_says(native_server, files, assets):
    """The mixed image reads like the receipt (B) and looks like the photo (A)."""
    text = _query(native_server, "images", files["mixed"], "text", topK="5")
    assert _ids(text)[0] == assets["receipt"] and text.json()["nativeUsed"] is False
    assert "ACME" in text.json()["query"]
    native = _query(native_server, "images", files["mixed"], "native", topK="5")
    assert _ids(native)[0] == assets["photo"] and native.json()["nativeUsed"] is True
    assert native.json()["query"] == ""  # native: the file's text is not derived, nor searched
    for mode in ("hybrid", "auto"):
        both = _query(native_server, "images", files["mixed"], mode, topK="5")
        assert set(_ids(both)[:2]) == {assets["photo"], assets["receipt"]}, both.text
        assert both.json()["nativeUsed"] is True and "ACME" in both.json()["query"]


@pytest.mark.parametrize("mode", ["native", "hybrid", "auto"])
def test_silent_recording_finds_its_sound_alike(native_server, files, assets, mode):
    resp = _query(native_server, "audio", files["silence"], mode)
    ids = _ids(resp)
    assert resp.json()["nativeUsed"] is True
    assert ids and ids[0] == assets["audio"], resp.text
    assert resp.json()["results"][0]["modality"] == "audio"


@pytest.mark.parametrize("mode", ["text", "native", "hybrid", "auto"])
def test_spoken_query_in_each_mode(native_server, files, assets, mode):
    resp = _query(native_server, "audio", files["audio"], mode)
    ids = _ids(resp)
    assert resp.json()["nativeUsed"] is (mode != "text")
    assert ids and ids[0] == assets["audio"], resp.text
    assert ("crane" in resp.json()["query"].lower()) is (mode != "native")


# --- the command line --------------------------------------------------------------------


def _search(config, *args: str, key: bool = True) -> tuple[int, dict | None, str]:
    env = cli_env()
    if not key:
        env.pop("GEMINI_API_KEY", None)
    done = run_cli("search", "--config", str(config), "--json", "--min-score", "0", *args, cwd=config.parent, env=env, inherit_env=False, timeout=300)
    try:
        out = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        out = None
    return done.returncode, out, done.stderr


@pytest.mark.parametrize("mode", ["native", "hybrid"])
def test_cli_through_the_server(native_server, native_config, fake, assets, tmp_path, mode):
    """Query files never embedded before, and no API key in the command's environment: in-process
    it cannot embed them, so does not find their look-alikes; through the server (which has the key)
    it does."""
    image = tmp_path / f"look-{mode}.png"
    Image.new("RGB", (130, 90) if mode == "native" else (140, 100), "white").save(image)
    audio = _silence(tmp_path / f"sound-{mode}.wav", 1.2 if mode == "native" else 1.3)
    _look(fake, image, PHOTO_LOOK)
    _look(fake, audio, AUDIO_SOUND)
    native_server.settle()
    for flag, path, asset in (("--image", image, "photo"), ("--audio", audio, "audio")):
        rc, out, err = _search(native_config, flag, str(path), "--retrieval-mode", mode, "--no-server", key=False)
        # (in-process the gemini provider cannot be built without the key: no native query vector)
        assert rc != 0 or not any(f"/{assets[asset]}/" in r["path"] for r in out["results"]), out
        rc, out, err = _search(native_config, flag, str(path), "--retrieval-mode", mode, key=False)
        assert rc == 0, err
        assert out["results"] and f"/{assets[asset]}/" in out["results"][0]["path"], out


def test_a_native_query_without_the_providers_key_says_so(native_server, native_config, files):
    """In-process without the key, the file cannot be embedded: a clear error and exit 1, not an
    empty answer."""
    rc, out, err = _search(native_config, "--image", str(files["blank"]), "--retrieval-mode", "native", "--no-server", key=False)
    assert rc == 1 and out is None
    assert "[ERROR]" in err and "native media query needs the gemini provider" in err and "GEMINI_API_KEY" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("mode", ["native", "hybrid"])
def test_cli_in_process(native_server, native_config, files, assets, mode):
    native_server.settle()
    for flag, path, asset in (("--image", files["blank"], "photo"), ("--audio", files["silence"], "audio")):
        rc, out, err = _search(native_config, flag, str(path), "--retrieval-mode", mode, "--no-server")
        assert rc == 0, err
        assert out["results"] and f"/{assets[asset]}/" in out["results"][0]["path"], out
    rc, out, err = _search(native_config, "--image", str(files["mixed"]), "--retrieval-mode", "native", "--no-server")
    assert rc == 0, err
    assert out["results"] and f"/{assets['photo']}/" in out["results"][0]["path"], out
    rc, out, err = _search(native_config, "--image", str(files["mixed"]), "--retrieval-mode", "text", "--no-server")
    assert rc == 0, err
    assert out["results"] and f"/{assets['receipt']}/" in out["results"][0]["path"], out


# --- an index without native vectors -----------------------------------------------------


@pytest.fixture(scope="module")
def text_only_config(tmp_path_factory, fake):
    return make_memory(tmp_path_factory.mktemp("text-only"), **_config(fake, native=False))


def test_native_modes_need_native_vectors(text_only_config, files):
    srv = Server(text_only_config)
    try:
        for mode in ("native", "hybrid"):
            for kind, path in (("audio", files["audio"]), ("images", files["mixed"])):
                resp = _query(srv, kind, path, mode)
                assert resp.status_code == 422, resp.text
                assert resp.json()["field"] == "retrievalMode" and "native media vectors" in resp.json()["error"]
            rc, out, err = _search(text_only_config, "--audio", str(files["audio"]), "--retrieval-mode", mode)
            assert rc == 1 and "--retrieval-mode" in err and "native media vectors" in err, err
        text = _query(srv, "audio", files["audio"], "auto")
        assert text.status_code == 200 and text.json()["nativeUsed"] is False
    finally:
        srv.stop()
