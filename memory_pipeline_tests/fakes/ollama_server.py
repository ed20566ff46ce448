"""A fake Ollama server: ``POST /api/embed`` (batch) and ``POST /api/embeddings`` (one prompt).

``/api/embed``: ``{"model", "input": str | [str], "truncate"?, "dimensions"?}`` →
``{"model", "embeddings": [[...]], "total_duration", "load_duration", "prompt_eval_count"}``.
``/api/embeddings``: ``{"model", "prompt"}`` → ``{"embedding": [...]}``. Errors
``{"error": "..."}``. ``legacy_only=True`` plays an old server without ``/api/embed`` (404).
No auth (a local server); ``GET /api/version`` and ``GET /api/tags`` answer too.
"""

from __future__ import annotations

from memory_pipeline_tests.fakes.base import FakeServer

MODEL_DIMS = {"nomic-embed-text": 768, "mxbai-embed-large": 1024, "all-minilm": 384}


class OllamaFake(FakeServer):
    provider = "ollama"
    default_api_key = None

    def __init__(self, *, legacy_only: bool = False, models: tuple[str, ...] = ("nomic-embed-text",), **kwargs) -> None:
        super().__init__(**kwargs)
        self.legacy_only = legacy_only
        self.models = models

    def error_body(self, status, message):
        return {"error": message}

    def _model(self, body) -> tuple[str | None, dict | None]:
        model = body.get("model") if isinstance(body, dict) else None
        if not model:
            return None, {"error": "model is required"}
        if model.split(":")[0] not in self.models:
            return None, {"error": f'model "{model}" not found, try pulling it first'}
        return model, None

    def inputs(self, request):
        body = request.body if isinstance(request.body, dict) else {}
        if "prompt" in body:
            return [body["prompt"]]
        value = body.get("input", [])
        return value if isinstance(value, list) else [value]

    def handle(self, method, path, headers, body, wrong_dims):
        path = path.rstrip("/")
        if method == "GET" and path == "/api/version":
            return 200, {}, {"version": "0.13.0"}
        if method == "GET" and path == "/api/tags":
            return 200, {}, {"models": [{"name": f"{m}:latest", "model": f"{m}:latest"} for m in self.models]}
        if method == "POST" and path == "/api/embed" and not self.legacy_only:
            model, err = self._model(body)
            if err:
                return 404 if "not found" in err["error"] else 400, {}, err
            inputs = body.get("input")
            inputs = inputs if isinstance(inputs, list) else [inputs]
            dims = body.get("dimensions") or MODEL_DIMS.get(model.split(":")[0], self.dims)
            if wrong_dims:
                dims = dims // 2 or 1
            return (
                200,
                {},
                {
                    "model": model,
                    "embeddings": [self.vector(t, dims) for t in inputs],
                    "total_duration": 1000,
                    "load_duration": 10,
                    "prompt_eval_count": sum(len(t.split()) for t in inputs),
                },
            )
        if method == "POST" and path == "/api/embeddings":
            model, err = self._model(body)
            if err:
                return 404 if "not found" in err["error"] else 400, {}, err
            dims = MODEL_DIMS.get(model.split(":")[0], self.dims)
            if wrong_dims:
                dims = dims // 2 or 1
            return 200, {}, {"embedding": self.vector(body.get("prompt") or "", dims)}
        return 404, {}, "404 page not found"
