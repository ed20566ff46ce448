"""What a run did: per-file problems, the typed run summary, and the no-op check.

The summary is built once from what the stages return (:class:`RunResults` collects
their counts during a run), never parsed back out of Dagster metadata. The CLI prints
it, ``index --json`` and the run records (``runs/last_run.json``, ``history.jsonl``)
store it as JSON (:meth:`RunSummary.as_dict`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from memory_pipeline import storage
from memory_pipeline.changes import EmbeddingIdentity, committed, fingerprint, manifest_fingerprints, shard_fingerprints
from memory_pipeline.discovery import SHARD_KEYS, classify, indexed_media_types, media_size_problem_of
from memory_pipeline.models import EXTRACTION_STATUS_SCHEMA, INDEXED_STATE_SCHEMA, MANIFEST_SCHEMA
from memory_pipeline.settings import Settings
from memory_pipeline.stages.chunk import ChunkCounts
from memory_pipeline.stages.discover import DiscoverCounts, check_table
from memory_pipeline.stages.embed import EmbedCounts
from memory_pipeline.stages.extract import ExtractCounts
from memory_pipeline.stages.write import WriteStats


def run_errors(settings: Settings, shards: Iterable[str]) -> list[dict]:
    """Every file not indexed for a reason: discovery skips and failures, extraction failures."""
    data = storage.of(settings)
    errors: list[dict] = []
    for shard in shards:
        manifest = {r["doc_id"]: r for r in data.read("source_files", shard, MANIFEST_SCHEMA).to_pylist()}
        for r in manifest.values():
            if r["status"] in ("skipped", "failed"):
                errors.append({"path": r["abs_path"], "source": r["source"], "status": r["status"], "reason": r["reason"]})
        for r in data.read("extracted_content", shard, EXTRACTION_STATUS_SCHEMA, ".status").to_pylist():
            if r["status"] == "failed" or r["reason"]:
                # An ok file with a reason was indexed in part (e.g. a PDF over the page cap).
                m = manifest.get(r["doc_id"], {})
                status = "failed" if r["status"] == "failed" else "partial"
                errors.append({"path": m.get("abs_path", r["doc_id"]), "source": m.get("source", ""), "status": status, "reason": r["reason"]})
    return sorted(errors, key=lambda e: e["path"])


@dataclass
class EmbedInfo:
    """How the run embedded: with which provider, why (a fallback), at what estimated cost."""

    provider: str = ""
    model: str = ""
    dims: int = 0
    mode: str = ""  # vector+fts | fts-only
    requested_provider: str = ""
    fallback_reason: str = ""
    est_cost_usd: float | None = 0.0
    tokens_total: int = 0  # live and batch tokens


@dataclass
class RunResults:
    """What each stage of one run returned; filled in by the assets as they finish."""

    discover: DiscoverCounts | None = None
    extract: ExtractCounts | None = None
    chunk: ChunkCounts | None = None
    embed: EmbedCounts | None = None
    embed_info: EmbedInfo | None = None
    write: WriteStats | None = None
    coverage: float | None = None
    error: BaseException | None = None  # the error of the step that failed the run (the last one raised)

    def failed(self, err: BaseException) -> None:
        self.error = err


@dataclass(frozen=True)
class RunSummary(Mapping):
    """One `memory index` run, as the CLI shows it and the records keep it.

    Read by attribute, or as a mapping with the keys of ``index --json``.
    """

    files_seen: int = 0
    files_changed: int = 0
    files_deleted: int = 0
    files_repaired: int = 0
    chunks_total: int = 0
    chunks_embedded: int = 0
    chunks_cached: int = 0
    tokens_embedded: int = 0
    est_cost_usd: float | None = 0.0
    rows_written: int = 0
    rows_deleted: int = 0
    table_rows: int = 0
    provider: str = ""
    model: str = ""
    dims: int = 0
    mode: str = ""
    batch: dict = field(default_factory=lambda: {"enabled": False})
    files_pending: int = 0
    requested_provider: str = ""
    fallback_reason: str = ""
    generation: str = ""
    generation_waits_for: list[str] = field(default_factory=list)  # building: files the new generation lacks (first 5)
    table: str = ""
    skipped_run: bool = False
    shards: list[str] = field(default_factory=list)  # the partitions this run worked on (files_* count their files)
    coverage: float | None = None
    errors: list[dict] = field(default_factory=list)
    run_id: str | None = None
    seconds: float = 0.0
    finished_at: str = ""

    @classmethod
    def of(cls, settings: Settings, results: RunResults, *, run_id: str | None, seconds: float, shards: Iterable[str] = SHARD_KEYS) -> RunSummary:
        d = results.discover or DiscoverCounts()
        c = results.chunk or ChunkCounts()
        e = results.embed or EmbedCounts()
        info = results.embed_info or EmbedInfo(requested_provider=settings.provider)
        w = results.write or WriteStats()
        return cls(
            files_seen=d.files_seen,
            files_changed=d.files_changed,
            files_deleted=d.files_deleted,
            files_repaired=d.files_repaired,
            chunks_total=c.chunks,
            chunks_embedded=e.embedded,
            chunks_cached=e.cached,
            tokens_embedded=info.tokens_total,
            est_cost_usd=info.est_cost_usd,
            rows_written=w.rows_written,
            rows_deleted=w.rows_deleted,
            table_rows=w.table_rows,
            provider=info.provider,
            model=info.model,
            dims=info.dims,
            mode=info.mode,
            batch=e.batch or {"enabled": False},
            files_pending=w.files_pending,
            requested_provider=info.requested_provider,
            fallback_reason=info.fallback_reason,
            generation=w.generation,
            generation_waits_for=list(w.generation_waits_for),
            table=w.table,
            shards=list(shards),
            coverage=results.coverage,
            errors=run_errors(settings, SHARD_KEYS),
            run_id=run_id,
            seconds=round(seconds, 3),
            finished_at=_now(),
        )

    @classmethod
    def combined(cls, parts: Sequence[RunSummary]) -> RunSummary:
        """Runs over disjoint shards, one after another, as one: their counts added up; the table,
        coverage, errors and identity as the last run left them."""
        from dataclasses import replace

        last = parts[-1]
        if len(parts) == 1:
            return last
        added = {name: sum(getattr(p, name) for p in parts) for name in _ADDED}
        cost = None if any(p.est_cost_usd is None for p in parts) else sum(p.est_cost_usd or 0.0 for p in parts)
        return replace(last, **added, est_cost_usd=cost, shards=[s for p in parts for s in p.shards])

    def with_timing(self, *, run_id: str | None, seconds: float) -> RunSummary:
        from dataclasses import replace

        return replace(self, run_id=run_id, seconds=round(seconds, 3), finished_at=_now())

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    # Mapping: the JSON shape, for scripts and older callers.
    def __getitem__(self, key: str) -> Any:
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)


_FIELDS = tuple(f.name for f in fields(RunSummary))
# What each run of a combined summary did on its own shards.
_ADDED = ("files_seen", "files_changed", "files_deleted", "files_repaired", "chunks_total", "chunks_embedded", "chunks_cached",
          "tokens_embedded", "rows_written", "rows_deleted", "files_pending")  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Settlement:
    """What a run would have to do: the shards with work (none: settled), and the no-op summary
    when settled."""

    shards: list[str]
    summary: RunSummary | None = None
    files_elsewhere: dict[str, int] = field(default_factory=dict)  # shard -> files its manifest lists


def settle(settings: Settings, ident: EmbeddingIdentity) -> Settlement:
    """Which shards have work since the last run: cheap, one stat walk and the small per-shard
    manifests and states, plus three narrow columns of the table; no model load, no Dagster.

    A shard is settled when every file's stat matches its manifest, every indexable file is
    committed to the table with the current chunking and model fingerprint (or failed
    extraction with unchanged content), no deletion is pending, and the table holds what the
    records say for its files. A missing source folder or a table of an older layout puts every
    shard to work.
    """
    data = storage.of(settings)
    every = list(SHARD_KEYS)
    if any(not s.path.is_dir() for s in settings.sources):
        return Settlement(every)
    fp = fingerprint(settings, ident)
    current = shard_fingerprints(settings)
    seen = manifest_fingerprints(settings, SHARD_KEYS)
    work = {s for s in SHARD_KEYS if current.get(s, "") != seen.get(s, "")}
    listed: dict[str, int] = {}
    for shard in SHARD_KEYS:
        if shard in work:
            continue
        manifest = data.read("source_files", shard, MANIFEST_SCHEMA).to_pylist()
        listed[shard] = len(manifest)
        if not _shard_settled(data, shard, manifest, fp, indexed_media_types(settings), settings.multimodal.max_file_bytes):
            work.add(shard)
    # The records say what is done: make sure the table agrees (a deleted or restored table is not settled).
    check = check_table(settings, ident, SHARD_KEYS)
    if check.upgrade:
        return Settlement(every)
    work |= {s for s, files in check.stale.items() if files} | {s for s, files in check.orphans.items() if files}
    work |= _building_work(settings, ident, fp)
    if work:
        ordered = [s for s in SHARD_KEYS if s in work]
        return Settlement(ordered, files_elsewhere={s: n for s, n in listed.items() if s not in work})
    summary = RunSummary(
        files_seen=sum(listed.values()),
        table_rows=check.table_rows,
        provider=ident.provider,
        model=ident.model,
        dims=ident.dims,
        mode="vector+fts" if ident.dims else "fts-only",
        requested_provider=settings.provider,
        skipped_run=True,
        shards=[],  # no shard had work (it listed all 16, as if each had)
        errors=run_errors(settings, SHARD_KEYS),
    )
    return Settlement([], summary, listed)


def _building_work(settings: Settings, ident: EmbeddingIdentity, fp: str) -> set[str]:
    """While this identity's generation builds, the shards of the files it waits for (see
    ``write.build_waits_for``): each run tries them again and says what the switch waits for. Settled
    on a failed file's unchanged content, every later run had been skipped, silent about the build,
    and a failure that clears without a change the walk sees (a permission fixed, a tool installed,
    a provider back) never let the switch happen."""
    from memory_pipeline.stages.write import waiting_rows
    from memory_pipeline.stores import generations

    building = generations.load(settings)["building"]
    if not building or generations.table_for(settings, ident.meta()) != building:
        return set()
    return {r["shard"] for r in waiting_rows(settings, fp)}


def _shard_settled(data: storage.DataStore, shard: str, manifest: list[dict], fp: str, media_types: tuple[str, ...], media_max: int) -> bool:
    state = {r["doc_id"]: r for r in data.read("memory_vectors", shard, INDEXED_STATE_SCHEMA, ".state").to_pylist()}
    status = data.read("extracted_content", shard, EXTRACTION_STATUS_SCHEMA, ".status").to_pylist()
    failed = {r["doc_id"] for r in status if r["status"] == "failed"}
    present = set()
    for row in manifest:
        if _selection_changed(row, media_types, media_max):
            return False  # multimodal.enabled / types / max_file_bytes changed what this file is
        if row["status"] == "skipped":
            continue
        present.add(row["doc_id"])
        if row["status"] == "ok" and not committed(row, state.get(row["doc_id"]), fp) and row["doc_id"] not in failed:
            return False
    return not (set(state) - present)


def _selection_changed(row: dict, media_types: tuple[str, ...], media_max: int) -> bool:
    """Whether the configuration now classifies a recorded file otherwise (indexed or skipped) than
    the run that recorded it: a media type turned on or off, or its size limit changed. The stat
    walk sees no change then, so without this a run was skipped: a type turned on stayed unindexed
    and one turned off stayed searchable, until `--force`."""
    if row["walk_status"] != "ok" or row["status"] not in ("ok", "skipped") or not row["modality"]:
        return False
    now, _ = classify(row["mime_type"], row["modality"], row["path"], media_types)
    if now == "ok" and media_size_problem_of(row["modality"], row["size"], media_max):
        now = "skipped"
    return now != row["status"]


def records_match_table(settings: Settings, table_rows: int, recorded: int, fingerprints: set[str]) -> str:
    """'' when the table searches read holds as many rows as the records say, or when no verdict can
    be given; else what is wrong. A verdict only when every record is of the configured model's
    fingerprint and that model's generation is the current one, not building: after a rollback, or
    while a new generation builds, the records describe two tables."""
    from memory_pipeline.changes import EmbeddingIdentity
    from memory_pipeline.errors import MemoryPipelineError
    from memory_pipeline.providers.registry import resolve_provider
    from memory_pipeline.stores import generations

    if table_rows == recorded:
        return ""
    try:
        ident = EmbeddingIdentity.of(resolve_provider(settings))
    except MemoryPipelineError:
        return ""
    state = generations.load(settings)
    current = state["current"]
    if state["building"] or (current and generations.table_for(settings, ident.meta()) != current):
        return ""
    if fingerprints - {fingerprint(settings, ident)}:
        return ""
    return f"the table holds {table_rows} rows where the index records say {recorded} (rows deleted or restored outside a run)"


def indexed_by_source(settings: Settings) -> tuple[dict[str, dict], int, set[str]]:
    """Per source, from the last records: ``files`` seen, ``indexed_files`` (the version on disk is
    in the index), ``stale_files`` (an older version's rows stand in: the file fails now) and
    ``chunks``; and the chunks the records say the tables hold, in all. (`memory status` had counted
    every record as an indexed file, a stale one and a missing source folder's own record included.)"""
    data = storage.of(settings)
    per: dict[str, dict] = {s.name: {"files": 0, "indexed_files": 0, "stale_files": 0, "chunks": 0} for s in settings.sources}
    recorded = 0
    fingerprints: set[str] = set()
    for shard in SHARD_KEYS:
        seen = {r["doc_id"]: r for r in data.read("source_files", shard, MANIFEST_SCHEMA).to_pylist() if r["path"]}
        for row in seen.values():
            per.setdefault(row["source"], {"files": 0, "indexed_files": 0, "stale_files": 0, "chunks": 0})["files"] += 1
        for row in data.read("memory_vectors", shard, INDEXED_STATE_SCHEMA, ".state").to_pylist():
            recorded += row["chunks"]
            fingerprints.add(row["fingerprint"])
            file = seen.get(row["doc_id"])
            if file is None:
                continue  # deleted since: the next run removes its rows
            entry = per[file["source"]]
            entry["chunks"] += row["chunks"]
            entry["indexed_files" if row["sha256"] == file["sha256"] else "stale_files"] += 1
    return per, recorded, fingerprints


def settled_summary(settings: Settings, ident: EmbeddingIdentity) -> RunSummary | None:
    """The summary of a no-op run when nothing changed since the last one, else None (see :func:`settle`)."""
    return settle(settings, ident).summary


__all__ = ["EmbedInfo", "RunResults", "RunSummary", "Settlement", "indexed_by_source", "records_match_table", "run_errors", "settle", "settled_summary"]
