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

**Object storage.** ``data_dir: s3://bucket/prefix`` puts the shared part on any S3-compatible
store: the LanceDB table(s), the Parquet assets, the generation pointer, the provider state and
the run records (``last_run.json`` and the two ledgers, one object per line there, since objects
cannot be appended to). Endpoint, region and credentials come from the standard AWS variables and
chain (``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP=true`` for a plain-http server, the keys or a
profile), never from the YAML. What belongs to one machine stays on local disk under
``local_dir`` (default ``$XDG_CACHE_HOME/memory_pipeline/s3/<bucket>/<prefix>``): the embedding
cache (a cache: nothing depends on it), the batch job store, the Dagster instance of ``memory
index``, the locks, ``analytics.duckdb`` (its tables copied from the store) and ``server.json``.
An object becomes visible whole or not at all (multipart uploads included), so writes stay atomic
there too; a shared JSON file that several writers change (the generation pointer) is updated
with conditional writes (:meth:`DataStore.update_json`), since a lock file orders one machine only.

The same files are read and written as polars DataFrames (:meth:`DataStore.read_frame`,
:meth:`DataStore.write_frame`, :meth:`DataStore.frames`), which is how the Dagster IO
manager (``defs/io_managers.py``) moves data between the assets. A frame is written in its
asset's Arrow schema, so the file is the same whichever side wrote it. polars, like
pyarrow, is imported only where a frame is read or written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from memory_pipeline.errors import ObjectStoreError

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa
    from pyarrow import fs as pafs

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


T = TypeVar("T")
_CAS_ATTEMPTS = 30

# The shared small files, by key (a path relative to the data folder, or to the bucket prefix).
GENERATIONS = "generations.json"
PROVIDER_STATE = "provider_state.json"
LAST_RUN = "runs/last_run.json"
LEDGER_COMPACT_AT = 64
"""Loose line objects of a ledger on object storage that a writer merges into one segment."""
_SEGMENT = ".seg.jsonl"
_NO_COMPACTION = "no-compaction"  # written where deleting a merged object was refused


def segment_text(entries: Sequence[tuple[str, str]]) -> str:
    """A ledger segment: one JSON ``[line object name, line]`` per row, so any line survives."""
    return "".join(json.dumps([name, line]) + "\n" for name, line in entries)


def segment_entries(text: str) -> list[tuple[str, str]]:
    """The rows of :func:`segment_text`; a row that does not parse (a cut-short write) is skipped."""
    out = []
    for row in text.split("\n"):
        try:
            name, line = json.loads(row)
        except (ValueError, TypeError):
            continue
        if isinstance(name, str) and isinstance(line, str):
            out.append((name, line))
    return out


def _is_ledger_object(name: str) -> bool:
    return name.endswith((".json", _SEGMENT))


HISTORY = "runs/history.jsonl"
USAGE = "runs/embedding_usage.jsonl"
URL_SCHEMES = ("s3",)


