"""Who may talk to the server: loopback by default; a bearer token for anything else.

The token is read from the environment (``MEMORY_PIPELINE_TOKEN``) by the command that starts
the server and handed in; it is compared in constant time and never logged. When a token is
set every route but ``/healthz`` needs it (``Authorization: Bearer …``), whatever the address.
"""

from __future__ import annotations

import hmac
import ipaddress
import json

TOKEN_ENV = "MEMORY_PIPELINE_TOKEN"
OPEN_PATHS = ("/healthz",)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_matches(header: bytes | None, token: bytes) -> bool:
    """Constant-time check of an ``Authorization`` header against ``Bearer <token>``."""
    given = header or b""
    scheme, _, value = given.partition(b" ")
    ok_scheme = hmac.compare_digest(scheme.lower(), b"bearer")
    return hmac.compare_digest(value.strip(), token) and ok_scheme


class BearerAuth:
    """ASGI middleware: 401 JSON without the right bearer token (HTTP and the MCP route alike)."""

    def __init__(self, app, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        header = dict(scope.get("headers") or []).get(b"authorization")
        if token_matches(header, self.token):
            return await self.app(scope, receive, send)
        body = json.dumps({"error": "missing or wrong bearer token", "field": "Authorization"}).encode()
        await send({
            "type": "http.response.start", "status": 401,
            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="memory"'),
                        (b"content-length", str(len(body)).encode())],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": body})


class LoopbackHost:
    """ASGI middleware: 400 JSON unless the Host header names a loopback address (``hosts``), so a
    page on another site cannot reach a loopback server by DNS rebinding. Starlette's
    ``TrustedHostMiddleware`` does the same with a plain-text answer; every other error here is
    ``{"error", "field"}``."""

    def __init__(self, app, hosts) -> None:
        self.app = app
        self.hosts = {h.lower() for h in hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        from starlette._utils import parse_host_header

        raw = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        parsed = parse_host_header(raw)
        if parsed is not None and parsed.host.lower() in self.hosts:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps({
            "error": "the Host header must name a loopback address (127.0.0.1, localhost or [::1]): this server only answers this machine",
            "field": "Host",
        }).encode()  # fmt: skip
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})
