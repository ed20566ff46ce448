"""Index coverage with DuckDB: the manifest, the errors and the LanceDB table, side by side.

``refresh_analytics`` rebuilds ``<data_dir>/analytics.duckdb``: copies of the
Parquet assets' records (``source_files``, ``extraction_status``,
``indexed_state``) and of the run ledgers (``runs``, ``embedding_usage``), a
vector-free snapshot of the table's rows, and the derived tables
``file_status``, ``coverage`` and ``problems``. It is written to a temporary
file and renamed into place, so parallel runs never block each other and a
reader (the DuckDB CLI, a notebook) always sees a whole database.
Analysts need nothing from this project to query it::

    duckdb data/index/analytics.duckdb "SELECT * FROM coverage"

The file is portable: every table is stored in it, so a copy of the data folder
(or of the file alone) answers from any working directory. The one view,
``memory_chunks`` (the chunk texts, too big to copy), reads its Parquet files by
a path relative to the data folder; DuckDB resolves relative paths against the
process's working directory, or against ``SET file_search_path = '<data folder>'``
when set (``query`` here sets it). A DuckDB database cannot resolve a view's path
against its own location (no setting is stored in the file, and table functions
take no subqueries), so: ``cd data/index && duckdb analytics.duckdb``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from memory_pipeline import storage
from memory_pipeline.models import CHUNKS_SCHEMA, EXTRACTION_STATUS_SCHEMA, INDEXED_STATE_SCHEMA, MANIFEST_SCHEMA
from memory_pipeline.providers.pricing import estimate_usd, price_rows, usd_per_mtok
from memory_pipeline.settings import Settings
from memory_pipeline.stores.lance import FTS_COLUMN, VectorStore

DB_NAME = "analytics.duckdb"
# What building the analytics database may hold in memory (DuckDB spills to disk beyond it; 600,000
# rows answer within 48 MB, see the tests), the write-ahead log past which DuckDB writes the copied
# tables into the database file instead of holding them as in-memory row groups until the end
# (17,748 rows of a 10,000-note folder held 20.5 MB that way, 2.4 MB with this), and the batches the
# table's rows are read in (65,536-row batches took +45 MB of Lance's scan at 100k rows, 4,096 +28).
DUCKDB_MEMORY_LIMIT = "128MB"
DUCKDB_CHECKPOINT = "1MB"
DUCKDB_ALLOCATOR_FLUSH = "256KB"
ROWS_BATCH = 8_192
SCHEMA_VERSION = 5  # of the database's tables: a change rebuilds every cached database
# The columns of the ledgers' tables before their first line (then: every key of the lines).
USAGE_COLUMNS = 'run_id VARCHAR, provider VARCHAR, model VARCHAR, chunks BIGINT, tokens BIGINT, batch BOOLEAN, est_usd DOUBLE, "at" VARCHAR'
RUNS_COLUMNS = "run_id VARCHAR, finished_at VARCHAR, files_seen BIGINT, files_changed BIGINT, table_rows BIGINT, errors BIGINT"
_ROW_COLUMNS = ["chunk_id", "doc_id", "source", "path", "shard", "modality", "mime_type", "file_sha256", "embedding_model", "tokens", "indexed_at"]
_ROWS_SCHEMA = pa.schema(
    [
        ("chunk_id", pa.string()), ("doc_id", pa.string()), ("source", pa.string()), ("path", pa.string()),
        ("shard", pa.string()), ("modality", pa.string()), ("mime_type", pa.string()), ("file_sha256", pa.string()),
        ("embedding_model", pa.string()), ("tokens", pa.int32()), ("indexed_at", pa.timestamp("us", tz="UTC")),
    ]
)  # fmt: skip

# One row per discovered file: what happened to it and whether the table reflects it.
FILE_STATUS_SQL = """
CREATE TABLE file_status AS
SELECT
    m.doc_id, m.source, m.path, m.abs_path, m.modality, m.mime_type, m.size, m.sha256,
    m.status AS discovery_status,
    e.status AS extraction_status,
    s.sha256 AS indexed_sha256,
    coalesce(s.chunks, 0) AS chunks,
    coalesce(v.table_rows, 0) AS table_rows,
    -- Recorded as indexed into this table (its fingerprint: while a new generation is built, the
    -- files not rewritten yet are recorded for the old one), yet rows are missing from it (deleted
    -- outside a run): not indexed until a run of its shard writes them again (missing_rows).
    coalesce(s.sha256 = m.sha256 AND ($fp::VARCHAR IS NULL OR s.fingerprint = $fp) AND coalesce(v.table_rows, 0) < s.chunks, false) AS rows_missing,
    CASE
        WHEN m.status = 'skipped' THEN 'skipped'
        WHEN m.status = 'failed' THEN 'failed'
        WHEN rows_missing THEN 'pending'
        -- indexed into the table judged: while a new generation builds, a file recorded for the
        -- current one is not in the new one yet (pending), as the rows counted beside it are the new one's
        WHEN s.sha256 = m.sha256 AND ($fp::VARCHAR IS NULL OR s.fingerprint = $fp) THEN 'indexed'
        WHEN e.status = 'failed' THEN 'failed'
        ELSE 'pending'
    END AS state,
    (s.sha256 IS NOT NULL AND s.sha256 <> m.sha256) AS stale,
    coalesce(nullif(m.reason, ''), nullif(e.reason, ''), '') AS reason
