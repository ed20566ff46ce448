"""Request bodies capped at ``multimodal.max_file_bytes`` (plus room for a multipart envelope).

A body over the cap is refused with 413, before it is read when ``Content-Length`` says so, else as
soon as the count passes: a file upload (a multipart body) with the message `memory store` prints
for a file over the limit, any other body (a search, a note) saying that the request is too large.
"""

from __future__ import annotations

import json

ENVELOPE = 64 * 1024  # multipart boundaries, part headers and the small form fields


def too_large_message(limit: int, name: str = "upload") -> str:
    return f"File {name} exceeds {limit} bytes limit for embedding"


def _body_too_large(scope, limit: int) -> str:
    content_type = dict(scope.get("headers") or []).get(b"content-type", b"").lower()
    if content_type.startswith(b"multipart/"):
        return too_large_message(limit)
    return f"the request body exceeds the server's limit of {limit} bytes (multimodal.max_file_bytes)"


class BodyLimit:
    """ASGI middleware counting request body bytes."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.cap = limit + ENVELOPE

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.cap
            except ValueError:
                return await _reply(send, 400, {"error": "Content-Length is not a number", "field": "Content-Length"})
            if too_big:
                return await _reply(send, 413, {"error": _body_too_large(scope, self.limit), "field": "body"})
        seen = 0
        over = False

        async def counted():
            # Past the cap the body is cut short; whatever the app answers then is replaced by a 413.
            nonlocal seen, over
            if over:
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.cap:
                    over = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        replaced = False

        async def watched(message):
            nonlocal replaced
            if over and message["type"] == "http.response.start":
                replaced = True
                return await _reply(send, 413, {"error": _body_too_large(scope, self.limit), "field": "body"})
            if replaced:
                return None
            await send(message)

        await self.app(scope, counted, watched)


async def _reply(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})
