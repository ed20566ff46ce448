"""The stages of the index as plain functions over one or more partitions (shards).

Each stage reads its upstream Parquet files under ``<data_dir>/assets`` and writes
its own, atomically (temp file + rename). Nothing here knows about Dagster; the
assets in ``defs/`` call these and report the returned counts.

Crash safety: the record of what the table holds (``memory_vectors/<shard>.state``)
is written only after the table commit. A run killed anywhere before that is
simply redone by the next run: rows are keyed by chunk id (idempotent) and
vectors already computed come back from the cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from memory_pipeline import progress
from memory_pipeline.batching.stage import embed_batched
from memory_pipeline.chunking import CHUNKER_VERSION, chunk_segments, locator_for
from memory_pipeline.discovery import (
    MEDIA_MODALITIES,
    NOTE_SUFFIX,
    DiscoveredFile,
    classify,
    indexed_media_types,
    inspect_file,
    media_size_problem,
    shard_of,
    sniff,
    walk_all,
)
from memory_pipeline.errors import ExtractionError, ProviderError
from memory_pipeline.extraction import MediaOptions, extract, shutdown_worker
from memory_pipeline.models import (
    CHUNKS_SCHEMA,
    DELETIONS_SCHEMA,
    EXTRACTION_STATUS_SCHEMA,
    INDEXED_STATE_SCHEMA,
    MANIFEST_SCHEMA,
    SEGMENTS_SCHEMA,
    Segment,
    embeddings_schema,
)
from memory_pipeline.providers.base import EmbeddingProvider
from memory_pipeline.safeio import UnsafeFileError, open_file
from memory_pipeline.providers.registry import ResolvedProvider
from memory_pipeline.settings import Settings
from memory_pipeline.stores import generations
from memory_pipeline.stores.cache import EmbeddingCache, cache_key
from memory_pipeline.stores.lance import FTS_COLUMN, VectorStore, table_schema

log = logging.getLogger("memory_pipeline")

EMBED_SLICE = 512  # vectors are checkpointed to the cache after every slice
EMBED_SLICE_ENV = "MEMORY_PIPELINE_EMBED_SLICE"
FAULT_ENV = "MEMORY_PIPELINE_FAULT"


def _fault(point: str) -> None:
    # Test hook: kill this process with SIGKILL at a named point to prove crash recovery.
    if os.environ.get(FAULT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


# --- files -------------------------------------------------------------------------------


def asset_path(settings: Settings, asset: str, shard: str, suffix: str = "") -> Path:
    return settings.assets_dir / asset / f"{shard}{suffix}.parquet"


def _write(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _read(path: Path, schema: pa.Schema) -> pa.Table:
    """The asset file, or an empty table when it is missing.

    A damaged file (truncated, overwritten) is moved aside and read as empty: every
    asset is derived data, so the stages that read it redo the work it recorded
    (a lost state record means those files are re-indexed, never that rows are trusted).
    """
    if not path.is_file():
        return schema.empty_table()
    try:
        return pq.read_table(path, schema=schema)
    except (pa.ArrowException, OSError, ValueError) as err:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(path, aside)
        except OSError:
            pass
        log.warning("%s is damaged (%s); moved aside to %s and rebuilt", path, type(err).__name__, aside.name)
        return schema.empty_table()


def read_manifest(settings: Settings, shard: str) -> pa.Table:
    return _read(asset_path(settings, "source_files", shard), MANIFEST_SCHEMA)


def read_deletions(settings: Settings, shard: str) -> pa.Table:
    return _read(asset_path(settings, "source_files", shard, ".deletions"), DELETIONS_SCHEMA)


def read_extraction_status(settings: Settings, shard: str) -> pa.Table:
    return _read(asset_path(settings, "extracted_content", shard, ".status"), EXTRACTION_STATUS_SCHEMA)


def read_chunks(settings: Settings, shard: str) -> pa.Table:
    return _read(asset_path(settings, "memory_chunks", shard), CHUNKS_SCHEMA)


def read_state(settings: Settings, shard: str) -> pa.Table:
    return _read(asset_path(settings, "memory_vectors", shard, ".state"), INDEXED_STATE_SCHEMA)


# --- identity ----------------------------------------------------------------------------


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
    tokens, overlap = chunk_budget(settings, ident)
    raw = f"{CHUNKER_VERSION}|{tokens}|{overlap}|{ident.provider}|{ident.model}|{ident.dims}|{ident.provider_key}"
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


# --- stage 1: source_files ---------------------------------------------------------------


@dataclass
class TableCheck:
    """Where the table no longer holds what the records (``memory_vectors/<shard>.state``) say."""

    stale: dict[str, set[str]] = field(default_factory=dict)  # shard -> files whose rows are missing or other
    orphans: dict[str, set[str]] = field(default_factory=dict)  # shard -> files with rows but no record
    table_rows: int = 0
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not any(self.stale.values()) and not any(self.orphans.values())

    @property
    def files(self) -> int:
        return sum(len(v) for v in self.stale.values()) + sum(len(v) for v in self.orphans.values())


def check_table(settings: Settings, ident: EmbeddingIdentity, shards: Sequence[str]) -> TableCheck:
    """Compare the table with the records, file by file: row count and file content hash.

    Catches a deleted or damaged table folder, rows deleted by hand and an older version
    restored (its rows carry an older file hash). Reads three narrow columns, no vectors.
    """
    from memory_pipeline.errors import StoreError

    check = TableCheck()
    store = VectorStore(settings.lancedb_uri, generations.table_for(settings, ident.meta()))
    try:
        rows = store.doc_rows(shards) if store.exists() else None
    except StoreError as err:
        rows, check.reason = None, str(err)
    if rows is None and not check.reason:
        check.reason = f"table {store.table_name} is missing"
    fp = fingerprint(settings, ident)
    held: dict[str, tuple[int, set[str]]] = {}
    held_in: dict[str, set[str]] = defaultdict(set)  # shard -> files with rows there
    if rows is not None:
        check.table_rows = rows.num_rows
        counts: dict[str, int] = defaultdict(int)
        hashes: dict[str, set[str]] = defaultdict(set)
        cols = (rows.column(c).to_pylist() for c in ("doc_id", "file_sha256", "shard"))
        for d, h, sh in zip(*cols):
            counts[d] += 1
            hashes[d].add(h)
            held_in[sh].add(d)
        held = {d: (counts[d], hashes[d]) for d in counts}
    for shard in shards:
        state = read_state(settings, shard).to_pylist()
        recorded = {r["doc_id"] for r in state}
        stale = set()
        for r in state:
            if r["fingerprint"] != fp:
                continue  # indexed for another identity: re-indexed anyway
            n, got = held.get(r["doc_id"], (0, set()))
            want = {file_sha256(r["sha256"])} if r["chunks"] else set()
            if n != r["chunks"] or got != want:
                stale.add(r["doc_id"])
        check.stale[shard] = stale
        check.orphans[shard] = {d for d in held_in.get(shard, ()) if d not in recorded}
    if not check.ok and not check.reason:
        check.reason = f"table {store.table_name} does not hold what the index records say"
    return check


@dataclass
class DiscoverCounts:
    files_seen: int = 0
    files_ok: int = 0
    files_changed: int = 0
    files_unchanged: int = 0
    files_deleted: int = 0
    files_skipped: int = 0
    files_failed: int = 0
    files_hashed: int = 0
    bytes_hashed: int = 0
    files_repaired: int = 0  # files re-indexed or removed because the table lost or changed their rows


def discover(
    settings: Settings, shards: Sequence[str], *, force: bool, fp: str, ident: EmbeddingIdentity | None = None
) -> DiscoverCounts:
    """Stat-walk every source, hash only what changed, decide per file: index, unchanged or nothing.

    With ``ident``, the table is first checked against the records: files whose rows are
    missing or hold other content are re-indexed, rows of files no record knows are removed.
    """
    wanted = set(shards)
    check = check_table(settings, ident, shards) if ident is not None and not force else None
    if check is not None and not check.ok:
        log.warning("%s: repairing %d files (re-indexed from the cache where it has their vectors)", check.reason, check.files)
    by_shard: dict[str, list[DiscoveredFile]] = defaultdict(list)
    for f in walk_all(settings):
        if f.shard in wanted:
            by_shard[f.shard].append(f)
    counts = DiscoverCounts()
    # A source folder that is missing (an unmounted disk) must not wipe its rows from the index.
    missing = {s.name: s.path for s in settings.sources if not s.path.is_dir()}
    for name, path in missing.items():
        shard = shard_of(name, "")
        if shard in wanted:
            by_shard[shard].append(
                DiscoveredFile(name, "", str(path), shard, 0, 0, 0, "failed", "source folder not found; its indexed rows are kept")
            )
    for shard in shards:
        prev = {r["doc_id"]: r for r in read_manifest(settings, shard).to_pylist()}
        state = {r["doc_id"]: r for r in read_state(settings, shard).to_pylist()}
        orphans: set[str] = set()
        if check is not None and not check.ok:
            stale = check.stale.get(shard, set())
            orphans = check.orphans.get(shard, set())
            counts.files_repaired += len(stale) + len(orphans)
            if stale:
                # The record is wrong: forget it now, so these files are indexed again.
                state = {d: r for d, r in state.items() if d not in stale}
                _write(
                    pa.Table.from_pylist(sorted(state.values(), key=lambda r: r["doc_id"]), schema=INDEXED_STATE_SCHEMA),
                    asset_path(settings, "memory_vectors", shard, ".state"),
                )
                orphans |= stale
        rows: list[dict] = []
        for f in by_shard.get(shard, []):
            rows.append(_manifest_row(f, prev.get(f.doc_id), state.get(f.doc_id), force, fp, counts, settings))
        present_ok = {r["doc_id"] for r in rows if r["status"] != "skipped"}
        deletions = [
            {"doc_id": d, "source": d.split(":", 1)[0], "path": d.split(":", 1)[1]}
            for d in sorted(set(state) | orphans)
            if d not in present_ok and d.split(":", 1)[0] not in missing
        ]
        counts.files_deleted += len(deletions)
        _write(pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA), asset_path(settings, "source_files", shard))
        _write(
            pa.Table.from_pylist(deletions, schema=DELETIONS_SCHEMA),
            asset_path(settings, "source_files", shard, ".deletions"),
        )
    return counts


def _note_tag(abs_path: str, root: Path | None) -> str:
    """A media file's note (``<file>.note.md``) is part of what it is indexed from: its stat
    joins the file's content hash, so editing the note re-indexes the file. A note that is a
    link out of the source folder is no note (extraction refuses it the same way)."""
    try:
        with open_file(abs_path + NOTE_SUFFIX, root) as note:
            st = note.stat
    except (OSError, ExtractionError):
        return ""
    return f"+note:{st.st_size}:{st.st_mtime_ns}"


def _source_names(settings: Settings) -> set[str]:
    return {s.name for s in settings.sources}


def file_sha256(manifest_sha: str) -> str:
    """The file's own SHA-256 from a manifest ``sha256`` (which may carry a note tag)."""
    return manifest_sha.split("+", 1)[0]


