"""Each remote provider through its real client (SDK or HTTP) against its local fake server.

What is asserted is what went over the wire (model, task type, input type, dimensions,
auth header) and the live-call policy: retries on 429 / 5xx / timeouts / truncated
bodies with Retry-After honoured, fail-fast on 400 / 401, wrong dimensions refused,
bounded concurrency, rate limits, over-long texts split.
"""

from __future__ import annotations

import numpy as np
import pytest

from memory_pipeline.errors import ConfigError, ProviderError
from memory_pipeline.providers.gemini import GeminiProvider, MediaItem
from memory_pipeline.providers.mistral import MistralProvider
from memory_pipeline.providers.ollama import OllamaProvider
from memory_pipeline.providers.openai import OpenAIProvider
from memory_pipeline.providers.remote import RateLimiter, parse_retry_after
from memory_pipeline.providers.voyage import VoyageProvider
from memory_pipeline.settings import ResolvedRemote
from memory_pipeline_tests.fakes.base import bag_of_words_vector
from memory_pipeline_tests.fakes.gemini_server import GeminiFake
from memory_pipeline_tests.fakes.mistral_server import MistralFake
from memory_pipeline_tests.fakes.ollama_server import OllamaFake
from memory_pipeline_tests.fakes.openai_server import OpenAIFake
from memory_pipeline_tests.fakes.voyage_server import VoyageFake

DOCS = [
    "We migrated the orders database to Postgres on Tuesday",
    "Grocery list: apples, bananas, oat milk",
    "Expense receipts for the Lisbon trip are in the shared folder",
]
QUERY = "where are the trip expense receipts"

# name: (fake class, provider class, env var, fake kwargs)
PROVIDERS = {
    "openai": (OpenAIFake, OpenAIProvider, "OPENAI_API_KEY"),
    "gemini": (GeminiFake, GeminiProvider, "GEMINI_API_KEY"),
    "voyage": (VoyageFake, VoyageProvider, "VOYAGE_API_KEY"),
    "mistral": (MistralFake, MistralProvider, "MISTRAL_API_KEY"),
    "ollama": (OllamaFake, OllamaProvider, None),
}


def remote(fake, **kw) -> ResolvedRemote:
    defaults = {"base_url": fake.base_url, "backoff_base_s": 0.01, "backoff_max_s": 2.0, "timeout_s": 2.0, "query_timeout_s": 2.0}
    return ResolvedRemote(**(defaults | kw))


def make(name, fake, model=None, dims=None, **kw):
    _, cls, env = PROVIDERS[name]
    return cls(model, dims, remote(fake, **kw), env={env: fake.api_key} if env else {})


@pytest.fixture(params=sorted(PROVIDERS))
def served(request):
    fake_cls = PROVIDERS[request.param][0]
    with fake_cls() as fake:
        yield request.param, fake


def test_each_provider_embeds_meaningfully_with_its_wire_protocol(served):
    name, fake = served
    p = make(name, fake)
    docs = p.embed_documents(DOCS)
    q = p.embed_query(QUERY)
    assert docs.shape == (3, p.dims) and q.shape == (p.dims,)
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    assert int(np.argmax(docs @ q)) == 2  # the receipts note
    index_req, query_req = fake.embed_requests()
    if name == "openai":
        assert index_req.headers["authorization"] == f"Bearer {fake.api_key}"
        assert index_req.body["model"] == "text-embedding-3-small" and index_req.body["dimensions"] == 1536
    elif name == "gemini":
        assert index_req.headers["x-goog-api-key"] == fake.api_key
        assert index_req.path.endswith("/models/gemini-embedding-001:batchEmbedContents")
        assert {r["taskType"] for r in index_req.body["requests"]} == {"RETRIEVAL_DOCUMENT"}
        assert query_req.body["requests"][0]["taskType"] == "RETRIEVAL_QUERY"
        assert index_req.body["requests"][0]["outputDimensionality"] == 3072
    elif name == "voyage":
        assert index_req.body["model"] == "voyage-4-large"
        assert index_req.body["input_type"] == "document" and query_req.body["input_type"] == "query"
        assert index_req.headers["authorization"] == f"Bearer {fake.api_key}"
    elif name == "mistral":
        assert index_req.body == {"model": "mistral-embed", "input": DOCS}
        assert index_req.headers["authorization"] == f"Bearer {fake.api_key}"
    else:
        assert index_req.path == "/api/embed" and index_req.body["model"] == "nomic-embed-text"
        assert index_req.body["input"] == DOCS


