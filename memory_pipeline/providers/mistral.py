"""Mistral embeddings over its HTTP API (``POST /v1/embeddings``, bearer token) with httpx.

The official ``mistralai`` SDK is not a dependency: the API is OpenAI-shaped and one
JSON POST is all it takes (httpx is already installed for the ``openai`` SDK).
"""

from __future__ import annotations

from memory_pipeline.providers.remote import ModelInfo, RemoteCallError, RemoteProvider, post_json


class MistralProvider(RemoteProvider):
    name = "mistral"
    env_keys = ("MISTRAL_API_KEY",)
    default_model = "mistral-embed"
    default_base_url = "https://api.mistral.ai"
    models = {
        "mistral-embed": ModelInfo(1024, 8192),
        "codestral-embed": ModelInfo(1536, 8192, (256, 512, 1024, 1536, 3072)),
    }
    fallback_info = ModelInfo(dims=0, max_input_tokens=8192)
    max_texts_per_request = 128
    max_tokens_per_request = 16_000

    def _send(self, texts, kind, timeout):
        payload: dict = {"model": self.model, "input": texts}
        if self.requested_dims is not None and self.info.dims_choices:
            payload["output_dimension"] = self.requested_dims
        body = post_json(self, f"{self.base_url}/v1/embeddings", payload, {"Authorization": f"Bearer {self._api_key}"}, timeout)
        try:
            return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])]
        except (KeyError, TypeError) as err:
            raise RemoteCallError(f"unexpected response shape: missing {err}") from None
