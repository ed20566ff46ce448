"""The batch job store: what was submitted to which provider, persisted before anyone waits.

SQLite under ``<data_dir>/batch/jobs.sqlite`` (WAL, shared by parallel runs and the
sensor). A job row is written *before* the upload (state ``submitting``) and gets
its remote id as soon as the provider returns it (state ``submitted``), so a run
that is killed or cancelled while waiting leaves everything the next run needs to
resume polling the same jobs instead of paying for them twice.

Job states::

    submitting ──> submitted ──> collected   (results are in the embedding cache)
         │             └──────> failed | expired | cancelled | abandoned
         └──> lost  (the process died before the provider answered; the work is resubmitted)

``provider_state`` counts batch failures per provider; at ``FAILURE_LIMIT`` (or at
once on an "unavailable" error) batching is disabled for that provider until
``memory batch reset``.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memory_pipeline.errors import StoreError

FAILURE_LIMIT = 2
OPEN_STATES = ("submitting", "submitted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    local_id TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    provider_key TEXT NOT NULL,
    model TEXT NOT NULL,
    remote_id TEXT,
    state TEXT NOT NULL,
    remote_status TEXT NOT NULL DEFAULT '',
    requests INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    shards TEXT NOT NULL DEFAULT '[]',
    meta TEXT NOT NULL DEFAULT '{}',
    error TEXT NOT NULL DEFAULT '',
    polls INTEGER NOT NULL DEFAULT 0,
    ready INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE TABLE IF NOT EXISTS job_items (
    local_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    content_hash TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (local_id, position)
);
CREATE INDEX IF NOT EXISTS job_items_hash ON job_items(content_hash);
CREATE TABLE IF NOT EXISTS provider_state (
    provider TEXT PRIMARY KEY,
    failures INTEGER NOT NULL DEFAULT 0,
    disabled INTEGER NOT NULL DEFAULT 0,
    reason TEXT NOT NULL DEFAULT '',
    updated_at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class JobRecord:
    local_id: str
    provider: str
    provider_key: str
    model: str
    remote_id: str | None
    state: str
    remote_status: str
    requests: int
    tokens: int
    shards: tuple[str, ...]
    meta: dict = field(default_factory=dict)
    error: str = ""
    polls: int = 0
    ready: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES


@dataclass(frozen=True)
class ProviderBatchState:
    provider: str
    failures: int
    disabled: bool
    reason: str


def store_path(data_dir: Path) -> Path:
    """The job store of a data folder (``storage.DataStore.batch_jobs``)."""
    from memory_pipeline.storage import DataStore

    return DataStore(Path(data_dir)).batch_jobs


class JobStore:
    """Persisted batch jobs and per-provider failure state."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(str(path), timeout=60, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")  # a job id must survive a power cut
            self._conn.executescript(_SCHEMA)
        except sqlite3.Error as err:
            raise StoreError(f"cannot open batch job store {path}: {err}") from err

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- jobs ----------------------------------------------------------------------------

    def begin(
        self,
        *,
        provider: str,
        provider_key: str,
        model: str,
        hashes: Sequence[str],
        tokens: Sequence[int],
        shards: Iterable[str],
        submitter: dict | None = None,
    ) -> str:
        """Record a job about to be submitted (before any upload); returns its local id."""
        local_id = uuid.uuid4().hex
        now = time.time()
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._conn.execute(
                "INSERT INTO jobs(local_id, provider, provider_key, model, state, requests, tokens, shards, meta,"
                " created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    local_id,
                    provider,
                    provider_key,
                    model,
                    "submitting",
                    len(hashes),
                    int(sum(tokens)),
                    json.dumps(sorted(set(shards))),
                    json.dumps(submitter or {}),
                    now,
                    now,
                ),
            )
            self._conn.executemany(
                "INSERT INTO job_items(local_id, position, content_hash, tokens) VALUES (?,?,?,?)",
                [(local_id, i, h, int(n)) for i, (h, n) in enumerate(zip(hashes, tokens))],
            )
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return local_id

    def submitted(self, local_id: str, remote_id: str, meta: dict | None = None) -> None:
        """The provider accepted the job: from now on it is resumed, never resubmitted."""
        rec = self.get(local_id)
        merged = {**(rec.meta if rec else {}), **(meta or {})}
        self._update(local_id, state="submitted", remote_id=remote_id, meta=json.dumps(merged))

    def set_status(self, local_id: str, remote_status: str, *, ready: bool | None = None) -> None:
        sets: dict[str, str | int] = {"remote_status": remote_status}
        if ready is not None:
            sets["ready"] = int(ready)
        self._update(local_id, **sets)
        self._conn.execute("UPDATE jobs SET polls = polls + 1 WHERE local_id = ?", (local_id,))

    def finish(self, local_id: str, state: str, error: str = "") -> None:
        self._update(local_id, state=state, error=error[:500])

    def _update(self, local_id: str, **sets) -> None:
        cols = ", ".join(f"{k} = ?" for k in sets)
        self._conn.execute(f"UPDATE jobs SET {cols}, updated_at = ? WHERE local_id = ?", (*sets.values(), time.time(), local_id))

    def get(self, local_id: str) -> JobRecord | None:
        row = self._conn.execute(f"SELECT {_COLS} FROM jobs WHERE local_id = ?", (local_id,)).fetchone()
        return _record(row) if row else None

    def jobs(self, *, states: Sequence[str] | None = None, provider_key: str | None = None, limit: int = 1000) -> list[JobRecord]:
        where, args = [], []
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args += list(states)
        if provider_key is not None:
            where.append("provider_key = ?")
            args.append(provider_key)
        sql = f"SELECT {_COLS} FROM jobs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY created_at DESC LIMIT ?"
        return [_record(r) for r in self._conn.execute(sql, (*args, limit)).fetchall()]

    def open_jobs(self, provider_key: str | None = None) -> list[JobRecord]:
        return sorted(self.jobs(states=OPEN_STATES, provider_key=provider_key), key=lambda j: j.created_at)

    def items(self, local_id: str) -> list[tuple[str, int]]:
        """(content_hash, tokens) of a job, in submission order."""
        return [
            (h, n) for h, n in self._conn.execute("SELECT content_hash, tokens FROM job_items WHERE local_id = ? ORDER BY position", (local_id,)).fetchall()
        ]

    # --- failure policy ------------------------------------------------------------------

    def provider_state(self, provider: str) -> ProviderBatchState:
        row = self._conn.execute("SELECT failures, disabled, reason FROM provider_state WHERE provider = ?", (provider,)).fetchone()
        if row is None:
            return ProviderBatchState(provider, 0, False, "")
        return ProviderBatchState(provider, int(row[0]), bool(row[1]), row[2])

    def all_provider_states(self) -> list[ProviderBatchState]:
        rows = self._conn.execute("SELECT provider, failures, disabled, reason FROM provider_state ORDER BY provider")
        return [ProviderBatchState(p, int(f), bool(d), r) for p, f, d, r in rows.fetchall()]

    def record_failure(self, provider: str, reason: str, *, unavailable: bool = False) -> ProviderBatchState:
        """Count a batch failure; disable batching at FAILURE_LIMIT, or at once when the API is unavailable."""
        state = self.provider_state(provider)
        failures = state.failures + 1
        disabled = state.disabled or unavailable or failures >= FAILURE_LIMIT
        why = (
            state.reason
            if state.disabled
            else (f"batch API unavailable: {reason}" if unavailable else (f"{failures} batch failures; last: {reason}" if disabled else reason))
        )
        self._conn.execute(
            "INSERT INTO provider_state(provider, failures, disabled, reason, updated_at) VALUES (?,?,?,?,?)"
            " ON CONFLICT(provider) DO UPDATE SET failures = excluded.failures, disabled = excluded.disabled,"
            " reason = excluded.reason, updated_at = excluded.updated_at",
            (provider, failures, int(disabled), why[:500], time.time()),
        )
        return ProviderBatchState(provider, failures, disabled, why)

    def record_success(self, provider: str) -> None:
        """A job came back whole: consecutive failures start again from zero (a disable stays)."""
        self._conn.execute(
            "UPDATE provider_state SET failures = 0, updated_at = ? WHERE provider = ? AND disabled = 0",
            (time.time(), provider),
        )

    def reset(self, provider: str | None = None) -> list[str]:
        """Re-enable batching (one provider, or all); returns the providers that were reset."""
        if provider is None:
            names = [r[0] for r in self._conn.execute("SELECT provider FROM provider_state").fetchall()]
            self._conn.execute("DELETE FROM provider_state")
            return names
        cur = self._conn.execute("DELETE FROM provider_state WHERE provider = ?", (provider,))
        return [provider] if cur.rowcount else []


_COLS = "local_id, provider, provider_key, model, remote_id, state, remote_status, requests, tokens, shards, meta, error, polls, ready, created_at, updated_at"


def _record(row: tuple) -> JobRecord:
    return JobRecord(
        local_id=row[0],
        provider=row[1],
        provider_key=row[2],
        model=row[3],
        remote_id=row[4],
        state=row[5],
        remote_status=row[6],
        requests=int(row[7]),
        tokens=int(row[8]),
        shards=tuple(json.loads(row[9] or "[]")),
        meta=json.loads(row[10] or "{}"),
        error=row[11],
        polls=int(row[12]),
        ready=bool(row[13]),
        created_at=float(row[14]),
        updated_at=float(row[15]),
    )
