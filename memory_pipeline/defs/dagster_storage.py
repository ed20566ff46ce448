"""Dagster's SQLite event log, with each database's engine kept for the process's life.

Dagster's ``SqliteEventLogStorage`` builds a new SQLAlchemy engine for every connection: every
event of a run (about 300 for a 16-shard run of the sample) pays engine creation, a fresh
SQLite connection and SQL compiled again (the compiled-statement cache lives on the engine).
That was 55-60 % of a warm index run's time with nothing to embed. This class keeps one engine
per database file (the run's own and the cross-run index), reusing its pooled connection and
compiled statements; everything else, files and schema included, is Dagster's own, so the
instance stays readable by `dagster dev`, the daemon and any other Dagster process.

- Engines are per process: a forked child drops its parent's (never sharing a connection across
  a fork) and builds its own.
- At most ``_MAX_ENGINES`` are kept (least recently used first out): a long-lived process that
  reads many runs holds a bounded number of open files.
- ``wipe`` closes every engine before Dagster deletes the files.

Selected in the ``dagster.yaml`` that ``memory index`` writes (see ``runner.DAGSTER_YAML``); an
instance configured by hand (PostgreSQL, another storage) is left alone.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SqliteEventLogStorage
from dagster._core.storage.sql import create_engine
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from sqlalchemy.pool import QueuePool

_MAX_ENGINES = 8
EVENT_BATCH_SIZE = 1000  # events stored per transaction at most


def enable_event_batches() -> None:
    """Have Dagster hand batches of events to the event log in one call (its
    ``DAGSTER_EVENT_BATCH_SIZE``, read per event): a range run's planned materializations, a
    step's materializations of every partition. ``store_event_batch`` below stores a batch in
    one transaction per database; another storage stores it event by event, as without. A value
    the user set is kept (0 turns batches off)."""
    os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", str(EVENT_BATCH_SIZE))


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    """``SqliteEventLogStorage`` that reuses one engine per database file (see the module's notes)."""

    def __init__(self, base_dir: str, inst_data: Any = None) -> None:
        self._engines: OrderedDict[str, Any] = OrderedDict()
        self._engines_pid = os.getpid()
        # Guards the engine table only: Dagster's own _db_lock is held around whole transactions,
        # and has_table is called inside one (so it cannot take _db_lock again).
        self._engines_lock = threading.Lock()
        self._batch = threading.local()  # the open transactions of a store_event_batch, per thread
        super().__init__(base_dir, inst_data)

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> PooledSqliteEventLogStorage:  # type: ignore[override]
        return cls(inst_data=inst_data, **config_value)

    def _engine(self, shard: str) -> Any:
        with self._engines_lock:
            return self._engine_locked(shard)

    def _engine_locked(self, shard: str) -> Any:
        if self._engines_pid != os.getpid():  # a forked child: the parent's connections are not ours
            self._engines = OrderedDict()
            self._engines_pid = os.getpid()
        engine = self._engines.get(shard)
        if engine is not None:
            self._engines.move_to_end(shard)
            return engine
        engine = create_engine(
            self.conn_string_for_shard(shard),
            poolclass=QueuePool,
            pool_size=1,
            max_overflow=4,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
        )
        self._engines[shard] = engine
        while len(self._engines) > _MAX_ENGINES:
            _, old = self._engines.popitem(last=False)
            old.dispose()
        return engine

    @contextlib.contextmanager
    def _connect(self, shard: str) -> Iterator[Any]:  # type: ignore[override]
        batch = getattr(self._batch, "open", None)
        if batch is not None:  # inside store_event_batch, on its thread: its lock is held
            conn = batch.get(shard)
            if conn is None:
                conn = batch[shard] = self._batch.stack.enter_context(self._transaction(shard))
            yield conn
            return
        with self._db_lock:
            with self._transaction(shard) as conn:
                yield conn

    @contextlib.contextmanager
    def _transaction(self, shard: str) -> Iterator[Any]:
        engine = self._engine(shard)
        if shard not in self._initialized_dbs:
            self._initdb(engine)
            self._initialized_dbs.add(shard)
        with engine.connect() as conn:
            with conn.begin():
                yield conn

    def store_event_batch(self, events: Sequence[Any]) -> None:
        """Several events in one transaction per database (the run's and the cross-run index),
        each stored exactly as ``store_event`` stores it. Dagster hands a batch here when
        ``DAGSTER_EVENT_BATCH_SIZE`` is set (``runner`` sets it): a range run's planned
        materializations (one per asset and partition) and each step's materializations (one per
        partition). One transaction per event cost 2.6 ms each, 0.8 s of a 16-shard run's 321
        events. A failure rolls the whole batch back (Dagster then stores its events one by one)."""
        if len(events) < 2:
            for event in events:
                self.store_event(event)
            return
        with self._db_lock, contextlib.ExitStack() as stack:
            self._batch.open, self._batch.stack = {}, stack
            try:
                for event in events:
                    self.store_event(event)
            finally:
                self._batch.open = self._batch.stack = None

    def has_table(self, table_name: str) -> bool:
        with self._engine(INDEX_SHARD_NAME).connect() as conn:
            return bool(conn.dialect.has_table(conn, table_name))

    def _close_engines(self) -> None:
        with self._engines_lock:
            engines, self._engines = list(self._engines.values()), OrderedDict()
        for engine in engines:
            engine.dispose()

    def wipe(self) -> None:
        with self._db_lock:
            self._close_engines()
        super().wipe()

    def dispose(self) -> None:
        with self._db_lock:
            self._close_engines()
        super().dispose()
