"""The embed stage in waves: its memory follows a wave of shards, not the whole run (issue 16).

The stage functions are called directly (as in test_stages.py) with a small ``WAVE_BYTES``,
so a folder of a few dozen notes spreads over many waves; one run through Dagster shows
that a provider failing in a later wave still hands over to the fallback.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from memory_pipeline import storage
from memory_pipeline.changes import EmbeddingIdentity, fingerprint
from memory_pipeline.errors import ProviderError
from memory_pipeline.providers.registry import ResolvedProvider
from memory_pipeline.settings import load_settings
from memory_pipeline.stages import (
    ChunkCounts,
    DiscoverCounts,
    EmbedCounts,
    ExtractCounts,
    StageHooks,
    discover,
    embed_chunks,
    extract_content,
    make_chunks,
)
from memory_pipeline.stages import embed as embed_stage
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.embedder import HashEmbedder
from memory_pipeline_tests.unit.test_stages import SHARDS, _frames, _store

NOTES = 48


@pytest.fixture
def chunked(tmp_path: Path):
    """A folder of notes spread over the shards, discovered, extracted and chunked (no vectors yet)."""
    mem = tmp_path / "mem"
    mem.mkdir()
    for i in range(NOTES):
        # Two notes share each text: a text in two shards (and often two waves) is embedded once.
        (mem / f"note-{i:03d}.md").write_text(f"# Note {i % (NOTES // 2)}\n\nThe heron came back to pond {i % (NOTES // 2)} at dawn.\n")
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml", chunking={"tokens": 64, "overlap": 0}))
    embedder = HashEmbedder()
    ident = EmbeddingIdentity.of(ResolvedProvider("test", embedder))
    _store(settings, "source_files", discover(settings, SHARDS, force=False, fp=fingerprint(settings, ident), ident=ident, counts=DiscoverCounts()))
    _store(settings, "extracted_content", extract_content(settings, _frames(settings, "source_files"), ExtractCounts()))
    _store(
        settings,
        "memory_chunks",
        make_chunks(settings, _frames(settings, "source_files"), _frames(settings, "extracted_content"), embedder, ident, ChunkCounts()),
    )
    return settings, embedder, ident


def _wave_of(monkeypatch, chunks: int, dims: int) -> None:
    """Waves of at most about ``chunks`` chunks (their texts count too)."""
    monkeypatch.setattr(embed_stage, "WAVE_BYTES", chunks * (dims * 4 + embed_stage._ROW_BYTES))


def _no_cache(settings):
    return replace(settings, cache=replace(settings.cache, enabled=False))


def _vectors(settings) -> dict[str, np.ndarray]:
    out = {}
    for _shard, frame in _frames(settings, "chunk_embeddings").items():
        for h, v in frame.select("content_hash", "vector").iter_rows():
            out[h] = np.asarray(v, np.float32)
    return out


def test_waves_make_the_same_frames_as_one_wave(chunked, monkeypatch):
    settings, embedder, ident = chunked
    one = EmbedCounts()
    whole = dict(embed_chunks(settings, _frames(settings, "memory_chunks"), embedder, ident, counts=one))
    assert embedder.calls and one.chunks == NOTES and one.unique == NOTES // 2

    settings = _no_cache(settings)  # every wave embeds its own texts: the provider sees the waves
    _wave_of(monkeypatch, 4, ident.dims)
    waved_embedder = HashEmbedder()
    many = EmbedCounts()
    per_shard: dict[str, dict[str, int]] = {}
    waved = dict(embed_chunks(settings, _frames(settings, "memory_chunks"), waved_embedder, ident, counts=many, per_shard=per_shard))
    assert list(waved) == list(whole) == SHARDS
    for shard in SHARDS:
        assert waved[shard].equals(whole[shard]), shard
    assert many.chunks == NOTES and many.dims == ident.dims
    # Several provider calls, none for more than a wave's texts plus one shard's (a wave ends on a shard's boundary).
    biggest_shard = max(f.height for f in _frames(settings, "memory_chunks").values())
    assert len(waved_embedder.calls) > 1 and max(waved_embedder.calls) <= 4 + biggest_shard
    assert sum(n["chunks"] for n in per_shard.values()) == NOTES


def test_only_the_first_wave_is_embedded_before_the_frames_are_read(chunked, monkeypatch):
    settings, embedder, ident = chunked
    settings = _no_cache(settings)
    _wave_of(monkeypatch, 4, ident.dims)
    stream = embed_chunks(settings, _frames(settings, "memory_chunks"), embedder, ident)
    first = sum(embedder.calls)
    assert 0 < first < NOTES
    frames = list(stream)
    assert len(frames) == len(SHARDS) and sum(embedder.calls) > first


def test_a_later_wave_reads_what_an_earlier_one_embedded_from_the_cache(chunked, monkeypatch):
    settings, embedder, ident = chunked
    _wave_of(monkeypatch, 4, ident.dims)
    counts = EmbedCounts()
    _store(settings, "chunk_embeddings", embed_chunks(settings, _frames(settings, "memory_chunks"), embedder, ident, counts=counts))
    # Each text is sent once, whichever wave its second note falls in; the other copy is a cache hit or shares the wave.
    assert sum(embedder.calls) == counts.embedded == NOTES // 2
    assert counts.embedded + counts.cached <= counts.unique
    vectors = _vectors(settings)
    assert len(vectors) == NOTES // 2
    for h, v in vectors.items():
        assert np.isclose(np.linalg.norm(v), 1.0, atol=1e-4), h


def test_batch_providers_keep_one_wave(chunked, monkeypatch):
    """With the batch API on, one set of jobs for the run: the waves are not used."""
    settings, _embedder, ident = chunked
    settings = replace(settings, remote=replace(settings.remote, batch=replace(settings.remote.batch, enabled=True)))
    seen: list[int] = []
    real = embed_stage._embed

    def spy(settings, provider, ident, hooks, texts, *rest):
        seen.append(len(texts))
        return real(settings, provider, ident, hooks, texts, *rest)

    monkeypatch.setattr(embed_stage, "_embed", spy)
    _wave_of(monkeypatch, 4, ident.dims)
    batchable = HashEmbedder()
    batchable.name = "openai"  # a provider with a batch API (the test embedder has no backend: live requests)
    list(embed_chunks(settings, _frames(settings, "memory_chunks"), batchable, ident))
    assert seen == [NOTES // 2]


class _FailsAfter(HashEmbedder):
    """Embeds ``ok`` calls, then fails for good."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    def embed_documents(self, texts):
        if len(self.calls) >= self.ok:
            raise ProviderError("HTTP 500: the provider is down", provider="test-hash", status=500)
        return super().embed_documents(texts)


