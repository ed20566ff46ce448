"""Run the asset graph in-process: over the shards with work (what `memory index` does: a stat walk
and the per-shard records say which shards changed, and one run covers the range from the first of
them to the last; none changed: no run at all), over every shard (`--force`), or over only the
shards that hold some files (what the server does after an ingest, a note or a delete).

Runs started here take a lock per shard (``runs/locks/<shard>.lock``, in shard order), so two
processes (`memory index` and `memory serve`) never work on one shard at once: a shard's manifest,
chunks and state files are rewritten by every run over it. Runs over other shards go ahead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from memory_pipeline import storage
from memory_pipeline.discovery import SHARD_KEYS, shard_of
from memory_pipeline.errors import MemoryPipelineError, PrimaryFailed
from memory_pipeline.priority import yield_to_server
from memory_pipeline.settings import Settings
from memory_pipeline.stages.hooks import NO_HOOKS, StageHooks
from memory_pipeline.stages.report import RunResults, RunSummary, Settlement, settle

DAGSTER_YAML = """\
# Written by memory_pipeline: a persistent instance for `memory index` and `make ui`.
telemetry:
  enabled: false
# No first-visit dialog in the UI: it asks for an e-mail address and loads its form from
# dagster.io (the UI runs offline, on 127.0.0.1), and it covers whatever the user clicks next.
nux:
  enabled: false
# Assets log through context.log (the event log); capturing stdout would start
# tail processes for every run.
compute_logs:
  module: dagster._core.storage.noop_compute_log_manager
  class: NoOpComputeLogManager
# A run that fails for a transient reason (the machine rebooted, a worker died) is retried
# from the failed steps (runs launched by the daemon: the sensor, the schedule, backfills).
run_retries:
  enabled: true
  max_retries: 2
# Dagster's SQLite event log with one engine per database kept for the process (each event
# otherwise builds an engine and compiles its SQL again); same files and schema as Dagster's.
event_log_storage:
  module: memory_pipeline.defs.dagster_storage
  class: PooledSqliteEventLogStorage
  config:
    base_dir: {events_dir}