FROM source_files m
LEFT JOIN indexed_state s USING (doc_id)
LEFT JOIN extraction_status e USING (doc_id)
LEFT JOIN (SELECT doc_id, count(*) AS table_rows FROM vector_rows GROUP BY doc_id) v USING (doc_id)
WHERE m.path <> ''
"""

COVERAGE_SQL = """
CREATE TABLE coverage AS
WITH files AS (
    SELECT source, coalesce(nullif(modality, ''), 'unknown') AS modality,
           count(*) AS files_discovered,
           -- every file not skipped by rule: one that failed before extraction (unreadable, content
           -- not what its name says) was asked for and is missing, so it counts against coverage
           count(*) FILTER (WHERE discovery_status <> 'skipped') AS files_indexable,
           count(*) FILTER (WHERE state = 'indexed') AS files_indexed,
           count(*) FILTER (WHERE state = 'skipped') AS files_skipped,
           count(*) FILTER (WHERE state = 'failed') AS files_failed,
           count(*) FILTER (WHERE state = 'pending') AS files_pending,
           count(*) FILTER (WHERE stale) AS files_stale,
           sum(chunks)::BIGINT AS chunks
    FROM file_status
    WHERE NOT ends_with(path, '/')  -- a folder that cannot be listed is a problem, not a file (its files are counted)
    GROUP BY ALL
), rows AS (
    SELECT source, modality, count(*) AS rows, sum(tokens)::BIGINT AS tokens FROM vector_rows GROUP BY ALL
)
SELECT f.*, coalesce(r.rows, 0) AS rows, coalesce(r.tokens, 0) AS tokens,
       CASE WHEN f.files_indexable = 0 THEN 1.0 ELSE f.files_indexed / f.files_indexable END AS coverage
FROM files f LEFT JOIN rows r USING (source, modality)
ORDER BY source, modality
"""

PROBLEMS_SQL = """
CREATE TABLE problems AS
SELECT 'orphan_rows' AS kind, doc_id, any_value(path) AS path, count(*) AS rows,
       'rows of a file that is not in the sources any more' AS detail
FROM vector_rows
WHERE doc_id NOT IN (SELECT doc_id FROM file_status WHERE state <> 'skipped')
GROUP BY doc_id
UNION ALL
SELECT 'duplicate_chunk_id', any_value(doc_id), any_value(path), count(*), 'chunk id ' || chunk_id || ' stored more than once'
FROM vector_rows GROUP BY chunk_id HAVING count(*) > 1
UNION ALL
SELECT 'model_mismatch', doc_id, any_value(path), count(*), 'rows embedded with ' || any_value(embedding_model) || ', not ' || $model
FROM vector_rows WHERE embedding_model <> $model GROUP BY doc_id
UNION ALL
SELECT 'stale_rows', v.doc_id, any_value(v.path), count(*), 'rows of an older version of the file'
FROM vector_rows v JOIN file_status f USING (doc_id)
WHERE v.file_sha256 <> split_part(f.sha256, '+', 1) GROUP BY v.doc_id  -- a media file's note tags its sha256
UNION ALL
SELECT 'zero_chunks', doc_id, path, 0, 'indexed, but no text to search'
FROM file_status WHERE state = 'indexed' AND chunks = 0
UNION ALL
SELECT 'missing_rows', doc_id, path, chunks - table_rows,
       'recorded as indexed with ' || chunks || ' chunk(s), but the table holds ' || table_rows
       || ' (rows deleted outside a run); the next run of its shard writes them again'
