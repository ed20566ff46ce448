"""Run the whole asset graph in-process (what `memory index` and the nightly schedule do)."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from memory_pipeline import pipeline
from memory_pipeline.discovery import SHARD_KEYS
from memory_pipeline.errors import MemoryPipelineError, PrimaryFailed
from memory_pipeline.settings import Settings

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
    home = settings.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    # Ours is kept current; a file the user wrote is left alone.
    if not cfg.is_file() or (cfg.read_text().startswith("# Written by memory_pipeline") and cfg.read_text() != DAGSTER_YAML):
        cfg.write_text(DAGSTER_YAML)
    return home


def run_index(settings: Settings, *, force: bool = False, _after_fallback: bool = False) -> dict:
    """Materialize every asset over every shard in one in-process run; returns the summary.

    When a stat walk shows that nothing changed since the last run (and that run's
    work is all committed), no run is started: there is nothing to materialize.
    """
    started = time.perf_counter()
    if not force:
        settled = pipeline.settled_summary(settings)
        if settled is not None:
            summary = settled | {
                "run_id": None,
                "seconds": round(time.perf_counter() - started, 3),
                "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            _record_run(settings, summary)
            return summary
    home = ensure_dagster_home(settings)
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        meta, run_id = _materialize(settings, force, home)
    except PrimaryFailed:
        if _after_fallback:
            raise
        # The failure is recorded: this run goes again with the fallback (a new generation if it differs).
        return run_index(settings, force=force, _after_fallback=True)
    summary = _summary(settings, meta, run_id, time.perf_counter() - started)
    _record_run(settings, summary)
    return summary


def _materialize(settings: Settings, force: bool, home: Path) -> tuple[dict, str]:
    import dagster as dg

    from memory_pipeline.defs.assets import index_assets
    from memory_pipeline.defs.partitions import FULL_RANGE_TAGS
    from memory_pipeline.defs.resources import MemoryConfigResource

    with dg.DagsterInstance.from_config(str(home)) as instance, _user_errors():
        result = dg.materialize(
            index_assets,
            instance=instance,
            resources={"memory_config": MemoryConfigResource(config_path=str(settings.config_path or ""))},
            tags=dict(FULL_RANGE_TAGS),
            run_config={
                "ops": {
                    "source_files": {"config": {"force": force}},
                    "memory_vectors": {"config": {"force": force}},
                },
                "loggers": {"console": {"config": {"log_level": "CRITICAL"}}},
            },
            raise_on_error=True,
        )
        return _metadata_by_asset(result), result.run_id


@contextmanager
def _user_errors():
    """Unwrap Dagster's step errors: our own errors surface as themselves, with their hint."""
    from dagster import DagsterError, DagsterExecutionStepExecutionError
    from dagster._core.errors import DagsterAssetCheckFailedError

    try:
        yield
    except DagsterAssetCheckFailedError as err:
        failed = str(err).strip().splitlines()[-1].split(":", 1)[-1].strip()
        raise MemoryPipelineError(
            f"the index failed a blocking check ({failed}); files were indexed, but the table has faults",
            hint='see `memory analytics --sql "SELECT * FROM problems"`; `memory index --force` repairs the table',
        ) from err
    except DagsterExecutionStepExecutionError as err:
        cause = err.user_exception
        if isinstance(cause, MemoryPipelineError):
            raise cause from err
        raise MemoryPipelineError(
            f"step {err.step_key} failed: {type(cause).__name__}: {cause}",
            hint="see the run in the Dagster UI (make ui) for the traceback",
        ) from err
    except DagsterError as err:  # e.g. retries exhausted on a transient error
        cause: BaseException | None = err
        while cause is not None and not isinstance(cause, MemoryPipelineError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from err
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise MemoryPipelineError(f"index run failed: {first}", hint="see the run in the Dagster UI (make ui)") from err


def _metadata_by_asset(result) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        key = mat.asset_key.to_user_string()
        if key not in out:
            out[key] = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    return out


def _summary(settings: Settings, meta: dict[str, dict], run_id: str, seconds: float) -> dict:
    src = meta.get("source_files", {})
    chunks = meta.get("memory_chunks", {})
    emb = meta.get("chunk_embeddings", {})
    vec = meta.get("memory_vectors", {})
    cov = meta.get("index_coverage", {})
    return {
        "files_seen": int(src.get("files_seen", 0)),
        "files_changed": int(src.get("files_changed", 0)),
        "files_deleted": int(src.get("files_deleted", 0)),
        "files_repaired": int(src.get("files_repaired", 0)),
        "chunks_total": int(chunks.get("chunks", 0)),
        "chunks_embedded": int(emb.get("embedded", 0)),
        "chunks_cached": int(emb.get("cached", 0)),
        "tokens_embedded": int(emb.get("tokens_total", 0)),
        "est_cost_usd": emb.get("est_cost_usd"),
        "rows_written": int(vec.get("rows_written", 0)),
        "rows_deleted": int(vec.get("rows_deleted", 0)),
        "table_rows": int(vec.get("table_rows", 0)),
        "provider": emb.get("provider", ""),
        "model": emb.get("model", ""),
        "dims": int(emb.get("dims", 0)),
        "mode": emb.get("mode", ""),
        "batch": emb.get("batch", {"enabled": False}),
        "files_pending": int(vec.get("files_pending", 0)),
        "requested_provider": emb.get("requested_provider", settings.provider),
        "fallback_reason": emb.get("fallback_reason", ""),
        "generation": vec.get("generation", ""),
        "table": vec.get("table", ""),
        "skipped_run": False,
        "coverage": cov.get("coverage"),
        "errors": pipeline.run_errors(settings, SHARD_KEYS),
        "run_id": run_id,
        "seconds": round(seconds, 3),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _record_run(settings: Settings, summary: dict) -> None:
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    (settings.runs_dir / "last_run.json").write_text(json.dumps(summary, indent=2))
    with open(settings.runs_dir / "history.jsonl", "a") as fh:
        row = {k: v for k, v in summary.items() if k != "errors"} | {"errors": len(summary["errors"])}
        fh.write(json.dumps(row) + "\n")


def last_run(settings: Settings) -> dict | None:
    path = settings.runs_dir / "last_run.json"
    return json.loads(path.read_text()) if path.is_file() else None


__all__ = ["run_index", "last_run", "ensure_dagster_home"]