@pytest.mark.parametrize(
    ("name", "model", "dims", "field"),
    [
        ("openai", "text-embedding-3-large", 256, "dimensions"),
        ("gemini", "gemini-embedding-001", 768, "outputDimensionality"),
        ("voyage", "voyage-4-large", 512, "output_dimension"),
    ],
)
def test_dims_are_requested_and_honoured(name, model, dims, field):
    with PROVIDERS[name][0]() as fake:
        p = make(name, fake, model=model, dims=dims)
        assert p.embed_documents(DOCS).shape == (3, dims) and p.dims == dims
        body = fake.embed_requests()[0].body
        sent = body["requests"][0][field] if name == "gemini" else body[field]
        assert sent == dims and (body.get("model") or body["requests"][0]["model"]).endswith(model)


def test_dims_a_model_cannot_give_are_a_config_error():
    with OpenAIFake() as fake:
        with pytest.raises(ConfigError, match="dims"):
            make("openai", fake, model="text-embedding-3-small", dims=3072)
        with pytest.raises(ConfigError, match="dims"):
            make("openai", fake, model="text-embedding-ada-002", dims=512)


def test_ollama_without_the_batch_endpoint_uses_the_single_prompt_one():
    with OllamaFake(legacy_only=True) as fake:
        p = make("ollama", fake)
        assert int(np.argmax(p.embed_documents(DOCS) @ p.embed_query(QUERY))) == 2
        paths = [r.path for r in fake.requests]
        assert paths[0] == "/api/embed" and paths.count("/api/embeddings") == len(DOCS) + 1
        assert p.legacy and "/api/embed" not in paths[1:]  # remembered, not probed again


@pytest.mark.parametrize("fault", ["429", "500", "503", "timeout", "truncated"])
def test_transient_faults_are_retried(served, fault):
    name, fake = served
    fake.timeout_s = 1.5
    p = make(name, fake, timeout_s=0.5)
    fake.fail_next(fault, fault)
    vecs = p.embed_documents(DOCS)
    assert np.allclose(vecs, [bag_of_words_vector(t, p.dims) for t in DOCS], atol=1e-5)
    assert p.stats["retries"] == 2 and [r.fault for r in fake.requests[:2]] == [fault, fault]


def test_retry_after_is_respected():
    with OpenAIFake(retry_after=0.6) as fake:
        p = make("openai", fake, backoff_base_s=0.001)
        fake.fail_next("429")
        p.embed_documents(DOCS)
        first, second = fake.requests[:2]
        assert first.fault == "429" and second.fault is None
        assert second.at - first.at >= 0.55  # the server asked for 0.6 s; jittered backoff alone is ~1 ms


@pytest.mark.parametrize(("fault", "status"), [("400", 400), ("401", 401), ("403", 403)])
def test_non_retryable_errors_fail_fast_with_the_providers_message(served, fault, status):
    name, fake = served
    p = make(name, fake)
    fake.fail_next(fault)
    with pytest.raises(ProviderError) as info:
        p.embed_documents(DOCS)
    assert info.value.status == status and info.value.provider == name
    assert len(fake.requests) == 1  # no retry
    expected = {400: "Invalid request", 401: "Incorrect API key", 403: "Permission denied"}[status]
    assert expected in str(info.value)


def test_a_wrong_key_is_a_clear_error_that_never_shows_the_key():
    with OpenAIFake(api_key="sk-the-right-one") as fake:
        p = OpenAIProvider(None, None, remote(fake), env={"OPENAI_API_KEY": "sk-WRONG-SENTINEL-4242"})
        with pytest.raises(ProviderError) as info:
            p.embed_query("hello")
        assert info.value.status == 401 and "OPENAI_API_KEY" in info.value.hint
        assert "SENTINEL" not in str(info.value) and "SENTINEL" not in info.value.hint


