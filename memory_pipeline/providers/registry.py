"""Provider names to classes, and ``auto`` selection."""

from __future__ import annotations

from dataclasses import dataclass

from memory_pipeline.errors import ConfigError, ProviderUnavailable
from memory_pipeline.providers.base import EmbeddingProvider
from memory_pipeline.settings import Settings


@dataclass(frozen=True)
class ResolvedProvider:
    """The provider a run uses, or None for FTS-only, with the reason."""

    requested: str
    provider: EmbeddingProvider | None
    reason: str = ""


_CACHE: dict[tuple[str, str | None], EmbeddingProvider] = {}


def _local(model: str | None) -> EmbeddingProvider:
    from memory_pipeline.providers.local import LocalProvider

    key = ("local", model)
    if key not in _CACHE:
        _CACHE[key] = LocalProvider(model)
    return _CACHE[key]


def resolve_provider(settings: Settings) -> ResolvedProvider:
    """The configured provider; ``auto`` takes local when its model is present, else FTS-only."""
    requested = settings.provider
    if requested == "none":
        return ResolvedProvider(requested, None, "provider: none (full-text search only)")
    if requested == "local":
        return ResolvedProvider(requested, _local(settings.model))
    if requested == "auto":
        try:
            return ResolvedProvider(requested, _local(settings.model))
        except ProviderUnavailable as err:
            return ResolvedProvider(requested, None, f"no embedding provider available: {err}")
    raise ConfigError(f"provider {requested!r} is not available in this version", key="provider")