FROM file_status WHERE rows_missing AND discovery_status = 'ok'
UNION ALL
SELECT 'partial', doc_id, path, 0, reason
FROM file_status WHERE state = 'indexed' AND extraction_status = 'ok' AND reason <> ''
UNION ALL
SELECT 'failed', doc_id, path, 0, reason FROM file_status WHERE state = 'failed'
UNION ALL
SELECT 'skipped', doc_id, path, 0, reason FROM file_status WHERE state = 'skipped'
"""


@dataclass
class CoverageReport:
    """What the checks and the asset metadata need, read back from the database."""

    path: Path
    coverage: list[dict] = field(default_factory=list)
    problems: dict[str, list[dict]] = field(default_factory=dict)
    files_indexable: int = 0
    files_indexed: int = 0
    table_rows: int = 0
    table_dims: int = 0
    models: list[str] = field(default_factory=list)
    fts_indexed: bool = False
    fts_unindexed_rows: int = 0
    cost: list[dict] = field(default_factory=list)

    @property
    def coverage_ratio(self) -> float:
        return 1.0 if self.files_indexable == 0 else self.files_indexed / self.files_indexable

    def paths(self, kind: str) -> list[str]:
        return sorted({p["path"] for p in self.problems.get(kind, [])})


def _bounded(con) -> None:
    """Hold DuckDB's build of the database to ``DUCKDB_MEMORY_LIMIT``, spilling to disk beyond it.

    DuckDB's own default is 80 % of the machine's memory: at a million chunks the build added
    ~800 MB to an index run, at its end, the run's peak. It spills to its default folder,
    ``<database>.tmp`` beside the (per-process) temporary database, removed when the connection
    closes. Per connection: nothing is stored in the file, so analysts' own connections keep
    DuckDB's defaults.
    """
    con.execute(f"SET memory_limit = {_sql_str(DUCKDB_MEMORY_LIMIT)}")
    con.execute("SET preserve_insertion_order = false")  # lets copies and joins stream, and spill
    con.execute(f"SET checkpoint_threshold = {_sql_str(DUCKDB_CHECKPOINT)}")
    # One thread: the coverage and problems queries over a million rows take seconds either way,
    # and each thread's own buffers (Parquet reads, hash tables) were the index run's peak at its
    # end: 10,000 long notes 474 -> 466 MB, now below the full-text build's (2026-12-05).
    con.execute("SET threads = 1")
    # DuckDB's bundled jemalloc keeps what a thread freed until that thread's peak passes 128 MB
    # (DuckDB's default flush threshold): the copies' and queries' freed buffers stayed resident to
    # the end of the run, +32 MB anonymous memory at 10,000 notes against +14 MB at 1,000. Flushed
    # after every task instead, `memory index` of 10,000 long notes peaked at 450 MiB, not 468-469, and
    # of 1,000 at 434, not 440-441 (2026-12-06, two runs each). The cost: at a million rows the build alone
    # took 3.9 s, not 3.4 (and peaked 6 MB lower); at 10,000 notes 0.25 s either way.
    con.execute(f"SET allocator_flush_threshold = {_sql_str(DUCKDB_ALLOCATOR_FLUSH)}")
    con.execute(f"SET allocator_bulk_deallocation_flush_threshold = {_sql_str(DUCKDB_ALLOCATOR_FLUSH)}")


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _dataset(con, data: storage.DataStore, name: str, asset: str, suffix: str, schema: pa.Schema) -> None:
    # A copy, not a view: the file then answers without the Parquet files, from any directory.
    files = data.partition_files(asset, suffix)
    if files and not data.remote:
        pattern = Path(files[0]).parent / f"??{suffix}.parquet"
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM read_parquet({_sql_str(pattern.as_posix())}, union_by_name = true)")
        return
    # On object storage (DuckDB's httpfs is an extension downloaded at run time): read through Arrow.
    rows = pa.concat_tables([data.read_file(f, schema) for f in files]) if files else schema.empty_table()  # noqa: F841 - read by DuckDB
    con.execute(f"CREATE TABLE {name} AS SELECT * FROM rows")


UNRUN_REASON = "its shard (partition) has not run yet"


def _unrun_shards(con, settings: Settings, data: storage.DataStore) -> None:
    """Files of shards that no run has recorded yet, added to ``source_files`` as not indexed.

    Coverage is computed over the runs' records; a shard never run (a Dagster run of a few partitions
    on a fresh index) had none, so its files were not counted at all, and coverage read 1.000 over
    two files of thirteen. When a shard has no record, a stat walk (no reading) finds its files; each
    counts as indexable and pending, with :data:`UNRUN_REASON`. Only then: a run of every shard writes
    every record, so a walk is not paid at each rebuild.
    """
    from memory_pipeline.discovery import SHARD_KEYS, sniff, walk_all

    recorded = {Path(name).name.split(".", 1)[0] for name in data.partition_files("source_files")}
    if recorded >= set(SHARD_KEYS):
        return
    rows = []
    for f in walk_all(settings):
        if f.shard in recorded or not f.path or f.path.endswith("/"):
            continue
        mime, modality = sniff(b"", f.path)  # by its name: the walk reads nothing
        rows.append({
            "doc_id": f.doc_id, "source": f.source, "path": f.path, "abs_path": f.abs_path, "shard": f.shard,
            "size": f.size, "mtime_ns": f.mtime_ns, "inode": f.inode, "sha256": "", "mime_type": mime, "modality": modality,
            "status": f.status, "reason": UNRUN_REASON if f.status == "ok" else f.reason, "action": "none", "walk_status": f.status,
        })  # fmt: skip
    if rows:
        unrun = pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA)  # noqa: F841 - read by DuckDB
        con.execute("INSERT INTO source_files BY NAME SELECT * FROM unrun")


def _vector_rows(settings: Settings, table_name: str) -> tuple[pa.RecordBatchReader, int, dict, str]:
    """A stream of the table's rows (the columns of ``_ROWS_SCHEMA``), its dims, FTS state and provider.

    A stream, not a table: DuckDB copies it batch by batch, so a million rows never sit in
    memory twice (as Arrow and as DuckDB's copy).
    """
    store = VectorStore(storage.of(settings).lancedb_uri, table_name)
    table = store.open()
    if table is None:
        return pa.RecordBatchReader.from_batches(_ROWS_SCHEMA, []), 0, {}, ""
    # A plain scan of the columns needed: the vectors never leave the table.
    scan = table.search().select(_ROW_COLUMNS).to_batches(ROWS_BATCH) if table.count_rows() else None
    batches = (b.select(_ROW_COLUMNS).cast(_ROWS_SCHEMA) for b in scan) if scan is not None else iter(())
    fts: dict = {"indexed": False, "unindexed_rows": 0}
    for idx in table.list_indices():
        if FTS_COLUMN in idx.columns:
            stats = table.index_stats(idx.name)
            fts = {"indexed": True, "unindexed_rows": int(getattr(stats, "num_unindexed_rows", 0) or 0)}
    return pa.RecordBatchReader.from_batches(_ROWS_SCHEMA, batches), store.dims(), fts, str(store.meta().get("provider", ""))


_COST_SCHEMA = pa.schema(
    [
        ("provider", pa.string()), ("model", pa.string()), ("rows", pa.int64()), ("tokens_in_table", pa.int64()),
        ("tokens_embedded", pa.int64()), ("usd_per_mtok", pa.float64()),
        ("est_usd_table", pa.float64()), ("est_usd_spent", pa.float64()),
    ]
)  # fmt: skip


def record_usage(settings: Settings, *, run_id: str, provider: str, model: str, chunks: int, tokens: int, batch: bool = False) -> None:
    """Append what one embedding step sent to its provider to ``runs/embedding_usage.jsonl``.

    Written by the step that embeds (CLI runs and UI backfills alike); one short
    line per append with O_APPEND, so parallel runs never interleave.
    """
    if not chunks and not tokens:
        return
    line = {
        "run_id": run_id, "provider": provider, "model": model, "chunks": chunks, "tokens": tokens, "batch": batch,
        "est_usd": estimate_usd(provider, model, tokens, batch=batch),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    storage.of(settings).append_line(storage.USAGE, json.dumps(line))


def _read_usage(settings: Settings) -> list[dict]:
    out = []
    for line in storage.of(settings).read_lines(storage.USAGE):
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line from a killed run
    return out


def _table_tokens(con, provider: str) -> dict[tuple[str, str], tuple[int, int]]:
    """Rows and tokens per ``(provider, model)`` of the copied ``vector_rows`` (one generation, one provider)."""
    sql = "SELECT embedding_model, count(*), coalesce(sum(tokens), 0)::BIGINT FROM vector_rows WHERE embedding_model <> '' GROUP BY 1"
    return {(provider, model): (int(n), int(tokens)) for model, n, tokens in con.execute(sql).fetchall()}


def _embedding_cost(settings: Settings, in_table: Mapping[tuple[str, str], tuple[int, int]]) -> pa.Table:
    """Tokens and estimated cost per provider and model: what the table holds, and what was sent.

    ``in_table``: rows and tokens per ``(provider, model)`` of the table's rows
    (``_table_tokens``); the usage ledger carries the tokens each embedding step sent (cache
    hits excluded). Prices: providers/pricing.py.
    """
    spent: dict[tuple[str, str], list] = {}
    for use in _read_usage(settings):
        acc = spent.setdefault((use["provider"], use["model"]), [0, 0.0])
        acc[0] += int(use.get("tokens") or 0)
        acc[1] = None if acc[1] is None or use.get("est_usd") is None else acc[1] + use["est_usd"]
    rows = []
    for key in sorted(set(in_table) | set(spent)):
        n_rows, tokens = in_table.get(key, [0, 0])
        sent, usd = spent.get(key, [0, 0.0])
        rows.append(
            {
                "provider": key[0], "model": key[1], "rows": n_rows, "tokens_in_table": tokens,
                "tokens_embedded": sent, "usd_per_mtok": usd_per_mtok(*key),
                "est_usd_table": estimate_usd(*key, tokens), "est_usd_spent": None if usd is None else round(usd, 6),
            }
        )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=_COST_SCHEMA)


def refresh_analytics(settings: Settings, model: str, table_name: str | None = None, index_fp: str | None = None) -> CoverageReport:
    """Rebuild the analytics database and return the coverage and problems it holds.

    ``table_name``: the generation the run wrote (default: the configured table). ``index_fp``:
    the fingerprint its files are recorded with (``changes.fingerprint``): only those are checked
    for rows missing from it (None: every file recorded as indexed).

    Skipped when nothing it reads changed since the database was built (the table's version,
    every asset file's size and time, the ledgers, the model asked about): the report is then
    read back from the database. A run's coverage step and its checks read the same state, so
    the second of them costs a few stats (on object storage: four listings instead of reading
    every partition again); any change, by any process or machine, rebuilds.
    """
    import duckdb

    table_name = table_name or settings.table_name
    data = storage.of(settings)
    final = data.analytics_db
    fingerprint = _fingerprint(data, table_name, f"{model}|{index_fp or ''}")
    if final.is_file():
        cached = _cached_report(final, fingerprint)
        if cached is not None:
            return cached
    tmp = final.with_name(f".{DB_NAME}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    prices = pa.Table.from_pylist(price_rows())  # noqa: F841 - read by DuckDB
    final.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(tmp))
    try:
        _bounded(con)
        _dataset(con, data, "source_files", "source_files", "", MANIFEST_SCHEMA)
        _unrun_shards(con, settings, data)
        _dataset(con, data, "extraction_status", "extracted_content", ".status", EXTRACTION_STATUS_SCHEMA)
        _dataset(con, data, "indexed_state", "memory_vectors", ".state", INDEXED_STATE_SCHEMA)
        chunk_files = data.partition_files("memory_chunks")
        if chunk_files and data.remote:
            # Object storage: a copy of the chunks (without the embedding text), as for the other assets.
            keep = pa.schema([f for f in CHUNKS_SCHEMA if f.name != "embed_text"])
            chunks = pa.concat_tables([data.read_file(f, keep) for f in chunk_files])  # noqa: F841 - read by DuckDB
            con.execute("CREATE TABLE memory_chunks AS SELECT * FROM chunks")
        elif chunk_files:
            # Relative to the data folder (see the module docstring); bound once here, from that folder.
            rel = (data.assets_dir / "memory_chunks" / "??.parquet").relative_to(data.root).as_posix()
            con.execute(f"SET file_search_path = {_sql_str(data.root.as_posix())}")
            con.execute(f"CREATE VIEW memory_chunks AS SELECT * EXCLUDE (embed_text) FROM read_parquet({_sql_str(rel)})")
        # The table's scan opened where it is consumed, not while the assets above are copied.
        vector_rows, dims, fts, provider = _vector_rows(settings, table_name)  # noqa: F841 - read by DuckDB
        con.execute("CREATE TABLE vector_rows AS SELECT * FROM vector_rows")
        embedding_cost = _embedding_cost(settings, _table_tokens(con, provider))  # noqa: F841 - read by DuckDB
        con.execute("CREATE TABLE embedding_cost AS SELECT * FROM embedding_cost")
        con.execute("CREATE TABLE prices AS SELECT * FROM prices")
        con.execute(FILE_STATUS_SQL, {"fp": index_fp})
        con.execute(COVERAGE_SQL)
        con.execute(PROBLEMS_SQL, {"model": model})
        _ledger(con, "embedding_usage", data, storage.USAGE, USAGE_COLUMNS)
        _ledger(con, "runs", data, storage.HISTORY, RUNS_COLUMNS)
        con.execute(
            "CREATE TABLE table_info AS SELECT ? AS uri, ? AS table_name, ? AS dims, ? AS fts_indexed, ? AS fts_unindexed_rows",
            [data.lancedb_uri, table_name, dims, fts.get("indexed", False), fts.get("unindexed_rows", 0)],
        )
        con.execute("CREATE TABLE refresh_state AS SELECT ? AS fingerprint, now() AS refreshed_at", [fingerprint])
        report = _report(con, final)
    finally:
        con.close()
    os.replace(tmp, final)
    return report


def _report(con, final: Path) -> CoverageReport:
    """The coverage report a built analytics database holds."""
    # fetchall, not fetchone: DuckDB 2 keeps a half-read result open and refuses the next query.
    rows, dims, fts_indexed, unindexed = con.execute(
        "SELECT (SELECT count(*) FROM vector_rows), dims, fts_indexed, fts_unindexed_rows FROM table_info"
    ).fetchall()[0]
    report = CoverageReport(path=final, table_rows=int(rows), table_dims=int(dims or 0))
    report.fts_indexed = bool(fts_indexed)
    report.fts_unindexed_rows = int(unindexed or 0)
    cov = con.sql("SELECT * FROM coverage").to_arrow_table().to_pylist()
    report.coverage = cov
    report.files_indexable = sum(r["files_indexable"] for r in cov)
    report.files_indexed = sum(r["files_indexed"] for r in cov)
    for row in con.sql("SELECT kind, doc_id, path, rows, detail FROM problems ORDER BY kind, path").to_arrow_table().to_pylist():
        report.problems.setdefault(row["kind"], []).append(row)
    report.cost = con.sql("SELECT * FROM embedding_cost ORDER BY provider, model").to_arrow_table().to_pylist()
    report.models = [r[0] for r in con.execute("SELECT DISTINCT embedding_model FROM vector_rows ORDER BY 1").fetchall()]
    return report


def _fingerprint(data: storage.DataStore, table_name: str, model: str) -> str:
    """What the analytics database is built from, in one digest: the table's version, the size
    and time of every asset file it reads, the ledgers' state, and the model asked about."""
    import hashlib

    table = VectorStore(data.lancedb_uri, table_name).open()
    parts = [str(SCHEMA_VERSION), model, table_name, str(table.version) if table is not None else "-"]
    for asset, suffix in (("source_files", ""), ("extracted_content", ".status"), ("memory_vectors", ".state"), ("memory_chunks", "")):
        parts.extend(data.stamps(asset, suffix))
    parts.extend(data.ledger_stamp(key) for key in (storage.USAGE, storage.HISTORY))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _cached_report(final: Path, fingerprint: str) -> CoverageReport | None:
    """The report of the database at ``final`` if it was built from this very state; else None."""
    import duckdb

    try:
        con = duckdb.connect(str(final), read_only=True)
    except duckdb.Error:
        return None  # being replaced, or damaged: rebuilt
    try:
        stored = con.execute("SELECT fingerprint FROM refresh_state").fetchall()
        if not stored or stored[0][0] != fingerprint:
            return None
        return _report(con, final)
    except duckdb.Error:
        return None  # built by an older version (no refresh_state): rebuilt
    finally:
        con.close()


def _ledger(con, name: str, data: storage.DataStore, key: str, empty_columns: str) -> None:
    """A JSONL ledger as a table; an empty one (with its main columns) before the first line is written."""
    path = data.root / key
    if data.remote:
        lines = data.read_lines(key)
        if not lines:
            con.execute(f"CREATE OR REPLACE TABLE {name} ({empty_columns})")
            return
        # DuckDB reads the lines as it reads the local ledger (same type inference): from a local copy.
        path = data.root / "runs" / f".{name}.{os.getpid()}.jsonl"
        storage.write_text(path, "\n".join(lines) + "\n")
        try:
            con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM read_json_auto({_sql_str(path.as_posix())})")
        finally:
            path.unlink(missing_ok=True)
    elif path.is_file() and path.stat().st_size:
        con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM read_json_auto({_sql_str(path.as_posix())})")
    else:
        con.execute(f"CREATE OR REPLACE TABLE {name} ({empty_columns})")


def refresh_runs(settings: Settings) -> bool:
    """Bring the ``runs`` table up to date with ``runs/history.jsonl``.

    The run history gets its line after the run (and so after ``refresh_analytics``);
    ``memory index`` calls this then, so ``SELECT * FROM runs`` includes the run just made.
    Copy, update, rename, like ``refresh_analytics``; when a parallel run replaced the
    database meanwhile, its copy is kept (it holds that run's own tables). False when
    there is no database or history yet, or the database changed under us.
    """
    import duckdb

    data = storage.of(settings)
    final = data.analytics_db
    if not final.is_file() or (not data.remote and not (data.root / storage.HISTORY).is_file()):
        return False
    before = final.stat()
    tmp = final.with_name(f".{DB_NAME}.{os.getpid()}.runs.tmp")
    shutil.copyfile(final, tmp)
    try:
        con = duckdb.connect(str(tmp))
        try:
            _ledger(con, "runs", data, storage.HISTORY, RUNS_COLUMNS)
        finally:
            con.close()
        after = final.stat()
        if (after.st_ino, after.st_mtime_ns, after.st_size) != (before.st_ino, before.st_mtime_ns, before.st_size):
            return False
        os.replace(tmp, final)
        return True
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)


def up_to_date(settings: Settings) -> Path:
    """The analytics database ``memory analytics`` reads, rebuilt first where it may be behind.

    In a local data folder every run rebuilds it (a run that finds nothing changed has nothing to
    add), so it is read as it is; one that is missing (deleted, or a copy of the folder without it)
    is built from the assets and the table. On object storage the database is this machine's
    (under ``local_dir``) while other machines' runs change the bucket: it is rebuilt whenever the
    bucket's assets, table or ledgers changed since it was built (``refresh_analytics``'s
    fingerprint: a few listings when nothing did), after the bucket itself is checked, so an
    unreachable store is an error, not an old answer.
    """
    from memory_pipeline.errors import MemoryPipelineError

    data = storage.of(settings)
    final = data.analytics_db
    if data.remote:
        storage.check_bucket(data.remote)
    if not data.partition_files("source_files"):
        if final.is_file():
            return final  # a copy of the database alone (or its folder without the assets): as it is
        raise MemoryPipelineError(f"nothing is indexed at {data.location} yet (no analytics database)", hint="run `memory index` first")
    model, table_name, index_fp = _identity(settings)
    refresh_analytics(settings, model, table_name, index_fp)
    return final


def _identity(settings: Settings) -> tuple[str, str, str | None]:
    """The model, table and index fingerprint to judge: the table an index run with this
    configuration writes (as its coverage step asks about it), judged against the model its
    generation record names. Resolving the provider here may give another one than the runs used
    (a paid provider's key missing on an analyst's machine: its fallback, or none), so the model
    comes from the table's record; the runs' fingerprint only when the identity resolved is the
    table's own. Where nothing resolves, the current generation."""
    from memory_pipeline.changes import EmbeddingIdentity, fingerprint
    from memory_pipeline.errors import MemoryPipelineError
    from memory_pipeline.providers.registry import resolve_provider
    from memory_pipeline.stores import generations

    try:
        ident = EmbeddingIdentity.of(resolve_provider(settings))
    except MemoryPipelineError:
        name, record = generations.current(settings)
        return str(record.get("model") or ""), name, None
    name = generations.table_for(settings, ident.meta())
    record = generations.load(settings)["generations"].get(name) or {}
    model = str(record.get("model") or ident.model)
    return model, name, fingerprint(settings, ident) if model == ident.model else None


def query(settings: Settings, sql: str) -> pa.Table:
    """Run one read-only query against the analytics database (from any directory)."""
    import duckdb

    path = storage.of(settings).analytics_db
    con = duckdb.connect(str(path), read_only=True)
    try:
        con.execute(f"SET file_search_path = {_sql_str(path.parent.as_posix())}")  # memory_chunks' relative path
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()
