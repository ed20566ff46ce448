"""Embedding providers behind one Protocol; SDKs and models are loaded lazily."""

from memory_pipeline.providers.base import EmbeddingProvider, normalize_vectors
from memory_pipeline.providers.registry import resolve_provider

__all__ = ["EmbeddingProvider", "normalize_vectors", "resolve_provider"]
