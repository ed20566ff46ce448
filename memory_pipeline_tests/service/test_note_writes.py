"""Notes written through the server: what the index would not take is refused before anything is
written, an answer never claims a note is searchable when it is not, and a burst of writes never
starves searches or health checks.

The server runs in this process (the real app on uvicorn, over real HTTP) so that a test can hold
its write lock and count the requests that reached it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from memory_pipeline.runner import shards_of
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.service.conftest import make_memory

pytestmark = pytest.mark.slow
LIMIT = 4096  # limits.max_file_bytes of the served folder


class _Counting:
    """The app, counting the requests to each path that reached it."""

    def __init__(self, app) -> None:
        self.app = app
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            with self.lock:
                self.seen[scope["path"]] = self.seen.get(scope["path"], 0) + 1
        await self.app(scope, receive, send)


class InProcessServer:
    """``create_app`` on uvicorn in a thread of this process, on a free loopback port."""

    def __init__(self, config: Path) -> None:
        import uvicorn

        from memory_pipeline.service.app import create_app
        from memory_pipeline.service.run import bind

        self.settings = load_settings(config)
        self.app = create_app(self.settings)
        self.counting = _Counting(self.app)
        sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.counting, log_level="warning", access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
        self.thread.start()
        self.http = httpx.Client(base_url=self.url, timeout=300)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if self.http.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("the server never got ready")

    @property
    def memory(self):
        return self.app.state.memory

    @property
    def folder(self) -> Path:
        return self.settings.sources[0].path

    def stop(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(60)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    srv = InProcessServer(make_memory(tmp_path_factory.mktemp("notes"), limits={"max_file_bytes": LIMIT}))
    yield srv
    srv.stop()


def note(srv, text: str, path: str, **extra) -> httpx.Response:
    return srv.http.post("/api/memory/notes", json={"text": text, "path": path, **extra})


def found(srv, query: str, path: str) -> bool:
    resp = srv.http.post("/api/memory/search", json={"query": query, "mode": "fts", "min_score": 0})
    assert resp.status_code == 200, resp.text
    return any(r["path"].endswith(path) for r in resp.json()["results"])


def _refused(resp: httpx.Response, status: int, field: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.json()["field"] == field, resp.text
    assert "configuration" not in resp.text  # a bad request, not a bad config file


def test_a_nul_in_a_note_is_refused_and_the_file_keeps_being_indexed(served):
    first = note(served, "The lighthouse keeper is Marit.", "memory/nul-day.md")
    assert first.status_code == 200 and first.json()["indexed"] is True, first.text
    before = (served.folder / "memory/nul-day.md").read_bytes()
    _refused(note(served, "bad \x00 byte", "memory/nul-day.md"), 422, "text")
    assert (served.folder / "memory/nul-day.md").read_bytes() == before
    later = note(served, "The ferry to Vlieland leaves at noon.", "memory/nul-day.md")
    assert later.status_code == 200 and later.json()["indexed"] is True, later.text
    assert found(served, "Vlieland", "memory/nul-day.md") and found(served, "lighthouse keeper Marit", "memory/nul-day.md")


@pytest.mark.parametrize("text", ["%PDF-1.7 is the version we ship", "GIF89a was the format", "abcdftypmp42 header"])
def test_text_that_would_make_a_new_note_read_as_media_is_refused(served, text):
    _refused(note(served, text, "memory/magic.md"), 422, "text")
    assert not (served.folder / "memory/magic.md").exists()


def test_a_secret_in_the_file_name_is_refused_before_writing(served):
    name = "ghp_1234567890abcdefghijklmnopqrstuvwxyz99.md"
    resp = note(served, "a note under a secret name", name)
    _refused(resp, 422, "path")
    assert "ghp_1234567890" not in resp.text  # the answer does not repeat the secret
    assert not (served.folder / name).exists()


def test_an_append_past_max_file_bytes_is_refused_and_the_file_keeps_its_rows(served):
    assert note(served, "Harbour dues are paid in March. " + "x" * 2000, "memory/dues.md").json()["indexed"] is True
    before = (served.folder / "memory/dues.md").read_bytes()
    resp = note(served, "y" * 3000, "memory/dues.md")
    _refused(resp, 413, "text")
    assert "max_file_bytes" in resp.json()["error"]
    assert (served.folder / "memory/dues.md").read_bytes() == before
    assert found(served, "harbour dues March", "memory/dues.md")
    _refused(note(served, "z" * (LIMIT + 1), "memory/big.md", append=False), 413, "text")
    assert not (served.folder / "memory/big.md").exists()


def test_a_name_over_255_bytes_is_a_422_and_creates_nothing(served):
    resp = note(served, "accents", f"deep/{'é' * 200}/x.md")
    _refused(resp, 422, "path")
    resp = note(served, "accents", "é" * 200 + ".md")
    _refused(resp, 422, "path")
    assert not (served.folder / "deep").exists()


def test_a_note_the_run_could_not_index_answers_indexed_false(served, monkeypatch):
    """A file the index run skips after the write (here: turned binary by another writer in the
    meantime) is answered ``indexed: false`` with why; a 200 all the same, since the note was
    written (an error status invited a retry that appended it again)."""
    target = served.folder / "memory/spoiled.md"
    real_index = served.memory.index

    def spoiled_then_index(shards):
        target.write_bytes(b"\x00" + target.read_bytes())
        return real_index(shards)

    monkeypatch.setattr(served.memory, "index", spoiled_then_index)
    resp = note(served, "Buoy 12 is green.", "memory/spoiled.md")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["indexed"] is False and "binary" in body["reason"], body
    assert body["path"].endswith("memory/spoiled.md") and body["doc_id"] == "mem:memory/spoiled.md"
    assert set(shards_of([("mem", "memory/spoiled.md")])) <= set(body["run"]["shards"] or [])


def test_searches_and_health_answer_while_a_burst_of_writes_waits(served):
    """More writes than the server's shared threads (40) wait on the write lock: a search, /healthz
    and /readyz still answer before the writes can go on."""
    writes = 45
    start = served.counting.seen.get("/api/memory/notes", 0)
    lock = served.memory.write_lock
    lock.acquire()
    try:
        with ThreadPoolExecutor(writes) as pool, httpx.Client(base_url=served.url, timeout=60) as other:
            pending = [pool.submit(note, served, f"Burst note {k} about kelp.", "memory/burst.md", index=False) for k in range(writes)]
            while served.counting.seen.get("/api/memory/notes", 0) - start < writes:
                time.sleep(0.05)  # every write has reached the app; none can finish while the lock is held
            time.sleep(0.5)  # and has had its turn to take a thread
            assert not any(p.done() for p in pending)
            assert other.get("/healthz").json() == {"ok": True}
            assert other.head("/healthz").status_code == 200
            assert other.get("/readyz").status_code == 200
            resp = other.post("/api/memory/search", json={"query": "lighthouse keeper", "mode": "fts"})
            assert resp.status_code == 200, resp.text
            assert not any(p.done() for p in pending)  # the search answered while the writes still waited
            lock.release()
            lock = None
            assert all(p.result().status_code == 200 for p in pending)
    finally:
        if lock is not None:
            lock.release()
    assert (served.folder / "memory/burst.md").read_text().count("Burst note") == writes