def test_a_failure_in_a_later_wave_is_raised_as_the_frames_are_read(chunked, monkeypatch):
    settings, _embedder, ident = chunked
    settings = _no_cache(settings)
    _wave_of(monkeypatch, 4, ident.dims)
    provider = _FailsAfter(ok=1)
    stream = embed_chunks(settings, _frames(settings, "memory_chunks"), provider, ident, hooks=StageHooks(embed_slice=10_000))
    got = []
    with pytest.raises(ProviderError, match="provider is down"):
        for pair in stream:
            got.append(pair)
    assert got  # the first wave's shards came out before the failure


@pytest.mark.parametrize("wave", ["later", "first"])
def test_a_primary_failing_in_a_later_wave_hands_over_to_the_fallback(tmp_path: Path, monkeypatch, wave: str):
    """Through Dagster: the primary embeds one slice, then fails for good (in a later wave, or
    part-way through the first); the run goes again with the fallback, and what the primary
    embedded is in the usage ledger."""
    from memory_pipeline.runner import run_index
    from memory_pipeline_tests.fakes.ollama_server import OllamaFake
    from memory_pipeline_tests.fakes.openai_server import OpenAIFake

    mem = tmp_path / "mem"
    mem.mkdir()
    for i in range(NOTES):
        (mem / f"note-{i:03d}.md").write_text(f"# Note {i}\n\nThe heron came back to pond {i} at dawn.\n")

    class FailAfterFirstSlice(StageHooks):
        def at(self, point: str) -> None:
            if point == "embed_after_first_batch":
                primary.fail_randomly(1.0, kinds=("500",))  # down for good once the first wave is in

    with OpenAIFake(dims=384) as primary, OllamaFake() as fallback:
        monkeypatch.setenv("OPENAI_API_KEY", primary.api_key or "")
        fast = {"backoff_base_ms": 10, "backoff_max_ms": 100, "timeout_ms": 3000, "max_retries": 1}
        cfg = write_config(
            tmp_path / "memory_pipeline.yaml", provider="openai", dims=384, fallback="ollama", chunking={"tokens": 64, "overlap": 0},
            remote={**fast, "base_url": primary.base_url, "providers": {"ollama": {"base_url": fallback.base_url}}},
        )  # fmt: skip
        if wave == "later":
            _wave_of(monkeypatch, 4, 384)
        settings = load_settings(cfg)
        summary = run_index(settings, hooks=FailAfterFirstSlice(embed_slice=10_000 if wave == "later" else 8))
    assert not summary.errors, summary.errors
    assert summary.provider == "ollama" and "openai failed permanently" in summary.fallback_reason
    assert summary.table_rows == summary.chunks_total == NOTES
    # The first wave went through the primary; a later one failed there.
    sent = sum(len(primary.inputs(r)) for r in primary.embed_requests())
    assert 0 < sent < NOTES
    assert any(r.fault for r in primary.requests)
    # What the primary embedded before it failed is in the usage ledger, beside the fallback's run.
    usage = [json.loads(line) for line in storage.of(settings).read_lines(storage.USAGE)]
    assert sum(u["chunks"] for u in usage if u["provider"] == "openai" and not u.get("batch")) == sent
    assert sum(u["chunks"] for u in usage if u["provider"] == "ollama") == NOTES


