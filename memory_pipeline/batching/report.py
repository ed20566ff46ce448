"""What `memory status` shows about batching, and `memory doctor --reset-batch`."""

from __future__ import annotations

import time

from memory_pipeline import storage
from memory_pipeline.batching.jobs import OPEN_STATES, JobStore
from memory_pipeline.settings import Settings


def batch_status(settings: Settings) -> dict:
    """Pending jobs, recent failures and, per provider, whether batching is disabled."""
    cfg = settings.remote.batch
    out: dict = {"enabled": cfg.enabled, "wait": cfg.wait, "pending_jobs": [], "recent_failures": [], "providers": {}}
    path = storage.of(settings).batch_jobs
    if not path.is_file():
        return out
    now = time.time()
    with JobStore(path) as store:
        for j in store.open_jobs():
            out["pending_jobs"].append(
                {
                    "provider": j.provider,
                    "model": j.model,
                    "job_id": j.remote_id,
                    "state": j.state,
                    "remote_status": j.remote_status,
                    "requests": j.requests,
                    "tokens": j.tokens,
                    "ready": j.ready,
                    "age_s": round(now - j.created_at),
                    "shards": list(j.shards),
                }
            )
        failed = [j for j in store.jobs(limit=50) if j.state not in (*OPEN_STATES, "collected")]
        out["recent_failures"] = [
            {"provider": j.provider, "job_id": j.remote_id, "state": j.state, "error": j.error, "age_s": round(now - j.updated_at)} for j in failed[:10]
        ]
        for st in store.all_provider_states():
            out["providers"][st.provider] = {"failures": st.failures, "disabled": st.disabled, "reason": st.reason}
    return out


def reset_batch(settings: Settings, provider: str | None = None) -> list[str]:
    """Re-enable batching after failures (one provider, or all); returns the providers reset."""
    path = storage.of(settings).batch_jobs
    if not path.is_file():
        return []
    with JobStore(path) as store:
        return store.reset(provider)
