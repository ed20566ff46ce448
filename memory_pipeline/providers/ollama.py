"""Ollama embeddings from a local (or LAN) Ollama server, over its HTTP API with httpx.

``POST /api/embed`` takes a list of inputs in one request; an older server without it
(404) is served through ``POST /api/embeddings``, one prompt per request, and the
provider remembers that. The host is ``remote.base_url`` (default
``http://127.0.0.1:11434``). No key; ``OLLAMA_API_KEY`` is sent as a bearer token when
set (for servers behind an authenticating proxy).
"""

from __future__ import annotations

from memory_pipeline.providers.remote import ModelInfo, RemoteCallError, RemoteProvider, post_json


class OllamaProvider(RemoteProvider):
    name = "ollama"
    env_keys = ("OLLAMA_API_KEY",)
    key_required = False
    default_model = "nomic-embed-text"
    default_base_url = "http://127.0.0.1:11434"
    # Ollama runs embedding models with a 2048-token context unless the model file says more.
    models = {
        "nomic-embed-text": ModelInfo(768, 2048),
        "mxbai-embed-large": ModelInfo(1024, 512),
        "all-minilm": ModelInfo(384, 256),
        "snowflake-arctic-embed": ModelInfo(1024, 512),
        "bge-m3": ModelInfo(1024, 2048),
    }
    fallback_info = ModelInfo(dims=0, max_input_tokens=2048)
    max_texts_per_request = 64
    max_tokens_per_request = 64 * 2048

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.info = self.models.get(self.model.split(":")[0], self.fallback_info)
        self.legacy = False  # the server has no /api/embed

    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def _send(self, texts, kind, timeout):
        if not self.legacy:
            try:
                body = post_json(self, f"{self.base_url}/api/embed", {"model": self.model, "input": texts, "truncate": False}, self._headers(), timeout)
            except RemoteCallError as err:
                if err.status != 404 or "model" in str(err).lower():
                    raise
                self.legacy = True
            else:
                if not isinstance(body, dict) or not isinstance(body.get("embeddings"), list):
                    raise RemoteCallError("unexpected response shape: no 'embeddings'")
                return body["embeddings"]
        out = []
        for text in texts:
            body = post_json(self, f"{self.base_url}/api/embeddings", {"model": self.model, "prompt": text}, self._headers(), timeout)
            if not isinstance(body, dict) or not isinstance(body.get("embedding"), list):
                raise RemoteCallError("unexpected response shape: no 'embedding'")
            out.append(body["embedding"])
        return out