def _manifest_row(
    f: DiscoveredFile,
    prev: dict | None,
    state: dict | None,
    force: bool,
    fp: str,
    counts: DiscoverCounts,
    settings: Settings | None = None,
) -> dict:
    counts.files_seen += 1
    row = {
        "doc_id": f.doc_id,
        "source": f.source,
        "path": f.path,
        "abs_path": f.abs_path,
        "shard": f.shard,
        "size": f.size,
        "mtime_ns": f.mtime_ns,
        "inode": f.inode,
        "sha256": "",
        "mime_type": "",
        "modality": "",
        "status": f.status,
        "reason": f.reason,
        "action": "none",
    }
    if f.status != "ok" and f.path:
        # Not read (empty, too large, a link out of the root): typed by its name, for coverage by modality.
        row["mime_type"], row["modality"] = sniff(b"", f.path)
    root = settings.source(f.source).path if settings is not None and f.source in _source_names(settings) else None
    if f.status == "ok":
        same_stat = (
            prev is not None
            and prev["size"] == f.size
            and prev["mtime_ns"] == f.mtime_ns
            and prev["inode"] == f.inode
            and prev["sha256"]
        )
        try:
            if same_stat:
                row["sha256"], row["mime_type"], row["modality"] = file_sha256(prev["sha256"]), prev["mime_type"], prev["modality"]
            else:
                # One contained open: the type, the hash and the stat all describe the same file.
                facts = inspect_file(f.abs_path, f.path, root)
                row["mime_type"], row["modality"], row["sha256"] = facts.mime, facts.modality, facts.sha256
                row["size"], row["mtime_ns"], row["inode"] = facts.size, facts.mtime_ns, facts.inode
                counts.files_hashed += 1
                counts.bytes_hashed += facts.size
            media_types = indexed_media_types(settings) if settings is not None else ()
            row["status"], row["reason"] = classify(row["mime_type"], row["modality"], f.path, media_types)
            if row["modality"] in MEDIA_MODALITIES:
                row["sha256"] += _note_tag(f.abs_path, root)
                too_big = media_size_problem(settings, row["modality"], f.size) if settings is not None else ""
                if row["status"] == "ok" and too_big:
                    row["status"], row["reason"] = "skipped", too_big
        except UnsafeFileError as err:  # a link out of the folder or a FIFO, seen only when opened
            row["status"], row["reason"] = "skipped", err.reason
        except PermissionError:
            row["status"], row["reason"] = "failed", "permission denied"
        except OSError as err:
            row["status"], row["reason"] = "failed", f"cannot read: {err.strerror or err}"
        except ExtractionError as err:
            row["status"], row["reason"] = "failed", err.reason
    if row["status"] == "ok":
        counts.files_ok += 1
        indexed = state is not None and state["sha256"] == row["sha256"] and state["fingerprint"] == fp
        row["action"] = "index" if force or not indexed else "unchanged"
        if row["action"] == "index":
            counts.files_changed += 1
        else:
            counts.files_unchanged += 1
    elif row["status"] == "skipped":
        counts.files_skipped += 1
    else:
        counts.files_failed += 1
    return row


