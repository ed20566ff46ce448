"""How a run's steps execute: in one process by default.

A shard run is six small steps; the multiprocess executor (Dagster's default) starts a Python
process per step, each paying the imports and the resources' set-up again, so a shard with
nothing to do took about 40 s. In one process the steps share all of that, and shards still run
in parallel as separate runs (a backfill launches one run per partition, and the run queue
decides how many at once).

``MEMORY_PIPELINE_EXECUTOR`` (read when the definitions load, so it is a deployment setting, not a
per-run one) picks another executor where steps should spread out:

- ``in_process`` (default): every step of a run in the run's own process.
- ``multiprocess``: a process per step (Dagster's default).
"""

import os

import dagster as dg

from memory_pipeline.errors import ConfigError

EXECUTOR_ENV = "MEMORY_PIPELINE_EXECUTOR"


def _chosen() -> dg.ExecutorDefinition:
    name = os.environ.get(EXECUTOR_ENV, "").strip() or "in_process"
    executors = {"in_process": dg.in_process_executor, "multiprocess": dg.multiprocess_executor}
    if name not in executors:
        raise ConfigError(f"{EXECUTOR_ENV}={name!r} is not an executor this project knows: choose one of {', '.join(sorted(executors))}")
    return executors[name]


@dg.definitions
def executor() -> dg.Definitions:
    """The executor of every job of the code location (index_job and the UI's asset jobs)."""
    return dg.Definitions(executor=_chosen())
