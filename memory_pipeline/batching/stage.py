"""The embedding stage's door to the batch APIs: decides whether to batch, and runs the engine."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from memory_pipeline.batching.engine import BatchEmbedder, BatchMetrics, BatchOptions, BatchOutcome
from memory_pipeline.batching.factory import backend_for
from memory_pipeline.batching.jobs import JobStore, store_path
from memory_pipeline.settings import Settings


def batch_options(settings: Settings) -> BatchOptions:
    cfg = settings.remote.batch
    return BatchOptions(wait=cfg.wait, concurrency=cfg.concurrency, poll_interval_ms=cfg.poll_interval_ms, timeout_ms=cfg.timeout_ms)


def embed_batched(
    settings: Settings,
    provider,
    ident,
    texts: Mapping[str, str],
    tokens: Mapping[str, int],
    shards_of: Mapping[str, set[str]],
    *,
    on_vectors: Callable[[dict[str, np.ndarray]], None] | None = None,
    on_submitted: Callable[[], None] | None = None,
) -> BatchOutcome | None:
    """Run ``texts`` through the provider's batch API; None when batching is off or the provider has none.

    Open jobs of this provider key are resumed even when ``texts`` is empty: a
    ``wait: false`` run's jobs are collected by whichever run comes next.
    """
    if not settings.remote.batch.enabled or provider is None:
        return None
    backend = backend_for(provider)
    if backend is None:
        return None
    with JobStore(store_path(settings.data_dir)) as store:
        if not texts and not store.open_jobs(ident.provider_key):
            return BatchOutcome(metrics=BatchMetrics(provider=ident.provider, model=ident.model, enabled=True))
        engine = BatchEmbedder(
            backend,
            store,
            batch_options(settings),
            provider_key=ident.provider_key,
            model=ident.model,
            dims=ident.dims,
            on_vectors=on_vectors,
            on_submitted=on_submitted,
        )
        return engine.run(texts, tokens, shards_of)
