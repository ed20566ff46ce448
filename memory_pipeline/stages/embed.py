"""Stage 4, ``chunk_embeddings``: a vector for every chunk of the changed files.

The embedding cache first (by content hash, so unchanged text is never sent twice),
then the provider's batch API where configured, then live requests in slices; every
slice is checkpointed to the cache, so a killed run loses at most one slice.

The shards are embedded in waves of bounded size (see :func:`embed_chunks`), so the
stage's memory follows a wave, not the run; the first wave when :func:`embed_chunks` is
called (so a provider that fails at once fails there), the others as the caller consumes
the frames of content hash and vector.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from memory_pipeline import progress, storage
from memory_pipeline.batching.factory import BATCH_PROVIDERS
from memory_pipeline.batching.stage import embed_batched
from memory_pipeline.changes import EmbeddingIdentity
from memory_pipeline.errors import ProviderError
from memory_pipeline.models import CHUNKS_SCHEMA, embeddings_schema
from memory_pipeline.providers.base import EmbeddingProvider
from memory_pipeline.settings import Settings
from memory_pipeline.stages.hooks import NO_HOOKS, StageHooks
from memory_pipeline.stages.media import embed_media
from memory_pipeline.stores.cache import EmbeddingCache, cache_key

if TYPE_CHECKING:
    import polars as pl


@dataclass
class EmbedCounts:
    chunks: int = 0
    unique: int = 0
    cached: int = 0
    embedded: int = 0
    tokens_embedded: int = 0
    media_embedded: int = 0  # of which natively, from the media bytes
    dims: int = 0
    seconds: float = 0.0
    batched: int = 0  # vectors that came back from provider batch jobs
    pending: int = 0  # chunks whose batch job is still running (remote.batch.wait: false)
    batch: dict | None = None  # the run's batch metrics (jobs, requests, tokens, fallbacks, cost)


WAVE_BYTES = 4 * 1024 * 1024
"""About what one wave of the embed stage holds: its texts (their UTF-8 bytes), vectors and
bookkeeping (see :func:`embed_chunks`).

