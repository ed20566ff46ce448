"""The analytics database is built within a memory limit, spilling to disk, with the same answers.

At a million chunks DuckDB's default limit (80 % of the machine) let the coverage step add ~800 MB
to an index run, at its end. ``refresh_analytics`` now streams the table's rows into DuckDB and
holds the build to ``DUCKDB_MEMORY_LIMIT``: the coverage and problems queries must still answer
exactly over more rows than fit in the limit.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from memory_pipeline.models import EXTRACTION_STATUS_SCHEMA, INDEXED_STATE_SCHEMA, MANIFEST_SCHEMA
from memory_pipeline.stores import analytics

DOCS = 60_000
CHUNKS_PER_DOC = 10
STALE = {7, 12_345}  # docs whose rows carry an older file hash
DUPLICATED = 59_999  # a doc whose first chunk is stored twice


def _table(schema: pa.Schema, columns: dict) -> pa.Table:
    n = len(next(iter(columns.values())))
    return pa.table({f.name: columns.get(f.name, pa.nulls(n, f.type) if f.type != pa.string() else [""] * n) for f in schema}, schema=schema)


def _vector_batches():
    now = datetime(2026, 12, 5, tzinfo=UTC)
    step = 5_000  # docs per batch
    for first in range(0, DOCS, step):
        docs = range(first, first + step)
        rows = [(d, c) for d in docs for c in range(CHUNKS_PER_DOC)] + ([(DUPLICATED, 0)] if DUPLICATED in docs else [])
        yield pa.record_batch(
            {
                "chunk_id": [f"{d:08d}-{c:04d}-{'x' * 40}" for d, c in rows],
                "doc_id": [f"doc-{d:08d}" for d, _ in rows],
                "source": ["notes"] * len(rows),
                "path": [f"n/{d}.md" for d, _ in rows],
                "shard": [f"{d % 16:02x}" for d, _ in rows],
                "modality": ["text"] * len(rows),
                "mime_type": ["text/markdown"] * len(rows),
                "file_sha256": [("old" if d in STALE else f"sha{d}") for d, _ in rows],
                "embedding_model": ["m"] * len(rows),
                "tokens": pa.array([50] * len(rows), pa.int32()),
                "indexed_at": pa.array([now] * len(rows), pa.timestamp("us", tz="UTC")),
            },
            schema=analytics._ROWS_SCHEMA,
        )


def test_coverage_and_problems_answer_exactly_within_a_small_memory_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import duckdb

    # Held for real: at 8 MB this build fails with DuckDB's out-of-memory error; the copy alone is larger.
    monkeypatch.setattr(analytics, "DUCKDB_MEMORY_LIMIT", "48MB")
    ids = [f"doc-{d:08d}" for d in range(DOCS)]
    source_files = _table(  # noqa: F841 - read by DuckDB
        MANIFEST_SCHEMA,
        {
            "doc_id": ids, "source": ["notes"] * DOCS, "path": [f"n/{d}.md" for d in range(DOCS)],
            "sha256": [f"sha{d}" for d in range(DOCS)], "modality": ["text"] * DOCS, "status": ["ok"] * DOCS,
        },
    )  # fmt: skip
    extraction_status = _table(EXTRACTION_STATUS_SCHEMA, {"doc_id": ids, "status": ["ok"] * DOCS})  # noqa: F841 - read by DuckDB
    indexed_state = _table(  # noqa: F841 - read by DuckDB
        INDEXED_STATE_SCHEMA,
        {"doc_id": ids, "sha256": [f"sha{d}" for d in range(DOCS)], "chunks": pa.array([CHUNKS_PER_DOC] * DOCS, pa.int32())},
    )
    vector_rows = pa.RecordBatchReader.from_batches(analytics._ROWS_SCHEMA, _vector_batches())  # noqa: F841 - read by DuckDB
    con = duckdb.connect(str(tmp_path / "a.duckdb"))
    try:
        analytics._bounded(con)
        assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] == "45.7 MiB"  # 48 MB, as DuckDB writes it
        # One thread, and copied tables written to the file past 1 MB of log (not held in memory).
        assert con.execute("SELECT current_setting('threads'), current_setting('checkpoint_threshold')").fetchall()[0] == (
            1,
            "976.5 KiB",
        )  # 1 MB, as DuckDB writes it
        # DuckDB's allocator hands back what a task freed at once (its default: past 128 MB per thread).
        assert con.execute("SELECT current_setting('allocator_flush_threshold'), current_setting('allocator_bulk_deallocation_flush_threshold')").fetchall()[
            0
        ] == ("256KB", "250.0 KiB")  # 256 KB, as DuckDB writes each
        for name in ("source_files", "extraction_status", "indexed_state", "vector_rows"):
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM {name}")
        con.execute(analytics.FILE_STATUS_SQL, {"fp": None})
        con.execute(analytics.COVERAGE_SQL)
        con.execute(analytics.PROBLEMS_SQL, {"model": "m"})
        assert analytics._table_tokens(con, "local") == {("local", "m"): (DOCS * CHUNKS_PER_DOC + 1, 50 * (DOCS * CHUNKS_PER_DOC + 1))}
        [cov] = con.sql("SELECT files_indexable, files_indexed, rows FROM coverage").fetchall()
        assert cov == (DOCS, DOCS, DOCS * CHUNKS_PER_DOC + 1)
        problems = con.sql("SELECT kind, doc_id, rows FROM problems ORDER BY kind, doc_id").fetchall()
        assert (tmp_path / "a.duckdb.tmp").is_dir()  # it spilled, to DuckDB's own folder beside the database
    finally:
        con.close()
    assert not (tmp_path / "a.duckdb.tmp").exists()  # and removed it
    assert problems == [
        ("duplicate_chunk_id", f"doc-{DUPLICATED:08d}", 2),
        *[("stale_rows", f"doc-{d:08d}", CHUNKS_PER_DOC) for d in sorted(STALE)],
    ]