"""


def ensure_dagster_home(settings: Settings) -> Path:
    home = storage.of(settings).dagster_home
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    # Where Dagster's default SQLite storage keeps the event logs (so an instance written by an
    # older version keeps its history); JSON quoting is valid YAML for any path.
    ours = DAGSTER_YAML.format(events_dir=json.dumps(str(home.resolve() / "history" / "runs")))
    # Ours is kept current; a file the user wrote is left alone.
    if not cfg.is_file() or (cfg.read_text().startswith("# Written by memory_pipeline") and cfg.read_text() != ours):
        cfg.write_text(ours)
    return home


def run_index(
    settings: Settings,
    *,
    force: bool = False,
    hooks: StageHooks = NO_HOOKS,
    shards: Iterable[str] | None = None,
    keep_model: bool = False,
    _after_fallback: bool = False,
) -> RunSummary:
    """Materialize the asset graph over every shard (or over ``shards``) in-process; returns the summary.

    When a stat walk shows that nothing changed since the last run (and that run's
    work is all committed), no run is started: there is nothing to materialize.
    ``shards``: only these partitions (see :func:`shards_of`), with the same assets, change
    detection and checks; one run per contiguous range of them, their summaries added up.
    ``hooks``: points a caller can act at during the run (tests); none by default.
    ``keep_model``: the embedding model stays loaded afterwards (the server searches with it).
    """
    started = time.perf_counter()
    wanted = _checked_shards(shards)
    elsewhere = 0  # files of the shards left out because they have no work (counted as seen)
    if not force and shards is None:
        settlement = _settlement(settings)
        if settlement is not None and settlement.summary is not None:
            summary = settlement.summary.with_timing(run_id=None, seconds=time.perf_counter() - started)
            _record_run(settings, summary)
            return summary
        if settlement is not None:
            # Only the shards with work, as one run over the range from the first to the last of
            # them: a run's fixed cost (and Dagster's events per partition) is paid for those only.
            wanted = _span(settlement.shards[0], settlement.shards[-1])
            elsewhere = sum(n for s, n in settlement.files_elsewhere.items() if s not in wanted)
    yield_to_server(settings)  # before the model's threads start: they take this thread's priority
    _warm_model(settings)
    try:
        parts = _run_ranges(settings, force, hooks, wanted, keep_model)
    except PrimaryFailed:
        if _after_fallback:
            raise
        # The failure is recorded: this run goes again with the fallback (a new generation if it differs).
        return run_index(settings, force=force, hooks=hooks, shards=shards, keep_model=keep_model, _after_fallback=True)
    summary = RunSummary.combined(parts).with_timing(run_id=parts[-1].run_id, seconds=time.perf_counter() - started)
    if elsewhere:
        summary = dataclasses.replace(summary, files_seen=summary.files_seen + elsewhere)
    _record_run(settings, summary)
    return summary


def _warm_model(settings: Settings) -> None:
    """Load the embedding model in a background thread while the run discovers, extracts and
    chunks (the run's provider is the same cached instance, so its first embed finds the model
    loaded, or waits on the load's lock). Called only when there is work: a no-op run never
    loads a model. A failure here is ignored: the run's own first use reports it."""
    import threading

    from memory_pipeline.providers.registry import resolve_provider

    def load() -> None:
        try:
            warm = getattr(resolve_provider(settings).provider, "warm", None)  # the local model has one
            if warm is not None:
                warm()
        except Exception:  # noqa: BLE001 - reported by the run itself when it embeds
            pass

    threading.Thread(target=load, name="memory-model-warm", daemon=True).start()


def _run_ranges(settings: Settings, force: bool, hooks: StageHooks, shards: list[str], keep_model: bool = False) -> list[RunSummary]:
    """One run per contiguous range of ``shards``, under their locks; each run's summary."""
    home = ensure_dagster_home(settings)
    parts = []
    with _shard_locks(settings, shards):
        for first, last in _ranges(shards):
            results = RunResults()
            run_id = _materialize(settings, force, home, hooks, results, first, last, keep_model)
            parts.append(RunSummary.of(settings, results, run_id=run_id, seconds=0.0, shards=_span(first, last)))
    return parts


def shards_of(files: Iterable[tuple[str, str]]) -> list[str]:
    """The shards holding these files, ``(source name, path relative to the source)`` each; sorted."""
    return sorted({shard_of(source, rel) for source, rel in files})


def _checked_shards(shards: Iterable[str] | None) -> list[str]:
    if shards is None:
        return list(SHARD_KEYS)
    wanted = sorted(set(shards))
    unknown = [s for s in wanted if s not in SHARD_KEYS]
    if unknown or not wanted:
        raise ValueError(f"not a shard: {unknown[0]!r}" if unknown else "no shard to index")
    return wanted


def _ranges(shards: Sequence[str]) -> list[tuple[str, str]]:
    """Sorted shard keys as contiguous ``(first, last)`` ranges: a Dagster run covers one key or one range."""
    order = {s: i for i, s in enumerate(SHARD_KEYS)}
    ranges: list[list[str]] = []
    for s in shards:
        if ranges and order[s] == order[ranges[-1][1]] + 1:
            ranges[-1][1] = s
        else:
            ranges.append([s, s])
    return [(a, b) for a, b in ranges]


def _span(first: str, last: str) -> list[str]:
    return list(SHARD_KEYS[SHARD_KEYS.index(first) : SHARD_KEYS.index(last) + 1])


@contextlib.contextmanager
def _shard_locks(settings: Settings, shards: Sequence[str]) -> Iterator[None]:
    """Exclusive locks on these shards, taken in shard order (so two runs never wait on each other in a cycle)."""
    folder = storage.of(settings).locks_dir
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        for shard in sorted(shards):
            fh = stack.enter_context(open(folder / f"{shard}.lock", "a"))
            fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _settlement(settings: Settings) -> Settlement | None:
    """Which shards have work (None: unknown, run them all)."""
    from memory_pipeline.changes import EmbeddingIdentity
    from memory_pipeline.providers.registry import resolve_provider

    try:
        ident = EmbeddingIdentity.of(resolve_provider(settings))
    except Exception:  # noqa: BLE001 - let the full run report provider problems properly
        return None
    return settle(settings, ident)


def _materialize(settings: Settings, force: bool, home: Path, hooks: StageHooks, results: RunResults, first: str, last: str, keep_model: bool = False) -> str:
    """One in-process run of the graph over the shards ``first``..``last``; its run id. A failed run
    raises the error that failed it."""
    import dagster as dg

    from memory_pipeline.defs.assets import index_assets
    from memory_pipeline.defs.dagster_storage import enable_event_batches
    from memory_pipeline.defs.partitions import range_tags
    from memory_pipeline.defs.resources import index_resources

    # The instance is built from home's dagster.yaml; DAGSTER_HOME lets what the run starts find it too.
    os.environ["DAGSTER_HOME"] = str(home)
    enable_event_batches()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        close_dead_runs(instance)
        result = dg.materialize(
            index_assets,
            instance=instance,
            resources=index_resources(str(settings.config_path or ""), hooks=hooks, results=results, keep_model=keep_model),
            # One shard: a plain partition run (what the sensor asks for); more: a range.
            partition_key=first if first == last else None,
            tags={PROCESS_TAG: this_process()} | (range_tags(first, last) if first != last else {}),
            run_config={
                "ops": {
                    "source_files": {"config": {"force": force}},
                    "memory_vectors": {"config": {"force": force}},
                },
                "loggers": {"console": {"config": {"log_level": "CRITICAL"}}},
            },
            raise_on_error=False,
        )
        if result.success:
            return result.run_id
        raise _failure(result, results, remote=storage.of(settings).remote is not None)


# The process a run of `memory index` (or the server) lives in: ``host:pid:start``. Such a run
# executes in that process, so when the process is gone and the run still says STARTED, it was
# killed (SIGKILL, the machine's memory killer, a power cut): no one else will ever end it.
PROCESS_TAG = "memory_pipeline/process"


def _started_at(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from /proc); None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _machine() -> str:
    """This host, boot and PID namespace: where a pid names this process and no other. A container
    sharing the host's name (``--network host``) has its own pids, and a reboot starts them again."""
    import socket

    def read(how, path: str) -> str:
        try:
            return "".join(c for c in how(path) if c.isalnum() or c == "-")
        except OSError:
            return ""

    return f"{socket.gethostname()}/{read(lambda p: open(p).read(), '/proc/sys/kernel/random/boot_id')}/{read(os.readlink, '/proc/self/ns/pid')}"


def this_process() -> str:
    return f"{_machine()}:{os.getpid()}:{_started_at(os.getpid()) or ''}"


def _gone(pid: int, started: str) -> bool:
    """Whether process ``pid`` that started at ``started`` is gone (not merely hidden from us)."""
    now = _started_at(pid)
    if now is not None:
        return bool(started) and now != started  # the pid is another process's now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # another user's, hidden from /proc (hidepid): alive
    return False  # there, though /proc did not show it: leave it


def close_dead_runs(instance) -> list[str]:
    """Mark failed the runs of this machine's `memory index` processes that are gone while their
    run still says STARTED (in the UI for ever, before): a killed process ends nothing. Runs started
    another way (the UI, the daemon: Dagster's run monitoring) and other machines' are left alone."""
    import socket

    import dagster as dg

    if _started_at(os.getpid()) is None:
        return []  # no /proc here: a live process could not be told from a gone one
    machine = _machine()
    closed = []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING]), limit=100):
        parts = run.tags.get(PROCESS_TAG, "").split(":")
        if len(parts) != 3 or parts[0] != machine or not parts[1].isdigit() or not _gone(int(parts[1]), parts[2]):
            continue  # another machine's, container's or boot's (not ours to judge), or alive
        instance.report_run_failed(
            run, message=f"its process ({parts[1]} on {socket.gethostname()}) ended without finishing the run (killed); the next run redid its work"
        )
        closed.append(run.run_id)
    return closed


