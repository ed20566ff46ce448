"""Change detection: what makes a file, a chunk or a vector the same as last time.

Pure functions over settings, walk results and the records the stages keep; no I/O
beyond the stat walk in :func:`shard_fingerprints` and the small Parquet records read
through the storage layer in :func:`manifest_fingerprints`.

- :class:`EmbeddingIdentity` says when vectors are comparable (provider, model, dims, key).
- :func:`fingerprint` is what a file is indexed *with*: chunker version, chunk budget,
  identity. A file is re-indexed when its content hash or this fingerprint changed.
- :func:`chunk_id` is the stable id of a chunk.
- :func:`decide` is the per-file decision of a run: ``index`` or ``unchanged``.
- :func:`shard_fingerprints` / :func:`manifest_fingerprints`: a cheap per-partition digest
  of a stat walk and of what the last run saw (the sensor and the no-op check compare them).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memory_pipeline import storage
from memory_pipeline.chunking import CHUNKER_REVISION, CHUNKER_VERSION
from memory_pipeline.discovery import walk_all
from memory_pipeline.models import KEPT, MANIFEST_SCHEMA

if TYPE_CHECKING:
    from memory_pipeline.providers.registry import ResolvedProvider
    from memory_pipeline.settings import Settings


@dataclass(frozen=True)
class EmbeddingIdentity:
    """What makes vectors comparable: provider, model, dims and the provider key (no secrets)."""

    provider: str
    model: str
    dims: int
    provider_key: str
    max_input_tokens: int | None

    @classmethod
    def of(cls, resolved: ResolvedProvider) -> EmbeddingIdentity:
        p = resolved.provider
        if p is None:
            return cls("none", "none", 0, "none", None)
        return cls(p.name, p.model, p.dims, p.provider_key, p.max_input_tokens)

    def meta(self) -> dict:
        return {"provider": self.provider, "model": self.model, "dims": self.dims, "provider_key": self.provider_key}


def chunk_budget(settings: Settings, ident: EmbeddingIdentity) -> tuple[int, int]:
    """(tokens, overlap) for chunking: the configured size, capped below the model's real limit."""
    tokens = settings.chunking.tokens
    if ident.max_input_tokens:
        # cl100k and word-piece counts differ; the exact model check in chunking catches the rest.
        tokens = min(tokens, int(ident.max_input_tokens * 0.8))
    overlap = min(settings.chunking.overlap, tokens // 4)
    return tokens, overlap


def fingerprint(settings: Settings, ident: EmbeddingIdentity) -> str:
    """What every file of the index is chunked and embedded with; a change re-indexes all files."""
    tokens, overlap = chunk_budget(settings, ident)
    raw = f"{CHUNKER_VERSION}.{CHUNKER_REVISION}|{tokens}|{overlap}|{ident.provider}|{ident.model}|{ident.dims}|{ident.provider_key}"
    if settings.multimodal.enabled and settings.multimodal.native:
        raw += "|native-media"  # turning native media vectors on or off re-embeds the media files
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def chunk_id(source: str, path: str, locator: str, content_hash: str, occurrence: int = 0) -> str:
    """Stable id of a chunk. ``occurrence`` counts earlier chunks of the same file with the same
    locator and text (pieces of one long repetitive line): position is part of identity, so ids
    are unique by construction, while every other chunk keeps the id it always had."""
    raw = f"{source}\0{path}\0{locator}\0{content_hash}\0{CHUNKER_VERSION}"
    if occurrence:
        raw += f"\0{occurrence}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def file_sha256(manifest_sha: str) -> str:
    """The file's own SHA-256 from a manifest ``sha256`` (which may carry a note tag)."""
    return manifest_sha.split("+", 1)[0]


def same_stat(prev: dict | None, size: int, mtime_ns: int, inode: int) -> bool:
    """The file looks untouched since the last manifest (so its hash and type are reused)."""
    return prev is not None and prev["size"] == size and prev["mtime_ns"] == mtime_ns and prev["inode"] == inode and bool(prev["sha256"])


def decide(sha256: str, state: dict | None, fp: str, *, force: bool) -> str:
    """``index`` when the table does not hold this content with this fingerprint (or forced), else ``unchanged``."""
    indexed = state is not None and state["sha256"] == sha256 and state["fingerprint"] == fp
    return "index" if force or not indexed else "unchanged"


def committed(row: dict, state: dict | None, fp: str) -> bool:
    """The table holds this manifest row's content, indexed with fingerprint ``fp``."""
    return state is not None and state["sha256"] == row["sha256"] and state["fingerprint"] == fp


def _digest(items: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()[:16]


def shard_fingerprints(settings: Settings) -> dict[str, str]:
    """A cheap fingerprint per shard from a stat walk (no reading): what the sensor compares."""
    parts: dict[str, list[str]] = defaultdict(list)
    for f in walk_all(settings):
        parts[f.shard].append(f"{f.doc_id}|{f.size}|{f.mtime_ns}|{f.inode}|{f.status}")
    return {s: _digest(v) for s, v in parts.items()}


def manifest_fingerprints(settings: Settings, shards: Iterable[str]) -> dict[str, str]:
    """The same fingerprint computed from the last manifests (their stored walk status): what the last run saw."""
    data = storage.of(settings)
    out = {}
    for s in shards:
        rows = data.read("source_files", s, MANIFEST_SCHEMA).to_pylist()
        if rows:
            # A record kept while its folder cannot be listed is not what the walk sees.
            out[s] = _digest(f"{r['doc_id']}|{r['size']}|{r['mtime_ns']}|{r['inode']}|{r['walk_status']}" for r in rows if r["walk_status"] != KEPT)
    return out


__all__ = [
    "EmbeddingIdentity",
    "chunk_budget",
    "chunk_id",
    "committed",
    "decide",
    "file_sha256",
    "fingerprint",
    "manifest_fingerprints",
    "same_stat",
    "shard_fingerprints",
]