@dataclass(frozen=True)
class DataStore:
    """Paths and atomic I/O under one data folder.

    ``root`` is the local folder. ``remote`` (``s3://bucket/prefix``), when set, is where the
    shared part lives (the table, the assets, the pointer, the run records); ``root`` then holds
    only what belongs to this machine (see the module docstring).
    """

    root: Path
    remote: str = ""

    # --- where things are ------------------------------------------------------------------

    @property
    def location(self) -> str:
        """The data folder as the user named it: the local path or the ``s3://`` URL."""
        return self.remote or str(self.root)

    @property
    def assets_dir(self) -> Path:
        """The local assets folder (only without ``remote``; see :meth:`asset_location`)."""
        return self.root / "assets"

    def asset_location(self, asset: str) -> str:
        """Where an asset's partition files live: a folder or an ``s3://`` prefix."""
        return f"{self.remote}/assets/{asset}" if self.remote else str(self.assets_dir / asset)

    @property
    def lancedb_uri(self) -> str:
        return f"{self.remote}/lancedb" if self.remote else str(self.root / "lancedb")

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
    def locks_dir(self) -> Path:
        """Lock files (always local: they order this machine's processes)."""
        return self.root / "runs" / "locks"

    @property
    def batch_jobs(self) -> Path:
        return self.root / "batch" / "jobs.sqlite"

    @property
    def server_file(self) -> Path:
        """Where a running `memory serve` writes its address (service/serverfile.py)."""
        return self.root / "server.json"

    def asset(self, asset: str, shard: str, suffix: str = "") -> Path:
        """The local Parquet file of one partition of an asset (or of one of its side files)."""
        return self.assets_dir / self._asset_key(asset, shard, suffix).removeprefix("assets/")

    @staticmethod
    def _asset_key(asset: str, shard: str, suffix: str = "") -> str:
        if asset not in ASSETS or (suffix and (asset, suffix) not in SIDE_FILES):
            raise ValueError(f"unknown asset file {asset}{suffix}")
        return f"assets/{asset}/{shard}{suffix}.parquet"

    # --- object storage ------------------------------------------------------------------

    def _object(self, key: str) -> tuple[pafs.FileSystem, str]:
        """The object store and the object's path in it (``bucket/prefix/key``)."""
        check_bucket(self.remote)
        return object_store(), f"{self.remote.removeprefix('s3://')}/{key}"

    def where(self, key: str) -> str:
        """A shared file's location, for messages."""
        return f"{self.remote}/{key}" if self.remote else str(self.root / key)

    # --- Parquet ---------------------------------------------------------------------------

    def read(self, asset: str, shard: str, schema: pa.Schema | None, suffix: str = "") -> pa.Table:
        if self.remote:
            return read_object_parquet(self._object(self._asset_key(asset, shard, suffix))[1], schema)
        return read_parquet(self.asset(asset, shard, suffix), schema)

    def read_pieces(self, asset: str, shard: str, schema: pa.Schema, suffix: str = "") -> Iterator[pa.Table]:
        """One partition a piece at a time: its Parquet row groups in order, each in ``schema``
        (only its columns read). A stage that wrote the partition in pieces (:meth:`write_pieces`)
        reads it back in those pieces, so its memory holds one of them, not the shard. A file of
        one row group (or none), a missing one and one whose footer is damaged read as :meth:`read`
        reads them: as one table. A file damaged inside a piece is set aside as that read does, and
        an OSError raised: the pieces before it were read already, and half a shard is not an empty
        one. On object storage the object is fetched whole (one GET, compressed), then decoded a
        piece at a time."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        got = None
        if self.remote:
            # One GET, as every object read (a version whole); the row groups decoded one at a time.
            got = get_object(self._object(self._asset_key(asset, shard, suffix))[1])
            source: Any = pa.BufferReader(got[0]) if got is not None else None
        else:
            path = self.asset(asset, shard, suffix)
            source = path if path.is_file() else None
        try:
            parquet = pq.ParquetFile(source) if source is not None else None
        except (pa.ArrowException, OSError, ValueError):
            parquet = None  # damaged: the whole read below sets it aside
        columns = [n for n in schema.names if n in set(parquet.schema_arrow.names)] if parquet is not None else []
        if parquet is None or parquet.num_row_groups <= 1:
            whole = None
            if parquet is not None and self.remote:
                try:
                    whole = conform(parquet.read(columns=columns), schema)  # the object already fetched, not a second GET
                except (pa.ArrowException, OSError, ValueError):
                    whole = None  # damaged: the read below sets it aside
            yield whole if whole is not None else self.read(asset, shard, schema, suffix)
            return
        for i in range(parquet.num_row_groups):
            try:
                piece = conform(parquet.read_row_group(i, columns=columns), schema)
            except (pa.ArrowException, OSError, ValueError) as err:
                if os_fault(err):
                    raise  # unreadable here (permissions, the disk), not damaged: left where it is
                # Damaged inside: set aside like a damaged file's whole read, but raised, since the
                # pieces before it were read already (half a shard is not an empty one).
                raise self._set_aside_damaged(asset, shard, suffix, got[1] if self.remote and got is not None else "", err) from err
            yield piece
            del piece

    def _set_aside_damaged(self, asset: str, shard: str, suffix: str, etag: str, err: Exception) -> OSError:
        """Move a partition damaged inside aside (the next run makes it again); the error to raise."""
        kind = type(err).__name__
        if self.remote:
            path = self._object(self._asset_key(asset, shard, suffix))[1]
            aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
            moved = bool(etag) and _set_aside(path, etag, aside) is True
            where = f"s3://{path}"
        else:
            target = self.asset(asset, shard, suffix)
            aside = str(target.with_name(f"{target.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"))
            try:
                os.replace(target, aside)
                moved = True
            except OSError:
                moved = False
            where = str(target)
        log.warning("%s is damaged (%s)%s", where, kind, f"; moved aside to {aside.rsplit('/', 1)[-1]}" if moved else "")
        return OSError(f"{where} is damaged ({kind}: {err}); {'moved aside: the next run makes it again' if moved else 'remove it and run again'}")

    def row_groups(self, asset: str, shard: str, suffix: str = "") -> int | None:
        """How many pieces (row groups) a local partition file has; None for a missing, damaged or
        remote one (a reader that needs two files' pieces to line up then reads them whole)."""
        import pyarrow.parquet as pq

        if self.remote:
            return None
        path = self.asset(asset, shard, suffix)
        try:
            return pq.ParquetFile(path).num_row_groups if path.is_file() else None
        except (OSError, ValueError):
            return None

    def write_pieces(self, tables: Iterable[pa.Table], asset: str, shard: str, suffix: str = "") -> tuple[str, int]:
        """Write one partition from its pieces (tables of one schema, the first's), each a row group,
        atomically: the file appears whole once the last piece is written, or not at all. Only the
        piece being written is in memory. Where it went, and its rows."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = 0
        writer = None
        if self.remote:
            fs, path = self._object(self._asset_key(asset, shard, suffix))
            sink: Any = pa.BufferOutputStream()  # compressed; one PUT once whole (an object appears whole or not at all)
            location = f"s3://{path}"
        else:
            target = self.asset(asset, shard, suffix)
            target.parent.mkdir(parents=True, exist_ok=True)
            sink = target.with_suffix(f".tmp{os.getpid()}")
            location = str(target)
        try:
            for table in tables:
                if writer is None:
                    writer = pq.ParquetWriter(sink, table.schema, **parquet_options(table.schema))
                if table.num_rows:
                    # A piece, one row group however many rows (the readers' pieces are whole files);
                    # an empty partition has none.
                    writer.write_table(table, row_group_size=table.num_rows)
                rows += table.num_rows
                del table
            if writer is None:
                raise ValueError(f"no piece to write for {asset}{suffix} {shard}")
            writer.close()
            writer = None
            if self.remote:
                with fs.open_output_stream(path) as out:
                    out.write(sink.getvalue())
            else:
                os.replace(sink, target)
        finally:
            if writer is not None:
                writer.close()
            if not self.remote and os.path.exists(sink):
                os.unlink(sink)
        return location, rows

    def write(self, table: pa.Table, asset: str, shard: str, suffix: str = "") -> str:
        """Write one partition file (atomically); where it went."""
        if self.remote:
            import pyarrow.parquet as pq

            fs, path = self._object(self._asset_key(asset, shard, suffix))
            pq.write_table(table, path, filesystem=fs, **parquet_options(table.schema))  # one PUT: the object appears whole or not at all
            return f"s3://{path}"
        path = self.asset(asset, shard, suffix)
        write_parquet(table, path)
        return str(path)

    def _partitions(self, asset: str, suffix: str = "") -> list[tuple[str, str, int, int]]:
        """(location, name, size, mtime_ns) of every partition file of an asset (or side file), by name."""
        pattern = re.compile(r"^[^.]+" + re.escape(suffix) + r"\.parquet$")
        if self.remote:
            from pyarrow import fs as pafs

            store, folder = self._object(f"assets/{asset}")
            infos = store.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
            found = [(i.path, i.base_name, i.size, i.mtime_ns) for i in infos if i.type == pafs.FileType.File and pattern.match(i.base_name)]
        else:
            folder = self.assets_dir / asset
            found = []
            for entry in os.scandir(folder) if folder.is_dir() else ():
                if pattern.match(entry.name):
                    with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                        st = entry.stat()
                        found.append((entry.path, entry.name, st.st_size, st.st_mtime_ns))
        return sorted(found, key=lambda f: f[1])

    def partition_files(self, asset: str, suffix: str = "") -> list[str]:
        """The partition files of an asset (or side file) that exist, sorted by shard, as
        locations :meth:`read_file` takes."""
        return [f[0] for f in self._partitions(asset, suffix)]

    def stamps(self, asset: str, suffix: str = "") -> list[str]:
        """``name size mtime`` of every partition file of an asset: changes whenever one is written."""
        return [f"{name} {size} {mtime}" for _, name, size, mtime in self._partitions(asset, suffix)]

    def ledger_stamp(self, key: str) -> str:
        """A ledger's state in one string: changes whenever a line is added."""
        if self.remote:
            from pyarrow import fs as pafs

            store, folder = self._object(f"{key}.d")
            names = sorted(i.base_name for i in store.get_file_info(pafs.FileSelector(folder, allow_not_found=True)))
            return f"{key} {len(names)} {names[-1] if names else ''}"
        try:
            st = os.stat(self.root / key)
        except FileNotFoundError:
            return f"{key} -"
        return f"{key} {st.st_size} {st.st_mtime_ns}"

    def read_file(self, location: str, schema: pa.Schema | None) -> pa.Table:
        """One file listed by :meth:`partition_files`, read forgivingly."""
        if self.remote:
            return read_object_parquet(location, schema)
        return read_parquet(Path(location), schema)

    def write_rows(self, rows: list[dict], schema: pa.Schema, asset: str, shard: str, suffix: str = "") -> str:
        import pyarrow as pa

        return self.write(pa.Table.from_pylist(rows, schema=schema), asset, shard, suffix)

    def read_frame(self, asset: str, shard: str, schema: pa.Schema | None, suffix: str = "") -> pl.DataFrame:
        """One partition as a polars DataFrame, read as forgivingly as :meth:`read`.

        ``schema`` None takes the file's own columns (an asset whose schema depends on the
        run, like chunk_embeddings' vector width); a missing file is then a frame without columns.
        """
        import polars as pl

        frame = pl.from_arrow(self.read(asset, shard, schema, suffix))
        assert isinstance(frame, pl.DataFrame)  # a Table gives a DataFrame (a bare array would give a Series)
        return frame

    def frames(self, asset: str, shards: Sequence[str], schema: pa.Schema | None, suffix: str = "") -> LazyFrames:
        """shard -> DataFrame over ``shards``, each partition read when it is looked up (never kept)."""
        return LazyFrames(self, asset, tuple(shards), schema, suffix)

    def row_count(self, asset: str, shards, suffix: str = "") -> int:
        """Rows of an asset over these shards, from the Parquet footers only."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        total = 0
        if self.remote:
            wanted = {f"{shard}{suffix}.parquet" for shard in shards}
            store = object_store()
            for location in self.partition_files(asset, suffix):
                if location.rsplit("/", 1)[-1] not in wanted:
                    continue
                # The footer alone, in ranged reads (a chunks file can be large): an object replaced
                # between them reads as neither version, so a failed read is tried again.
                for attempt in range(3):
                    try:
                        with store.open_input_file(location) as fh:
                            total += pq.ParquetFile(fh).metadata.num_rows
                        break
                    except (pa.ArrowException, OSError):
                        time.sleep(0.05 * (attempt + 1))  # replaced meanwhile, or damaged: the next read sets it aside
            return total
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
        if self.remote:
            store = object_store()
            files = self.partition_files(asset, suffix)
            for location in files:
                store.delete_file(location)
            return len(files)
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

    # --- shared small files, by key (GENERATIONS, PROVIDER_STATE, LAST_RUN, HISTORY, USAGE) ---

    def read_text(self, key: str) -> str | None:
        """A shared file's text, or None when it does not exist."""
        if self.remote:
            got = get_object(self._object(key)[1])
            return None if got is None else got[0].decode()
        path = self.root / key
        try:
            return path.read_text()
        except FileNotFoundError:
            return None

    def write_text(self, key: str, text: str) -> None:
        """Replace a shared file atomically (a rename on disk, one PUT on object storage)."""
        if self.remote:
            store, path = self._object(key)
            with store.open_output_stream(path) as fh:
                fh.write(text.encode())
            return
        write_text(self.root / key, text)

    def remove(self, key: str) -> bool:
        """Delete a shared file; whether it was there."""
        if self.remote:
            store, path = self._object(key)
            try:
                store.delete_file(path)
            except FileNotFoundError:
                return False
            return True
        try:
            (self.root / key).unlink()
        except FileNotFoundError:
            return False
        return True

    def write_json(self, key: str, value: Any) -> None:
        self.write_text(key, json.dumps(value, indent=2, sort_keys=True))

    def read_json(self, key: str) -> Any | None:
        """The parsed file, or None when it is missing."""
        text = self.read_text(key)
        return None if text is None else json.loads(text)

    def update_json(self, key: str, change: Callable[[dict], T], default: Callable[[], dict]) -> T:
        """Read-modify-write a shared JSON file without losing a concurrent writer's change.

        ``change(state)`` edits the state in place and returns a value, which this returns; the
        file is written only when the state changed. On disk: under an exclusive lock (a local
        lock file). On object storage, where a lock file would order one machine only: a
        conditional PUT (``If-Match`` the ETag that was read, ``If-None-Match: *`` for a new
        file); when another writer got there first, the file is read again and ``change`` applied
        again, so ``change`` must have no side effects outside the state. ValueError: the file is
        not JSON.
        """
        if not self.remote:
            import fcntl

            self.locks_dir.mkdir(parents=True, exist_ok=True)
            with open(self.locks_dir / (key.replace("/", "_") + ".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                text = self.read_text(key)
                state = default() | (json.loads(text) if text else {})
                before = json.dumps(state, sort_keys=True)
                result = change(state)
                if json.dumps(state, sort_keys=True) != before:
                    self.write_json(key, state)
                return result
        client, bucket, name = _s3_client(), *self._bucket_key(key)
        for attempt in range(_CAS_ATTEMPTS):
            text, etag = _get_versioned(client, bucket, name)
            state = default() | (json.loads(text) if text else {})
            before = json.dumps(state, sort_keys=True)
            result = change(state)
            if json.dumps(state, sort_keys=True) == before or _put_if(client, bucket, name, json.dumps(state, indent=2, sort_keys=True), etag):
                return result
            time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))  # another writer won: read again
        raise OSError(f"{self.where(key)} kept changing under {_CAS_ATTEMPTS} attempts to update it")

    def _bucket_key(self, key: str) -> tuple[str, str]:
        bucket, _, prefix = self.remote.removeprefix("s3://").partition("/")
        return bucket, f"{prefix}/{key}" if prefix else key

    def append_line(self, key: str, line: str) -> None:
        """Add one line to a ledger. On disk: O_APPEND (parallel writers never interleave within
        a line). On object storage, which cannot append: one object per line under
        ``<key>.d/``, named by time so :meth:`read_lines` gives them in order; once
        :data:`LEDGER_COMPACT_AT` of them gather, they are merged into one segment object."""
        line = line.rstrip("\n") + "\n"
        if self.remote:
            store, path = self._object(f"{key}.d/{time.time_ns():020d}-{uuid.uuid4().hex[:12]}.json")
            with store.open_output_stream(path) as fh:
                fh.write(line.encode())
            try:
                self._compact_ledger(key)
            except OSError as err:  # the line is written; merging can wait for the next writer
                log.warning("could not compact the ledger %s: %s", self.where(key), err)
            return
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def read_lines(self, key: str) -> list[str]:
        """A ledger's lines, oldest first (empty when there is none yet)."""
        if self.remote:
            for attempt in range(_CAS_ATTEMPTS):
                read = self._ledger_entries(key)
                if read is not None:
                    return [line for _, line in read[0]]
                # An object listed was gone when fetched: a writer merged it into a segment. List again.
                time.sleep(min(1.0, 0.02 * 2**attempt))
            raise OSError(f"{self.where(key)} kept changing under {_CAS_ATTEMPTS} attempts to read it")
        text = self.read_text(key)
        return [] if not text else text.splitlines()

    def _ledger_entries(self, key: str, *, loose_only: bool = False) -> tuple[list[tuple[str, str]], list[str]] | None:
        """A ledger on object storage as ``(line object name, line)``, oldest first (the loose line
        objects and the lines merged into segments, each line once however many segments hold it:
        two writers may merge the same lines), and the objects read. None when a listed object
        vanished before it was read."""
        from concurrent.futures import ThreadPoolExecutor

        from pyarrow import fs as pafs

        store, folder = self._object(f"{key}.d")
        infos = store.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        objects = sorted((i for i in infos if i.type == pafs.FileType.File and _is_ledger_object(i.base_name)), key=lambda i: i.base_name)
        if loose_only:
            objects = [i for i in objects if not i.base_name.endswith(_SEGMENT)]

        def fetch(info) -> list[tuple[str, str]] | None:
            try:
                with store.open_input_stream(info.path) as fh:
                    text = fh.read().decode()
            except OSError:
                # Gone since the listing (a writer merged it), which pyarrow reports at the read, or a
                # read cut short: the caller lists again (and gives up after a bounded number of tries).
                return None
            if not info.base_name.endswith(_SEGMENT):
                return [(info.base_name, text.rstrip("\n"))]
            return segment_entries(text)

        entries: dict[str, str] = {}
        with ThreadPoolExecutor(max_workers=16) as pool:  # one GET per object: fetched side by side
            for got in pool.map(fetch, objects):
                if got is None:
                    return None
                entries.update(got)
        return sorted(entries.items()), [i.base_name for i in objects]

    def _compact_ledger(self, key: str) -> None:
        """Merge a ledger's loose line objects into one segment once there are
        :data:`LEDGER_COMPACT_AT` of them, and all its segments into one once there are as many
        segments. The new segment is written before anything it holds is deleted, and each line
        keeps its object's name in it, so readers never miss or repeat a line."""
        from pyarrow import fs as pafs

        store, folder = self._object(f"{key}.d")
        infos = [i for i in store.get_file_info(pafs.FileSelector(folder, allow_not_found=True)) if i.type == pafs.FileType.File]
        if any(i.base_name == _NO_COMPACTION for i in infos):
            return  # a delete was refused here once: merging would only add copies
        infos = [i for i in infos if _is_ledger_object(i.base_name)]
        segments = sum(1 for i in infos if i.base_name.endswith(_SEGMENT))
        if len(infos) - segments >= LEDGER_COMPACT_AT:
            read = self._ledger_entries(key, loose_only=True)
        elif segments >= LEDGER_COMPACT_AT:
            read = self._ledger_entries(key)
        else:
            return
        if not read or not read[0]:
            return  # another writer is merging them now
        entries, objects = read
        body = segment_text(entries)
        with store.open_output_stream(f"{folder}/{entries[-1][0].removesuffix('.json')}-{uuid.uuid4().hex[:12]}{_SEGMENT}") as fh:
            fh.write(body.encode())
        for name in objects:
            try:
                store.delete_file(f"{folder}/{name}")
            except FileNotFoundError:
                pass
            except OSError as err:
                if "NOT_FOUND" in str(err):
                    continue
                # Deletes refused (a bucket without s3:DeleteObject): the lines stay readable (each once,
                # by name), and a marker stops every later writer from merging them over and over.
                with store.open_output_stream(f"{folder}/{_NO_COMPACTION}") as fh:
                    fh.write(f"deletes refused: {err}\n".encode())
                raise


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

    def table(self, shard: str, schema: pa.Schema) -> pa.Table:
        """One partition as Arrow, only ``schema``'s columns read (a stage that needs a few of a
        large partition's columns reads no more, and no DataFrame copy is made)."""
        if shard not in self._shards:
            raise KeyError(shard)
        return self._data.read(self._asset, shard, schema, self._suffix)

    def pieces(self, shard: str, schema: pa.Schema) -> Iterator[pa.Table]:
        """One partition a piece at a time (its row groups), only ``schema``'s columns read."""
        if shard not in self._shards:
            raise KeyError(shard)
        return self._data.read_pieces(self._asset, shard, schema, self._suffix)

    def row_groups(self, shard: str) -> int | None:
        if shard not in self._shards:
            raise KeyError(shard)
        return self._data.row_groups(self._asset, shard, self._suffix)

    def __iter__(self) -> Iterator[str]:
        return iter(self._shards)

    def __len__(self) -> int:
        return len(self._shards)

    def __repr__(self) -> str:
        return f"LazyFrames({self._asset}{self._suffix}, {len(self._shards)} shards)"


PIECE_ROWS = 4096
"""The rows of a piece: the stages from extraction to the table write each shard in pieces of
about this many rows (whole files each: a file's segments or chunks are never split), written as
the Parquet file's row groups and read back one at a time (:func:`pieces`). A shard is a sixteenth
of the folder, so without pieces each stage's memory grew with the folder: at a million chunks a
shard is 62,500 of them (see README, Benchmarks)."""


def pieces(frames: Mapping[str, pl.DataFrame], shard: str, schema: pa.Schema) -> Iterator[pa.Table]:
    """A shard of an asset as Arrow tables in ``schema``: its pieces when the frames are the IO
    manager's (:class:`LazyFrames`), else the one frame converted."""
    if isinstance(frames, LazyFrames):
        return frames.pieces(shard, schema)
    return iter([conform(frames[shard].to_arrow(), schema)])


@lru_cache(maxsize=64)
def _store(root: Path, remote: str = "") -> DataStore:
    return DataStore(root, remote)


def of(settings: Settings) -> DataStore:
    """The data folder of a configuration."""
    data_dir = settings.data_dir
    if isinstance(data_dir, str) and is_url(data_dir):
        return _store(Path(settings.local_dir) if settings.local_dir else default_local_dir(data_dir), data_dir.rstrip("/"))
    return _store(Path(data_dir))


def is_url(value: str) -> bool:
    """Whether a ``data_dir`` names object storage (``s3://…``) rather than a folder."""
    return urlsplit(value).scheme.lower() in URL_SCHEMES


def check_url(value: str) -> str:
    """An ``s3://bucket/prefix`` data_dir, checked: a bucket, no credentials, no query. ValueError otherwise."""
    value = value.strip()
    if any(c.isspace() or not c.isprintable() or c == "\\" for c in value):
        raise ValueError("has a space, a control character or a backslash in it: s3://bucket/prefix")
    parts = urlsplit(value)
    if parts.username or parts.password or "@" in parts.netloc:
        raise ValueError("must not carry credentials: they come from the AWS environment variables or profile")
    if not parts.netloc:
        raise ValueError("needs a bucket: s3://bucket/prefix")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", parts.netloc):
        raise ValueError("has a bucket name that is not one (letters, digits, '.', '-', '_'): s3://bucket/prefix")
    if parts.query or parts.fragment or value.rstrip().endswith(("?", "#")):
        raise ValueError("takes no query or fragment: s3://bucket/prefix")
    body = parts.path.removeprefix("/").rstrip("/")
    segments = body.split("/") if body else []
    if any(seg in ("", ".", "..") for seg in segments):
        raise ValueError("has an empty, '.' or '..' path segment: s3://bucket/prefix")
    return f"s3://{parts.netloc}{parts.path.rstrip('/')}"


def default_local_dir(url: str) -> Path:
    """Where a machine keeps its own part of an object-storage data folder."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "memory_pipeline" / "s3" / url.removeprefix("s3://").strip("/")


_TRUE = ("1", "true", "yes", "on")


@lru_cache(maxsize=4)
def _object_store(endpoint: str, region: str, allow_http: bool) -> pafs.FileSystem:
    from pyarrow import fs as pafs

    kwargs: dict[str, Any] = {}
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        if parts.scheme == "http" and not allow_http:
            from memory_pipeline.errors import ConfigError

            raise ConfigError(
                f"AWS_ENDPOINT_URL {shown_endpoint(endpoint)} is plain http, which is refused unless AWS_ALLOW_HTTP=true",
                hint="export AWS_ALLOW_HTTP=true for a test server on a trusted network, or use its https:// address",
            )
        kwargs["endpoint_override"] = parts.netloc
        kwargs["scheme"] = parts.scheme
    if region:
        kwargs["region"] = region
    return pafs.S3FileSystem(**kwargs)  # credentials: the AWS SDK's default chain (environment, profile, instance)


def shown_endpoint(endpoint: str) -> str:
    """An endpoint as messages may show it: without a user name or password in it
    (``http://user:secret@host:9000`` -> ``http://host:9000``)."""
    if "@" not in endpoint:
        return endpoint
    scheme = _SCHEME.match(endpoint)  # none: a bare host:port (a password may hold "://" too)
    head = scheme.group(0) if scheme else ""
    host = endpoint[len(head) :].rpartition("@")[2]  # the last "@": a hand-pasted password may hold "@", "/" or "#"
    return f"{head}{host}"


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # RFC 3986's scheme, and its "://"


def _aws_env() -> tuple[str, str, bool]:
    """(endpoint, region, allow_http) from the standard AWS variables: the one place they are read."""
    env = os.environ
    endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "").strip()
    region = (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "").strip()
    return endpoint, region, env.get("AWS_ALLOW_HTTP", "").strip().lower() in _TRUE


def object_store() -> pafs.FileSystem:
    """The S3 file system, configured from the standard AWS environment variables only."""
    return _object_store(*_aws_env())


def check_bucket(url: str) -> None:
    """That the bucket of an ``s3://`` URL exists and these credentials can see it, once per process.

    A missing bucket, a denied one or an unreachable store is one clear error here (ConfigError,
    StoreError), not whatever the first read or commit deep inside a run would raise.
    """
    _check_bucket(urlsplit(url).netloc, _aws_env()[0])


@lru_cache(maxsize=16)
def _check_bucket(bucket: str, endpoint: str) -> None:
    from pyarrow import fs as pafs

    from memory_pipeline.errors import ConfigError, StoreError

    where = f" at {shown_endpoint(endpoint)}" if endpoint else ""
    try:
        info = object_store().get_file_info(bucket)
    except OSError as err:
        reason = _reason(err)
        raise StoreError(
            f"cannot reach the bucket {bucket}{where}: {reason}",
            hint="check the AWS credentials and AWS_ENDPOINT_URL in the environment, and that the store is up",
        ) from None
    if info.type == pafs.FileType.NotFound:
        raise ConfigError(
            f"data_dir: the bucket {bucket} does not exist{where} (or these AWS credentials cannot see it)",
            hint="create the bucket, or fix data_dir in the configuration file",
        )


os.register_at_fork(after_in_child=_object_store.cache_clear)  # a forked worker makes its own connections
os.register_at_fork(after_in_child=_check_bucket.cache_clear)


def _reason(err: BaseException) -> str:
    """An error's message on one line, at most 300 characters (SDK messages span lines), without
    the user name and password of any URL in it (an endpoint given as ``http://user:secret@host``)."""
    return one_line(str(err))


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters, without the user name and password of any
    URL in it."""
    return _USERINFO.sub("//", " ".join(text.split()))[:limit]


# A URL's user name and password: up to its last "@" before the next space (a password may hold
# "@", "/", "#" or "?" unencoded when pasted by hand).
_USERINFO = re.compile(r"//[^\s@]*(?:@[^\s@]*)*@")


def _code(err: BaseException) -> str:
    """An S3 error's code (``NoSuchKey``, ``PreconditionFailed``, …); empty for one with no reply."""
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))


