"""`memory serve` over real HTTP: health, schema, search with every option, memory_get, notes,
status, errors that name the field, the body cap, traversal, the server file and `memory search`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memory_pipeline_tests.service.conftest import NOTES, Server, cli_env, memory

pytestmark = pytest.mark.slow


def search(server, **body):
    resp = server.http.post("/api/memory/search", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()["results"]


def test_health_ready_and_schema(server):
    assert server.http.get("/healthz").json() == {"ok": True}
    assert server.http.get("/readyz").json() == {"ready": True}
    paths = server.http.get("/openapi.json").json()["paths"]
    for route in ("/api/memory/search", "/api/memory/get", "/api/memory/notes", "/api/memory/status",
                  "/api/agentos/rag/multimodal/images/ingest", "/api/agentos/rag/multimodal/audio/ingest",
                  "/api/agentos/rag/multimodal/documents/ingest", "/api/agentos/rag/multimodal/query",
                  "/api/agentos/rag/multimodal/images/query", "/api/agentos/rag/multimodal/audio/query",
                  "/api/agentos/rag/multimodal/assets/{assetId}", "/api/agentos/rag/multimodal/assets/{assetId}/content"):  # fmt: skip
        assert route in paths, route
    # No page that loads third-party scripts on the server's origin (FastAPI's Swagger and ReDoc pages).
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert server.http.get(page).status_code == 404, page


def test_search_finds_the_right_note(server):
    results = search(server, query="which vector database did we choose for the support bot")
    assert results and results[0]["path"].endswith("2026-11-01.md")
    assert {"path", "line_start", "line_end", "score", "snippet", "chunk_id", "doc_id"} <= set(results[0])


def test_search_options(server):
    assert search(server, query="standup", mode="fts")[0]["path"].endswith("2026-11-01.md")
    assert search(server, query="daily standup meeting time", mode="vector", max_results=1, min_score=0)[0]["path"].endswith("2026-11-01.md")
    assert all("people/" in r["path"] for r in search(server, query="on call", path="people/*", min_score=0))
    dated = search(server, query="deploys rollback standup", since="2026-11-10", until="2026-11-30", min_score=0)
    assert dated and all(r["path"].endswith("2026-11-12.md") for r in dated)
    assert server.http.post("/api/memory/search", json={"query": "standup", "source": "nope"}).status_code == 422
    assert search(server, query="warehouse scanners", types=["text"], fusion="rrf", mmr=True, mmr_lambda=0.5,
                  recency_half_life_days=30)[0]["path"].endswith("warehouse.txt")  # fmt: skip
    assert search(server, query="warehouse scanners", types=["image"]) == []
    assert search(server, query="zebra giraffe polka") == []  # abstains


def test_search_renders_like_the_cli(server):
    resp = server.http.post("/api/memory/search", json={"query": "standup", "render": "plain"}).json()
    assert "— Text Results —" in resp["text"] and "**Standup**" in resp["text"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "query"),
        ({"query": ""}, "query"),
        ({"query": "x", "max_results": 0}, "max_results"),
        ({"query": "x", "mode": "magic"}, "mode"),
        ({"query": "x", "types": ["spreadsheet"]}, "types.0"),
        ({"query": "x", "since": "yesterday"}, "since"),
        ({"query": "x", "since": "2026-12-01", "until": "2026-11-01"}, "since"),
        ({"query": "x", "unknown": 1}, "unknown"),
        ({"query": "x", "min_score": 2}, "min_score"),
    ],
)
def test_bad_search_input_names_the_field(server, body, field):
    resp = server.http.post("/api/memory/search", json=body)
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"] == field
    assert "Traceback" not in resp.text


def test_not_json_is_a_4xx(server):
    resp = server.http.post("/api/memory/search", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 422 and resp.json()["field"]


def test_memory_get_lines(server, memory_config):
    hit = search(server, query="Dana routing-api")[0]
    got = server.http.get("/api/memory/get", params={"path": hit["path"], "from": 2, "lines": 1}).json()
    assert got["text"] == "Dana owns routing-api and prefers async reviews."
    assert (got["from"], got["to"], got["total_lines"], got["truncated"]) == (2, 2, 3, True)
    rel = server.http.get("/api/memory/get", params={"path": "people/dana.md", "source": "mem"}).json()
    assert rel["text"].startswith("# Dana") and rel["doc_id"] == "mem:people/dana.md"


def test_memory_get_stays_inside_the_sources(server, memory_config, tmp_path):
    mem = memory_config.parent / "mem"
    secret = tmp_path / "outside.txt"
    secret.write_text("the outside secret\n")
    (mem / "escape.md").symlink_to(secret)
    (mem / "media").mkdir(exist_ok=True)
    (mem / "media" / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    for path, status in [
        ("../memory_pipeline.yaml", 422),
        (str(memory_config), 422),
        ("/etc/passwd", 422),
        (str(mem / ".." / "memory_pipeline.yaml"), 422),
        ("escape.md", 422),
        (str(mem / "escape.md"), 422),
        ("missing.md", 404),
        ("people", 422),
        ("media/photo.png", 415),
        ("a\\b.md", 422),
    ]:
        resp = server.http.get("/api/memory/get", params={"path": path})
        assert resp.status_code == status, (path, resp.text)
        assert resp.json()["field"] == "path"
        assert "outside secret" not in resp.text
    assert server.http.get("/api/memory/get", params={"path": "people/dana.md", "lines": 0}).status_code == 422


def test_write_note_then_find_it(server, memory_config):
    resp = server.http.post("/api/memory/notes", json={"text": "The retro moved to Wednesday at 4pm in room Borealis.", "path": "notes/retro.md"})
    assert resp.status_code == 200, resp.text
    note = resp.json()
    assert note["indexed"] and note["doc_id"] == "mem:notes/retro.md"
    assert (memory_config.parent / "mem" / "notes" / "retro.md").read_text().startswith("The retro moved")
    assert search(server, query="when is the retro")[0]["path"].endswith("notes/retro.md")
    for bad in ({"text": "x", "path": "../x.md"}, {"text": "x", "path": "/tmp/x.md"}, {"text": "x", "path": "notes/x.sh"},
                {"text": "x", "path": ".hidden/x.md"}, {"text": "  "}, {"text": "x", "source": "nope"}):  # fmt: skip
        resp = server.http.post("/api/memory/notes", json=bad)
        assert resp.status_code == 422, (bad, resp.text)
        assert resp.json()["field"] == ("source" if "source" in bad else "text" if not bad["text"].strip() else "path"), (bad, resp.json())
    assert not (memory_config.parent / "x.md").exists()


def test_index_route_is_memory_index_json(server, memory_config):
    """POST /api/memory/index runs `memory index` on what changed in the folder behind the server's
    back and answers its JSON (the keys and value types of `memory index --json`); the note is then
    found, and a second call has nothing to embed."""
    note = memory_config.parent / "mem" / "notes" / "kiln.md"
    note.parent.mkdir(exist_ok=True)
    note.write_text("# Pottery\nThe pottery kiln in the basement fires at 1240 degrees on Thursdays.\n")
    resp = server.http.post("/api/memory/index")
    assert resp.status_code == 200, resp.text
    run = resp.json()
    assert run["files_changed"] >= 1 and run["chunks_embedded"] >= 1 and run["rows_written"] >= 1, run
    assert run["provider"] == "local" and run["table_rows"] > 0 and not run["skipped_run"] and run["files_seen"] >= len(NOTES) + 1
    assert search(server, query="what temperature does the pottery kiln fire at")[0]["path"].endswith("notes/kiln.md")
    again = server.http.post("/api/memory/index")
    assert again.status_code == 200, again.text
    again = again.json()
    assert (again["files_changed"], again["chunks_embedded"], again["rows_written"], again["rows_deleted"]) == (0, 0, 0, 0), again
    # The CLI's JSON for the same folder (nothing left to do there either): the same keys, the same types.
    cli = memory("index", "--config", str(memory_config), "--json", cwd=memory_config.parent)
    assert cli.returncode == 0, cli.stderr
    cli = json.loads(cli.stdout)
    assert cli["ok"] is True and cli["chunks_embedded"] == 0
    assert run["ok"] is True and set(cli) == set(run), set(cli) ^ set(run)
    for key in cli:
        assert cli[key] is None or run[key] is None or type(cli[key]) is type(run[key]), (key, cli[key], run[key])


def test_status(server):
    status = server.http.get("/api/memory/status").json()
    assert status["ready"] and status["provider"] == "local" and status["table"]["rows"] > 0
    assert status["native_media"] is False


def test_body_cap_413_with_the_cli_message(server):
    big = b"x" * (2 * 1024 * 1024 + 128 * 1024)
    resp = server.http.post("/api/agentos/rag/multimodal/documents/ingest", files={"document": ("big.txt", big, "text/plain")})
    assert resp.status_code == 413
    assert resp.json()["error"] == "File upload exceeds 2097152 bytes limit for embedding"

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(40):
            yield b"y" * 65536

    resp = server.http.post("/api/memory/search", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413
    # Not a file: the message says the request is too large (it said "File upload … for embedding").
    assert resp.json() == {"error": "the request body exceeds the server's limit of 2097152 bytes (multimodal.max_file_bytes)", "field": "body"}
    resp = server.http.post("/api/memory/notes", content=b"{" + b" " * (2 * 1024 * 1024 + 128 * 1024) + b"}", headers={"content-type": "application/json"})
    assert resp.status_code == 413 and resp.json()["error"].startswith("the request body exceeds"), resp.text


def test_file_over_the_limit_is_named(server):
    just_over = b"a" * (2 * 1024 * 1024 + 1)
    resp = server.http.post("/api/agentos/rag/multimodal/documents/ingest", files={"document": ("notes.txt", just_over, "text/plain")})
    assert resp.status_code == 413
    assert resp.json()["error"] == "File notes.txt exceeds 2097152 bytes limit for embedding"


def test_truncated_json_names_the_body(server):
    """A body that is not whole JSON: the field is `body` and the position is in the message (the
    field was the character position, "10")."""
    resp = server.http.post("/api/memory/search", content=b'{"query": "kiln', headers={"content-type": "application/json"})
    assert resp.status_code == 422
    body = resp.json()
    assert body["field"] == "body" and body["error"].startswith("body: not valid JSON at character "), body


def test_foreign_host_header_is_refused(server):
    resp = server.http.get("/api/memory/status", headers={"host": "evil.example:80"})
    assert resp.status_code == 400
    # JSON naming the field, like every other error here (it was Starlette's plain text).
    assert resp.json()["field"] == "Host" and "loopback" in resp.json()["error"], resp.text
    assert server.http.get("/api/memory/status", headers={"host": "localhost:1"}).status_code == 200


def test_no_cors_by_default(server):
    resp = server.http.options("/api/memory/search", headers={"origin": "http://evil.example", "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in resp.headers


def test_cors_origin_allows_that_origin_only(memory_config, tmp_path):
    """`memory serve --cors-origin O`: preflights and requests from O get Access-Control-Allow-Origin,
    any other origin none. (A copy of the folder: a second server on the same data folder would take
    over its server file.)"""
    import shutil

    root = tmp_path / "cors"
    shutil.copytree(memory_config.parent, root, ignore=shutil.ignore_patterns("serve-*.log", "server.json"))
    allowed, other = "http://app.example:3000", "http://evil.example"
    srv = Server(root / "memory_pipeline.yaml", "--cors-origin", allowed)
    try:
        pre = {"access-control-request-method": "POST", "access-control-request-headers": "content-type"}
        ok = srv.http.options("/api/memory/search", headers={"origin": allowed, **pre})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == allowed, (ok.status_code, ok.headers)
        assert "POST" in ok.headers["access-control-allow-methods"]
        got = srv.http.get("/api/memory/status", headers={"origin": allowed})
        assert got.status_code == 200 and got.headers["access-control-allow-origin"] == allowed
        found = srv.http.post("/api/memory/search", json={"query": "standup"}, headers={"origin": allowed})
        assert found.status_code == 200 and found.headers["access-control-allow-origin"] == allowed
        refused = srv.http.options("/api/memory/search", headers={"origin": other, **pre})
        assert refused.status_code >= 400 and "access-control-allow-origin" not in refused.headers
        foreign = srv.http.get("/api/memory/status", headers={"origin": other})
        assert foreign.status_code == 200 and "access-control-allow-origin" not in foreign.headers
        assert "access-control-allow-origin" not in srv.http.get("/api/memory/status").headers  # no Origin: not a CORS request
    finally:
        srv.stop()


def test_cli_search_goes_through_the_running_server(server, memory_config):
    code = ("import sys; from memory_pipeline.cli import main; rc = main(['search', '--config', sys.argv[1], 'standup room', '--json']);"
            "print('IN_PROCESS' if 'memory_pipeline.search' in sys.modules else 'SERVED', file=sys.stderr); sys.exit(rc)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(memory_config)], cwd=memory_config.parent, env=cli_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "SERVED" in done.stderr
    assert json.loads(done.stdout)["results"][0]["path"].endswith("2026-11-01.md")
    plain = memory("search", "--config", str(memory_config), "standup room", cwd=memory_config.parent)
    assert plain.returncode == 0 and "— Text Results —" in plain.stdout and "2026-11-01.md" in plain.stdout


def test_cli_search_falls_back_in_process_without_a_live_server(tmp_path, memory_config):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(memory_config.parent, root, ignore=shutil.ignore_patterns("serve-*.log"))
    cfg = root / "memory_pipeline.yaml"
    (root / "index" / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": 2**22 + 17, "config": str(cfg)}))
    done = memory("search", "--config", str(cfg), "standup room", "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["results"][0]["path"].endswith("2026-11-01.md")


def test_retrieval_mode_native_without_native_vectors_is_an_error(server, memory_config, tmp_path):
    from memory_pipeline_tests import sample_media as sm

    image = sm.text_image(tmp_path / "q.png", ["ACME CORP receipt"])
    done = memory("search", "--config", str(memory_config), "--image", str(image), "--retrieval-mode", "native", cwd=memory_config.parent)
    assert done.returncode == 1
    assert "--retrieval-mode native needs native media vectors" in done.stderr


SERVED_PROBE = (
    "import sys; from memory_pipeline.cli import main; rc = main(sys.argv[1:]);"
    "print('IN_PROCESS' if {'memory_pipeline.search', 'memory_pipeline.querying'} & set(sys.modules) else 'SERVED', file=sys.stderr); sys.exit(rc)"
)


def probe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`memory ...` in a fresh interpreter that says on stderr whether it searched in-process."""
    return subprocess.run([sys.executable, "-c", SERVED_PROBE, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("mode", ["auto", "text"])
def test_cli_search_by_image_goes_through_the_running_server(server, memory_config, tmp_path, mode):
    from memory_pipeline_tests import sample_media as sm

    image = sm.text_image(tmp_path / "whiteboard.png", ["daily standup room Aurora"])
    server.settle()
    args = ["search", "--config", str(memory_config), "--image", str(image), "--retrieval-mode", mode]
    served = probe(*args, "--json", cwd=memory_config.parent)
    assert served.returncode == 0, served.stderr
    assert "SERVED" in served.stderr
    local = memory(*args, "--json", "--no-server", cwd=memory_config.parent)
    assert local.returncode == 0, local.stderr
    assert json.loads(served.stdout) == json.loads(local.stdout)
    assert json.loads(served.stdout)["results"][0]["path"].endswith("2026-11-01.md")
    # The plain output too, with the query words beside the image.
    plain = probe(*args, "standup", cwd=memory_config.parent)
    local_plain = memory(*args, "standup", "--no-server", cwd=memory_config.parent)
    assert plain.returncode == local_plain.returncode == 0, plain.stderr
    assert "SERVED" in plain.stderr and plain.stdout == local_plain.stdout


def test_cli_search_by_audio_goes_through_the_running_server(server, memory_config, tmp_path):
    from memory_pipeline_tests import sample_media as sm

    audio = sm.speech_audio(tmp_path / "memo.wav", "Dana owns the routing service and prefers async reviews.")
    server.settle()
    args = ["search", "--config", str(memory_config), "--audio", str(audio), "--json"]
    served = probe(*args, cwd=memory_config.parent)
    assert served.returncode == 0 and "SERVED" in served.stderr, served.stderr
    local = memory(*args, "--no-server", cwd=memory_config.parent)
    assert json.loads(served.stdout) == json.loads(local.stdout)
    assert json.loads(served.stdout)["results"][0]["path"].endswith("dana.md")


def test_cli_search_by_file_errors_are_the_in_process_ones(server, memory_config, tmp_path):
    """A file the server refuses (not an image; native without native vectors; missing) ends as in-process: same message, same exit code."""
    text = tmp_path / "notes.png"
    text.write_text("not an image at all\n")
    cases = [
        ["--image", str(text)],
        ["--image", str(tmp_path / "missing.png")],
        ["--audio", str(text), "--retrieval-mode", "native"],
    ]
    for extra in cases:
        args = ["search", "--config", str(memory_config), *extra]
        served = memory(*args, cwd=memory_config.parent)
        local = memory(*args, "--no-server", cwd=memory_config.parent)
        assert served.returncode == local.returncode != 0, (extra, served.stderr)
        assert served.stderr == local.stderr and served.stdout == local.stdout, extra


def test_search_files_route(server, tmp_path):
    from memory_pipeline_tests import sample_media as sm

    image = sm.text_image(tmp_path / "q.png", ["deploys on Fridays after the freeze"]).read_bytes()
    resp = server.http.post("/api/memory/search/files", files={"image": ("q.png", image, "image/png")},
                            data={"options": json.dumps({"max_results": 2, "retrieval_mode": "text", "render": "plain"})})  # fmt: skip
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert "freeze" in body["query"].lower() and body["results"][0]["path"].endswith("2026-11-12.md") and len(body["results"]) <= 2
    assert body["text"]
    bad = server.http.post("/api/memory/search/files", files={"image": ("q.png", image, "image/png")}, data={"options": '{"max_results": 0}'})
    assert bad.status_code == 422 and bad.json()["field"] == "options.max_results"
    assert server.http.post("/api/memory/search/files", data={"options": "{}"}).status_code == 422
    native = server.http.post("/api/memory/search/files", files={"image": ("q.png", image, "image/png")}, data={"options": '{"retrieval_mode": "native"}'})
    assert native.status_code == 422 and native.json()["field"] == "retrieval_mode"


def test_search_result_schema_is_the_dataclass(server):
    """The API's result schema is search.SearchResult's: the same fields, all of them always sent."""
    import dataclasses

    from memory_pipeline.search.searcher import SearchResult

    schema = server.http.get("/openapi.json").json()["components"]["schemas"]["SearchResult"]
    names = [f.name for f in dataclasses.fields(SearchResult)]
    assert list(schema["properties"]) == names and sorted(schema["required"]) == sorted(names)
    hit = server.http.post("/api/memory/search", json={"query": "standup room"}).json()["results"][0]
    assert list(hit) == names


def test_search_files_options_any_json_is_a_result_or_a_named_422(server, tmp_path):
    """The multipart route's ``options`` is JSON the schema cannot type: any object of any
    option names and values (hypothesis-built) gets a 200 with results of the documented
    shape, or a 422 naming the field, never a 5xx."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    keys = ["query", "max_results", "min_score", "mode", "fusion", "source", "path", "types", "modality", "since", "until",
            "mmr", "mmr_lambda", "recency_half_life_days", "retrieval_mode", "render", "unknown_knob"]  # fmt: skip
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=False), st.text(max_size=30),
                        st.sampled_from(["hybrid", "fts", "vector", "rrf", "auto", "text", "native", "plain", "2026-11-12", "image", "mem"]))  # fmt: skip
    values = st.one_of(scalars, st.lists(scalars, max_size=3))
    from memory_pipeline_tests import sample_media as sm

    image = sm.text_image(tmp_path / "q.png", ["standup room"]).read_bytes()  # OCRed once per request

    seen: set[int] = set()

    @given(options=st.dictionaries(st.sampled_from(keys), values, max_size=6))
    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(options):
        resp = server.http.post("/api/memory/search/files", files={"image": ("q.png", image, "image/png")}, data={"options": json.dumps(options)})
        seen.add(resp.status_code)
        assert resp.status_code in (200, 422), (options, resp.status_code, resp.text)
        body = resp.json()
        if resp.status_code == 422:
            assert body.get("field") and "Traceback" not in resp.text, (options, body)
        else:
            assert isinstance(body["results"], list) and all("path" in r and "score" in r for r in body["results"]), body

    check()
    assert seen == {200, 422}  # both outcomes were exercised