# What Dagster makes of Ctrl-C or SIGTERM during a step (it maps SIGTERM to SIGINT while it runs).
_INTERRUPTIONS = frozenset({"DagsterExecutionInterruptedError", "KeyboardInterrupt"})


def _interrupted(result) -> bool:
    """Whether the run stopped because the process was interrupted: an event of the run (a step's
    failure, the run's own) carries Dagster's interruption error, here or as the cause of another."""
    for event in result.all_events:
        error = getattr(event.event_specific_data, "error", None)
        for _ in range(10):  # bounded: a cause chain is short
            if error is None:
                break
            if getattr(error, "cls_name", None) in _INTERRUPTIONS:
                return True
            error = getattr(error, "cause", None) or getattr(error, "context", None)
    return False


def _failure(result, results: RunResults, *, remote: bool = False) -> BaseException:
    """The error of a failed run, for the user: an interruption as ``KeyboardInterrupt`` (the run
    resumes when started again), our own error as itself (with its hint), else what failed. An
    ``OSError`` is the disk's or the object store's (``remote``: an ``s3://`` data_dir), not a bug:
    its hint says what to check (it named the Dagster UI, for a store that went down mid-run)."""
    from memory_pipeline.defs.checks import CHECKS

    if _interrupted(result):
        return KeyboardInterrupt("the index run was interrupted")
    err = results.error
    if isinstance(err, MemoryPipelineError):
        return err
    if err is not None:
        hint = "see the run in the Dagster UI (make ui) for the traceback"
        if isinstance(err, OSError):
            from memory_pipeline.errors import ObjectStoreError

            hint = ObjectStoreError.hint if remote else "a file or storage error: check the data folder's disk and permissions"
        return MemoryPipelineError(f"the index run failed: {type(err).__name__}: {err}", hint=hint)
    failed_checks = [e.check_name for e in result.get_asset_check_evaluations() if not e.passed and CHECKS.get(e.check_name, (False,))[0]]
    if failed_checks:
        return MemoryPipelineError(
            f"the index failed a blocking check ({', '.join(sorted(failed_checks))}); files were indexed, but the table has faults",
            hint='see `memory analytics --sql "SELECT * FROM problems"`; `memory index --force` repairs the table',
        )
    failures = [e.step_failure_data.error for e in result.all_events if e.is_step_failure and e.step_failure_data.error]
    first = step_error(failures[0]) if failures else "unknown error"
    return MemoryPipelineError(f"the index run failed: {first}", hint="see the run in the Dagster UI (make ui)")


