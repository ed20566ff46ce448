"""A fake of the Gemini API's embeddings (``POST /v1beta/models/{model}:batchEmbedContents``).

Auth by the ``x-goog-api-key`` header (what ``google-genai`` sends). Requests
``{"requests": [{"model": "models/…", "content": {"parts": [...]}, "taskType",
"outputDimensionality", "title"?}]}``; a part is ``{"text"}`` or ``{"inlineData":
{"mimeType", "data": base64}}`` (multimodal models only). Replies
``{"embeddings": [{"values": [...]}]}``. Errors ``{"error": {"code", "message", "status"}}``
(429 is ``RESOURCE_EXHAUSTED``). ``:embedContent`` (one content) is served too.

The vector of a content is the hashed bag of words of its text parts plus, for each
inline part, the words of ``media_words[sha256(bytes)]`` when a test registered some
(what the media "shows"), else a token naming its mime type and digest.
"""

from __future__ import annotations

import base64
import hashlib
import re

from memory_pipeline_tests.fakes.base import FakeServer

MODEL_DIMS = {"gemini-embedding-001": 3072, "gemini-embedding-2-preview": 3072, "text-embedding-004": 768}
MULTIMODAL_MODELS = ("gemini-embedding-2-preview", "gemini-embedding-2")
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
_PATH_RE = re.compile(r"^/(v1beta|v1|v1alpha)/models/([^/:]+):(batchEmbedContents|embedContent)$")


def decode_bytes(text: str) -> bytes:
    """Proto JSON ``bytes``: base64, standard or URL-safe (what google-genai sends), padding optional."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class GeminiFake(FakeServer):
    provider = "gemini"
    default_api_key = "gemini-test-key"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.media_words: dict[str, str] = {}  # sha256 of media bytes -> words it "shows"

    def authorized(self, headers):
        return self.api_key is None or headers.get("x-goog-api-key") == self.api_key

    def error_body(self, status, message):
        return {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}}

    def _embed_one(self, model: str, req: dict, wrong_dims: bool) -> tuple[list[float] | None, str]:
        content = req.get("content") or {}
        texts, extra = [], []
        for part in content.get("parts") or []:
            if "text" in part:
                texts.append(part["text"])
            elif "inlineData" in part or "inline_data" in part:
                if model not in MULTIMODAL_MODELS:
                    return None, f"model {model} does not support inline data; use a multimodal embedding model"
                inline = part.get("inlineData") or part.get("inline_data")
                data = decode_bytes(inline.get("data", ""))
                digest = hashlib.sha256(data).hexdigest()
                if digest in self.media_words:
                    texts.append(self.media_words[digest])
                else:
                    extra.append(f"media:{inline.get('mimeType') or inline.get('mime_type')}:{digest[:12]}")
            else:
                return None, "a part must have text or inlineData"
        if not texts and not extra:
            return None, "content must have at least one part"
        dims = req.get("outputDimensionality") or MODEL_DIMS.get(model, self.dims)
        if wrong_dims:
            dims = dims // 2 or 1
        return self.vector("\n".join(texts), dims, tuple(extra)), ""

    def inputs(self, request):
        body = request.body if isinstance(request.body, dict) else {}
        reqs = body.get("requests", [body])
        return ["".join(p.get("text", "") for p in (r.get("content") or {}).get("parts", [])) for r in reqs]

    def handle(self, method, path, headers, body, wrong_dims):
        m = _PATH_RE.match(path.split("?")[0])
        if method != "POST" or not m:
            return 404, {}, self.error_body(404, f"method not found: {method} {path}")
        model, action = m.group(2), m.group(3)
        if not isinstance(body, dict):
            return 400, {}, self.error_body(400, "Invalid JSON payload received.")
        requests = body.get("requests") if action == "batchEmbedContents" else [body]
        if not isinstance(requests, list) or not requests:
            return 400, {}, self.error_body(400, "* BatchEmbedContentsRequest.requests: contents is not specified")
        if len(requests) > 100:
            return 400, {}, self.error_body(400, "* BatchEmbedContentsRequest.requests: at most 100 requests can be in one batch")
        embeddings = []
        for req in requests:
            named = (req.get("model") or f"models/{model}").removeprefix("models/")
            if named != model:
                return 400, {}, self.error_body(400, f"Model {named} in request does not match the URL model {model}")
            values, err = self._embed_one(model, req, wrong_dims)
            if values is None:
                return 400, {}, self.error_body(400, err)
            embeddings.append({"values": values})
        if action == "embedContent":
            return 200, {}, {"embedding": embeddings[0]}
        return 200, {}, {"embeddings": embeddings}