# S3 error codes that no retry can mend: the caller's identity, the bucket or its region is wrong.
_PERMANENT_CODES = frozenset(
    {
        "AccessDenied", "AllAccessDisabled", "AccountProblem", "InvalidAccessKeyId", "SignatureDoesNotMatch",
        "InvalidToken", "ExpiredToken", "NoSuchBucket", "InvalidBucketName", "AuthorizationHeaderMalformed",
        "PermanentRedirect",
    }
)  # fmt: skip
# The same, as the other clients word them: pyarrow's (the AWS C++ SDK's ``ACCESS_DENIED``) and
# LanceDB's (Rust object_store's "Client error with status 403 Forbidden: <Code>AccessDenied…").
_PERMANENT_TEXT = re.compile(
    r"\b(?:" + "|".join(sorted(_PERMANENT_CODES)) + r"|ACCESS_DENIED|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH|NO_SUCH_BUCKET"
    r"|status 40[13]\b|HTTP status code 40[13]\b|40[13] Forbidden|401 Unauthorized)"
)


def _permanent(err: BaseException) -> bool:
    """Whether an S3 call's error is one that trying again cannot mend (denied, no such bucket,
    a profile or keys that do not exist); a connection error, a timeout, throttling or credentials
    not found (the instance metadata service may be slow to answer) is not."""
    from botocore.exceptions import PartialCredentialsError, ProfileNotFound

    code = _code(err)
    return code in _PERMANENT_CODES or code in ("401", "403") or isinstance(err, (PartialCredentialsError, ProfileNotFound))


