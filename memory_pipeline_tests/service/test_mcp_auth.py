"""The MCP server through the official client SDK over stdio (`memory mcp`) and streamable HTTP
(`/mcp` on `memory serve`); and the bearer token that any non-loopback bind needs."""

from __future__ import annotations

import json
import sys

import anyio
import pytest

from memory_pipeline_tests.service.conftest import Server, cli_env, memory

pytestmark = pytest.mark.slow
TOOLS = {"memory_search", "memory_get", "memory_store", "memory_status"}


async def _session(client) -> dict:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert TOOLS <= set(tools)
    schema = tools["memory_search"].input_schema if hasattr(tools["memory_search"], "input_schema") else tools["memory_search"].inputSchema
    assert schema["required"] == ["query"] and schema["properties"]["max_results"]
    # An argument a tool does not take is refused, naming it (it was ignored: `limit` gave the default).
    assert all((t.input_schema if hasattr(t, "input_schema") else t.inputSchema).get("additionalProperties") is False for t in tools.values())
    unknown = await client.call_tool("memory_search", {"query": "vector database", "limit": 1})
    assert (unknown.is_error if hasattr(unknown, "is_error") else unknown.isError) and "limit" in unknown.content[0].text, unknown
    found = await client.call_tool("memory_search", {"query": "which vector database did we choose for the support bot"})
    assert not found.is_error if hasattr(found, "is_error") else not found.isError
    results = _payload(found)["results"]
    assert results[0]["path"].endswith("2026-11-01.md")
    lines = _payload(await client.call_tool("memory_get", {"path": results[0]["path"], "from_line": 1, "lines": 2}))
    assert lines["text"].startswith("# Standup")
    bad = await client.call_tool("memory_get", {"path": "../../etc/passwd"})
    assert (bad.is_error if hasattr(bad, "is_error") else bad.isError) and "path" in bad.content[0].text
    status = _payload(await client.call_tool("memory_status", {}))
    assert status["table"]["rows"] > 0
    return tools


def _payload(result) -> dict:
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    if structured:
        return structured.get("result", structured) if set(structured) == {"result"} else structured
    return json.loads(result.content[0].text)


def test_mcp_over_stdio(memory_config):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def main():
        params = StdioServerParameters(command=sys.executable, args=["-m", "memory_pipeline.cli", "mcp", "--config", str(memory_config)],
                                       env=cli_env(), cwd=str(memory_config.parent))  # fmt: skip
        async with Client(params, read_timeout_seconds=600) as client:
            await _session(client)
            stored = _payload(await client.call_tool("memory_store", {"text": "The offsite is in Lisbon in March.", "path": "notes/offsite.md"}))
            assert stored["indexed"] and stored["doc_id"] == "mem:notes/offsite.md"
            found = _payload(await client.call_tool("memory_search", {"query": "where is the offsite"}))
            assert found["results"][0]["path"].endswith("notes/offsite.md")

    anyio.run(main)


def test_mcp_over_streamable_http(server):
    from mcp import Client

    async def main():
        async with Client(f"{server.url}/mcp", read_timeout_seconds=600) as client:
            await _session(client)
            stored = _payload(await client.call_tool("memory_store", {"text": "The hackathon is in Porto in May.", "path": "notes/hackathon.md"}))
            assert stored["indexed"] and stored["doc_id"] == "mem:notes/hackathon.md"
            found = _payload(await client.call_tool("memory_search", {"query": "where is the hackathon"}))
            assert found["results"][0]["path"].endswith("notes/hackathon.md")
            bad = await client.call_tool("memory_store", {"text": "x", "path": "../outside.md"})
            assert (bad.is_error if hasattr(bad, "is_error") else bad.isError) and "path" in bad.content[0].text

    anyio.run(main)
    assert (server.config.parent / "mem" / "notes" / "hackathon.md").read_text().startswith("The hackathon is in Porto")
    assert not (server.config.parent / "outside.md").exists()


def test_non_loopback_needs_a_token(memory_config):
    done = memory("serve", "--config", str(memory_config), "--host", "0.0.0.0", "--port", "0", cwd=memory_config.parent, timeout=120)
    assert done.returncode == 1
    assert "MEMORY_PIPELINE_TOKEN" in done.stderr and "[ERROR]" in done.stderr


def test_the_config_service_section_is_what_serve_uses(memory_config):
    import yaml

    cfg = yaml.safe_load(memory_config.read_text())
    cfg["service"] = {"host": "0.0.0.0", "port": 0}
    other = memory_config.with_name("service-host.yaml")
    other.write_text(yaml.safe_dump(cfg))
    done = memory("serve", "--config", str(other), cwd=memory_config.parent, timeout=120)
    assert done.returncode == 1 and "MEMORY_PIPELINE_TOKEN" in done.stderr  # service.host from the file
    # A flag wins over the file: on loopback no token is asked for (port 70000 then stops it, for its own reason).
    done = memory("serve", "--config", str(other), "--host", "127.0.0.1", "--port", "70000", cwd=memory_config.parent, timeout=120)
    assert done.returncode != 0 and "MEMORY_PIPELINE_TOKEN" not in done.stderr


def test_bearer_token(memory_config):
    token = "t0ken-" + "x" * 26
    srv = Server(memory_config, "--host", "0.0.0.0", token=token)
    try:
        import httpx

        bare = httpx.Client(base_url=srv.url.replace("0.0.0.0", "127.0.0.1"), timeout=60)
        assert bare.get("/healthz").status_code == 200  # liveness stays open
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {token}"}, {"Authorization": token}):
            resp = bare.post("/api/memory/search", json={"query": "standup"}, headers=headers)
            assert resp.status_code == 401 and resp.json()["field"] == "Authorization"
            assert resp.headers["www-authenticate"].startswith("Bearer")
        assert bare.get("/openapi.json").status_code == 401
        assert bare.post("/mcp", json={}).status_code == 401
        ok = bare.post("/api/memory/search", json={"query": "standup"}, headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and ok.json()["results"]
        bare.close()
        _mcp_with_token(srv.url.replace("0.0.0.0", "127.0.0.1"), token)
        # `memory search` sends the token from the environment, and falls back in-process without it.
        with_token = memory("search", "--config", str(memory_config), "standup", "--json", cwd=memory_config.parent, MEMORY_PIPELINE_TOKEN=token)
        assert with_token.returncode == 0 and json.loads(with_token.stdout)["results"]
    finally:
        srv.stop()


def _mcp_with_token(url: str, token: str) -> None:
    """The MCP client SDK over streamable HTTP: refused without the bearer token, served with it."""
    from mcp import Client, MCPError
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def connect(headers: dict) -> None:
        async with create_mcp_http_client(headers=headers) as http:
            async with Client(streamable_http_client(f"{url}/mcp", http_client=http), read_timeout_seconds=600) as client:
                await _session(client)

    with pytest.raises(Exception) as refused:  # the SDK answers the 401 with an MCPError in task groups
        anyio.run(connect, {"Authorization": "Bearer not-the-token"})
    assert refused.group_contains(MCPError, depth=None) if isinstance(refused.value, BaseExceptionGroup) else refused.errisinstance(MCPError)
    anyio.run(connect, {"Authorization": f"Bearer {token}"})
