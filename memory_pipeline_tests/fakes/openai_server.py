"""A fake of OpenAI's embeddings endpoint (``POST /v1/embeddings``), for the real ``openai`` SDK.

Bearer auth; ``input`` a string or a list; ``dimensions``; ``encoding_format`` float or
base64 (the SDK asks for base64 by default and decodes it); errors in OpenAI's body
``{"error": {"message", "type", "param", "code"}}``. Mistral's API has the same shape
(see ``mistral_server``).
"""

from __future__ import annotations

import base64

import numpy as np

from memory_pipeline_tests.fakes.base import FakeServer, bearer_ok

MODEL_DIMS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}


class OpenAIFake(FakeServer):
    provider = "openai"
    path = "/v1/embeddings"

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("api_key", "sk-test-openai")
        super().__init__(**kwargs)

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"

    def authorized(self, headers):
        return bearer_ok(headers, self.api_key)

    def error_body(self, status, message):
        kind = {429: ("rate_limit_exceeded", "requests"), 401: ("invalid_api_key", "invalid_request_error")}.get(
            status, (None, "server_error" if status >= 500 else "invalid_request_error")
        )
        return {"error": {"message": message, "type": kind[1], "param": None, "code": kind[0]}}

    def model_dims(self, model: str, requested: int | None) -> int:
        return requested or MODEL_DIMS.get(model, self.dims)

    def handle(self, method, path, headers, body, wrong_dims):
        if method != "POST" or path.rstrip("/") != self.path:
            return 404, {}, self.error_body(404, f"Invalid URL ({method} {path})")
        if not isinstance(body, dict) or "input" not in body or "model" not in body:
            return 400, {}, self.error_body(400, "'input' and 'model' are required properties")
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if any(not isinstance(t, str) or not t for t in inputs):
            return 400, {}, self.error_body(400, "'$.input' is invalid: inputs must be non-empty strings")
        dims = self.model_dims(body["model"], body.get("dimensions"))
        if wrong_dims:
            dims = dims // 2 or 1
        data = []
        for i, text in enumerate(inputs):
            vec = self.vector(text, dims)
            if body.get("encoding_format") == "base64":
                vec = base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        tokens = sum(len(t.split()) for t in inputs)
        return 200, {}, self.response(body["model"], data, tokens)

    def response(self, model, data, tokens):
        return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
