"""The embedding stage's door to the batch APIs: decides whether to batch, and runs the engine."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from memory_pipeline import storage
from memory_pipeline.batching.engine import BatchEmbedder, BatchMetrics, BatchOptions, BatchOutcome
from memory_pipeline.batching.factory import backend_for
from memory_pipeline.batching.jobs import JobStore
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
    with JobStore(storage.of(settings).batch_jobs) as store:
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


def poll_ready_jobs(settings: Settings, provider, ident) -> list:
    """One status call per open job of this provider (no download); returns the jobs that have finished.

    What the ``wait: false`` sensor runs: a finished job's shards get a run, whose
    embedding stage downloads the results and materializes the rest of the graph.
    """
    path = storage.of(settings).batch_jobs
    if provider is None or not path.is_file():
        return []
    backend = backend_for(provider)
    if backend is None:
        return []
    from memory_pipeline.batching.backends import BatchApiError

    ready = []
    with JobStore(path) as store:
        for job in store.open_jobs(ident.provider_key):
            if job.state != "submitted":
                continue
            if not job.ready:
                try:
                    status = backend.poll(job.remote_id or "", job.meta)
                except BatchApiError as err:
                    if err.status != 404:
                        continue  # transient: the next tick asks again
                    status = None  # gone at the provider: the run settles it (falls back)
                store.set_status(job.local_id, status.remote_status if status else "not found", ready=status is None or status.terminal)
                job = store.get(job.local_id)
            if job is not None and job.ready:
                ready.append(job)
    return ready
