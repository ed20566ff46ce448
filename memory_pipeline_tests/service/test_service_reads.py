"""What the server reads back: memory_get never returns secrets, an unknown source is an error (not
"nothing relevant"), MCP errors carry no configuration hint for a bad argument, and a damaged table
is a 503 (one line on the command line), never a 500."""

from __future__ import annotations

import json

import anyio
import pytest

from memory_pipeline_tests.service.conftest import Server, make_memory, memory

pytestmark = pytest.mark.slow
OPENAI_KEY = "sk-proj-" + "Ab3dE5gH7jK9mN1pQ3rS5tU7wX9yZ1bC3dE5fG7hJ9kL1mN3"
SECRETS = f"# Access\nThe bot's key is {OPENAI_KEY} for now.\nDatabase: postgres://admin:hunter2-Salted-99@db.internal:5432/app\n"


def test_memory_get_returns_redacted_lines(server):
    (server.config.parent / "mem" / "access.md").write_text(SECRETS)  # the user's file holds them verbatim
    resp = server.http.get("/api/memory/get", params={"path": "access.md"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert OPENAI_KEY not in resp.text and "hunter2-Salted-99" not in resp.text
    assert "[REDACTED:" in body["text"] and "admin:[REDACTED:password]@db.internal" in body["text"]
    assert body["total_lines"] == 3 and body["text"].splitlines()[0] == "# Access"  # line numbers unchanged
    one = server.http.get("/api/memory/get", params={"path": "access.md", "from": 3, "lines": 1}).json()
    assert one["text"].startswith("Database: postgres://admin:[REDACTED:password]@")


def test_memory_get_cleans_like_the_index_before_it_redacts_and_counts_lines_as_search_does(server):
    """Redacted raw, a file with carriage-return line ends kept `.pgpass` and `.netrc` lines whole
    (their detectors need a line start) and a key with a control character inside it (which the
    index removes before it redacts) came back in clear. And `splitlines` cut lines at form feeds,
    NEL and U+2028, where search locators count newlines only."""
    mem = server.config.parent / "mem"
    pgpass = "db.example.com:5432:mydb:bob:S3cr3tPgpassZZ1"
    (mem / "cr-only.md").write_bytes(
        f"Pgpass notes\r\rOur backup host entry:\r{pgpass}\rmachine api.example.com login bob password NetrcSecretQQ7\rend\r".encode()
    )
    (mem / "crlf.md").write_bytes(f"x\r\nbackup host entry:\r\n{pgpass}\r\n".encode())
    (mem / "ctl.md").write_bytes(f"Key note\n\nOPENAI key {OPENAI_KEY[:14]}\x08{OPENAI_KEY[14:]} here\n".encode())
    for name, secrets in (("cr-only.md", ("S3cr3tPgpassZZ1", "NetrcSecretQQ7")), ("crlf.md", ("S3cr3tPgpassZZ1",)), ("ctl.md", (OPENAI_KEY[14:],))):
        resp = server.http.get("/api/memory/get", params={"path": name})
        assert resp.status_code == 200, resp.text
        assert not any(secret in resp.text for secret in secrets) and "[REDACTED:" in resp.json()["text"], (name, resp.text)
    cr = server.http.get("/api/memory/get", params={"path": "cr-only.md", "from": 3, "lines": 1}).json()
    assert cr["text"] == "Our backup host entry:" and cr["total_lines"] == 6, cr
    (mem / "ff.md").write_bytes("Title\n\npage one\n\x0c\npage two\x0cstill two\u2028same\x85line\nLINE6 the zebra fact\nline seven\n".encode())
    six = server.http.get("/api/memory/get", params={"path": "ff.md", "from": 6, "lines": 1}).json()
    assert six["text"] == "LINE6 the zebra fact" and six["total_lines"] == 7, six


def test_an_unknown_source_in_a_search_is_a_422(server):
    resp = server.http.post("/api/memory/search", json={"query": "standup", "source": "nope"})
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"] == "source" and "nope" in resp.json()["error"]
    ok = server.http.post("/api/memory/search", json={"query": "standup", "source": "mem", "mode": "fts"})
    assert ok.status_code == 200 and ok.json()["results"]
    done = memory("search", "--config", str(server.config), "--no-server", "--source", "nope", "standup", cwd=server.config.parent)
    assert done.returncode == 1 and "unknown source 'nope'" in done.stderr and "Traceback" not in done.stderr


def test_mcp_errors_name_the_argument_without_the_configuration_hint(server):
    from mcp import Client

    async def main():
        async with Client(f"{server.url}/mcp", read_timeout_seconds=600) as client:
            bad = await client.call_tool("memory_get", {"path": "../cfg.yaml"})
            assert bad.is_error and "path" in bad.content[0].text
            assert "configuration" not in bad.content[0].text, bad.content[0].text
            get = await client.call_tool("memory_get", {"path": "access.md"})
            assert not get.is_error
            text = (get.structured_content or json.loads(get.content[0].text))["text"]
            assert OPENAI_KEY not in text and "[REDACTED:" in text
            unknown = await client.call_tool("memory_search", {"query": "standup", "source": "nope"})
            assert unknown.is_error and "unknown source 'nope'" in unknown.content[0].text

    (server.config.parent / "mem" / "access.md").write_text(SECRETS)
    anyio.run(main)


class _Unready(Server):
    def wait_ready(self, timeout: float = 300) -> None:  # the damaged table is never ready
        pass


def test_a_damaged_table_is_a_503_not_a_500(tmp_path):
    cfg = make_memory(tmp_path)
    data = [p for p in (tmp_path / "index" / "lancedb").rglob("*.lance") if p.is_file() and "data" in p.parts]
    assert data
    for p in data:
        with open(p, "r+b") as f:
            f.truncate(100)
    done = memory("search", "--config", str(cfg), "--no-server", "standup", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "a bug" not in done.stderr, done.stderr
    assert "memory index --force" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    srv = _Unready(cfg)
    try:
        resp = srv.http.post("/api/memory/search", json={"query": "standup"})
        assert resp.status_code == 503, resp.text
        assert "memory index --force" in resp.json()["hint"]
    finally:
        srv.stop()
