"""Voyage AI embeddings over its HTTP API (``POST /v1/embeddings``, bearer token) with httpx.

voyage-4-large by default; ``input_type`` is ``document`` when indexing and ``query`` when
searching (Voyage prepends its retrieval prompts); ``dims`` maps to ``output_dimension``.
The ``voyageai`` SDK is not a dependency: one JSON POST is all it takes.
"""

from __future__ import annotations

from memory_pipeline.providers.remote import ModelInfo, RemoteCallError, RemoteProvider, post_json

_FLEX = (256, 512, 1024, 2048)


class VoyageProvider(RemoteProvider):
    name = "voyage"
    env_keys = ("VOYAGE_API_KEY",)
    default_model = "voyage-4-large"
    default_base_url = "https://api.voyageai.com/v1"
    models = {
        "voyage-4-large": ModelInfo(1024, 32_000, _FLEX),
        "voyage-4": ModelInfo(1024, 32_000, _FLEX),
        "voyage-4-lite": ModelInfo(1024, 32_000, _FLEX),
        "voyage-3.5": ModelInfo(1024, 32_000, _FLEX),
        "voyage-3-large": ModelInfo(1024, 32_000, _FLEX),
        "voyage-code-3": ModelInfo(1024, 32_000, _FLEX),
    }
    fallback_info = ModelInfo(dims=0, max_input_tokens=32_000)
    max_texts_per_request = 1000
    max_tokens_per_request = 120_000

    def _send(self, texts, kind, timeout):
        payload: dict = {"input": texts, "model": self.model, "input_type": kind, "truncation": False}
        if self.requested_dims is not None:
            payload["output_dimension"] = self.requested_dims
        body = post_json(self, f"{self.base_url}/embeddings", payload, {"Authorization": f"Bearer {self._api_key}"}, timeout)
        try:
            return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])]
        except (KeyError, TypeError) as err:
            raise RemoteCallError(f"unexpected response shape: missing {err}") from None
