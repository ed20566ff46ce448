"""The instance `memory index` writes keeps Dagster's SQLite event log with pooled engines.

Real Dagster runs on a real SQLite instance: the instance selects ``PooledSqliteEventLogStorage``;
what it writes is read back by Dagster's stock storage on the same files (so `dagster dev`, the
daemon and an older version see the same history); engines are bounded, rebuilt after a fork,
shared safely between threads, and closed by ``wipe``.
"""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import dagster as dg
import pytest

from memory_pipeline.defs import dagster_storage
from memory_pipeline.defs.dagster_storage import PooledSqliteEventLogStorage
from memory_pipeline.runner import ensure_dagster_home
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import write_config

PARTS = dg.StaticPartitionsDefinition([f"{i:02x}" for i in range(12)])


@dg.asset(partitions_def=PARTS)
def numbers(context) -> dg.MaterializeResult:  # noqa: ANN001 - Dagster reads the annotation, a string here
    return dg.MaterializeResult(metadata={"partition": context.partition_key})


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "mem").mkdir()
    return ensure_dagster_home(load_settings(write_config(tmp_path / "memory_pipeline.yaml")))


def _materialize(instance: dg.DagsterInstance, key: str) -> None:
    assert dg.materialize([numbers], instance=instance, partition_key=key).success


def _stock(home: Path, tmp_path: Path) -> dg.DagsterInstance:
    """Dagster's default SQLite instance on the same files (no memory_pipeline classes)."""
    stock = tmp_path / "stock-home"
    stock.mkdir(exist_ok=True)
    (stock / "dagster.yaml").write_text(f'telemetry:\n  enabled: false\nstorage:\n  sqlite:\n    base_dir: "{home}"\n')
    return dg.DagsterInstance.from_config(str(stock))


def _materialized(instance: dg.DagsterInstance) -> set[str]:
    return set(instance.get_materialized_partitions(numbers.key))


def test_the_written_instance_uses_the_pooled_storage_and_dagster_reads_its_files(home: Path, tmp_path: Path):
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.event_log_storage, PooledSqliteEventLogStorage)
        for key in ("00", "01", "02"):
            _materialize(instance, key)
        runs = instance.get_runs()
        assert len(runs) == 3 and all(r.is_success for r in runs)
    with _stock(home, tmp_path) as stock:
        assert type(stock.event_log_storage).__name__ == "SqliteEventLogStorage"
        assert _materialized(stock) == {"00", "01", "02"}
        records = stock.fetch_materializations(numbers.key, limit=10).records
        partitions = [r.asset_materialization.metadata["partition"].value for r in records if r.asset_materialization]
        assert sorted(map(str, partitions)) == ["00", "01", "02"]
        # And the other way: what the stock storage writes, ours reads.
        _materialize(stock, "03")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert _materialized(instance) == {"00", "01", "02", "03"}


def test_engines_are_bounded_and_reused(home: Path, monkeypatch):
    monkeypatch.setattr(dagster_storage, "_MAX_ENGINES", 3)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        storage = instance.event_log_storage
        assert isinstance(storage, PooledSqliteEventLogStorage)
        for key in PARTS.get_partition_keys()[:6]:  # six runs: six run databases and the index
            _materialize(instance, key)
            assert len(storage._engines) <= 3
        index = storage._engine("index")
        assert storage._engine("index") is index  # one engine per file, reused
        # Evicted run databases are opened again on demand: every run's events are still there.
        for run in instance.get_runs():
            assert any(e.dagster_event.is_step_success for e in instance.all_logs(run.run_id) if e.dagster_event)
        assert len(storage._engines) <= 3
        assert _materialized(instance) == set(PARTS.get_partition_keys()[:6])


def _child_materializes(home: str, key: str) -> None:
    with dg.DagsterInstance.from_config(home) as instance:
        _materialize(instance, key)


def _forked_child(storage: PooledSqliteEventLogStorage, home: str, key: str, out) -> None:  # noqa: ANN001
    # The inherited storage drops the parent's engines before its first use in this process.
    parent_engines = list(storage._engines.values())
    engine = storage._engine("index")
    out.put(all(engine is not e for e in parent_engines))
    _child_materializes(home, key)


def test_a_forked_child_builds_its_own_engines_and_both_processes_write(home: Path):
    ctx = multiprocessing.get_context("fork")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        _materialize(instance, "00")
        storage = instance.event_log_storage
        assert isinstance(storage, PooledSqliteEventLogStorage) and storage._engines
        out = ctx.Queue()
        child = ctx.Process(target=_forked_child, args=(storage, str(home), "01", out))
        child.start()
        child.join(120)
        assert child.exitcode == 0 and out.get(timeout=5) is True
        _materialize(instance, "02")  # the parent's pooled connections still work
        assert _materialized(instance) == {"00", "01", "02"}


def test_reader_threads_share_the_storage_with_a_running_run(home: Path):
    """Readers on other threads (a server's requests, Dagster's event watcher) while a run writes."""
    errors: list[BaseException] = []
    seen: list[int] = []
    done = threading.Event()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        storage = instance.event_log_storage
        assert isinstance(storage, PooledSqliteEventLogStorage)

        def read() -> None:
            try:
                while not done.is_set():
                    seen.append(len(instance.fetch_materializations(numbers.key, limit=50).records))
                    assert storage.has_table("asset_event_tags")
                    for run in instance.get_runs(limit=2):
                        instance.all_logs(run.run_id)
            except BaseException as err:  # noqa: BLE001 - reported by the assertion below
                errors.append(err)

        readers = [threading.Thread(target=read) for _ in range(3)]
        for t in readers:
            t.start()
        try:
            for key in ("04", "05", "06", "07"):
                _materialize(instance, key)
        finally:
            done.set()
            for t in readers:
                t.join(60)
        assert not errors and seen
        assert _materialized(instance) == {"04", "05", "06", "07"}


