"""A fake of Voyage AI's embeddings endpoint (``POST /v1/embeddings``), bearer auth.

Requests ``{"input": [...], "model", "input_type": "query"|"document"|null, "truncation",
"output_dimension", "output_dtype"}``; replies ``{"object": "list", "data": [{"object":
"embedding", "embedding", "index"}], "model", "usage": {"total_tokens"}}``; errors
``{"detail": "..."}``.
"""

from __future__ import annotations

from memory_pipeline_tests.fakes.base import FakeServer, bearer_ok

MODEL_DIMS = {"voyage-4-large": 1024, "voyage-4": 1024, "voyage-4-lite": 1024, "voyage-3.5": 1024}
ALLOWED_DIMS = (256, 512, 1024, 2048)


class VoyageFake(FakeServer):
    provider = "voyage"
    path = "/v1/embeddings"

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("api_key", "pa-test-voyage")
        super().__init__(**kwargs)

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"

    def authorized(self, headers):
        return bearer_ok(headers, self.api_key)

    def error_body(self, status, message):
        return {"detail": message}

    def handle(self, method, path, headers, body, wrong_dims):
        if method != "POST" or path.rstrip("/") != self.path:
            return 404, {}, {"detail": "Not Found"}
        if not isinstance(body, dict) or "input" not in body or "model" not in body:
            return 400, {}, {"detail": "Request body must have 'input' and 'model'"}
        if body.get("input_type") not in (None, "query", "document"):
            return 400, {}, {"detail": "input_type must be None, 'query' or 'document'"}
        dims = body.get("output_dimension") or MODEL_DIMS.get(body["model"], self.dims)
        if body.get("output_dimension") is not None and dims not in ALLOWED_DIMS:
            return 400, {}, {"detail": f"output_dimension must be one of {ALLOWED_DIMS}"}
        if wrong_dims:
            dims = dims // 2 or 1
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "embedding": self.vector(t, dims), "index": i} for i, t in enumerate(inputs)]
        return 200, {}, {"object": "list", "data": data, "model": body["model"], "usage": {"total_tokens": sum(len(t.split()) for t in inputs)}}