def test_retries_are_bounded_then_reported(served):
    name, fake = served
    p = make(name, fake, max_retries=2)
    fake.fail_next("500", "500", "500", "500")
    with pytest.raises(ProviderError, match="gave up after 3 attempts"):
        p.embed_documents(DOCS)
    assert len(fake.requests) == 3


def test_a_wrong_dimension_response_is_refused(served):
    name, fake = served
    p = make(name, fake)
    fake.fail_next("wrong_dims")
    with pytest.raises(ProviderError, match="dims"):
        p.embed_documents(DOCS)


def test_concurrency_is_bounded_and_used():
    with MistralFake() as fake:
        fake.delay_s = 0.15
        p = make("mistral", fake, concurrency=3, batch_size=1)
        texts = [f"note number {i} about topic {i % 5}" for i in range(12)]
        vecs = p.embed_documents(texts)
        assert vecs.shape == (12, 1024) and len(fake.requests) == 12
        assert fake.max_in_flight == 3
        assert all(len(r.body["input"]) == 1 for r in fake.requests)


def test_rate_limiter_spaces_requests_and_tokens():
    now = [0.0]
    slept: list[float] = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    limiter = RateLimiter(requests_per_minute=2, clock=lambda: now[0], sleep=sleep)
    assert limiter.acquire() == 0 and limiter.acquire() == 0
    assert limiter.acquire() == pytest.approx(30.0, abs=0.1)  # the 3rd of 2/min waits half a minute
    tokens = RateLimiter(tokens_per_minute=600, clock=lambda: now[0], sleep=sleep)
    assert tokens.acquire(600) == 0
    assert tokens.acquire(300) == pytest.approx(30.0, abs=0.1)
    assert tokens.acquire(5000) == pytest.approx(60.0, abs=0.1)  # more than a minute's worth: waits for a full bucket


def test_retry_after_header_forms():
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert parse_retry_after({}) is None


def test_a_text_over_the_input_limit_is_split_never_sent_too_long():
    from memory_pipeline.chunking import _encoding

    with OllamaFake(models=("all-minilm",)) as fake:
        p = make("ollama", fake, model="all-minilm")  # 256-token input limit
        long_text = " ".join(f"word{i} receipts" for i in range(400))
        vecs = p.embed_documents(["short note", long_text])
        assert vecs.shape == (2, 384) and p.stats["split_texts"] == 1
        enc = _encoding()
        sent = [t for r in fake.embed_requests() for t in fake.inputs(r)]
        assert len(sent) >= 4 and max(len(enc.encode_ordinary(t)) for t in sent) <= p.max_input_tokens
        assert np.isclose(np.linalg.norm(vecs[1]), 1.0)


def test_nan_and_inf_from_a_provider_are_sanitized():
    with OpenAIFake() as fake:
        p = make("openai", fake, dims=None)
        out = p._check([[float("nan"), float("inf"), 1.0] + [0.0] * 1533], 1)
        assert np.isfinite(out).all()


def test_gemini_embeds_media_natively_with_a_multimodal_model():
    with GeminiFake() as fake:
        png = b"\x89PNG\r\n\x1a\n fake image bytes"
        fake.media_words[__import__("hashlib").sha256(png).hexdigest()] = "expense receipt from the Lisbon trip"
        p = make("gemini", fake, model="gemini-embedding-2-preview", dims=768)
        assert p.supports_multimodal
        media = p.embed_media([MediaItem("IMG_0042.png", png, "image/png")])
        assert media.shape == (1, 768)
        part = fake.embed_requests()[-1].body["requests"][0]["content"]["parts"][1]
        assert part["inline_data"]["mime_type"] == "image/png"
        assert float(media[0] @ p.embed_query(QUERY)) > float(media[0] @ p.embed_query("orders database migration"))
        text_only = make("gemini", fake)
        with pytest.raises(ConfigError, match="cannot embed media"):
            text_only.embed_media([MediaItem("x.png", png, "image/png")])
