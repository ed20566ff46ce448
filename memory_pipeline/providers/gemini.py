"""Gemini embeddings through the official ``google-genai`` SDK (imported lazily).

gemini-embedding-001 by default; gemini-embedding-2-preview also embeds media natively.
Task type RETRIEVAL_DOCUMENT when indexing, RETRIEVAL_QUERY when searching;
``output_dimensionality`` 768 / 1536 / 3072 (``dims``, default 3072) is always sent, so
the size never depends on a server default. The SDK's own retries are off: the shared
live-call policy retries instead.

Media (multimodal models only): ``embed_media([MediaItem(label, data, mime_type), …])``
sends one content per item, a text part (the label: file name, caption, derived text)
and an ``inline_data`` part with the bytes, and returns one vector per item, in the same
space as the text vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memory_pipeline.errors import ConfigError
from memory_pipeline.providers.base import normalize_vectors
from memory_pipeline.providers.remote import ModelInfo, RemoteCallError, RemoteProvider, parse_retry_after

_DIMS = (768, 1536, 3072)
MAX_INLINE_BYTES = 20 * 1024 * 1024  # the API's limit on one request's inline data
_IMAGE_TOKENS = 258  # what an inline image costs, for the token rate limit


@dataclass(frozen=True)
class MediaItem:
    """One media file to embed natively: a text label, its bytes and their mime type."""

    label: str
    data: bytes
    mime_type: str


class GeminiProvider(RemoteProvider):
    name = "gemini"
    env_keys = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
    default_model = "gemini-embedding-001"
    default_base_url = "https://generativelanguage.googleapis.com"
    models = {
        "gemini-embedding-001": ModelInfo(3072, 2048, _DIMS),
        "gemini-embedding-2-preview": ModelInfo(3072, 8192, _DIMS, multimodal=True),
        "gemini-embedding-2": ModelInfo(3072, 8192, _DIMS, multimodal=True),
    }
    fallback_info = ModelInfo(dims=0, max_input_tokens=2048)
    max_texts_per_request = 100  # batchEmbedContents takes at most 100 requests
    max_tokens_per_request = 100 * 2048

    @property
    def supports_multimodal(self) -> bool:  # type: ignore[override]
        return self.info.multimodal

    def _sdk(self):
        with self._client_lock:
            if self._client is None:
                from google import genai
                from google.genai import types

                self._client = genai.Client(
                    api_key=self._api_key,
                    http_options=types.HttpOptions(base_url=self.base_url, timeout=int(self.remote.timeout_s * 1000)),
                )
            return self._client

    def _send(self, items, kind, timeout):
        from google.genai import errors, types

        contents = []
        for item in items:
            if isinstance(item, MediaItem):
                contents.append(
                    types.Content(parts=[types.Part.from_text(text=item.label or " "), types.Part.from_bytes(data=item.data, mime_type=item.mime_type)])
                )
            else:
                contents.append(types.Content(parts=[types.Part.from_text(text=item)]))
        config = types.EmbedContentConfig(
            task_type="RETRIEVAL_QUERY" if kind == "query" else "RETRIEVAL_DOCUMENT",
            output_dimensionality=self._dims or None,
            http_options=types.HttpOptions(timeout=int(timeout * 1000)),
        )
        try:
            resp = self._sdk().models.embed_content(model=self.model, contents=contents, config=config)
        except errors.APIError as err:
            headers = getattr(getattr(err, "response", None), "headers", None)
            raise RemoteCallError(
                f"HTTP {err.code} {err.status or ''}: {err.message or ''}".strip(), status=err.code, retry_after=parse_retry_after(headers)
            ) from None
        except ValueError as err:  # a truncated or malformed body
            raise RemoteCallError(f"unreadable response: {type(err).__name__}") from None
        except Exception as err:  # the SDK lets httpx's transport errors through
            if type(err).__module__.startswith(("httpx", "httpcore", "ssl", "socket")) or isinstance(err, OSError):
                raise RemoteCallError(f"no answer from {self.base_url}: {type(err).__name__}") from None
            raise
        return [e.values for e in (resp.embeddings or [])]

    def embed_media(self, items: Sequence[MediaItem]) -> np.ndarray:
        """One vector per media item (label + bytes), in the text vectors' space."""
        if not self.supports_multimodal:
            raise ConfigError(f"gemini model {self.model} cannot embed media natively; use gemini-embedding-2-preview", key="model")
        if not items:
            return np.zeros((0, self.dims), dtype=np.float32)
        groups: list[list[int]] = []
        cur: list[int] = []
        size = 0
        for i, item in enumerate(items):
            if len(item.data) > MAX_INLINE_BYTES:
                raise ConfigError(f"media item {item.label!r} is {len(item.data)} bytes; inline data is limited to {MAX_INLINE_BYTES}")
            if cur and (len(cur) >= self.max_texts_per_request or size + len(item.data) > MAX_INLINE_BYTES):
                groups.append(cur)
                cur, size = [], 0
            cur.append(i)
            size += len(item.data)
        if cur:
            groups.append(cur)
        out = np.zeros((len(items), self.dims), dtype=np.float32)
        for idx in groups:
            tokens = len(idx) * _IMAGE_TOKENS + sum(self.count_tokens([items[i].label for i in idx]))
            out[idx] = self._call([items[i] for i in idx], "document", self.remote.timeout_s, tokens)
        return normalize_vectors(out)