def permanent_failure(err: BaseException | None) -> bool:
    """Whether a store error, or one it was raised from, is one no retry can mend: an
    :class:`ObjectStoreError` marked ``permanent``, or a message of any client that says access
    was denied or the bucket does not exist (the table's and pyarrow's errors come wrapped)."""
    for _ in range(8):  # the error and what it was raised from
        if err is None:
            return False
        if getattr(err, "permanent", False) or _PERMANENT_TEXT.search(str(err)):
            return True
        err = err.__cause__ or err.__context__
    return False


def _s3_client():
    """boto3's S3 client (whole-object reads and conditional writes, which pyarrow's file system
    does not offer); the endpoint, region and keys from the same AWS variables and chain.
    OSError when it cannot be made (a profile that does not exist, a bad endpoint)."""
    from botocore.exceptions import BotoCoreError

    object_store()  # the same checks (AWS_ALLOW_HTTP) and one-line errors first
    endpoint, region, _ = _aws_env()
    if endpoint and "://" not in endpoint:
        endpoint = f"https://{endpoint}"  # as pyarrow's file system takes a bare host:port
    # Made again whenever an AWS variable changes (keys, token, profile, retries, CA bundle).
    aws = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    try:
        return _boto_client(endpoint, region, aws)
    except (BotoCoreError, ValueError) as err:
        raise ObjectStoreError(f"cannot make an S3 client: {_reason(err)}", permanent=_permanent(err)) from None