# --- stage 2: extracted_content ----------------------------------------------------------


@dataclass
class ExtractCounts:
    files: int = 0
    extracted: int = 0
    failed: int = 0
    segments: int = 0
    chars: int = 0
    failures: list[dict] = field(default_factory=list)


def extract_content(settings: Settings, shards: Sequence[str]) -> ExtractCounts:
    """Extract text segments for every file marked ``index``; failures are recorded, never raised."""
    counts = ExtractCounts()
    options = MediaOptions.from_settings(settings)
    todo = {s: [r for r in read_manifest(settings, s).to_pylist() if r["action"] == "index"] for s in shards}
    total = sum(len(v) for v in todo.values())
    roots = {s.name: s.path for s in settings.sources}
    try:
        _extract_shards(settings, shards, todo, roots, options, counts, total)
    finally:
        shutdown_worker()  # the media worker (if one was started) ends with the stage
    return counts


def _extract_shards(settings: Settings, shards, todo, roots, options, counts: ExtractCounts, total: int) -> None:
    done = 0
    if total:
        progress.report("extract", 0, total, "files")
    for shard in shards:
        seg_rows: list[dict] = []
        status_rows: list[dict] = []
        for row in todo[shard]:
            counts.files += 1
            try:
                segments = extract(row["abs_path"], row["modality"], row["mime_type"], options, roots.get(row["source"]))
            except Exception as err:  # noqa: BLE001 - one file's failure, whatever it is, is that file's error
                reason = err.reason if isinstance(err, ExtractionError) else f"extraction failed unexpectedly: {type(err).__name__}: {err}"
                counts.failed += 1
                counts.failures.append({"path": row["abs_path"], "reason": reason})
                status_rows.append({"doc_id": row["doc_id"], "status": "failed", "reason": reason, "segments": 0, "chars": 0})
                done += 1
                progress.report("extract", done, total, "files")
                continue
            counts.extracted += 1
            chars = sum(len(s.text) for s in segments)
            counts.segments += len(segments)
            counts.chars += chars
            warning = getattr(segments, "warning", "")  # indexed in part (a PDF over the page cap)
            status_rows.append({"doc_id": row["doc_id"], "status": "ok", "reason": warning, "segments": len(segments), "chars": chars})
            for i, seg in enumerate(segments):
                seg_rows.append(
                    {
                        "doc_id": row["doc_id"],
                        "seg_index": i,
                        "text": seg.text,
                        "line_start": seg.line_start,
                        "line_end": seg.line_end,
                        "label": seg.label,
                        "kind": seg.kind,
                    }
                )
            done += 1
            progress.report("extract", done, total, "files")
        _write(pa.Table.from_pylist(seg_rows, schema=SEGMENTS_SCHEMA), asset_path(settings, "extracted_content", shard))
        _write(
            pa.Table.from_pylist(status_rows, schema=EXTRACTION_STATUS_SCHEMA),
            asset_path(settings, "extracted_content", shard, ".status"),
        )


