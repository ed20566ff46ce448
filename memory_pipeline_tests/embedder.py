"""A deterministic test embedder: the provider contract without a model.

Vectors are derived from the text's words (hashed into a fixed number of dims), so the
same text always gets the same vector, texts sharing words are close, and a run needs
no model load. Used by the stage unit tests, which call the stages directly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from memory_pipeline.providers.base import normalize_vectors, stable_key


class HashEmbedder:
    name = "test-hash"
    supports_multimodal = False

    def __init__(self, dims: int = 32, max_input_tokens: int = 512) -> None:
        self.model = f"hash-{dims}"
        self._dims = dims
        self._max = max_input_tokens
        self.calls: list[int] = []  # texts per embed_documents call
        self.released = 0

    @property
    def dims(self) -> int:
        return self._dims

    @property
    def max_input_tokens(self) -> int:
        return self._max

    @property
    def provider_key(self) -> str:
        return stable_key(self.name, self.model, self._dims)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(t.split()) + 2 for t in texts]

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self._dims, dtype=np.float32)
        for word in text.lower().split():
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big")
            v[h % self._dims] += 1.0
        return v

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(len(texts))
        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        return normalize_vectors(np.stack([self._vector(t) for t in texts]))

    def embed_query(self, text: str) -> np.ndarray:
        return normalize_vectors(self._vector(text))[0]

    def release(self) -> None:
        self.released += 1
