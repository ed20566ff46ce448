"""No chunk is ever longer than the local model's real input limit (so none is silently truncated)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from memory_pipeline.chunking import chunk_segments
from memory_pipeline.models import Segment
from memory_pipeline.providers.local import LocalProvider


@pytest.fixture(scope="module")
def provider() -> LocalProvider:
    return LocalProvider()


def _hostile_markdown() -> str:
    rng = random.Random(7)
    parts = ["# Notes > with a deep heading path\n## Sub section with a long title " + "word " * 30]
    # word-piece heavy text: identifiers, URLs, numbers, code, emoji, CJK, accents
    parts.append("```python\n" + "\n".join(f"x_{i} = compute_{i}(arg_{i}, **kw_{i})  # 🚀 {i}" for i in range(200)) + "\n```")
    parts.append(" ".join(f"https://example.com/{rng.randrange(10**9)}/{rng.randrange(10**9)}?q={rng.randrange(10**6)}" for _ in range(300)))
    parts.append("数据库备份策略" * 400)
    parts.append(" ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12)) for _ in range(800)))
    parts.append("Zürich café naïve résumé façade " * 200)
    return "\n\n".join(parts) + "\n"


@pytest.mark.parametrize("tokens", [64, 200, 400, 2000])
def test_chunks_fit_the_model_limit_for_hostile_text(provider: LocalProvider, tokens: int):
    limit = provider.max_input_tokens
    assert limit == 256
    text = _hostile_markdown()
    budget = min(tokens, int(limit * 0.8))
    chunks = chunk_segments(
        "markdown", [Segment(text, 1, text.count("\n"))], budget=budget, overlap=budget // 4,
        model_limit=limit, count_model=provider.count_tokens,
    )  # fmt: skip
    assert len(chunks) > 10
    counts = provider.count_tokens([c.embed_text for c in chunks])
    assert max(counts) <= limit
    assert [c.model_tokens for c in chunks] == counts
    # Nothing lost: every character of content survives somewhere.
    joined = "".join(c.text for c in chunks)
    for needle in ("compute_199", "数据库备份策略", "résumé façade"):
        assert needle in joined


def test_the_limit_is_what_sentence_transformers_truncates_at(provider: LocalProvider):
    model = provider._load_st()
    assert model.max_seq_length == provider.max_input_tokens
    long_text = "token " * 1000
    ids = model.tokenize([long_text])["input_ids"]
    assert ids.shape[1] == provider.max_input_tokens  # the model would cut here: we never send more
    assert provider.count_tokens([long_text])[0] > provider.max_input_tokens


def test_direct_path_equals_sentence_transformers(provider: LocalProvider):
    """The fast path (transformers directly) gives the vectors SentenceTransformer.encode gives."""
    assert provider._pooling == "mean"
    texts = [
        "Moved the orders database to PostgreSQL.",
        "数据库备份策略：每日增量备份",
        "short",
        "A much longer passage about kubernetes upgrades, node pools and disruption budgets " * 12,  # truncated at 256
        "",
    ]
    direct = provider.embed_documents(texts)
    reference = provider._load_st().encode(texts, batch_size=2, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(direct, reference, atol=2e-5)
    assert np.allclose(np.linalg.norm(direct, axis=1), 1.0, atol=1e-5)