Small, so that memory does not follow the size of the folder: at 64 MiB, with each text counted
as 600 bytes (some 30,000 chunks a wave), 10,000 notes of one long chunk each were a single wave
of 17,748 chunks of about 1,000 characters, and the run's peak RSS went from 503 MB at 1,000
notes to 610 MB (issue 15 asks for 5 %); waves of 16 MiB gave 579 MB, of 4 MiB 544-551 MB (one
run each, `benchmarks/bench_index.py`'s long notes). A wave of 4 MiB still holds over a thousand
chunks: the default int8 runtime embeds each text alone anyway, and the other runtimes' batches
(sorted by length within a wave) stay full."""
_ROW_BYTES = 600  # a chunk's content hash and bookkeeping in Python objects (dict and set entries), about


def embed_chunks(
    settings: Settings,
    chunks: Mapping[str, pl.DataFrame],
    provider: EmbeddingProvider | None,
    ident: EmbeddingIdentity,
    hooks: StageHooks = NO_HOOKS,
    counts: EmbedCounts | None = None,
    per_shard: dict[str, dict[str, int]] | None = None,
) -> Iterator[tuple[str, pl.DataFrame]]:
    """Vectors for every chunk of the changed files (cache first, then the provider); returns
    ``(shard, content_hash + vector)`` per shard of ``chunks``, or per piece of a shard the chunk
    stage wrote in pieces (one frame for each of its pieces, in order: the write stage reads the
    two files' pieces side by side).

    The shards are embedded in waves of whole shards or pieces, each wave holding about
    :data:`WAVE_BYTES` of texts and vectors, so memory follows the largest wave (at least one
    piece), not the run. The first wave is embedded now (so a provider that fails at once
    fails here); the others as the frames are consumed. With the provider's batch API on, the
    whole run is one wave: one set of jobs, submitted together.

    A text that two waves share is embedded by the first and read from the cache by the
    second (embedded twice with the cache off); ``counts`` then has it in both waves'
    ``unique``, and as ``cached`` in the second.

    ``per_shard``: filled in with each shard's own numbers as its frame is built (chunks, unique
    texts, and of those how many came from the cache and how many were embedded by this run; a
    text two shards, or two pieces of a shard, share counts in both)."""
    counts = counts if counts is not None else EmbedCounts()
    counts.dims = ident.dims
    per_shard = per_shard if per_shard is not None else {}
    if provider is None:
        # Full-text only: empty one-dimensional frames (the chunks are not even read), so the graph
        # stays whole; each partition's numbers are zeros (nothing read, nothing embedded).
        def fts_only() -> Iterator[tuple[str, pl.DataFrame]]:
            for s in chunks:
                per_shard.setdefault(s, {"chunks": 0, "unique": 0, "cached": 0, "embedded": 0, "tokens_total": 0})
                yield s, _frame([], np.zeros((0, 1), np.float32), 1)

        return fts_only()
    batch = settings.remote.batch.enabled and getattr(provider, "name", "") in BATCH_PROVIDERS
    waves = _waves(chunks, None if batch else WAVE_BYTES, ident.dims)
    first = next(waves, None)
    done = _embed_wave(settings, provider, ident, hooks, first, counts, per_shard) if first else []

    def stream() -> Iterator[tuple[str, pl.DataFrame]]:
        from memory_pipeline.stages.write import give_back_memory

        yield from done
        done.clear()
        for wave in waves:
            # The frames yielded so far are written: what their Arrow conversion and Parquet
            # write freed goes back before the next wave is embedded, or the allocators keep it
            # and a folder of many waves peaks higher than one of a single wave (10,000 long
            # notes: +11 % over 1,000 with the same waves; see README, Benchmarks).
            give_back_memory()
            yield from _embed_wave(settings, provider, ident, hooks, wave, counts, per_shard)

    return stream()


def _waves(chunks: Mapping[str, pl.DataFrame], cap: int | None, dims: int) -> Iterator[list[tuple[str, pl.DataFrame]]]:
    """Consecutive shards, or pieces of shards (a shard the chunk stage wrote in pieces is read a
    piece at a time), whose texts and vectors add up to about ``cap`` bytes (all when None)."""
    import polars as pl

    wave: list[tuple[str, pl.DataFrame]] = []
    size = 0
    for shard in chunks:
        for piece in storage.pieces(chunks, shard, _WAVE_SCHEMA):
            table = pl.from_arrow(piece)
            assert isinstance(table, pl.DataFrame)  # a Table gives a DataFrame
            wave.append((shard, table))
            size += _wave_bytes(table, dims)
            if cap is not None and size >= cap:
                yield wave
                wave, size = [], 0
    if wave:
        yield wave


# The chunks' columns a wave reads: what is embedded, and how.
_WAVE_SCHEMA = pa.schema([CHUNKS_SCHEMA.field(n) for n in ("content_hash", "embed_text", "tokens", "media_file", "mime_type", "source")])


def _wave_bytes(table: pl.DataFrame, dims: int) -> int:
    """What a shard's chunks cost a wave: their texts (UTF-8 bytes), vectors and bookkeeping."""
    if table.height == 0:
        return 0  # an empty frame's text column may have no string type to measure
    text = int(table.get_column("embed_text").str.len_bytes().sum() or 0)
    return text + table.height * (max(dims, 1) * 4 + _ROW_BYTES)


def _embed_wave(settings, provider, ident, hooks, wave: list[tuple[str, pl.DataFrame]], counts: EmbedCounts, per_shard) -> list[tuple[str, pl.DataFrame]]:
    """The frames of one wave's shards, their vectors made now."""
    data = storage.of(settings)
    texts: dict[str, str] = {}
    tokens: dict[str, int] = {}
    shards_of: dict[str, set[str]] = defaultdict(set)
    media: dict[str, tuple[str, str, str, Path | None]] = {}  # content hash -> (abs path, mime, label, root)
    roots = {s.name: s.path for s in settings.sources}
    for shard, table in wave:
        counts.chunks += table.height
        for h, t, n, f, mime, src in table.iter_rows():
            texts.setdefault(h, t)
            tokens.setdefault(h, n)
            shards_of[h].add(shard)
            if f:
                media.setdefault(h, (f, mime, t, roots.get(src)))
    counts.unique += len(texts)
    vectors: dict[str, np.ndarray] = {}
    cache = EmbeddingCache(data.cache_path, settings.cache.max_entries) if settings.cache.enabled else None
    try:
        cached = _embed(settings, provider, ident, hooks, texts, tokens, shards_of, media, cache, vectors, counts)
    finally:
        if cache is not None:
            cache.close()
    del texts, shards_of, media
    return list(_frames([(s, t.get_column("content_hash")) for s, t in wave], vectors, ident.dims, cached, per_shard, tokens))


def _frames(
    columns: list[tuple[str, pl.Series]],
    vectors: dict[str, np.ndarray],
    dims: int,
    cached: set[str],
    per_shard: dict[str, dict[str, int]],
    tokens: Mapping[str, int],
) -> Iterator[tuple[str, pl.DataFrame]]:
    for s, column in columns:
        unique = set(column.to_list())
        # Chunks still in a running batch job get no vector yet: their files wait (memory_vectors skips them).
        hashes = sorted(h for h in unique if h in vectors)
        fresh = [h for h in hashes if h not in cached]
        # A shard in pieces adds up its pieces' numbers (a text two pieces share counts in both).
        got = per_shard.setdefault(s, {"chunks": 0, "unique": 0, "cached": 0, "embedded": 0, "tokens_total": 0})
        for k, v in (
            ("chunks", len(column)),
            ("unique", len(unique)),
            ("cached", len(hashes) - len(fresh)),
            ("embedded", len(fresh)),
            ("tokens_total", sum(tokens.get(h, 0) for h in fresh)),  # what this shard's new vectors cost in tokens
        ):
            got[k] += v
        # Stacked straight into float32: a copy after the stack (``astype``) held a shard's vectors
        # twice, +96 MB at a million chunks (62,500 to a shard).
        arr = np.stack([vectors[h] for h in hashes], dtype=np.float32) if hashes else np.zeros((0, dims), np.float32)
        yield s, _frame(hashes, arr, dims)


def _frame(hashes: list[str], arr: np.ndarray, dims: int) -> pl.DataFrame:
    import polars as pl

    vec = pa.FixedSizeListArray.from_arrays(pa.array(arr.reshape(-1), type=pa.float32()), dims)
    frame = pl.from_arrow(pa.Table.from_arrays([pa.array(hashes, type=pa.string()), vec], schema=embeddings_schema(dims)))
    assert isinstance(frame, pl.DataFrame)
    return frame


def _embed(settings, provider, ident, hooks, texts, tokens, shards_of, media, cache, vectors, counts: EmbedCounts) -> set[str]:
    """Fill ``vectors`` for ``texts``: the cache first, then native media, the batch API, live
    requests. Returns the content hashes whose vectors came from the cache."""
    keys = {h: cache_key(ident.provider, ident.model, ident.provider_key, ident.dims, h) for h in texts}
    if cache is not None and keys:
        hits = cache.get_many(list(keys.values()), ident.dims)
        vectors.update((h, hits[k]) for h, k in keys.items() if k in hits)
    cached = set(vectors)
    counts.cached += len(vectors)
    started = time.perf_counter()
    media_misses = [h for h in texts if h not in vectors and h in media]
    if media_misses:
        got = embed_media(provider, {h: media[h] for h in media_misses})
        vectors.update(got)
        media_misses = [h for h in media_misses if h in got]
        if cache is not None:
            cache.put_many((keys[h], vectors[h]) for h in media_misses)
        counts.embedded += len(media_misses)
        counts.media_embedded += len(media_misses)
    # A media file whose bytes could not be read natively gets no text vector in its place.
    misses = sorted((h for h in texts if h not in vectors and h not in media), key=lambda h: len(texts[h]))
    batched = embed_batched(
        settings,
        provider,
        ident,
        {h: texts[h] for h in misses},
        tokens,
        shards_of,
        # Every vector a job returns goes to the cache, also those of other shards' files: their runs find them there.
        on_vectors=(
            lambda got: cache.put_many((keys.get(h) or cache_key(ident.provider, ident.model, ident.provider_key, ident.dims, h), v) for h, v in got.items())
        )
        if cache is not None
        else None,
        on_submitted=lambda: hooks.at("batch_after_submit"),
    )
    if batched is not None:
        vectors.update((h, v) for h, v in batched.vectors.items() if h in texts)
        counts.batched = sum(1 for h in misses if h in vectors)
        counts.pending = len(batched.pending)
        # What the batch could not do (failed, expired beyond retry, disabled) is embedded live now.
        misses = [h for h in misses if h not in vectors and h not in batched.pending]
    slice_size = max(hooks.embed_slice, 1)
    # Progress over the waves so far: the total grows by each wave's misses.
    before = counts.embedded - counts.media_embedded
    total = before + len(misses)
    if misses:
        progress.report("embed", before, total, "chunks")
    for i in range(0, len(misses), slice_size):
        batch = misses[i : i + slice_size]
        out = provider.embed_documents([texts[h] for h in batch])
        if out.shape != (len(batch), ident.dims):
            raise ProviderError(f"provider returned vectors of shape {out.shape}, expected ({len(batch)}, {ident.dims})", provider=ident.provider)
        for h, v in zip(batch, out):
            vectors[h] = v
        if cache is not None:
            cache.put_many((keys[h], vectors[h]) for h in batch)
        counts.embedded += len(batch)
        counts.tokens_embedded += sum(tokens[h] for h in batch)
        progress.report("embed", counts.embedded - counts.media_embedded, total, "chunks")
        hooks.at("embed_after_first_batch")
    counts.seconds += time.perf_counter() - started
    if batched is not None:
        m = batched.metrics
        m.live_fallbacks, m.live_tokens, m.cache_hits = counts.embedded - counts.media_embedded, counts.tokens_embedded, counts.cached
        m.finish_costs()
        counts.batch = m.as_dict()
        counts.embedded += counts.batched
    if cache is not None and counts.embedded:
        cache.prune()
    return cached


__all__ = ["EmbedCounts", "embed_chunks"]
