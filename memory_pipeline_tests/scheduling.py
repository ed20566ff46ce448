"""How the suite is shared between pytest-xdist workers (`make test`: `-n 2 --dist loadfile --no-loadscope-reorder`).

Loaded for every run through ``-p memory_pipeline_tests.scheduling`` (pyproject's addopts); it
does nothing unless the run has xdist workers.

- One worker per module (``--dist loadfile``): a module's tests run on one worker, so a module- or
  class-scoped fixture (an index built once per module, a server, a loaded model) is built once,
  not once per worker. (``--dist loadgroup`` would let a module without shared fixtures spread
  over both workers, but pytest-xdist 3.8 marks groups by rewriting ``item._nodeid``, which
  pytest 9 no longer reads: every group is silently ignored.)
- The ``longest`` modules first (a single test of minutes, like the Celery backfill), then long
  modules: every module outside ``unit/`` (the CLI, Dagster, media, service and browser
  tests, minutes each) and any marked ``slow`` is queued before the short unit modules, so the two
  workers end together
  instead of one waiting on a long module that came last. The order inside a module is kept.
  (``--no-loadscope-reorder`` keeps this order: by default xdist queues the modules with the most
  tests first, which puts the 700 quick redaction tests first and the one-test browser module last.)
- One thread per worker: each worker (and the `memory` processes it starts) is held to one
  OpenMP thread unless OMP_NUM_THREADS says otherwise, so two workers share two cores instead of
  four torch threads fighting over them.
"""

from __future__ import annotations

import os

import pytest


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _is_worker(config):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _is_worker(config):
        return
    # A stable sort on a key shared by a module's tests: long modules first, collection order otherwise.
    long = {m for m in map(_module_of, items) if "/unit/" not in f"/{m}"}
    long |= {_module_of(i) for i in items if i.get_closest_marker("slow") is not None}
    longest = {_module_of(i) for i in items if i.get_closest_marker("longest") is not None}
    items.sort(key=lambda i: (_module_of(i) not in longest, _module_of(i) not in long))
