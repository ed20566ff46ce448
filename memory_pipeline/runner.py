"""Run the whole asset graph in-process (what `memory index` and the nightly schedule do)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from memory_pipeline import storage
from memory_pipeline.errors import MemoryPipelineError, PrimaryFailed
from memory_pipeline.settings import Settings
from memory_pipeline.stages.hooks import NO_HOOKS, StageHooks
from memory_pipeline.stages.report import RunResults, RunSummary, settled_summary

DAGSTER_YAML = """\
# Written by memory_pipeline: a persistent instance for `memory index` and `make ui`.
telemetry:
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
"""


def ensure_dagster_home(settings: Settings) -> Path:
    home = storage.of(settings).dagster_home
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    # Ours is kept current; a file the user wrote is left alone.
    if not cfg.is_file() or (cfg.read_text().startswith("# Written by memory_pipeline") and cfg.read_text() != DAGSTER_YAML):
        cfg.write_text(DAGSTER_YAML)
    return home


def run_index(settings: Settings, *, force: bool = False, hooks: StageHooks = NO_HOOKS, _after_fallback: bool = False) -> RunSummary:
    """Materialize every asset over every shard in one in-process run; returns the summary.

    When a stat walk shows that nothing changed since the last run (and that run's
    work is all committed), no run is started: there is nothing to materialize.
    ``hooks``: points a caller can act at during the run (tests); none by default.
    """
    started = time.perf_counter()
    if not force:
        settled = _settled(settings)
        if settled is not None:
            summary = settled.with_timing(run_id=None, seconds=time.perf_counter() - started)
            _record_run(settings, summary)
            return summary
    home = ensure_dagster_home(settings)
    results = RunResults()
    try:
        run_id = _materialize(settings, force, home, hooks, results)
    except PrimaryFailed:
        if _after_fallback:
            raise
        # The failure is recorded: this run goes again with the fallback (a new generation if it differs).
        return run_index(settings, force=force, hooks=hooks, _after_fallback=True)
    summary = RunSummary.of(settings, results, run_id=run_id, seconds=time.perf_counter() - started)
    _record_run(settings, summary)
    return summary


def _settled(settings: Settings) -> RunSummary | None:
    from memory_pipeline.changes import EmbeddingIdentity
    from memory_pipeline.providers.registry import resolve_provider

    try:
        ident = EmbeddingIdentity.of(resolve_provider(settings))
    except Exception:  # noqa: BLE001 - let the full run report provider problems properly
        return None
    return settled_summary(settings, ident)


def _materialize(settings: Settings, force: bool, home: Path, hooks: StageHooks, results: RunResults) -> str:
    """One in-process run of the graph; its run id. A failed run raises the error that failed it."""
    import dagster as dg

    from memory_pipeline.defs.assets import index_assets
    from memory_pipeline.defs.partitions import FULL_RANGE_TAGS
    from memory_pipeline.defs.resources import index_resources

    # The instance is built from home's dagster.yaml; DAGSTER_HOME lets what the run starts find it too.
    os.environ["DAGSTER_HOME"] = str(home)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = dg.materialize(
            index_assets,
            instance=instance,
            resources=index_resources(str(settings.config_path or ""), hooks=hooks, results=results),
            tags=dict(FULL_RANGE_TAGS),
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
        raise _failure(result, results)


def _failure(result, results: RunResults) -> MemoryPipelineError:
    """The error of a failed run, for the user: our own error as itself (with its hint), else what failed."""
    from memory_pipeline.defs.checks import CHECKS

    err = results.error
    if isinstance(err, MemoryPipelineError):
        return err
    if err is not None:
        return MemoryPipelineError(f"the index run failed: {type(err).__name__}: {err}", hint="see the run in the Dagster UI (make ui) for the traceback")
    failed_checks = [e.check_name for e in result.get_asset_check_evaluations() if not e.passed and CHECKS.get(e.check_name, (False,))[0]]
    if failed_checks:
        return MemoryPipelineError(
            f"the index failed a blocking check ({', '.join(sorted(failed_checks))}); files were indexed, but the table has faults",
            hint='see `memory analytics --sql "SELECT * FROM problems"`; `memory index --force` repairs the table',
        )
    failures = [e.step_failure_data.error for e in result.all_events if e.is_step_failure and e.step_failure_data.error]
    first = (failures[0].message.strip().splitlines() or ["unknown error"])[0] if failures else "unknown error"
    return MemoryPipelineError(f"the index run failed: {first}", hint="see the run in the Dagster UI (make ui)")


def _record_run(settings: Settings, summary: RunSummary) -> None:
    data = storage.of(settings)
    record = summary.as_dict()
    storage.write_text(data.runs_dir / "last_run.json", json.dumps(record, indent=2))
    data.append_line(data.runs_dir / "history.jsonl", json.dumps(record | {"errors": len(summary.errors)}))


def last_run(settings: Settings) -> dict | None:
    return storage.of(settings).read_json(storage.of(settings).runs_dir / "last_run.json")


__all__ = ["run_index", "last_run", "ensure_dagster_home"]