def step_error(error) -> str:
    """A failed step's error (Dagster's ``SerializableErrorInfo``) on one line: its message and, where
    Dagster wrapped the error that failed it ("Error occurred while handling output "result" of step
    "memory_chunks":", an object store gone mid-write), that error too: the cause is what the user
    can act on. URLs' user names and passwords are left out."""
    from memory_pipeline.storage import one_line

    def line(err) -> str:
        text = (err.message or "").strip()
        return one_line(text.splitlines()[0] if text else "")

    top, root, depth = line(error), error, 0
    while getattr(root, "cause", None) is not None and depth < 10:  # bounded: a cause chain is short
        root, depth = root.cause, depth + 1
    under = line(root) if root is not error else ""
    return (f"{top} {under}" if under and under not in top else top) or "unknown error"


def _record_run(settings: Settings, summary: RunSummary) -> None:
    data = storage.of(settings)
    record = summary.as_dict()
    data.write_text(storage.LAST_RUN, json.dumps(record, indent=2))
    data.append_line(storage.HISTORY, json.dumps(record | {"errors": len(summary.errors)}))


def last_run(settings: Settings) -> dict | None:
    return storage.of(settings).read_json(storage.LAST_RUN)


__all__ = ["run_index", "shards_of", "last_run", "ensure_dagster_home"]
