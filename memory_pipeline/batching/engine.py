"""Corpus-wide batch embedding: resume, pack, submit, poll, collect, fall back.

``BatchEmbedder.run`` takes every chunk text of the run that the cache did not
have (already de-duplicated by content hash across all files and shards) and:

1. resumes the open jobs of this provider key found in the job store (a killed run's
   jobs are polled again, never resubmitted); a job whose submitter died before the
   provider answered is marked ``lost`` and its work goes back in the queue;
2. packs what no open job already covers into as few jobs as the provider's limits
   allow (requests per job, bytes per file, tokens per request) and submits them,
   ``concurrency`` at a time; every job is in the store before its upload starts;
3. with ``wait``, polls with exponential backoff capped at ``poll_interval_ms``
   until every job is terminal or ``timeout_ms`` passes; without ``wait``, polls
   once, collects what is finished and leaves the rest pending for the sensor;
4. collects results into the embedding cache as each job finishes (a partial job
   keeps its good lines), and decides for what is missing:

   - failed lines of a completed job: retried live;
   - an expired job: a batch failure; what is missing is resubmitted (batch) while
     batching stays enabled, else embedded live;
   - a failed or cancelled job, a submit error, a wait timeout (the job is cancelled):
     a batch failure; the work is embedded live;
   - after ``FAILURE_LIMIT`` failures, or one error saying the batch API is
     unavailable, batching is disabled for the provider until ``memory batch reset``.

Nothing here knows Dagster; the pipeline passes the texts and receives vectors, the
hashes to embed live, the hashes still pending, and the run's metrics.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from memory_pipeline.batching.backends import BatchApiError, BatchBackend, BatchRequest, JobStatus, pack
from memory_pipeline.batching.jobs import JobRecord, JobStore
from memory_pipeline.providers import pricing
from memory_pipeline.providers.base import normalize_vectors

log = logging.getLogger(__name__)

_LOST_AFTER_S = 3600.0  # a 'submitting' job older than this, whoever started it, is lost
_MAX_ROUNDS_WITHOUT_WAIT = 1


@dataclass(frozen=True)
class BatchOptions:
    """``remote.batch`` of the config, as the engine needs it."""

    wait: bool = True
    concurrency: int = 2
    poll_interval_ms: int = 2000
    timeout_ms: int = 3_600_000


@dataclass
class BatchMetrics:
    """What a run did with the batch API; every field goes to Dagster metadata and ``index --json``."""

    provider: str = ""
    model: str = ""
    enabled: bool = False
    disabled: bool = False
    disabled_reason: str = ""
    failures: int = 0
    jobs_submitted: int = 0
    jobs_resumed: int = 0
    jobs_collected: int = 0
    jobs_failed: int = 0
    jobs_pending: int = 0
    requests_submitted: int = 0
    requests_collected: int = 0
    requests_failed: int = 0
    requests_pending: int = 0
    requests_resubmitted: int = 0
    batch_tokens: int = 0
    live_fallbacks: int = 0
    live_tokens: int = 0
    cache_hits: int = 0
    estimated_cost_usd: float | None = None
    live_cost_usd: float | None = None
    saved_usd: float | None = None

    def finish_costs(self) -> None:
        est = pricing.estimate(self.provider, self.model, batch_tokens=self.batch_tokens, live_tokens=self.live_tokens)
        self.estimated_cost_usd = est["estimated_cost_usd"]
        self.live_cost_usd = est["live_cost_usd"]
        self.saved_usd = est["saved_usd"]

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class BatchOutcome:
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    fallback: list[str] = field(default_factory=list)  # embed these live now
    pending: set[str] = field(default_factory=set)  # still in a running job (wait: false)
    metrics: BatchMetrics = field(default_factory=BatchMetrics)


@dataclass
class _Open:
    record: JobRecord
    keys: list[str]
    tokens: dict[str, int]


class BatchEmbedder:
    """Runs one embedding stage's misses through a provider's batch API."""

    def __init__(
        self,
        backend: BatchBackend,
        store: JobStore,
        options: BatchOptions,
        *,
        provider_key: str,
        model: str,
        dims: int,
        on_vectors: Callable[[dict[str, np.ndarray]], None] | None = None,
        on_submitted: Callable[[], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.store = store
        self.options = options
        self.provider = backend.provider
        self.provider_key = provider_key
        self.model = model
        self.dims = dims
        self.on_vectors = on_vectors
        self.on_submitted = on_submitted
        self.sleep = sleep
        self.clock = clock

    # --- the run ---------------------------------------------------------------------------

    def run(self, texts: Mapping[str, str], tokens: Mapping[str, int], shards_of: Mapping[str, set[str]] | None = None) -> BatchOutcome:
        out = BatchOutcome(metrics=BatchMetrics(provider=self.provider, model=self.model, enabled=True))
        m = out.metrics
        need = set(texts)
        shards_of = shards_of or {}
        state = self.store.provider_state(self.provider)
        m.disabled, m.disabled_reason, m.failures = state.disabled, state.reason, state.failures

        open_jobs = [self._open(r) for r in self._resumable()]
        m.jobs_resumed = len(open_jobs)
        covered = {k for j in open_jobs for k in j.keys}
        queue = [BatchRequest(h, texts[h], int(tokens.get(h, 0))) for h in sorted(need - covered)]
        fallback: set[str] = set()

        # Finished jobs first (without waiting): their results may cover this run.
        open_jobs = self._poll_round(open_jobs, need, texts, tokens, out, fallback, queue)

        packs = [] if m.disabled else pack(queue, self.backend.limits, self.backend.request_bytes)
        if m.disabled:
            fallback.update(r.key for r in queue)
        deadline = self.clock() + self.options.timeout_ms / 1000.0
        delay = min(1.0, self.options.poll_interval_ms / 1000.0)
        while True:
            # Submit while there is room (all at once without wait: the run is not holding them).
            limit = self.options.concurrency if self.options.wait else len(packs) + len(open_jobs)
            while packs and len(open_jobs) < max(limit, 1):
                if m.disabled:
                    fallback.update(r.key for p in packs for r in p)
                    packs = []
                    break
                job = self._submit(packs.pop(0), shards_of, out, fallback)
                if job is not None:
                    open_jobs.append(job)
            if not open_jobs and not packs:
                break
            if not self.options.wait:
                break
            if self.clock() >= deadline:
                for job in open_jobs:
                    self._abandon(job, need, out, fallback, "timed out waiting for the batch (remote.batch.timeout_ms)")
                open_jobs = []
                fallback.update(r.key for p in packs for r in p)
                break
            self.sleep(delay)
            delay = min(delay * 2, self.options.poll_interval_ms / 1000.0)
            requeued: list[BatchRequest] = []
            open_jobs = self._poll_round(open_jobs, need, texts, tokens, out, fallback, requeued)
            if requeued:
                packs += pack(requeued, self.backend.limits, self.backend.request_bytes)

        for job in open_jobs:
            out.pending.update(k for k in job.keys if k in need)
        m.jobs_pending = len(open_jobs)
        m.requests_pending = len(out.pending)
        out.fallback = sorted((fallback & need) - set(out.vectors) - out.pending)
        m.live_fallbacks = len(out.fallback)
        return out

    # --- jobs ------------------------------------------------------------------------------

    def _resumable(self) -> list[JobRecord]:
        jobs = []
        for rec in self.store.open_jobs(self.provider_key):
            if rec.state == "submitting":
                if self._submitter_gone(rec):
                    self.store.finish(rec.local_id, "lost", "the run died before the provider accepted the job")
                continue  # another live run is submitting it; it will collect it
            jobs.append(rec)
        return jobs

    @staticmethod
    def _submitter_gone(rec: JobRecord) -> bool:
        who = rec.meta or {}
        if time.time() - rec.created_at > _LOST_AFTER_S:
            return True
        if who.get("host") != socket.gethostname():
            return False
        if int(who.get("pid", 0)) == os.getpid():
            return True  # this process gave up on it (an interrupted submit)
        try:
            os.kill(int(who.get("pid", 0)), 0)
        except (ProcessLookupError, ValueError):
            return True
        except PermissionError:
            return False
        return int(who.get("pid", 0)) == 0

    def _open(self, rec: JobRecord) -> _Open:
        items = self.store.items(rec.local_id)
        return _Open(rec, [h for h, _ in items], {h: n for h, n in items})

    def _submit(self, requests: list[BatchRequest], shards_of, out: BatchOutcome, fallback: set[str]) -> _Open | None:
        m = out.metrics
        hashes = [r.key for r in requests]
        shards = {s for h in hashes for s in shards_of.get(h, ())}
        local_id = self.store.begin(
            provider=self.provider,
            provider_key=self.provider_key,
            model=self.model,
            hashes=hashes,
            tokens=[r.tokens for r in requests],
            shards=shards,
            submitter={"pid": os.getpid(), "host": socket.gethostname()},
        )
        try:
            sub = self.backend.submit(requests, local_id)
        except BatchApiError as err:
            self.store.finish(local_id, "failed", str(err))
            self._failure(out, str(err), unavailable=err.unavailable)
            m.jobs_failed += 1
            fallback.update(hashes)
            log.warning("batch submit failed, embedding live instead: %s", err)
            return None
        self.store.submitted(local_id, sub.remote_id, sub.meta)
        m.jobs_submitted += 1
        m.requests_submitted += len(requests)
        if self.on_submitted is not None:
            self.on_submitted()
        rec = self.store.get(local_id)
        assert rec is not None
        return _Open(rec, hashes, {r.key: r.tokens for r in requests})

    def _poll_round(self, jobs: list[_Open], need, texts, tokens, out, fallback, requeue: list[BatchRequest]) -> list[_Open]:
        still: list[_Open] = []
        for job in jobs:
            try:
                status = self.backend.poll(job.record.remote_id or "", job.record.meta)
            except BatchApiError as err:
                if err.status == 404:
                    self._settle_failed(job, need, out, fallback, f"job not found at the provider: {err}", state="failed")
                    continue
                log.warning("batch poll failed (will retry): %s", err)  # transient: poll again next round
                still.append(job)
                continue
            self.store.set_status(job.record.local_id, status.remote_status, ready=status.terminal)
            if not status.terminal:
                still.append(job)
                continue
            if not self._settle(job, status, need, texts, tokens, out, fallback, requeue):
                still.append(job)  # its results could not be downloaded yet: try again
        return still

    def _settle(self, job: _Open, status: JobStatus, need, texts, tokens, out: BatchOutcome, fallback, requeue) -> bool:
        """Collect a finished job; False when its results could not be downloaded (it stays open)."""
        m = out.metrics
        results = None
        if status.state in ("completed", "expired") or status.meta.get("output_file_id") or status.meta.get("error_file_id"):
            try:
                results = self.backend.results(job.record.remote_id or "", status, job.keys)
            except BatchApiError as err:
                log.warning("batch results could not be downloaded (will retry): %s", err)
                return False  # stays open in the store: the next round, run or sensor tick tries again
        got = self._accept(job, results, out) if results is not None else set()
        missing = [k for k in job.keys if k not in got and k in need]
        if status.state == "completed":
            failed_lines = {k: v for k, v in (results.errors if results else {}).items() if k in need}
            m.requests_failed += len(failed_lines)
            self.store.finish(job.record.local_id, "collected", "; ".join(sorted(set(failed_lines.values())))[:500])
            m.jobs_collected += 1
            if not failed_lines and len(missing) == 0:
                self.store.record_success(self.provider)
            # A partially failed job keeps its good lines; the failed ones are retried live.
            fallback.update(missing)
            return True
        reason = status.error or f"batch {status.remote_status}"
        self.store.finish(job.record.local_id, status.state, reason)
        m.jobs_failed += 1
        self._failure(out, f"job {job.record.remote_id} {status.state}: {reason}")
        if status.state == "expired" and not m.disabled:
            # Resubmit only what is missing, through the batch API again.
            m.requests_resubmitted += len(missing)
            requeue.extend(BatchRequest(k, texts[k], int(tokens.get(k, job.tokens.get(k, 0)))) for k in missing if k in texts)
        else:
            fallback.update(missing)
        return True

    def _settle_failed(self, job: _Open, need, out: BatchOutcome, fallback, reason: str, *, state: str) -> None:
        self.store.finish(job.record.local_id, state, reason)
        out.metrics.jobs_failed += 1
        self._failure(out, reason)
        fallback.update(k for k in job.keys if k in need)

    def _abandon(self, job: _Open, need, out: BatchOutcome, fallback, reason: str) -> None:
        try:
            self.backend.cancel(job.record.remote_id or "", job.record.meta)
        except BatchApiError as err:
            log.warning("could not cancel batch %s: %s", job.record.remote_id, err)
        self._settle_failed(job, need, out, fallback, reason, state="abandoned")

    def _accept(self, job: _Open, results, out: BatchOutcome) -> set[str]:
        keys = [k for k in job.keys if k in results.vectors and len(results.vectors[k]) == self.dims]
        bad = [k for k in job.keys if k in results.vectors and len(results.vectors[k]) != self.dims]
        for k in bad:
            results.errors[k] = f"wrong dimension {len(results.vectors[k])}, expected {self.dims}"
        if not keys:
            return set()
        arr = normalize_vectors(np.asarray([results.vectors[k] for k in keys], dtype=np.float32))
        got = dict(zip(keys, arr))
        if self.on_vectors is not None:
            self.on_vectors(got)  # checkpoint into the cache before anything else can fail
        out.vectors.update(got)
        out.metrics.requests_collected += len(keys)
        out.metrics.batch_tokens += results.tokens or sum(job.tokens.get(k, 0) for k in keys)
        return set(keys)

    def _failure(self, out: BatchOutcome, reason: str, *, unavailable: bool = False) -> None:
        state = self.store.record_failure(self.provider, reason, unavailable=unavailable)
        out.metrics.failures = state.failures
        if state.disabled and not out.metrics.disabled:
            log.warning("batching disabled for %s: %s (re-enable with `memory batch reset`)", self.provider, state.reason)
        out.metrics.disabled = state.disabled
        out.metrics.disabled_reason = state.reason
