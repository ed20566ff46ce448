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
- ``celery``: each step is a Celery task, run by whichever worker takes it (``dagster-celery``,
  plain VMs): the broker from ``MEMORY_PIPELINE_CELERY_BROKER`` (e.g. ``redis://host:6379/0``),
  results through ``MEMORY_PIPELINE_CELERY_BACKEND`` (the broker when unset). Start workers with
  ``dagster-celery worker start -A dagster_celery.app -y <celery.yaml>`` on each machine.
- ``k8s``: each step a Kubernetes Job (``dagster-k8s``'s ``k8s_job_executor``). With the
  ``K8sRunLauncher`` alone (the Helm values in ``deploy/k8s``) each run is already a Job of its
  own, which is usually enough: shards run in parallel as runs, steps in one process.
"""

import os

import dagster as dg

from memory_pipeline.errors import ConfigError

EXECUTOR_ENV = "MEMORY_PIPELINE_EXECUTOR"


CELERY_BROKER_ENV = "MEMORY_PIPELINE_CELERY_BROKER"
CELERY_BACKEND_ENV = "MEMORY_PIPELINE_CELERY_BACKEND"
NAMES = ("in_process", "multiprocess", "celery", "k8s")


def _celery() -> dg.ExecutorDefinition:
    from dagster_celery import celery_executor

    broker = os.environ.get(CELERY_BROKER_ENV, "").strip()
    if not broker:
        raise ConfigError(f"{EXECUTOR_ENV}=celery needs the broker's URL in {CELERY_BROKER_ENV} (e.g. redis://127.0.0.1:6379/0)")
    backend = CELERY_BACKEND_ENV if os.environ.get(CELERY_BACKEND_ENV, "").strip() else CELERY_BROKER_ENV
    # The URLs are read from the environment where each run starts (never written into run config).
    return celery_executor.configured({"broker": {"env": CELERY_BROKER_ENV}, "backend": {"env": backend}})


def _k8s() -> dg.ExecutorDefinition:
    from dagster_k8s import k8s_job_executor

    return k8s_job_executor


def _chosen() -> dg.ExecutorDefinition:
    name = os.environ.get(EXECUTOR_ENV, "").strip() or "in_process"
    if name not in NAMES:
        raise ConfigError(f"{EXECUTOR_ENV}={name!r} is not an executor this project knows: choose one of {', '.join(NAMES)}")
    if name == "in_process":
        return dg.in_process_executor
    if name == "multiprocess":
        return dg.multiprocess_executor
    try:
        return _celery() if name == "celery" else _k8s()
    except ImportError as err:
        raise ConfigError(f"{EXECUTOR_ENV}={name} needs the {err.name} package (make installs it: requirements.lock)") from err


@dg.definitions
def executor() -> dg.Definitions:
    """The executor of every job of the code location (index_job and the UI's asset jobs)."""
    return dg.Definitions(executor=_chosen())