@lru_cache(maxsize=4)
def _boto_client(endpoint: str, region: str, aws: tuple):
    """One client per process and settings (a client is thread-safe; making one costs tens of ms)."""
    import boto3

    return boto3.Session().client("s3", endpoint_url=endpoint or None, region_name=region or None)


os.register_at_fork(after_in_child=_boto_client.cache_clear)


def _get_versioned(client, bucket: str, key: str) -> tuple[str | None, str | None]:
    """An object's text and ETag; (None, None) when it does not exist."""
    got = get_object(f"{bucket}/{key}", client)
    return (None, None) if got is None else (got[0].decode(), got[1])


def get_object(path: str, client=None) -> tuple[bytes, str] | None:
    """An object's bytes and ETag (``path``: ``bucket/key``) in one GET; None when it does not exist.

    One GET returns one version, whole. pyarrow's input streams ask for the size first and then
    for that many bytes: an object replaced in between (another machine's run writing the same
    partition) comes back as part of the new version, which reads as damaged. Raised as OSError:
    a network error, throttling or a denied read, never mistaken for a missing object.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, key = path.partition("/")
    client = client or _s3_client()
    try:
        got = client.get_object(Bucket=bucket, Key=key)
        return got["Body"].read(), got.get("ETag", "")
    except (ClientError, BotoCoreError) as err:
        if _code(err) in ("NoSuchKey", "404"):
            return None
        raise ObjectStoreError(f"s3://{path}: {_reason(err)}", permanent=_permanent(err)) from None


def _set_aside(path: str, etag: str, aside: str) -> bool | None:
    """Move the damaged version ``etag`` of an object to ``aside``: True when it moved; False when
    the object was replaced since it was read (the new version is read instead: it may be whole);
    None when the store refused the copy or the delete (warned; the object is left where it is).

    The copy and the delete are both conditional on that version (``If-Match``), and the version
    is checked between them too, for a store that ignores the conditions."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, key = path.partition("/")
    client = _s3_client()
    if_match = {"IfMatch": etag} if etag else {}
    try:
        copy_if = {"CopySourceIfMatch": etag} if etag else {}
        client.copy_object(Bucket=bucket, Key=aside.partition("/")[2], CopySource={"Bucket": bucket, "Key": key}, **copy_if)
        if etag and client.head_object(Bucket=bucket, Key=key).get("ETag") != etag:
            return False
        client.delete_object(Bucket=bucket, Key=key, **if_match)
    except (ClientError, BotoCoreError) as err:
        if _code(err) in ("PreconditionFailed", "412", "NoSuchKey", "404"):
            return False
        log.warning("could not set aside s3://%s: %s", path, _reason(err))
        return None
    return True