# --- stage 3: memory_chunks --------------------------------------------------------------


@dataclass
class ChunkCounts:
    files: int = 0
    chunks: int = 0
    tokens: int = 0
    max_model_tokens: int = 0
    failed: int = 0
    failures: list[dict] = field(default_factory=list)


def make_chunks(settings: Settings, shards: Sequence[str], provider: EmbeddingProvider | None, ident: EmbeddingIdentity) -> ChunkCounts:
    """Chunk every extracted file; chunks never exceed the provider's real input limit."""
    budget, overlap = chunk_budget(settings, ident)
    count_model = provider.count_tokens if provider is not None else None
    limit = provider.max_input_tokens if provider is not None else None
    native = native_media_enabled(settings, provider)
    counts = ChunkCounts()
    for shard in shards:
        failed: dict[str, str] = {}
        manifest = {r["doc_id"]: r for r in read_manifest(settings, shard).to_pylist()}
        segs_by_doc: dict[str, list[Segment]] = defaultdict(list)
        seg_table = _read(asset_path(settings, "extracted_content", shard), SEGMENTS_SCHEMA)
        for r in seg_table.to_pylist():
            segs_by_doc[r["doc_id"]].append(Segment(r["text"], r["line_start"], r["line_end"], r["label"], r["kind"] or ""))
        rows: list[dict] = []
        for doc, segments in segs_by_doc.items():
            m = manifest[doc]
            counts.files += 1
            try:
                chunks = chunk_segments(
                    m["modality"],
                    segments,
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
            seen: dict[tuple[str, str], int] = defaultdict(int)
            for c in chunks:
                embed_text = c.embed_text
                media_file = ""
                if native and c.kind == "media" and native_media_ok(m["mime_type"], m["size"]):
                    # The file itself: its bytes, labelled with its name, note and description.
                    embed_text = media_label(m["path"], segments)
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
                        "doc_id": doc,
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
            counts.chunks += len(chunks)
            counts.tokens += sum(c.tokens for c in chunks)
            counts.max_model_tokens = max([counts.max_model_tokens, *(c.model_tokens for c in chunks)])
        _write(pa.Table.from_pylist(rows, schema=CHUNKS_SCHEMA), asset_path(settings, "memory_chunks", shard))
        if failed:
            # Recorded where every reader of per-file outcomes looks (run errors, coverage, checks).
            status_path = asset_path(settings, "extracted_content", shard, ".status")
            status = read_extraction_status(settings, shard).to_pylist()
            for r in status:
                if r["doc_id"] in failed:
                    r.update(status="failed", reason=failed[r["doc_id"]])
            _write(pa.Table.from_pylist(status, schema=EXTRACTION_STATUS_SCHEMA), status_path)
            counts.failures.extend({"path": manifest[d]["abs_path"], "reason": r} for d, r in failed.items())
    return counts


# --- native media ------------------------------------------------------------------------

# What gemini-embedding-2 takes as inline data; other media (and all documents) are embedded from text.
NATIVE_MIME_TYPES = frozenset(
    {
        "image/png", "image/jpeg", "image/webp", "image/heic", "image/heif",
        "audio/mpeg", "audio/wav", "audio/ogg", "audio/opus", "audio/flac", "audio/aac", "audio/mp4",
        "video/mp4", "video/quicktime", "video/webm", "application/pdf",
    }
)  # fmt: skip
NATIVE_MAX_REQUEST_BYTES = 20 * 1024 * 1024  # inline data travels base64-encoded: 4 bytes per 3
NATIVE_SLICE_BYTES = 16 * 1024 * 1024  # raw bytes held in memory per native request


def native_media_enabled(settings: Settings, provider: EmbeddingProvider | None) -> bool:
    mm = settings.multimodal
    return bool(mm.enabled and mm.native and provider is not None and provider.supports_multimodal and hasattr(provider, "embed_media"))


def native_media_ok(mime: str, size: int) -> bool:
    """Sent natively only in a type the model takes and when its base64 fits one request."""
    return mime in NATIVE_MIME_TYPES and (size + 2) // 3 * 4 <= NATIVE_MAX_REQUEST_BYTES


def media_label(path: str, segments: Sequence[Segment]) -> str:
    """The text part sent with the media bytes: file name, the user's note, what the file is."""
    parts = [os.path.basename(path)]
    parts += [s.text for s in segments if s.kind == "note"]
    parts += [s.text for s in segments if s.kind == "media"]
    return "\n".join(p.strip() for p in parts if p.strip())


def _embed_media(provider, items: dict[str, tuple[str, str, str, Path | None]]) -> dict[str, np.ndarray]:
    """Native vectors by content hash for (abs_path, mime, label, source root) items.

    Bytes are read one request's worth at a time through one contained open: a file that
    became a link out of its folder (or vanished) since discovery gets no vector, so its
    file keeps its current rows and is tried again by the next run.
    """
    from memory_pipeline.providers.gemini import MediaItem

    vectors: dict[str, np.ndarray] = {}
    batch: list = []
    keys: list[str] = []
    size = 0

    def flush() -> None:
        for k, v in zip(keys, provider.embed_media(batch)):
            vectors[k] = v

    for h, (abs_path, mime, label, root) in items.items():
        try:
            with open_file(abs_path, root) as fh:
                data = fh.pread(fh.size)
        except (OSError, ExtractionError) as err:
            log.warning("%s: not embedded natively: %s", abs_path, getattr(err, "reason", None) or err)
            continue
        if batch and size + len(data) > NATIVE_SLICE_BYTES:
            flush()
            batch, keys, size = [], [], 0
        batch.append(MediaItem(label=label, data=data, mime_type=mime))
        keys.append(h)
        size += len(data)
    if batch:
        flush()
    return vectors


# --- stage 4: chunk_embeddings -----------------------------------------------------------


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


def embed_chunks(
    settings: Settings, shards: Sequence[str], provider: EmbeddingProvider | None, ident: EmbeddingIdentity
) -> EmbedCounts:
    """Vectors for every chunk of the changed files: cache first, then the provider, corpus-wide."""
    counts = EmbedCounts(dims=ident.dims)
    chunk_tables = {s: read_chunks(settings, s) for s in shards}
    if provider is None:
        for s in shards:
            _write(embeddings_schema(1).empty_table(), asset_path(settings, "chunk_embeddings", s))
        return counts
    texts: dict[str, str] = {}
    tokens: dict[str, int] = {}
    shards_of: dict[str, set[str]] = defaultdict(set)
    media: dict[str, tuple[str, str, str, Path | None]] = {}  # content hash -> (abs path, mime, label, root)
    roots = {s.name: s.path for s in settings.sources}
    for shard, table in chunk_tables.items():
        counts.chunks += table.num_rows
        for h, t, n, f, mime, src in zip(
            table.column("content_hash").to_pylist(),
            table.column("embed_text").to_pylist(),
            table.column("tokens").to_pylist(),
            table.column("media_file").to_pylist(),
            table.column("mime_type").to_pylist(),
            table.column("source").to_pylist(),
        ):
            texts.setdefault(h, t)
            tokens.setdefault(h, n)
            shards_of[h].add(shard)
            if f:
                media.setdefault(h, (f, mime, t, roots.get(src)))
    counts.unique = len(texts)
    keys = {h: cache_key(ident.provider, ident.model, ident.provider_key, ident.dims, h) for h in texts}
    vectors: dict[str, np.ndarray] = {}
    cache = EmbeddingCache(settings.cache_path, settings.cache.max_entries) if settings.cache.enabled else None
    try:
        if cache is not None and keys:
            hits = cache.get_many(list(keys.values()), ident.dims)
            for h, k in keys.items():
                if k in hits:
                    vectors[h] = hits[k]
        counts.cached = len(vectors)
        started = time.perf_counter()
        media_misses = [h for h in texts if h not in vectors and h in media]
        if media_misses:
            got = _embed_media(provider, {h: media[h] for h in media_misses})
            vectors.update(got)
            media_misses = [h for h in media_misses if h in got]
            if cache is not None:
                cache.put_many((keys[h], vectors[h]) for h in media_misses)
            counts.embedded += len(media_misses)
            counts.media_embedded += len(media_misses)
        # A media file whose bytes could not be read natively gets no text vector in its place.
        misses = sorted((h for h in texts if h not in vectors and h not in media), key=lambda h: len(texts[h]))
        pending: set[str] = set()

        def _key(h: str) -> str:
            return keys.get(h) or cache_key(ident.provider, ident.model, ident.provider_key, ident.dims, h)

        batched = embed_batched(
            settings,
            provider,
            ident,
            {h: texts[h] for h in misses},
            tokens,
            shards_of,
            # Every vector a job returns goes to the cache, also those of other shards' files: their runs find them there.
            on_vectors=(lambda got: cache.put_many((_key(h), v) for h, v in got.items())) if cache is not None else None,
            on_submitted=lambda: _fault("batch_after_submit"),
        )
        if batched is not None:
            vectors.update((h, v) for h, v in batched.vectors.items() if h in texts)
            pending = batched.pending
            counts.batched = sum(1 for h in misses if h in vectors)
            counts.pending = len(pending)
            # What the batch could not do (failed, expired beyond retry, disabled) is embedded live now.
            misses = [h for h in misses if h not in vectors and h not in pending]
        slice_size = max(int(os.environ.get(EMBED_SLICE_ENV, EMBED_SLICE)), 1)
        if misses:
            progress.report("embed", 0, len(misses), "chunks")
        for i in range(0, len(misses), slice_size):
            batch = misses[i : i + slice_size]
            out = provider.embed_documents([texts[h] for h in batch])
            if out.shape != (len(batch), ident.dims):
                raise ProviderError(
                    f"provider returned vectors of shape {out.shape}, expected ({len(batch)}, {ident.dims})",
                    provider=ident.provider,
                )
            for h, v in zip(batch, out):
                vectors[h] = v
            if cache is not None:
                cache.put_many((keys[h], vectors[h]) for h in batch)
            counts.embedded += len(batch)
            counts.tokens_embedded += sum(tokens[h] for h in batch)
            progress.report("embed", counts.embedded, len(misses), "chunks")
            _fault("embed_after_first_batch")
        counts.seconds = time.perf_counter() - started
        if batched is not None:
            m = batched.metrics
            m.live_fallbacks, m.live_tokens, m.cache_hits = counts.embedded - counts.media_embedded, counts.tokens_embedded, counts.cached
            m.finish_costs()
            counts.batch = m.as_dict()
            counts.embedded += counts.batched
        if cache is not None and counts.embedded:
            cache.prune()
    finally:
        if cache is not None:
            cache.close()
    schema = embeddings_schema(ident.dims)
    for s, table in chunk_tables.items():
        # Chunks still in a running batch job get no vector yet: their files wait (memory_vectors skips them).
        hashes = sorted(h for h in set(table.column("content_hash").to_pylist()) if h in vectors)
        arr = np.stack([vectors[h] for h in hashes]).astype(np.float32) if hashes else np.zeros((0, ident.dims), np.float32)
        vec = pa.FixedSizeListArray.from_arrays(pa.array(arr.reshape(-1), type=pa.float32()), ident.dims)
        _write(pa.Table.from_arrays([pa.array(hashes, type=pa.string()), vec], schema=schema), asset_path(settings, "chunk_embeddings", s))
    return counts


# --- stage 5: memory_vectors -------------------------------------------------------------


@dataclass
class WriteStats:
    files_replaced: int = 0
    files_deleted: int = 0
    rows_written: int = 0
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    commits: int = 0
    table_rows: int = 0
    fts: str = ""
    table: str = ""
    generation: str = ""  # current | building | switched (the new generation became current)
    files_pending: int = 0  # files whose vectors are still in a running batch job
    ann: str = ""  # exact (below ann.min_rows), built, current


def _search_text(heading: str, text: str, path: str) -> str:
    # The file name is searchable too: people remember "the note from 2026-11-02".
    stem = os.path.splitext(os.path.basename(path))[0].replace("-", " ").replace("_", " ")
    return "\n".join(p for p in (heading, text, stem) if p)


def write_vectors(
    settings: Settings, shards: Sequence[str], ident: EmbeddingIdentity, *, recreate: bool = False, force: bool = False
) -> WriteStats:
    """Replace each changed file's rows in one commit, remove deleted files, keep FTS current.

    A forced run replaces its shards whole, which also repairs what no per-file write
    can see (duplicated ids, rows of files the index lost track of).
    """
    stats = WriteStats()
    # A changed model/provider/dims writes a new generation; searches keep the current one meanwhile.
    table_name, building = generations.write_target(settings, ident.meta())
    stats.table, stats.generation = table_name, "building" if building else "current"
    store = VectorStore(settings.lancedb_uri, table_name)
    store.ensure(ident.dims, ident.meta(), recreate=recreate)
    fp = fingerprint(settings, ident)
    now = datetime.now(timezone.utc)
    for done, shard in enumerate(shards, start=1):
        manifest = {r["doc_id"]: r for r in read_manifest(settings, shard).to_pylist()}
        ext_status = read_extraction_status(settings, shard).to_pylist()
        replaced = [r["doc_id"] for r in ext_status if r["status"] == "ok"]
        deleted = read_deletions(settings, shard).column("doc_id").to_pylist()
        chunks = read_chunks(settings, shard)
        waiting = _docs_waiting_for_vectors(settings, shard, chunks, ident)
        if waiting:
            # Their vectors are in a batch job still running: they keep their current rows until it is in.
            chunks = chunks.filter(pa.compute.invert(pa.compute.is_in(chunks.column("doc_id"), pa.array(sorted(waiting)))))
            replaced = [d for d in replaced if d not in waiting]
            stats.files_pending += len(waiting)
        rows = _table_rows(chunks, settings, shard, ident, now)
        whole = force and not waiting
        counts = store.replace_shard(rows, shard) if whole else store.replace_docs(rows, replaced + deleted)
        _fault("write_after_first_commit")
        stats.files_replaced += len(replaced)
        stats.files_deleted += len(deleted)
        stats.rows_inserted += counts.inserted
        stats.rows_updated += counts.updated
        stats.rows_written += counts.inserted + counts.updated
        stats.rows_deleted += counts.deleted
        stats.commits += counts.commits
        # Record what the table now holds, only after the commit succeeded.
        state = {r["doc_id"]: r for r in read_state(settings, shard).to_pylist()}
        if whole:
            state = {}
        for d in deleted:
            state.pop(d, None)
        per_doc = defaultdict(int)
        for d in chunks.column("doc_id").to_pylist():
            per_doc[d] += 1
        for d in replaced:
            state[d] = {"doc_id": d, "sha256": manifest[d]["sha256"], "fingerprint": fp, "chunks": per_doc.get(d, 0)}
        _write(
            pa.Table.from_pylist(sorted(state.values(), key=lambda r: r["doc_id"]), schema=INDEXED_STATE_SCHEMA),
            asset_path(settings, "memory_vectors", shard, ".state"),
        )
        progress.report("write", done, len(shards), "partitions")
    if stats.commits or force:
        stats.fts = store.ensure_fts(settings.fts, rebuild=force).get("fts", "")
        stats.ann = store.ensure_ann(settings.ann).get("ann", "")
    else:
        stats.fts = "unchanged"
        stats.ann = "unchanged"
    stats.table_rows = store.count_rows()
    if building and build_complete(settings, fp):
        generations.switch(settings, table_name)
        stats.generation = "switched"
    return stats


def _media_type(modality: str) -> str | None:
    if modality not in MEDIA_MODALITIES:
        return None
    return modality if modality in ("image", "audio", "video") else "document"


def build_complete(settings: Settings, fp: str) -> bool:
    """Every indexable file of every shard is in the table of fingerprint ``fp`` (or failed to extract)."""
    from memory_pipeline.discovery import SHARD_KEYS

    for shard in SHARD_KEYS:
        state = {r["doc_id"]: r["fingerprint"] for r in read_state(settings, shard).to_pylist()}
        failed = {r["doc_id"] for r in read_extraction_status(settings, shard).to_pylist() if r["status"] == "failed"}
        for row in read_manifest(settings, shard).to_pylist():
            if row["status"] == "ok" and state.get(row["doc_id"]) != fp and row["doc_id"] not in failed:
                return False
    return True


def _docs_waiting_for_vectors(settings: Settings, shard: str, chunks: pa.Table, ident: EmbeddingIdentity) -> set[str]:
    """Files of the shard with a chunk that has no vector yet (a ``wait: false`` batch still running)."""
    if ident.dims <= 0 or chunks.num_rows == 0:
        return set()
    path = asset_path(settings, "chunk_embeddings", shard)
    have = set(pq.read_table(path, columns=["content_hash"]).column("content_hash").to_pylist()) if path.is_file() else set()
    return {d for d, h in zip(chunks.column("doc_id").to_pylist(), chunks.column("content_hash").to_pylist()) if h not in have}


def _table_rows(chunks: pa.Table, settings: Settings, shard: str, ident: EmbeddingIdentity, now: datetime) -> pa.Table:
    schema = table_schema(ident.dims, ident.meta())
    if chunks.num_rows == 0:
        return schema.empty_table()
    n = chunks.num_rows
    src_roots = {s.name: s.path for s in settings.sources}
    c = chunks.to_pydict()
    data = {
        "chunk_id": c["chunk_id"],
        "doc_id": c["doc_id"],
        "source": c["source"],
        "path": c["path"],
        "shard": c["shard"],
        "chunk_index": c["chunk_index"],
        "heading": c["heading"],
        "text": c["text"],
        FTS_COLUMN: [_search_text(h, t, p) for h, t, p in zip(c["heading"], c["text"], c["path"])],
        "content_hash": c["content_hash"],
        "line_start": c["line_start"],
        "line_end": c["line_end"],
        "locator": c["locator"],
        "tokens": c["tokens"],
        "modality": c["modality"],
        "mime_type": c["mime_type"],
        "memory_type": ["media" if m in MEDIA_MODALITIES else "text" for m in c["modality"]],
        "media_type": [_media_type(m) for m in c["modality"]],
        "original_file_path": [str(src_roots[s] / p) for s, p in zip(c["source"], c["path"])],
        "file_sha256": c["file_sha256"],
        "created_at": [datetime.fromtimestamp(m / 1e9, timezone.utc) for m in c["file_mtime_ns"]],
        "indexed_at": [now] * n,
        "embedding_model": [ident.model] * n,
    }
    if ident.dims > 0:
        emb = pq.read_table(asset_path(settings, "chunk_embeddings", shard), schema=embeddings_schema(ident.dims))
        index = {h: i for i, h in enumerate(emb.column("content_hash").to_pylist())}
        flat = emb.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, ident.dims)
        take = np.array([index[h] for h in c["content_hash"]], dtype=np.int64)
        vecs = flat[take].astype(np.float32)
        data["vector"] = pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), type=pa.float32()), ident.dims)
    return pa.table(data, schema=schema)


