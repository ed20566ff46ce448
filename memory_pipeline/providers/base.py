"""The contract every embedding provider meets."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class EmbeddingProvider(Protocol):
    name: str
    model: str

    @property
    def dims(self) -> int: ...

    @property
    def max_input_tokens(self) -> int:
        """The model's real input limit, in its own tokens (special tokens included)."""
        ...

    @property
    def supports_multimodal(self) -> bool: ...

    @property
    def provider_key(self) -> str:
        """A hash of what makes vectors comparable (endpoint, model, dims, key identity); never a secret."""
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Token counts in the model's own tokenizer, as the model will see them."""
        ...

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...

    def release(self) -> None:
        """Hand back what the provider holds between runs (a loaded model, an HTTP client); it is rebuilt on next use."""
        ...


def normalize_vectors(vectors: np.ndarray) -> np.ndarray:
    """float32, NaN/Inf replaced by 0, rows L2-normalized (zero rows stay zero)."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    arr = np.nan_to_num(arr, nan=0.0, posinf=0.0, neginf=0.0)
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return arr / norms


def stable_key(*parts: object) -> str:
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()[:16]