def _put_if(client, bucket: str, key: str, text: str, etag: str | None) -> bool:
    """Write the object if it is still the version read (``etag``; None: if it still does not
    exist); False when another writer changed it first."""
    from botocore.exceptions import BotoCoreError, ClientError

    condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
    try:
        client.put_object(Bucket=bucket, Key=key, Body=text.encode(), **condition)
    except (ClientError, BotoCoreError) as err:
        if _code(err) in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
            return False
        raise ObjectStoreError(f"s3://{bucket}/{key}: {_reason(err)}", permanent=_permanent(err)) from None
    return True


def write_text(path: Path, text: str) -> None:
    """Write a file atomically: a temp file beside it, then one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How a table is written: dictionary encoding and statistics for every column except vectors.

    A vector column is lists of floats that almost never repeat: Parquet's writer would still
    hash every float into a dictionary page before falling back to plain, and keep min/max
    statistics nobody reads. For a wave of 1,400 vectors of 384 floats that is 27 MB of Arrow
    memory (70 MB resident) and 10 times the write time, against 10 MB without (measured with
    pyarrow 26; the embed stage writes one such frame per shard while the next wave embeds)."""
    import pyarrow as pa

    def vector(t: pa.DataType) -> bool:
        return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and pa.types.is_floating(t.value_type)

    plain = [f.name for f in schema if not vector(f.type)]
    return {"use_dictionary": plain, "write_statistics": plain}