# --- reporting ---------------------------------------------------------------------------


def run_errors(settings: Settings, shards: Iterable[str]) -> list[dict]:
    """Every file not indexed for a reason: discovery skips and failures, extraction failures."""
    errors: list[dict] = []
    for shard in shards:
        manifest = {r["doc_id"]: r for r in read_manifest(settings, shard).to_pylist()}
        for r in manifest.values():
            if r["status"] in ("skipped", "failed"):
                errors.append({"path": r["abs_path"], "source": r["source"], "status": r["status"], "reason": r["reason"]})
        for r in read_extraction_status(settings, shard).to_pylist():
            if r["status"] == "failed" or r["reason"]:
                # An ok file with a reason was indexed in part (e.g. a PDF over the page cap).
                m = manifest.get(r["doc_id"], {})
                status = "failed" if r["status"] == "failed" else "partial"
                errors.append({"path": m.get("abs_path", r["doc_id"]), "source": m.get("source", ""), "status": status, "reason": r["reason"]})
    return sorted(errors, key=lambda e: e["path"])


def reset_index_state(settings: Settings) -> None:
    """Forget what the table holds (it is being rebuilt), so every shard re-indexes."""
    folder = settings.assets_dir / "memory_vectors"
    if folder.is_dir():
        for f in folder.glob("*.state.parquet"):
            f.unlink()


