"""Provider names to classes, ``auto`` selection and ``fallback``.

``auto``: the local model when it is installed, then openai, gemini, voyage, mistral,
the first whose API key is in the environment. Only a *missing key* (or a missing local
model) moves on; any other problem is reported. Nothing available → full-text only.
The same when neither the primary nor the fallback can start (a missing key or model):
the run indexes for full-text search and says why.

``fallback: <provider>``: used when the primary cannot start, or after it failed
permanently during a run (recorded in ``data_dir/provider_state.json``, without any
secret, until ``memory doctor`` sees the primary work again or the primary changes).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime

from memory_pipeline.errors import ConfigError, ProviderError, ProviderUnavailable
from memory_pipeline.providers.base import EmbeddingProvider
from memory_pipeline.providers.runtimes import Runtime
from memory_pipeline.settings import REMOTE_PROVIDERS, Settings

AUTO_ORDER = ("openai", "gemini", "voyage", "mistral")
_CLASSES = {
    "openai": "memory_pipeline.providers.openai:OpenAIProvider",
    "gemini": "memory_pipeline.providers.gemini:GeminiProvider",
    "voyage": "memory_pipeline.providers.voyage:VoyageProvider",
    "mistral": "memory_pipeline.providers.mistral:MistralProvider",
    "ollama": "memory_pipeline.providers.ollama:OllamaProvider",
}


@dataclass(frozen=True)
class ResolvedProvider:
    """The provider a run uses, or None for FTS-only, with the reason."""

    requested: str
    provider: EmbeddingProvider | None
    reason: str = ""
    fallback_from: str | None = None  # set when the fallback stands in for this primary

    @property
    def actual(self) -> str:
        return self.provider.name if self.provider is not None else "none"


_CACHE: dict[tuple, EmbeddingProvider] = {}


def provider_class(name: str) -> type:
    module, cls = _CLASSES[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as err:
        raise ProviderUnavailable(f"{name}: its SDK is not installed ({err.name})", provider=name, hint="run make run") from err


def _local(model: str | None, settings: Settings | None = None, runtime: Runtime | None = None) -> EmbeddingProvider:
    """The local model with the configured runtime (``runtime`` overrides it: an older table's)."""
    from memory_pipeline.providers.local import LocalProvider
    from memory_pipeline.settings import LocalConfig

    local = settings.local if settings is not None else LocalConfig()
    runtime = runtime or local.engine
    key = ("local", model, runtime, local.batch_tokens)
    if key not in _CACHE:
        _CACHE[key] = LocalProvider(model, runtime=runtime, batch_tokens=local.batch_tokens)
    return _CACHE[key]


def build_provider(name: str, settings: Settings, *, primary: bool = True, model: str | None = None, dims: int | None = None) -> EmbeddingProvider:
    """One provider by name; the primary takes ``model``/``dims`` from the config, a fallback its defaults."""
    if primary:
        model = settings.model if model is None else model
        dims = settings.dims if dims is None else dims
    if name == "local":
        return _local(model, settings)
    if name not in REMOTE_PROVIDERS:
        raise ConfigError(f"unknown provider {name!r}", key="provider")
    cls = provider_class(name)
    remote = settings.remote.for_provider(name, primary=primary)
    # The key's value is part of the in-memory cache key (as a hash) so a changed key builds a new client.
    key_hash = hashlib.sha256("".join(os.environ.get(k, "") for k in cls.env_keys).encode()).hexdigest()
    cache_key = (name, model, dims, remote, key_hash)
    if cache_key not in _CACHE:
        _CACHE[cache_key] = cls(model, dims, remote)
    return _CACHE[cache_key]


def _auto(settings: Settings) -> EmbeddingProvider:
    reasons = []
    try:
        return _local(settings.model, settings)
    except ProviderUnavailable as err:
        reasons.append(f"local: {err}")
    from memory_pipeline.providers.remote import MissingKey

    for name in AUTO_ORDER:
        try:
            # In auto mode ``model`` names a local model; remote providers use their defaults.
            return build_provider(name, settings, primary=True, model="", dims=settings.dims)
        except MissingKey as err:
            reasons.append(str(err))
    raise ProviderUnavailable("no embedding provider available (" + "; ".join(reasons) + ")", provider="auto")


def resolve_provider(settings: Settings) -> ResolvedProvider:
    """The provider this run uses: the configured one, auto's pick, the fallback, or none (FTS-only)."""
    requested = settings.provider
    if requested == "none":
        return ResolvedProvider(requested, None, "provider: none (full-text search only)")
    failed = primary_failure(settings)
    try:
        if failed is not None and settings.fallback:
            raise ProviderError(f"{failed['provider']} failed permanently at {failed['at']}: {failed['reason']}", provider=failed["provider"])
        provider = _auto(settings) if requested == "auto" else build_provider(requested, settings)
        return ResolvedProvider(requested, provider)
    except ProviderError as err:
        if settings.fallback and (isinstance(err, ProviderUnavailable) or failed is not None):
            try:
                fb = build_provider(settings.fallback, settings, primary=False)
            except ProviderUnavailable as fb_err:
                # Nothing can embed: the memory is still indexed and searchable by its words.
                return ResolvedProvider(requested, None, f"{err}; the fallback cannot start either: {fb_err}; full-text search only", fallback_from=requested)
            return ResolvedProvider(requested, fb, f"using fallback {fb.name}: {err}", fallback_from=requested)
        if requested == "auto" and isinstance(err, ProviderUnavailable):
            return ResolvedProvider(requested, None, f"{err}; full-text search only")
        raise


def query_provider(settings: Settings, record: dict) -> EmbeddingProvider | None:
    """The provider that embeds queries for a table generation built with ``record``'s identity.

    The configured provider when it is that identity; else the one that built the table
    (e.g. the old model while a new generation builds); None (full-text search) when it
    cannot be built here.
    """
    try:
        resolved = resolve_provider(settings).provider
    except ProviderError:
        resolved = None
    if resolved is not None and resolved.name == record.get("provider") and resolved.provider_key == record.get("provider_key"):
        return resolved
    name = record.get("provider")
    if not name or name == "none":
        return None
    if name == "local":
        # The runtime is in the key, not in the record: the configured one first, then the others.
        from memory_pipeline.providers.runtimes import every_runtime

        for runtime in sorted(every_runtime(), key=lambda r: r != settings.local.engine):
            try:
                p = _local(record.get("model") or None, settings, runtime)
            except ProviderError:
                continue
            if p.provider_key == record.get("provider_key") or record.get("provider_key") is None:
                return p
        return None
    for primary in (name == settings.provider, name != settings.provider):
        try:
            p = build_provider(name, settings, primary=primary, model=record.get("model") or "", dims=record.get("dims") or None)
        except (ProviderError, ConfigError):
            continue
        if p.provider_key == record.get("provider_key") or record.get("provider_key") is None:
            return p
    return None


# --- the permanent-failure record ------------------------------------------------------


def _primary_id(settings: Settings) -> str:
    return f"{settings.provider}|{settings.model or ''}|{settings.dims or ''}"


def primary_failure(settings: Settings) -> dict | None:
    """The recorded permanent failure of the configured primary, if any (and still the same primary)."""
    from memory_pipeline import storage

    try:
        state = storage.of(settings).read_json(storage.PROVIDER_STATE)
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    failed = state.get("failed")
    return failed if failed and failed.get("primary_id") == _primary_id(settings) else None


def mark_primary_failed(settings: Settings, provider: str, reason: str) -> None:
    """Record that the primary failed permanently: later runs use the fallback (written atomically)."""
    state = {
        "failed": {
            "primary_id": _primary_id(settings),
            "provider": provider,
            "reason": reason[:500],
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    }
    from memory_pipeline import storage

    storage.of(settings).write_text(storage.PROVIDER_STATE, json.dumps(state, indent=2))


def clear_primary_failure(settings: Settings) -> bool:
    from memory_pipeline import storage

    return storage.of(settings).remove(storage.PROVIDER_STATE)
