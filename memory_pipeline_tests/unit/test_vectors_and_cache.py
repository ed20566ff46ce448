"""Unit tests for normalize_vectors and the SQLite EmbeddingCache."""

from __future__ import annotations

import numpy as np
import pytest

from memory_pipeline.providers.base import normalize_vectors, stable_key
from memory_pipeline.stores.cache import EmbeddingCache, cache_key

NORMALIZE = [
    ("unit rows", [[3.0, 4.0], [0.0, 2.0]], [[0.6, 0.8], [0.0, 1.0]]),
    ("zero row stays zero", [[0.0, 0.0], [1.0, 0.0]], [[0.0, 0.0], [1.0, 0.0]]),
    ("nan becomes zero", [[np.nan, 3.0, 4.0]], [[0.0, 0.6, 0.8]]),
    ("inf becomes zero", [[np.inf, -np.inf, 5.0]], [[0.0, 0.0, 1.0]]),
    ("all nan row is zero", [[np.nan, np.nan]], [[0.0, 0.0]]),
    ("negative values", [[-3.0, 4.0]], [[-0.6, 0.8]]),
    ("one-d input", [3.0, 4.0], [[0.6, 0.8]]),
]


@pytest.mark.parametrize(("given", "expected"), [n[1:] for n in NORMALIZE], ids=[n[0] for n in NORMALIZE])
def test_normalize_vectors(given, expected):
    """NaN/Inf become 0, rows get unit L2 norm, zero rows stay zero, output is 2-D float32."""
    out = normalize_vectors(np.array(given, dtype=np.float64))
    assert out.dtype == np.float32 and out.ndim == 2
    np.testing.assert_allclose(out, np.array(expected, dtype=np.float32), atol=1e-6)
    assert np.isfinite(out).all()


def test_normalize_random_batch_has_unit_norms():
    """A random batch comes out with every row of norm 1 and directions preserved."""
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(64, 384)) * rng.uniform(0.01, 100, size=(64, 1))
    out = normalize_vectors(vecs)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    cos = (out * vecs).sum(axis=1) / np.linalg.norm(vecs, axis=1)
    np.testing.assert_allclose(cos, 1.0, atol=1e-5)


def test_normalize_does_not_modify_input():
    """The caller's array is left untouched."""
    vecs = np.array([[np.nan, 3.0, 4.0]], dtype=np.float32)
    normalize_vectors(vecs)
    assert np.isnan(vecs[0, 0]) and vecs[0, 1] == 3.0


def test_stable_key_is_deterministic_and_separated():
    """stable_key is stable and the separator keeps ('ab','c') apart from ('a','bc')."""
    assert stable_key("local", "m", 384) == stable_key("local", "m", 384)
    assert stable_key("ab", "c") != stable_key("a", "bc")
    assert len(stable_key("x")) == 16


@pytest.fixture
def cache(tmp_path):
    c = EmbeddingCache(tmp_path / "cache" / "embeddings.sqlite", max_entries=3)
    yield c
    c.close()


def vec(seed: int, dims: int = 8) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=dims).astype(np.float32)


def test_put_get_roundtrip(cache):
    """Vectors come back bit-identical, only for keys that were stored."""
    items = [(f"k{i}", vec(i)) for i in range(3)]
    assert cache.put_many(items) == 3
    assert len(cache) == 3
    got = cache.get_many(["k0", "k2", "missing"], dims=8)
    assert set(got) == {"k0", "k2"}
    np.testing.assert_array_equal(got["k0"], items[0][1])
    np.testing.assert_array_equal(got["k2"], items[2][1])
    assert got["k0"].dtype == np.float32


def test_put_empty_and_get_empty(cache):
    """Empty batches are no-ops."""
    assert cache.put_many([]) == 0
    assert cache.get_many([], dims=8) == {}


def test_float64_input_stored_as_float32(cache):
    """A float64 vector is stored as float32 with its dims."""
    cache.put_many([("k", np.array([0.5, 0.25], dtype=np.float64))])
    np.testing.assert_array_equal(cache.get_many(["k"], dims=2)["k"], np.array([0.5, 0.25], dtype=np.float32))


def test_dims_mismatch_not_returned(cache):
    """A vector stored with other dims is never returned for a lookup at these dims."""
    cache.put_many([("k", vec(1, dims=8))])
    assert cache.get_many(["k"], dims=16) == {}
    assert set(cache.get_many(["k"], dims=8)) == {"k"}


def test_overwrite_replaces(cache):
    """Putting a key again replaces its vector."""
    cache.put_many([("k", vec(1))])
    cache.put_many([("k", vec(2))])
    assert len(cache) == 1
    np.testing.assert_array_equal(cache.get_many(["k"], dims=8)["k"], vec(2))


def test_many_keys_beyond_sql_batch(tmp_path):
    """Lookups of more keys than one SQL batch still find all of them."""
    c = EmbeddingCache(tmp_path / "c.sqlite", max_entries=10_000)
    c.put_many([(f"k{i}", np.full(4, i, dtype=np.float32)) for i in range(1_234)])
    got = c.get_many([f"k{i}" for i in range(1_234)] + ["nope"], dims=4)
    assert len(got) == 1_234 and got["k1233"][0] == 1233
    c.close()


def test_lru_prune_keeps_most_recently_used(cache):
    """prune drops the least recently used entries down to max_entries; a get counts as a use."""
    for i in range(6):
        cache.put_many([(f"k{i}", vec(i))])  # one put per key: increasing last_used
    cache.get_many(["k0", "k1"], dims=8)  # k0, k1 now the most recent
    assert cache.prune() == 3
    assert len(cache) == 3
    assert set(cache.get_many([f"k{i}" for i in range(6)], dims=8)) == {"k0", "k1", "k5"}
    assert cache.prune() == 0


def test_cache_persists_across_instances(tmp_path):
    """A reopened cache file still holds its vectors."""
    path = tmp_path / "c.sqlite"
    c = EmbeddingCache(path, max_entries=10)
    c.put_many([("k", vec(3))])
    c.close()
    c2 = EmbeddingCache(path, max_entries=10)
    np.testing.assert_array_equal(c2.get_many(["k"], dims=8)["k"], vec(3))
    c2.close()


def test_cache_key_separates_every_field():
    """Changing any field of the key (provider, model, provider_key, dims, content) changes it."""
    base = ("local", "minilm", "pk", 384, "hash")
    keys = {cache_key(*base)}
    for i, other in enumerate(("openai", "mpnet", "pk2", 768, "hash2")):
        changed = list(base)
        changed[i] = other
        keys.add(cache_key(*changed))
    assert len(keys) == 6