def shard_fingerprints(settings: Settings) -> dict[str, str]:
    """A cheap fingerprint per shard from a stat walk (no reading): what the sensor compares."""
    parts: dict[str, list[str]] = defaultdict(list)
    for f in walk_all(settings):
        parts[f.shard].append(f"{f.doc_id}|{f.size}|{f.mtime_ns}|{f.inode}|{f.status}")
    return {s: hashlib.sha256("\n".join(sorted(v)).encode()).hexdigest()[:16] for s, v in parts.items()}


def manifest_fingerprints(settings: Settings, shards: Iterable[str]) -> dict[str, str]:
    """The same fingerprint computed from the last manifests: what the last run saw."""
    out = {}
    for s in shards:
        rows = read_manifest(settings, s).to_pylist()
        if rows:
            items = [
                f"{r['doc_id']}|{r['size']}|{r['mtime_ns']}|{r['inode']}|{'skipped' if r['status'] == 'skipped' else ('failed' if r['reason'].startswith('cannot stat') else 'ok')}"
                for r in rows
            ]
            out[s] = hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()[:16]
    return out


def settled_summary(settings: Settings) -> dict | None:
    """The summary of a no-op run when nothing changed since the last one, else None.

    Cheap: one stat walk and the small per-shard manifests and states; no model, no
    table, no Dagster. "Settled" means every file's stat matches the last manifest,
    every indexable file is committed to the table with the current chunking and
    model fingerprint (or failed extraction with unchanged content), and no
    deletion is pending.
    """
    from memory_pipeline.discovery import SHARD_KEYS
    from memory_pipeline.providers.registry import resolve_provider

    try:
        resolved = resolve_provider(settings)
    except Exception:  # let the full run report provider problems properly
        return None
    ident = EmbeddingIdentity.of(resolved)
    fp = fingerprint(settings, ident)
    if any(not s.path.is_dir() for s in settings.sources):
        return None
    current = shard_fingerprints(settings)
    seen = manifest_fingerprints(settings, SHARD_KEYS)
    if current != seen:
        return None
    files_seen = 0
    table_rows = 0
    for shard in SHARD_KEYS:
        manifest = read_manifest(settings, shard).to_pylist()
        state = {r["doc_id"]: r for r in read_state(settings, shard).to_pylist()}
        table_rows += sum(r["chunks"] for r in state.values())
        failed = {r["doc_id"] for r in read_extraction_status(settings, shard).to_pylist() if r["status"] == "failed"}
        files_seen += len(manifest)
        present = set()
        for row in manifest:
            if row["status"] == "skipped":
                continue
            present.add(row["doc_id"])
            if row["status"] != "ok":
                continue
            st = state.get(row["doc_id"])
            committed = st is not None and st["sha256"] == row["sha256"] and st["fingerprint"] == fp
            if not committed and row["doc_id"] not in failed:
                return None
        if set(state) - present:
            return None
    # The records say all is done: make sure the table agrees (a deleted or restored table is not settled).
    check = check_table(settings, ident, SHARD_KEYS)
    if not check.ok:
        return None
    table_rows = check.table_rows
    store_meta = {"provider": ident.provider, "model": ident.model, "dims": ident.dims}
    return {
        "files_seen": files_seen,
        "files_changed": 0,
        "files_deleted": 0,
        "files_repaired": 0,
        "chunks_total": 0,
        "chunks_embedded": 0,
        "chunks_cached": 0,
        "tokens_embedded": 0,
        "est_cost_usd": 0.0,
        "rows_written": 0,
        "rows_deleted": 0,
        "table_rows": table_rows,
        **store_meta,
        "mode": "vector+fts" if ident.dims else "fts-only",
        "skipped_run": True,
        "errors": run_errors(settings, SHARD_KEYS),
    }
