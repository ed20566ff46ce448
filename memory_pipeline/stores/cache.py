"""The embedding cache: SQLite, keyed by (provider, model, provider_key, dims, content hash).

Unchanged text is never embedded twice, across runs, renames and rebuilds.
Entries are pruned to ``cache.max_entries`` by least recent use. SQLite in WAL
mode lets parallel partition runs share it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from memory_pipeline.errors import StoreError

_BATCH = 500
log = logging.getLogger("memory_pipeline")


def cache_key(provider: str, model: str, provider_key: str, dims: int, content_hash: str) -> str:
    return hashlib.sha256(f"{provider}\0{model}\0{provider_key}\0{dims}\0{content_hash}".encode()).hexdigest()


# SQLite's primary result codes (``sqlite3.Error.sqlite_errorcode & 0xFF``) that mean the file
# itself is damaged or is no database: only then is deleting the cache the fix.
SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26
SQLITE_READONLY, SQLITE_CANTOPEN = 8, 14
SQLITE_IOERR, SQLITE_FULL = 10, 13


def damaged(err: sqlite3.Error) -> bool:
    """Whether ``err`` says the cache file is damaged (not locked, read-only or unreachable)."""
    return (getattr(err, "sqlite_errorcode", 0) & 0xFF) in (SQLITE_CORRUPT, SQLITE_NOTADB)


def disk_failure(err: BaseException) -> sqlite3.Error | None:
    """The SQLite error under ``err`` (itself, its cause or context, or what SQLAlchemy wrapped:
    Dagster's instance is SQLite too) that says the disk is full or failing; None if there is none."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [err]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen or len(seen) > 20:  # bounded: a chain is short
            continue
        seen.add(id(e))
        if isinstance(e, sqlite3.Error) and (getattr(e, "sqlite_errorcode", 0) & 0xFF) in (SQLITE_IOERR, SQLITE_FULL):
            return e
        orig = getattr(e, "orig", None)  # sqlalchemy.exc.DBAPIError
        stack += [e.__cause__, e.__context__, orig if isinstance(orig, BaseException) else None]
    return None


def open_readonly(path: Path) -> sqlite3.Connection:
    """The cache for reading only (`memory status`, `memory doctor`): it writes nothing, not even
    the WAL's shared-memory file, so it opens in a data folder this user cannot write. There the
    file is read as it is on disk (SQLite's ``immutable``): no writer can be at work in that folder."""
    uri = "file:" + urllib.parse.quote(str(path))
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=10)
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as err:
        conn.close()
        if (err.sqlite_errorcode & 0xFF) not in (SQLITE_READONLY, SQLITE_CANTOPEN):
            raise
    return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=10)


def entries(path: Path) -> int:
    """How many vectors the cache at ``path`` holds, read only."""
    conn = open_readonly(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0])
    finally:
        conn.close()


class EmbeddingCache:
    def __init__(self, path: Path, max_entries: int) -> None:
        self.path = path
        self.max_entries = max_entries
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = self._connect(path)
        except sqlite3.DatabaseError as err:
            if isinstance(err, sqlite3.OperationalError):  # locked, unreadable folder: not damage
                raise StoreError(f"cannot open embedding cache {path}: {err}") from err
            # A damaged cache file is only a cache: set it aside and start empty (vectors are recomputed).
            aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(f"{path}{suffix}"):
                    os.replace(f"{path}{suffix}", f"{aside}{suffix}")
            log.warning("embedding cache %s is damaged (%s); moved aside to %s, starting empty", path, err, aside.name)
            try:
                self._conn = self._connect(path)
            except sqlite3.Error as err2:
                raise StoreError(f"cannot open embedding cache {path}: {err2}") from err2
        except sqlite3.Error as err:
            raise StoreError(f"cannot open embedding cache {path}: {err}") from err

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), timeout=60, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS embeddings ( key TEXT PRIMARY KEY, dims INTEGER NOT NULL, vector BLOB NOT NULL, last_used INTEGER NOT NULL)"
            )
            conn.execute("CREATE INDEX IF NOT EXISTS embeddings_last_used ON embeddings(last_used)")
            conn.execute("SELECT key FROM embeddings LIMIT 1").fetchall()
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        self._conn.close()

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0])

    def get_many(self, keys: Sequence[str], dims: int) -> dict[str, np.ndarray]:
        """Cached vectors for the keys that are present; touches them for LRU."""
        found: dict[str, np.ndarray] = {}
        now = time.time_ns()
        for i in range(0, len(keys), _BATCH):
            batch = list(keys[i : i + _BATCH])
            marks = ",".join("?" * len(batch))
            rows = self._conn.execute(f"SELECT key, vector FROM embeddings WHERE dims = ? AND key IN ({marks})", [dims, *batch]).fetchall()
            for key, blob in rows:
                found[key] = np.frombuffer(blob, dtype=np.float32)
            if rows:
                self._conn.execute(
                    f"UPDATE embeddings SET last_used = ? WHERE key IN ({','.join('?' * len(rows))})",
                    [now, *[r[0] for r in rows]],
                )
        return found

    def put_many(self, items: Iterable[tuple[str, np.ndarray]]) -> int:
        now = time.time_ns()
        rows = [(k, int(v.shape[-1]), np.asarray(v, dtype=np.float32).tobytes(), now) for k, v in items]
        if not rows:
            return 0
        self._conn.execute("BEGIN")
        self._conn.executemany("INSERT OR REPLACE INTO embeddings(key, dims, vector, last_used) VALUES (?,?,?,?)", rows)
        self._conn.execute("COMMIT")
        return len(rows)

    def prune(self) -> int:
        """Drop least recently used entries beyond max_entries; returns how many were dropped."""
        total = len(self)
        excess = total - self.max_entries
        if excess <= 0:
            return 0
        self._conn.execute("DELETE FROM embeddings WHERE key IN (SELECT key FROM embeddings ORDER BY last_used ASC LIMIT ?)", [excess])
        return excess
