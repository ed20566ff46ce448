"""The batch engine against the fake batch APIs, driven by the real openai and google-genai SDKs."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from google import genai

from memory_pipeline.batching.backends import (
    BatchLimits,
    BatchRequest,
    GeminiBatchBackend,
    OpenAIBatchBackend,
    VoyageBatchBackend,
    pack,
)
from memory_pipeline.batching.engine import BatchEmbedder, BatchOptions
from memory_pipeline.batching.jobs import JobStore
from memory_pipeline.providers.base import normalize_vectors
from memory_pipeline_tests.fakes.base import bag_of_words_vector
from memory_pipeline_tests.fakes.batch_server import GeminiBatchFake, OpenAIBatchFake, VoyageBatchFake

DIMS = 32
TEXTS = {f"h{i:02d}": f"note {i} about the {w} migration" for i, w in enumerate(["orders", "billing", "search", "auth", "deploy", "cache", "queue"])}
TOKENS = {h: 8 for h in TEXTS}


FAKES = {"openai": OpenAIBatchFake, "voyage": VoyageBatchFake, "gemini": GeminiBatchFake}


@pytest.fixture
def fake(request):
    kind = getattr(request, "param", "openai")
    with FAKES[kind](dims=DIMS, polls_to_complete=3) as server:
        server.kind = kind
        yield server


def make_backend(fake, limits: BatchLimits | None = None):
    key = fake.api_key
    if fake.kind == "openai":
        client = openai.OpenAI(api_key=key, base_url=fake.base_url, max_retries=0)
        return OpenAIBatchBackend(client, "text-embedding-3-small", dimensions=DIMS, api_key=key, limits=limits)
    if fake.kind == "voyage":
        client = openai.OpenAI(api_key=key, base_url=fake.base_url, max_retries=0)
        return VoyageBatchBackend(client, "voyage-4-large", dimensions=DIMS, api_key=key, limits=limits)
    client = genai.Client(api_key=key, http_options={"base_url": fake.root_url})
    return GeminiBatchBackend(client, "gemini-embedding-001", dimensions=DIMS, api_key=key, limits=limits)


def engine(backend, store, *, wait=True, concurrency=2, timeout_ms=60_000, cache=None):
    return BatchEmbedder(
        backend,
        store,
        BatchOptions(wait=wait, concurrency=concurrency, poll_interval_ms=20, timeout_ms=timeout_ms),
        provider_key="pk",
        model=getattr(backend, "model", "m"),
        dims=DIMS,
        on_vectors=(cache.update if cache is not None else None),
    )


def expected(text: str) -> np.ndarray:
    return normalize_vectors(np.asarray([bag_of_words_vector(text, DIMS)]))[0]


@pytest.fixture
def store(tmp_path):
    s = JobStore(tmp_path / "jobs.sqlite")
    yield s
    s.close()


def test_pack_respects_requests_bytes_and_token_limits():
    reqs = [BatchRequest(f"k{i}", "x" * 10, 5) for i in range(10)]
    assert [len(p) for p in pack(reqs, BatchLimits(4, 10_000, 100), lambda r: 11)] == [4, 4, 2]
    assert [len(p) for p in pack(reqs, BatchLimits(100, 35, 100), lambda r: 11)] == [3, 3, 3, 1]
    assert sum(len(p) for p in pack(reqs, BatchLimits(3, 20, 100), lambda r: 11)) == 10  # never drops one
    with pytest.raises(ValueError, match="per-request limit"):
        pack([BatchRequest("big", "x", 500)], BatchLimits(10, 10_000, 100), lambda r: 1)


@pytest.mark.parametrize("fake", ["openai", "voyage", "gemini"], indirect=True)
def test_one_job_for_the_whole_corpus_vectors_equal_live(fake, store):
    cache: dict = {}
    out = engine(make_backend(fake), store, cache=cache).run(TEXTS, TOKENS, {h: {"0a"} for h in TEXTS})
    assert out.fallback == [] and out.pending == set()
    assert set(out.vectors) == set(TEXTS) == set(cache)
    for h, t in TEXTS.items():
        np.testing.assert_allclose(out.vectors[h], expected(t), atol=1e-6)
    m = out.metrics
    assert (m.jobs_submitted, m.requests_submitted, m.requests_collected, m.jobs_collected) == (1, len(TEXTS), len(TEXTS), 1)
    assert m.batch_tokens > 0 and m.estimated_cost_usd is None or m.estimated_cost_usd >= 0
    assert fake.batches_created() == 1
    # Polled over several status transitions before the results were read.
    polls = fake.count("GET", r"/v1\w*/batches/[\w-]+")
    assert polls >= 3
    (job,) = store.jobs()
    assert job.state == "collected" and job.remote_id and job.requests == len(TEXTS) and job.shards == ("0a",)


def test_packs_into_jobs_under_the_limits_with_bounded_concurrency(fake, store):
    backend = make_backend(fake, limits=BatchLimits(max_requests=3, max_bytes=10**6, max_request_tokens=8192))
    out = engine(backend, store, concurrency=1).run(TEXTS, TOKENS)
    assert set(out.vectors) == set(TEXTS)
    assert out.metrics.jobs_submitted == 3 == fake.batches_created()
    # concurrency 1: each batch was created only after the previous one finished.
    order = [(r.method, r.path) for r in fake.requests if r.path == "/v1/batches" or r.path.endswith("/content")]
    creates = [i for i, (m, p) in enumerate(order) if p == "/v1/batches"]
    assert all(any(c1 < i < c2 for i, (m, p) in enumerate(order) if p.endswith("/content")) for c1, c2 in zip(creates, creates[1:]))


@pytest.mark.parametrize("fake", ["openai", "gemini"], indirect=True)
def test_resume_without_resubmitting(fake, store, tmp_path):
    first = engine(make_backend(fake), store, wait=False).run(TEXTS, TOKENS)
    assert first.pending == set(TEXTS) and first.metrics.jobs_pending == 1 and not first.vectors
    # A new process (new store handle, new SDK client) picks the same job up.
    store2 = JobStore(tmp_path / "jobs.sqlite")
    out = engine(make_backend(fake), store2).run(TEXTS, TOKENS)
    store2.close()
    assert set(out.vectors) == set(TEXTS)
    assert out.metrics.jobs_resumed == 1 and out.metrics.jobs_submitted == 0
    assert fake.batches_created() == 1


@pytest.mark.parametrize("fake", ["openai", "voyage"], indirect=True)
def test_expired_job_keeps_its_results_and_resubmits_only_what_is_missing(fake, store):
    fake.batch_faults = ["expire"]
    out = engine(make_backend(fake), store).run(TEXTS, TOKENS)
    assert set(out.vectors) == set(TEXTS) and out.fallback == []
    m = out.metrics
    assert m.jobs_failed == 1 and m.jobs_submitted == 2 and m.failures == 1 and not m.disabled
    first, second = sorted(fake.batches.values(), key=lambda b: b["id"])
    done_first = len(first["lines"]) // 2
    assert len(second["lines"]) == len(TEXTS) - done_first == m.requests_resubmitted
    assert {ln["custom_id"] for ln in second["lines"]}.isdisjoint({ln["custom_id"] for ln in first["lines"][:done_first]})
    assert [j.state for j in sorted(store.jobs(), key=lambda j: j.created_at)] == ["expired", "collected"]


@pytest.mark.parametrize("fake", ["gemini"], indirect=True)
def test_gemini_expired_job_is_resubmitted(fake, store):
    fake.batch_faults = ["expire"]
    out = engine(make_backend(fake), store).run(TEXTS, TOKENS)
    assert set(out.vectors) == set(TEXTS) and out.metrics.jobs_submitted == 2 and out.metrics.requests_resubmitted == len(TEXTS)


@pytest.mark.parametrize("fake", ["openai", "gemini"], indirect=True)
def test_failed_job_falls_back_live_and_two_failures_disable(fake, store):
    fake.batch_faults = ["fail"]
    out = engine(make_backend(fake), store).run(TEXTS, TOKENS)
    assert out.fallback == sorted(TEXTS) and out.metrics.live_fallbacks == len(TEXTS)
    assert out.metrics.failures == 1 and not out.metrics.disabled
    fake.batch_faults = ["fail"]
    out = engine(make_backend(fake), store).run(TEXTS, TOKENS)
    assert out.metrics.disabled and "2 batch failures" in out.metrics.disabled_reason
    created = fake.batches_created()
    out = engine(make_backend(fake), store).run(TEXTS, TOKENS)
    assert fake.batches_created() == created  # disabled: nothing submitted
    assert out.fallback == sorted(TEXTS) and out.metrics.disabled
    assert store.reset(fake.kind) == [fake.kind]
    out = engine(make_backend(fake), store).run(TEXTS, TOKENS)
    assert set(out.vectors) == set(TEXTS) and fake.batches_created() == created + 1


@pytest.mark.parametrize("fake", ["openai", "voyage", "gemini"], indirect=True)
def test_partial_job_keeps_good_lines_and_retries_failed_ones_live(fake, store):
    fake.batch_faults = ["partial"]
    out = engine(make_backend(fake), store).run(TEXTS, TOKENS)
    keys = sorted(TEXTS)
    if fake.kind == "gemini":
        failed = {keys[i] for i in range(len(keys)) if i % 3 == 0}  # inline: request order
    else:
        (batch,) = fake.batches.values()
        failed = {ln["custom_id"] for i, ln in enumerate(batch["lines"]) if i % 3 == 0}
    assert set(out.fallback) == failed and set(out.vectors) == set(TEXTS) - failed
    assert out.metrics.requests_failed == len(failed) and out.metrics.failures == 0 and not out.metrics.disabled


@pytest.mark.parametrize("fake", ["openai", "gemini"], indirect=True)
def test_unavailable_batch_api_disables_at_once(fake, store):
    fake.batch_faults = ["unavailable"]
    out = engine(make_backend(fake), store).run(TEXTS, TOKENS)
    assert out.fallback == sorted(TEXTS) and out.metrics.disabled
    assert "unavailable" in out.metrics.disabled_reason
    assert store.provider_state(fake.kind).disabled


def test_wait_timeout_cancels_the_job_and_falls_back(fake, store):
    fake.batch_faults = ["hold"]
    fake.held = True
    out = engine(make_backend(fake), store, timeout_ms=300).run(TEXTS, TOKENS)
    assert out.fallback == sorted(TEXTS) and out.metrics.failures == 1
    (batch,) = fake.batches.values()
    assert batch["status"] == "cancelled"
    (job,) = store.jobs()
    assert job.state == "abandoned" and "timed out" in job.error


def test_a_submission_whose_process_died_is_resubmitted(fake, store):
    dead = store.begin(
        provider="openai",
        provider_key="pk",
        model="m",
        hashes=list(TEXTS),
        tokens=[1] * len(TEXTS),
        shards=[],
        submitter={"pid": 2**22 + 7, "host": __import__("socket").gethostname()},
    )
    out = engine(make_backend(fake), store).run(TEXTS, TOKENS)
    assert set(out.vectors) == set(TEXTS) and out.metrics.jobs_submitted == 1
    assert store.get(dead).state == "lost"


def test_no_key_in_the_job_store(fake, store, tmp_path):
    fake.batch_faults = ["fail", "partial"]
    engine(make_backend(fake), store).run(TEXTS, TOKENS)
    engine(make_backend(fake), store).run(TEXTS, TOKENS)
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("jobs.sqlite*"))
    assert fake.api_key.encode() not in raw and b"sk-test" not in raw