def write_parquet(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    pq.write_table(table, tmp, **parquet_options(table.schema))
    os.replace(tmp, path)


def read_object_parquet(path: str, schema: pa.Schema | None) -> pa.Table:
    """:func:`read_parquet` for an object (``bucket/key``): missing is empty; damaged is moved
    aside and empty. Read in one GET (:func:`get_object`), so an object another writer replaces
    meanwhile is read whole, as one version or the other."""
    import pyarrow as pa

    empty = schema.empty_table() if schema is not None else pa.table({})
    for _ in range(_CAS_ATTEMPTS):
        # A network error, throttling or a denied read is raised as it is (never mistaken for a
        # damaged file, which would be set aside and its work redone).
        got = get_object(path)
        if got is None:
            return empty
        data, etag = got
        try:
            table = _read_columns(pa.BufferReader(data), schema)
            return table if schema is None else conform(table, schema)
        except (pa.ArrowException, OSError, ValueError) as err:
            kind = type(err).__name__
        aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
        moved = _set_aside(path, etag, aside)
        if moved is not False:
            # Read as empty either way: its work is made again and the object written over.
            done = f"moved aside to {aside.rsplit('/', 1)[-1]}" if moved else "left where it is (the store refused to move it)"
            log.warning("s3://%s is damaged (%s); %s, and rebuilt", path, kind, done)
            return empty
    raise OSError(f"s3://{path} kept changing under {_CAS_ATTEMPTS} attempts to read it")


def _read_columns(source, schema: pa.Schema | None) -> pa.Table:
    """A Parquet file (path or buffer) with only ``schema``'s columns read, those the file has
    (all of them without a schema). A file damaged only in a column not asked for is then left in
    place: the read that needs that column sets it aside."""
    import pyarrow.parquet as pq

    if schema is None:
        return pq.read_table(source)
    present = set(pq.read_schema(source).names)
    return pq.read_table(source, columns=[n for n in schema.names if n in present])


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A table in ``schema``: missing columns filled (nulls, or empty strings for strings), extra ones dropped."""
    import pyarrow as pa

    columns = []
    for f in schema:
        if f.name in table.column_names:
            columns.append(table.column(f.name).cast(f.type))
        elif pa.types.is_string(f.type):
            columns.append(pa.array([""] * table.num_rows, type=f.type))
        else:
            columns.append(pa.nulls(table.num_rows, type=f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def os_fault(err: BaseException) -> bool:
    """Whether a failed read is the system's (permission denied, an I/O error of the disk: an
    ``OSError`` with an errno), not the file's content: Arrow raises a damaged Parquet file's
    errors without one (``ArrowInvalid``, or ``OSError: Couldn't deserialize thrift``). A file
    that cannot be read here is not damaged and must not be set aside as damaged."""
    return isinstance(err, OSError) and err.errno is not None


def read_parquet(path: Path, schema: pa.Schema | None) -> pa.Table:
    """The file as ``schema``, or an empty table when it is missing or damaged (an unreadable one,
    :func:`os_fault`, raises).

    Columns the file lacks (written before they existed) are filled with nulls, or
    empty strings for non-nullable string columns; columns it has beyond the schema
    are dropped. Without a schema the file is read as it is (and missing or damaged
    reads as a table without columns).
    """
    import pyarrow as pa

    empty = schema.empty_table() if schema is not None else pa.table({})
    if not path.is_file():
        return empty
    try:
        table = _read_columns(path, schema)
        return table if schema is None else conform(table, schema)
    except (pa.ArrowException, OSError, ValueError) as err:
        if os_fault(err):
            raise  # the file cannot be read here, which is not damage: it stays where it is
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(path, aside)
        except OSError:
            pass
        log.warning("%s is damaged (%s); moved aside to %s and rebuilt", path, type(err).__name__, aside.name)
        return empty


__all__ = [
    "ASSETS", "GENERATIONS", "HISTORY", "LAST_RUN", "PIECE_ROWS", "PROVIDER_STATE", "SIDE_ASSETS", "SIDE_FILES", "USAGE", "DataStore", "LazyFrames",
    "check_url", "default_local_dir", "is_url", "locate", "object_store", "of", "pieces", "read_parquet", "write_parquet", "write_text",
]  # fmt: skip
