"""Stage 1, ``source_files``: walk the sources, decide per file what this run does.

Produces per shard the manifest (one row per file: stat, hash, type, status, action),
one shard at a time, and records the deletions (files gone since the last run) beside
it. Before deciding, the table is checked against the records (:func:`check_table`):
files whose rows were lost or changed are indexed again and rows no record knows are
removed.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from memory_pipeline import storage
from memory_pipeline.changes import EmbeddingIdentity, committed, decide, file_sha256, fingerprint, same_stat
from memory_pipeline.discovery import DiscoveredFile, assess, forget_name_checks, missing_sources, shard_of, walk_all
from memory_pipeline.errors import StoreError
from memory_pipeline.models import DELETIONS_SCHEMA, EXTRACTION_STATUS_SCHEMA, INDEXED_STATE_SCHEMA, KEPT, MANIFEST_SCHEMA, frame_of
from memory_pipeline.settings import Settings
from memory_pipeline.stores import generations
from memory_pipeline.stores.lance import DOC_FTS_COLUMN, VectorStore

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger("memory_pipeline")


@dataclass
class TableCheck:
    """Where the table no longer holds what the records (``memory_vectors/<shard>.state``) say."""

    stale: dict[str, set[str]] = field(default_factory=dict)  # shard -> files whose rows are missing or other
    orphans: dict[str, set[str]] = field(default_factory=dict)  # shard -> files with rows but no record
    table_rows: int = 0
    reason: str = ""
    upgrade: str = ""  # why the table's layout is older than this version's (filled in by the next write)

    @property
    def ok(self) -> bool:
        return not any(self.stale.values()) and not any(self.orphans.values()) and not self.upgrade

    @property
    def files(self) -> int:
        return sum(len(v) for v in self.stale.values()) + sum(len(v) for v in self.orphans.values())


def check_table(settings: Settings, ident: EmbeddingIdentity, shards: Sequence[str]) -> TableCheck:
    """Compare the table with the records, file by file: row count and file content hash.

    Catches a deleted or damaged table folder, rows deleted by hand and an older version
    restored (its rows carry an older file hash). Reads three narrow columns, no vectors.
    """
    data = storage.of(settings)
    check = TableCheck()
    store = VectorStore(data.lancedb_uri, generations.table_for(settings, ident.meta()))
    present = True
    try:
        if not store.exists():
            present, check.reason = False, f"table {store.table_name} is missing"
    except StoreError as err:
        present, check.reason = False, str(err)
    fp = fingerprint(settings, ident)
    # No generation of this identity is current or building: a file recorded as indexed for it is in
    # a table that is not served or built any more (rolled back from, or an abandoned build), so it
    # is indexed again, into the generation the run creates. Trusted, these records had made that
    # generation complete, and current, with the few files changed since (issue: a rollback, then a
    # run with the rolled-back model, switched to a nearly empty table).
    elsewhere = not generations.holds_identity(settings, ident.meta())
    table_rows = 0
    # A shard at a time, the table's rows of it counted per file in Arrow: a no-op run over a
    # million chunks had turned all of them into Python strings at once (peak 644 MB at 1M
    # against 227 MB at 100k).
    for shard in shards:
        held: dict[str, tuple[int, set[str]]] = {}
        if present:
            try:
                rows = store.doc_rows([shard])
            except StoreError as err:
                present, check.reason = False, str(err)
            else:
                table_rows += rows.num_rows
                held = _held(rows)
                del rows
        state = data.read("memory_vectors", shard, INDEXED_STATE_SCHEMA, ".state").to_pylist()
        recorded = {r["doc_id"] for r in state}
        stale = set()
        for r in state:
            if r["fingerprint"] != fp:
                continue  # indexed for another identity: re-indexed anyway
            if elsewhere:
                stale.add(r["doc_id"])
                continue
            n, got = held.get(r["doc_id"], (0, set()))
            want = {file_sha256(r["sha256"])} if r["chunks"] else set()
            if n != r["chunks"] or got != want:
                stale.add(r["doc_id"])
        check.stale[shard] = stale
        check.orphans[shard] = {d for d in held if d not in recorded}
    if present:
        check.table_rows = table_rows
    _orphans_recorded_elsewhere(data, check, shards)
    if present and store.lacks_document_text():
        # An older table: not settled, so the next run reaches the write stage, which fills the
        # document texts in place from the table's own rows (nothing is read or embedded again).
        check.upgrade = f"table {store.table_name} lacks the document texts of full-text search ({DOC_FTS_COLUMN})"
    if not check.ok and not check.reason:
        check.reason = check.upgrade if check.files == 0 else f"table {store.table_name} does not hold what the index records say"
    return check


def _orphans_recorded_elsewhere(data, check: TableCheck, shards: Sequence[str]) -> None:
    """A file with rows in a shard other than the one that records it (rows copied or restored by
    hand): its rows there are orphans, whose removal deletes the file's rows everywhere, so the
    shard that records it re-indexes it too. Only read when there are orphans."""
    orphans = set().union(*check.orphans.values()) if check.orphans else set()
    if not orphans:
        return
    for shard in shards:
        state = data.read("memory_vectors", shard, INDEXED_STATE_SCHEMA, ".state").column("doc_id").to_pylist()
        check.stale[shard] |= orphans.intersection(state)


def _held(rows: pa.Table) -> dict[str, tuple[int, set[str]]]:
    """Per file of ``rows`` (``VectorStore.doc_rows``): its row count and its rows' file hashes."""
    if not rows.num_rows:
        return {}
    every = pc.CountOptions(mode="all")
    per_doc = rows.group_by("doc_id").aggregate([("file_sha256", "count", every), ("file_sha256", "distinct", every)])
    docs = per_doc.column("doc_id").to_pylist()
    counts = per_doc.column("file_sha256_count").to_pylist()
    hashes = per_doc.column("file_sha256_distinct").to_pylist()
    return {d: (n, set(h)) for d, n, h in zip(docs, counts, hashes, strict=True)}


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
    settings: Settings,
    shards: Sequence[str],
    *,
    force: bool,
    fp: str,
    ident: EmbeddingIdentity | None = None,
    counts: DiscoverCounts | None = None,
) -> Iterator[tuple[str, pl.DataFrame]]:
    """Stat-walk every source, hash only what changed, decide per file: index, unchanged or nothing.

    Yields ``(shard, manifest)`` for every shard, in order, as each is decided (hashing
    happens as the caller consumes); the shard's deletions are recorded
    (``source_files/<shard>.deletions``) before its manifest is yielded. ``counts`` is
    filled in as it goes. With ``ident``, the table is first checked against the records:
    files whose rows are missing or hold other content are re-indexed, rows of files no
    record knows are removed.
    """
    counts = counts if counts is not None else DiscoverCounts()
    data = storage.of(settings)
    wanted = set(shards)
    check = check_table(settings, ident, shards) if ident is not None and not force else None
    if check is not None and check.files:
        log.warning("%s: repairing %d files (re-indexed from the cache where it has their vectors)", check.reason, check.files)
    elif check is not None and check.upgrade:
        log.info("%s: added by this run's write stage", check.upgrade)
    by_shard: dict[str, list[DiscoveredFile]] = defaultdict(list)
    # Folders whose files were not seen this time, per source ("" for the whole source): the rows of
    # the files under them are kept. An unmounted disk (the source folder missing) or a folder that
    # cannot be listed (permissions, a disk error) must not wipe what was indexed from it.
    unseen: dict[str, list[str]] = defaultdict(list)
    for f in walk_all(settings):
        if f.unlisted:
            unseen[f.source].append("" if f.path == "./" else f.path.rstrip("/") + "/")
        if f.shard in wanted:
            by_shard[f.shard].append(f)
    # The walk's name checks were for this walk (and the settle's before it): the stages after it need none.
    forget_name_checks()
    for s, why in missing_sources(settings):
        unseen[s.name].append("")
        shard = shard_of(s.name, "")
        if shard in wanted:
            by_shard[shard].append(DiscoveredFile(s.name, "", str(s.path), shard, 0, 0, 0, "failed", f"source folder {why}; its indexed rows are kept"))
    for shard in shards:
        prev = {r["doc_id"]: r for r in data.read("source_files", shard, MANIFEST_SCHEMA).to_pylist()}
        state = {r["doc_id"]: r for r in data.read("memory_vectors", shard, INDEXED_STATE_SCHEMA, ".state").to_pylist()}
        orphans: set[str] = set()
        if check is not None and not check.ok:
            stale = check.stale.get(shard, set())
            orphans = check.orphans.get(shard, set())
            counts.files_repaired += len(stale) + len(orphans)
            if stale:
                # The record is wrong: forget it now, so these files are indexed again.
                state = {d: r for d, r in state.items() if d not in stale}
                data.write_rows(sorted(state.values(), key=lambda r: r["doc_id"]), INDEXED_STATE_SCHEMA, "memory_vectors", shard, ".state")
                orphans |= stale
        walked = by_shard.get(shard, [])
        failed_before = {r["doc_id"] for r in data.read("extracted_content", shard, EXTRACTION_STATUS_SCHEMA, ".status").to_pylist() if r["status"] == "failed"}
        rows = [
            manifest_row(f, prev.get(f.doc_id), state.get(f.doc_id), settings, force=force, fp=fp, counts=counts, failed_before=f.doc_id in failed_before)
            for f in walked
        ]
        # A file under a folder not seen this time keeps its last record as well as its rows: not
        # seen is not gone (coverage and the checks still count it, and nothing is indexed again).
        seen = {f.doc_id for f in walked}
        rows += [_kept(r, state.get(d), fp, counts) for d, r in prev.items() if d not in seen and r["path"] and _unseen(d, unseen)]
        # A file that fails keeps its last good rows; a path shown in place of a name (escaped or
        # redacted) keeps none: no file of that name is there now, so its rows are a gone file's
        # (a real ``caf\xe9.md`` deleted, the Latin-1 ``caf<E9>.md`` beside it is shown so again).
        present_ok = {r["doc_id"] for r, f in zip(rows, walked) if r["status"] != "skipped" and not f.shown}
        # A row another program wrote may have any doc_id: one without "source:" is an orphan too.
        deletions = [
            {"doc_id": d, "source": d.partition(":")[0] if ":" in d else "", "path": d.partition(":")[2] if ":" in d else d}
            for d in sorted(set(state) | orphans)
            if d not in present_ok and not _unseen(d, unseen)
        ]
        counts.files_deleted += len(deletions)
        data.write_rows(deletions, DELETIONS_SCHEMA, "source_files", shard, ".deletions")
        yield shard, frame_of(rows, MANIFEST_SCHEMA)


