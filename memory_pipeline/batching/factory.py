"""The batch backend of a provider, built from the live provider's own endpoint, model and key."""

from __future__ import annotations

from memory_pipeline.batching.backends import BatchBackend, GeminiBatchBackend, OpenAIBatchBackend, VoyageBatchBackend

BATCH_PROVIDERS = ("openai", "gemini", "voyage")
_SDK_RETRIES = 2  # submit/poll/download survive a blip; job-level failures are the engine's business


def backend_for(provider) -> BatchBackend | None:
    """A batch backend for ``provider``, or None when it has no batch API (local, mistral, ollama).

    The key comes from the provider, which read it from its environment variable; it
    lives only on the SDK client.
    """
    name = getattr(provider, "name", "")
    if name not in BATCH_PROVIDERS:
        return None
    key = getattr(provider, "_api_key", None)
    base_url = getattr(provider, "base_url", "")
    timeout = getattr(getattr(provider, "remote", None), "timeout_s", 60.0)
    requested = getattr(provider, "requested_dims", None)
    if name in ("openai", "voyage"):
        import openai

        client = openai.OpenAI(api_key=key or "unused", base_url=base_url, max_retries=_SDK_RETRIES, timeout=max(timeout, 120.0))
        if name == "openai":
            dims = provider.dims if requested is not None or provider.model.startswith("text-embedding-3") else None
            return OpenAIBatchBackend(client, provider.model, dimensions=dims, api_key=key)
        return VoyageBatchBackend(client, provider.model, dimensions=requested, api_key=key)
    from google import genai
    from google.genai import types

    client = genai.Client(api_key=key, http_options=types.HttpOptions(base_url=base_url, timeout=int(max(timeout, 120.0) * 1000)))
    return GeminiBatchBackend(client, provider.model, dimensions=provider.dims or None, api_key=key)
