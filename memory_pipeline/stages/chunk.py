"""Stage 3, ``memory_chunks``: token-aware chunks with stable ids, never over the model's input limit.

Takes the manifests and the segments (shard -> frame) and yields the chunks one shard
at a time, in pieces of whole files. A file whose chunking fails gets that reason in its
extraction status (where every reader of per-file outcomes looks); the other files are chunked.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memory_pipeline import storage
from memory_pipeline.changes import EmbeddingIdentity, chunk_budget, chunk_id, file_sha256
from memory_pipeline.chunking import chunk_segments, locator_for
from memory_pipeline.discovery import MEDIA_MODALITIES
from memory_pipeline.errors import ProviderError
from memory_pipeline.models import CHUNKS_SCHEMA, EXTRACTION_STATUS_SCHEMA, SEGMENTS_SCHEMA, Segment, frame_of
from memory_pipeline.providers.base import EmbeddingProvider
from memory_pipeline.settings import Settings
from memory_pipeline.stages.media import NATIVE_MODALITIES, media_label, native_media_enabled, native_problem

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa


@dataclass
class ChunkCounts:
    files: int = 0
    chunks: int = 0
    tokens: int = 0
    max_model_tokens: int = 0
    failed: int = 0
    failures: list[dict] = field(default_factory=list)


def make_chunks(
    settings: Settings,
    manifests: Mapping[str, pl.DataFrame],
    segments: Mapping[str, pl.DataFrame],
    provider: EmbeddingProvider | None,
    ident: EmbeddingIdentity,
    counts: ChunkCounts | None = None,
) -> Iterator[tuple[str, pl.DataFrame]]:
    """Yield ``(shard, chunks)`` per shard of ``segments``, a shard in pieces of whole files (about
    ``storage.PIECE_ROWS`` chunks each, its segments read a piece at a time too); chunks never
    exceed the provider's real input limit."""
    data = storage.of(settings)
    budget, overlap = chunk_budget(settings, ident)
    count_model = provider.count_tokens if provider is not None else None
    limit = provider.max_input_tokens if provider is not None else None
    native = native_media_enabled(settings, provider)
    counts = counts if counts is not None else ChunkCounts()
    for shard in segments:
        failed: dict[str, str] = {}
        not_native: dict[str, str] = {}  # media files embedded from derived text instead, and why
        manifest = {r["doc_id"]: r for r in manifests[shard].iter_rows(named=True)}
        rows: list[dict] = []
        for doc, doc_segments in _documents(storage.pieces(segments, shard, SEGMENTS_SCHEMA)):
            if len(rows) >= storage.PIECE_ROWS:
                # A piece of whole files: the shard's chunks file is written as it is made.
                yield shard, frame_of(rows, CHUNKS_SCHEMA)
                rows = []
            m = manifest[doc]
            counts.files += 1
            try:
                chunks = chunk_segments(
                    m["modality"],
                    doc_segments,
                    budget=budget,
                    overlap=overlap,
                    model_limit=limit,
                    count_model=count_model,
                    title=os.path.basename(m["path"]) if m["modality"] in MEDIA_MODALITIES else "",
                )
            except ProviderError:
                raise  # the model's tokenizer failed: not this file's fault
            except Exception as err:  # noqa: BLE001 - one file's failure, whatever it is, is that file's error
                failed[doc] = f"chunking failed: {type(err).__name__}: {err}"
                counts.failed += 1
                continue
            # Documents (docx, ...) are text only; media go natively when the model takes them, else say why not.
            goes_native = native and m["modality"] in NATIVE_MODALITIES
            problem = native_problem(m["mime_type"], m["size"], doc_segments) if goes_native else ""
            if problem:
                not_native[doc] = f"not embedded natively ({problem}); indexed from its derived text"
            rows.extend(_chunk_rows(m, shard, chunks, doc_segments, goes_native and not problem, count_model))
            counts.chunks += len(chunks)
            counts.tokens += sum(c.tokens for c in chunks)
            counts.max_model_tokens = max([counts.max_model_tokens, *(c.model_tokens for c in chunks)])
        if failed or not_native:
            # Recorded where every reader of per-file outcomes looks (run errors, coverage, checks):
            # a failure fails the file; a native fallback marks it indexed in part, with the reason.
            status = data.read("extracted_content", shard, EXTRACTION_STATUS_SCHEMA, ".status").to_pylist()
            for r in status:
                if r["doc_id"] in failed:
                    r.update(status="failed", reason=failed[r["doc_id"]])
                elif r["doc_id"] in not_native:
                    r.update(reason="; ".join(x for x in (r["reason"], not_native[r["doc_id"]]) if x))
            data.write_rows(status, EXTRACTION_STATUS_SCHEMA, "extracted_content", shard, ".status")
            counts.failures.extend({"path": manifest[d]["abs_path"], "reason": r} for d, r in failed.items())
        yield shard, frame_of(rows, CHUNKS_SCHEMA)


def _documents(tables: Iterator[pa.Table]) -> Iterator[tuple[str, list[Segment]]]:
    """Each file's segments, in the order of the shard's segments (a file's are consecutive), read
    a piece at a time: a file whose segments run on into the next piece is completed from it."""
    doc: str | None = None
    found: list[Segment] = []
    for table in tables:
        for r in (r for batch in table.to_batches(max_chunksize=1024) for r in batch.to_pylist()):
            if r["doc_id"] != doc:
                if doc is not None:
                    yield doc, found
                doc, found = r["doc_id"], []
            found.append(Segment(r["text"], r["line_start"], r["line_end"], r["label"], r["kind"] or ""))
        del table
    if doc is not None:
        yield doc, found


def _chunk_rows(m: dict, shard: str, chunks, segments: list[Segment], native: bool, count_model=None) -> list[dict]:
    rows = []
    seen: dict[tuple[str, str], int] = defaultdict(int)
    for c in chunks:
        embed_text = c.embed_text
        media_file = ""
        if native and c.kind == "media":
            # The file itself: its bytes, labelled with its name, note, description and derived text.
            embed_text = media_label(m["path"], segments, count_model)
            media_file = m["abs_path"]
        content_hash = hashlib.sha256(embed_text.encode()).hexdigest()
        if media_file:
            content_hash = hashlib.sha256(f"native\0{file_sha256(m['sha256'])}\0{embed_text}".encode()).hexdigest()
        locator = locator_for(m["modality"], c.line_start, c.line_end, c.kind)
        occurrence = seen[(locator, content_hash)]
        seen[(locator, content_hash)] += 1
        rows.append(
            {
                "chunk_id": chunk_id(m["source"], m["path"], locator, content_hash, occurrence),
                "doc_id": m["doc_id"],
                "source": m["source"],
                "path": m["path"],
                "shard": shard,
                "chunk_index": c.index,
                "heading": c.heading,
                "text": c.text,
                "embed_text": embed_text,
                "content_hash": content_hash,
                "line_start": c.line_start,
                "line_end": c.line_end,
                "locator": locator,
                "tokens": c.tokens,
                "modality": m["modality"],
                "mime_type": m["mime_type"],
                "file_sha256": file_sha256(m["sha256"]),
                "file_mtime_ns": m["mtime_ns"],
                "media_file": media_file,
            }
        )
    return rows


__all__ = ["ChunkCounts", "make_chunks"]
