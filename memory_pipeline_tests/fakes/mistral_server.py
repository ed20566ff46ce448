"""A fake of Mistral's embeddings endpoint (``POST /v1/embeddings``): OpenAI-shaped, bearer auth.

Requests ``{"model", "input": [...], "output_dimension"?, "output_dtype"?}``; replies
``{"id", "object": "list", "data": [{"object": "embedding", "embedding", "index"}], "model",
"usage"}``; errors ``{"object": "error", "message", "type", "param", "code"}``.
"""

from __future__ import annotations

import uuid

from memory_pipeline_tests.fakes.base import FakeServer

MODEL_DIMS = {"mistral-embed": 1024, "codestral-embed": 1536}


class MistralFake(FakeServer):
    provider = "mistral"
    default_api_key = "mistral-test-key"
    base_path = ""
    path = "/v1/embeddings"

    def error_body(self, status, message):
        kind = {401: "authentication_error", 429: "rate_limited"}.get(status, "invalid_request_error" if status < 500 else "internal_error")
        return {"object": "error", "message": message, "type": kind, "param": None, "code": str(status)}

    def handle(self, method, path, headers, body, wrong_dims):
        if method != "POST" or path.rstrip("/") != self.path:
            return 404, {}, self.error_body(404, f"no route {method} {path}")
        if not isinstance(body, dict) or "model" not in body or "input" not in body:
            return 422, {}, {"object": "error", "message": "model and input are required", "type": "invalid_request_error", "param": None, "code": "422"}
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        dims = body.get("output_dimension") or MODEL_DIMS.get(body["model"], self.dims)
        if wrong_dims:
            dims = dims // 2 or 1
        data = [{"object": "embedding", "embedding": self.vector(t, dims), "index": i} for i, t in enumerate(inputs)]
        tokens = sum(len(t.split()) for t in inputs)
        return (
            200,
            {},
            {
                "id": uuid.uuid4().hex,
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
            },
        )