def _unseen(doc: str, unseen: Mapping[str, list[str]]) -> bool:
    """Whether a file's ``source:path`` lies under a folder that was not seen this run."""
    source, _, path = doc.partition(":")
    return any(folder == "" or path.startswith(folder) for folder in unseen.get(source, ()))


def _kept(prev: dict, state: dict | None, fp: str, counts: DiscoverCounts) -> dict:
    """The last record of a file under a folder that was not seen this run: unchanged when the
    table holds that version, else failed (it cannot be read now). Its ``walk_status`` is
    :data:`KEPT`: the walk did not see it (the settle check leaves it out, and a forced run does
    not replace its shard whole, which would drop its rows)."""
    row = dict(prev) | {"walk_status": KEPT}
    if row["status"] == "ok" and committed(row, state, fp):
        row["action"] = "unchanged"
        counts.files_unchanged += 1
    elif row["status"] != "skipped":
        row.update(status="failed", action="none", reason="its folder cannot be read now; the rows of its last indexed version are kept")
        counts.files_failed += 1
    return row


def manifest_row(
    f: DiscoveredFile, prev: dict | None, state: dict | None, settings: Settings, *, force: bool, fp: str, counts: DiscoverCounts, failed_before: bool = False
) -> dict:
    """The manifest row of one walked file, counted in ``counts``. ``failed_before``: its last
    extraction failed; with its content unchanged since, it is tried again but not counted as
    changed (each run of its shard counted it again)."""
    counts.files_seen += 1
    known = None
    if f.status == "ok" and prev is not None and same_stat(prev, f.size, f.mtime_ns, f.inode):
        known = (prev["sha256"], prev["mime_type"], prev["modality"])
    facts = assess(f, settings, known=known)
    if f.status == "ok" and known is None:
        if facts.sha256:
            counts.files_hashed += 1
            counts.bytes_hashed += facts.size
    row = {
        "doc_id": f.doc_id,
        "source": f.source,
        "path": f.path,
        "abs_path": f.abs_path,
        "shard": f.shard,
        "size": facts.size,
        "mtime_ns": facts.mtime_ns,
        "inode": facts.inode,
        "sha256": facts.sha256,
        "mime_type": facts.mime,
        "modality": facts.modality,
        "status": facts.status,
        "reason": facts.reason,
        "action": "none",
        "walk_status": facts.walk_status,
    }
    if row["status"] == "ok":
        counts.files_ok += 1
        row["action"] = decide(row["sha256"], state, fp, force=force)
        retried = failed_before and not force and prev is not None and prev["sha256"] == row["sha256"] and prev["status"] == "ok"
        if row["action"] == "index" and not retried:
            counts.files_changed += 1
        else:
            counts.files_unchanged += 1
    elif row["status"] == "skipped":
        counts.files_skipped += 1
    else:
        counts.files_failed += 1
    return row


__all__ = ["DiscoverCounts", "TableCheck", "check_table", "discover", "manifest_row"]