def _shard_frame(n: int, text_len: int):
    import polars as pl

    return pl.DataFrame(
        {
            "content_hash": [f"h{text_len}-{i}" for i in range(n)],
            "embed_text": ["x" * text_len] * n,
            "tokens": [text_len // 4] * n,
            "media_file": [None] * n,
            "mime_type": ["text/markdown"] * n,
            "source": ["notes"] * n,
        },
        schema_overrides={"media_file": pl.Utf8},
    )


def test_a_wave_counts_the_bytes_of_its_texts():
    """Long chunks fill a wave sooner than short ones: a wave is sized by its texts' bytes, not
    by a count (10,000 notes of one long chunk each were one wave of 64 MiB, and the run's peak
    RSS followed the folder's size)."""
    dims, cap = 384, 200 * (384 * 4 + embed_stage._ROW_BYTES)
    short = {f"{i:02x}": _shard_frame(50, 10) for i in range(8)}
    long = {f"{i:02x}": _shard_frame(50, 8000) for i in range(8)}
    short_waves = [[s for s, _ in w] for w in embed_stage._waves(short, cap, dims)]
    long_waves = [[s for s, _ in w] for w in embed_stage._waves(long, cap, dims)]
    assert [s for w in short_waves for s in w] == [s for w in long_waves for s in w] == list(short)  # every shard once, in order
    assert len(short_waves) == 2  # 4 shards of 50 short chunks make 200 chunks' worth
    assert len(long_waves) == 8  # 50 chunks of 8,000 bytes already exceed the cap: a shard per wave
    assert [[s for s, _ in w] for w in embed_stage._waves(long, None, dims)] == [list(long)]  # no cap: one wave
    assert embed_stage._wave_bytes(_shard_frame(0, 10), dims) == 0
    assert embed_stage._wave_bytes(_shard_frame(3, 100), dims) == 3 * (100 + 384 * 4 + embed_stage._ROW_BYTES)
