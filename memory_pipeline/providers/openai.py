"""OpenAI embeddings through the official ``openai`` SDK (imported lazily).

text-embedding-3-small (1536 dims) by default, -large (3072); both take ``dimensions``
to return shorter vectors. ``remote.base_url`` points the SDK at any OpenAI-compatible
server. The SDK's own retries are off: the shared live-call policy retries instead.
"""

from __future__ import annotations

from memory_pipeline.providers.remote import ModelInfo, RemoteCallError, RemoteProvider, parse_retry_after


def _choices(top: int) -> tuple[int, ...]:
    return tuple(d for d in (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072) if d <= top)


class OpenAIProvider(RemoteProvider):
    name = "openai"
    env_keys = ("OPENAI_API_KEY",)
    default_model = "text-embedding-3-small"
    default_base_url = "https://api.openai.com/v1"
    models = {
        "text-embedding-3-small": ModelInfo(1536, 8191, _choices(1536)),
        "text-embedding-3-large": ModelInfo(3072, 8191, _choices(3072)),
        "text-embedding-ada-002": ModelInfo(1536, 8191),
    }
    fallback_info = ModelInfo(dims=0, max_input_tokens=8191)
    max_texts_per_request = 2048
    max_tokens_per_request = 300_000

    def _sdk(self):
        with self._client_lock:
            if self._client is None:
                import openai

                self._client = openai.OpenAI(api_key=self._api_key or "unused", base_url=self.base_url, max_retries=0, timeout=self.remote.timeout_s)
            return self._client

    def _send(self, texts, kind, timeout):
        import openai

        kwargs = {}
        if self.requested_dims is not None or self.model.startswith("text-embedding-3"):
            kwargs["dimensions"] = self._dims
        try:
            resp = self._sdk().embeddings.create(model=self.model, input=texts, timeout=timeout, **kwargs)
        except openai.APIStatusError as err:
            raise RemoteCallError(
                f"HTTP {err.status_code}: {_message(err)}", status=err.status_code, retry_after=parse_retry_after(err.response.headers)
            ) from None
        except openai.APITimeoutError:
            raise RemoteCallError(f"request timed out after {timeout:g}s") from None
        except openai.APIConnectionError as err:
            raise RemoteCallError(f"cannot reach {self.base_url}: {type(err.__cause__ or err).__name__}") from None
        except (ValueError, openai.APIResponseValidationError) as err:  # a truncated or malformed body
            raise RemoteCallError(f"unreadable response: {type(err).__name__}") from None
        data = sorted(resp.data, key=lambda d: d.index)
        return [d.embedding for d in data]


def _message(err) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))
    return str(getattr(err, "message", err))