def test_wipe_closes_the_engines_and_the_storage_works_after(home: Path):
    with dg.DagsterInstance.from_config(str(home)) as instance:
        _materialize(instance, "00")
        storage = instance.event_log_storage
        assert isinstance(storage, PooledSqliteEventLogStorage)
        storage.wipe()
        assert set(storage._engines) <= {"index"}  # the run databases closed (wipe clears the index through its own)
        assert not list((home / "history" / "runs").glob("[!i]*.db"))  # run databases deleted, index kept
        _materialize(instance, "01")
        assert _materialized(instance) == {"01"}


def test_an_instance_written_by_an_older_version_keeps_its_history(tmp_path: Path):
    (tmp_path / "mem").mkdir()
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml"))
    home = ensure_dagster_home(settings)
    # The file an older version wrote: Dagster's default storage under the same home.
    (home / "dagster.yaml").write_text("# Written by memory_pipeline: a persistent instance for `memory index` and `make ui`.\ntelemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(home)) as old:
        _materialize(old, "00")
    ensure_dagster_home(settings)
    assert "PooledSqliteEventLogStorage" in (home / "dagster.yaml").read_text()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.event_log_storage, PooledSqliteEventLogStorage)
        assert _materialized(instance) == {"00"}


def test_a_dagster_yaml_the_user_wrote_is_left_alone(tmp_path: Path):
    (tmp_path / "mem").mkdir()
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml"))
    home = ensure_dagster_home(settings)
    mine = "telemetry:\n  enabled: false\n"
    (home / "dagster.yaml").write_text(mine)
    ensure_dagster_home(settings)
    assert (home / "dagster.yaml").read_text() == mine


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.single_run())
def ranged(context) -> dg.MaterializeResult:  # noqa: ANN001 - Dagster reads the annotation, a string here
    keys = context.partition_key_range
    return dg.MaterializeResult(metadata={"range": f"{keys.start}-{keys.end}"})


def _range_run(instance: dg.DagsterInstance) -> str:
    tags = {"dagster/asset_partition_range_start": "00", "dagster/asset_partition_range_end": "0b"}
    result = dg.materialize([ranged], instance=instance, tags=tags)
    assert result.success
    return result.run_id


def _event_rows(instance: dg.DagsterInstance, run_id: str) -> list[tuple[str, str | None]]:
    return sorted((e.dagster_event.event_type_value, e.dagster_event.partition) for e in instance.all_logs(run_id) if e.dagster_event)


def test_a_range_run_stores_its_events_in_batches_and_stock_dagster_reads_the_same(home: Path, tmp_path: Path, monkeypatch):
    """With DAGSTER_EVENT_BATCH_SIZE set (as ``runner`` sets it), a range run's planned and done
    materializations reach ``store_event_batch`` and are stored exactly as one by one."""
    batches: list[int] = []
    real = PooledSqliteEventLogStorage.store_event_batch

    def counting(self, events):  # noqa: ANN001
        batches.append(len(events))
        return real(self, events)

    monkeypatch.setattr(PooledSqliteEventLogStorage, "store_event_batch", counting)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
        one_by_one = _range_run(instance)
        assert batches == []
        monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")
        batched = _range_run(instance)
        assert len(batches) >= 2 and sum(batches) >= 2 * len(PARTS.get_partition_keys())  # planned + done, per partition
        assert _event_rows(instance, batched) == _event_rows(instance, one_by_one)
    with _stock(home, tmp_path) as stock:
        assert _event_rows(stock, batched) == _event_rows(stock, one_by_one)
        assert set(stock.get_materialized_partitions(ranged.key)) == set(PARTS.get_partition_keys())
        latest = stock.fetch_materializations(ranged.key, limit=100).records
        assert sum(1 for r in latest if r.run_id == batched) == len(PARTS.get_partition_keys())


def test_a_batch_that_fails_part_way_leaves_none_of_its_events_and_dagster_stores_them_one_by_one(home: Path, monkeypatch):
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")
    real_event, real_batch = PooledSqliteEventLogStorage.store_event, PooledSqliteEventLogStorage.store_event_batch
    inside: list[int] = []  # events stored so far by the first batch
    failed: list[int] = []

    def flaky(self, event):  # noqa: ANN001
        # The fifth event of the first batch fails after four were written in its transaction.
        if inside and not failed:
            inside[0] += 1
            if inside[0] == 5:
                failed.append(5)
                raise RuntimeError("disk full")
        return real_event(self, event)

    def first_batch(self, events):  # noqa: ANN001
        if not failed and not inside:
            inside.append(0)
        try:
            return real_batch(self, events)
        finally:
            inside.clear() if failed else None

    monkeypatch.setattr(PooledSqliteEventLogStorage, "store_event", flaky)
    monkeypatch.setattr(PooledSqliteEventLogStorage, "store_event_batch", first_batch)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run_id = _range_run(instance)
        assert failed == [5]
        rows = _event_rows(instance, run_id)
        # Each planned materialization stored once: the rolled-back four did not stay behind.
        planned = [p for t, p in rows if t == "ASSET_MATERIALIZATION_PLANNED"]
        assert sorted(planned) == PARTS.get_partition_keys()
        done = [p for t, p in rows if t == "ASSET_MATERIALIZATION"]
        assert sorted(done) == PARTS.get_partition_keys()
