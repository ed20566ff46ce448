"""The data folder: the one owner of every path and every atomic write under ``data_dir``.

Layout (everything here is derived data; the source folders are the truth)::

    <data_dir>/
      assets/<asset>/<shard>[<suffix>].parquet   the stages' outputs, one file per partition
      lancedb/                                   the searched table(s)
      cache/embeddings.sqlite                    vectors by content hash
      generations.json (+ .lock)                 which table generation searches read
      provider_state.json                        a primary provider that failed for good
      batch/jobs.sqlite                          provider batch jobs
      runs/last_run.json, history.jsonl, embedding_usage.jsonl
      analytics.duckdb                           coverage tables for analysts
      dagster/                                   the Dagster instance of `memory index` / `make ui`

Writes are atomic (a temp file in the same folder, then one rename): a reader sees the
old file or the new one, never a torn one. Reads of Parquet assets are forgiving: a
missing file is an empty table, a file written by an older version without a column
gets that column's default, and a damaged file is moved aside and read as empty (the
stage that reads it redoes the work it recorded).

The same files are read and written as polars DataFrames (:meth:`DataStore.read_frame`,
:meth:`DataStore.write_frame`, :meth:`DataStore.frames`), which is how the Dagster IO
manager (``defs/io_managers.py``) moves data between the assets. A frame is written in its
asset's Arrow schema, so the file is the same whichever side wrote it. polars, like
pyarrow, is imported only where a frame is read or written.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa

    from memory_pipeline.settings import Settings

# pyarrow is imported where Parquet is read or written: the CLI's fast path (finding a running
# server through server.json) uses this module and must not pay for it.

log = logging.getLogger("memory_pipeline")

# The stages' assets, in graph order.
ASSETS = ("source_files", "extracted_content", "memory_chunks", "chunk_embeddings", "memory_vectors")
# Side files some stages write beside their main Parquet file (``<shard><suffix>.parquet``).
SIDE_FILES = {
    ("source_files", ".deletions"): "files deleted since the last run, whose rows go",
    ("extracted_content", ".status"): "per-file extraction outcome: ok, failed (with reason) or partial",
    ("memory_vectors", ".state"): "what the table holds per file: content hash, fingerprint, chunk count",
}
# The side files under their own names (their asset keys in the Dagster graph): name -> (asset, suffix).
SIDE_ASSETS = {
    "file_deletions": ("source_files", ".deletions"),
    "extraction_status": ("extracted_content", ".status"),
    "indexed_state": ("memory_vectors", ".state"),
}


def locate(name: str) -> tuple[str, str]:
    """(asset, suffix) of an asset or side-file name: ``memory_chunks`` or ``extraction_status``."""
    if name in SIDE_ASSETS:
        return SIDE_ASSETS[name]
    if name in ASSETS:
        return name, ""
    raise ValueError(f"unknown asset {name}")


@dataclass(frozen=True)
class DataStore:
    """Paths and atomic I/O under one data folder."""

    root: Path

    # --- where things are ------------------------------------------------------------------

    @property
    def assets_dir(self) -> Path:
        return self.root / "assets"

    @property
    def lancedb_uri(self) -> str:
        return str(self.root / "lancedb")

    @property
    def cache_path(self) -> Path:
        return self.root / "cache" / "embeddings.sqlite"

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def analytics_db(self) -> Path:
        return self.root / "analytics.duckdb"

    @property
    def generations_pointer(self) -> Path:
        return self.root / "generations.json"

    @property
    def provider_state(self) -> Path:
        return self.root / "provider_state.json"

    @property
    def batch_jobs(self) -> Path:
        return self.root / "batch" / "jobs.sqlite"

    @property
    def server_file(self) -> Path:
        """Where a running `memory serve` writes its address (service/serverfile.py)."""
        return self.root / "server.json"

    def asset(self, asset: str, shard: str, suffix: str = "") -> Path:
        """The Parquet file of one partition of an asset (or of one of its side files)."""
        if asset not in ASSETS or (suffix and (asset, suffix) not in SIDE_FILES):
            raise ValueError(f"unknown asset file {asset}{suffix}")
        return self.assets_dir / asset / f"{shard}{suffix}.parquet"

    # --- Parquet ---------------------------------------------------------------------------

    def read(self, asset: str, shard: str, schema: pa.Schema, suffix: str = "") -> pa.Table:
        return read_parquet(self.asset(asset, shard, suffix), schema)

    def write(self, table: pa.Table, asset: str, shard: str, suffix: str = "") -> Path:
        path = self.asset(asset, shard, suffix)
        write_parquet(table, path)
        return path

    def write_rows(self, rows: list[dict], schema: pa.Schema, asset: str, shard: str, suffix: str = "") -> Path:
        import pyarrow as pa

        return self.write(pa.Table.from_pylist(rows, schema=schema), asset, shard, suffix)

    def read_frame(self, asset: str, shard: str, schema: pa.Schema | None, suffix: str = "") -> pl.DataFrame:
        """One partition as a polars DataFrame, read as forgivingly as :meth:`read`.

        ``schema`` None takes the file's own columns (an asset whose schema depends on the
        run, like chunk_embeddings' vector width); a missing file is then a frame without columns.
        """
        import polars as pl

        frame = pl.from_arrow(read_parquet(self.asset(asset, shard, suffix), schema))
        assert isinstance(frame, pl.DataFrame)  # a Table gives a DataFrame (a bare array would give a Series)
        return frame

    def write_frame(self, frame: pl.DataFrame, asset: str, shard: str, schema: pa.Schema, suffix: str = "") -> Path:
        """Write one partition from a polars DataFrame, in ``schema`` (polars' own string and list
        types cast back), atomically."""
        return self.write(frame.to_arrow().select(schema.names).cast(schema), asset, shard, suffix)

    def frames(self, asset: str, shards: Sequence[str], schema: pa.Schema | None, suffix: str = "") -> LazyFrames:
        """shard -> DataFrame over ``shards``, each partition read when it is looked up (never kept)."""
        return LazyFrames(self, asset, tuple(shards), schema, suffix)

    def row_count(self, asset: str, shards, suffix: str = "") -> int:
        """Rows of an asset over these shards, from the Parquet footers only."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        total = 0
        for shard in shards:
            path = self.asset(asset, shard, suffix)
            if path.is_file():
                try:
                    total += pq.ParquetFile(path).metadata.num_rows
                except (pa.ArrowException, OSError):
                    continue  # damaged: the next read sets it aside
        return total

    def drop(self, asset: str, suffix: str = "") -> int:
        """Remove every partition file of an asset (or side file); how many went."""
        folder = self.assets_dir / asset
        if not folder.is_dir():
            return 0
        pattern = f"*{suffix}.parquet" if suffix else "*.parquet"
        gone = 0
        for f in folder.glob(pattern):
            if suffix or f.name.count(".") == 1:  # without a suffix: the main files only
                f.unlink(missing_ok=True)
                gone += 1
        return gone

    # --- small files -----------------------------------------------------------------------

    def write_json(self, path: Path, value: Any) -> None:
        write_text(path, json.dumps(value, indent=2, sort_keys=True))

    def read_json(self, path: Path) -> Any | None:
        """The parsed file, or None when it is missing."""
        if not path.is_file():
            return None
        return json.loads(path.read_text())

    def append_line(self, path: Path, line: str) -> None:
        """Append one line with O_APPEND (parallel writers never interleave within a line)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line.rstrip("\n") + "\n").encode())
        finally:
            os.close(fd)


class LazyFrames(Mapping[str, "pl.DataFrame"]):
    """An asset's partitions as a mapping shard -> DataFrame that reads a file on each lookup.

    Iterating it and looking each shard up holds one partition at a time: memory stays
    flat however many shards a run covers. Nothing is cached, so a second lookup reads the
    file again (and sees what was written to it meanwhile).
    """

    def __init__(self, data: DataStore, asset: str, shards: tuple[str, ...], schema: pa.Schema | None, suffix: str = "") -> None:
        self._data, self._asset, self._shards, self._schema, self._suffix = data, asset, shards, schema, suffix

    def __getitem__(self, shard: str) -> pl.DataFrame:
        if shard not in self._shards:
            raise KeyError(shard)
        return self._data.read_frame(self._asset, shard, self._schema, self._suffix)

    def __iter__(self) -> Iterator[str]:
        return iter(self._shards)

    def __len__(self) -> int:
        return len(self._shards)

    def __repr__(self) -> str:
        return f"LazyFrames({self._asset}{self._suffix}, {len(self._shards)} shards)"


@lru_cache(maxsize=64)
def _store(root: Path) -> DataStore:
    return DataStore(root)


def of(settings: Settings) -> DataStore:
    """The data folder of a configuration."""
    return _store(Path(settings.data_dir))


def write_text(path: Path, text: str) -> None:
    """Write a file atomically: a temp file beside it, then one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_parquet(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def read_parquet(path: Path, schema: pa.Schema | None) -> pa.Table:
    """The file as ``schema``, or an empty table when it is missing or damaged.

    Columns the file lacks (written before they existed) are filled with nulls, or
    empty strings for non-nullable string columns; columns it has beyond the schema
    are dropped. Without a schema the file is read as it is (and missing or damaged
    reads as a table without columns).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    empty = schema.empty_table() if schema is not None else pa.table({})
    if not path.is_file():
        return empty
    try:
        table = pq.read_table(path)
        if schema is None:
            return table
        columns = []
        for f in schema:
            if f.name in table.column_names:
                columns.append(table.column(f.name).cast(f.type))
            elif pa.types.is_string(f.type):
                columns.append(pa.array([""] * table.num_rows, type=f.type))
            else:
                columns.append(pa.nulls(table.num_rows, type=f.type))
        return pa.Table.from_arrays(columns, schema=schema)
    except (pa.ArrowException, OSError, ValueError) as err:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(path, aside)
        except OSError:
            pass
        log.warning("%s is damaged (%s); moved aside to %s and rebuilt", path, type(err).__name__, aside.name)
        return empty


__all__ = ["ASSETS", "SIDE_ASSETS", "SIDE_FILES", "DataStore", "LazyFrames", "locate", "of", "read_parquet", "write_parquet", "write_text"]
