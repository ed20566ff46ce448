"""Gathers the Dagster definitions; nothing else."""

import dagster as dg

from memory_pipeline.defs.assets import index_assets
from memory_pipeline.defs.jobs import index_job
from memory_pipeline.defs.resources import MemoryConfigResource
from memory_pipeline.defs.schedules import nightly_reconciliation_schedule
from memory_pipeline.defs.sensors import batch_jobs_sensor, memory_files_sensor

defs = dg.Definitions(
    assets=index_assets,
    jobs=[index_job],
    sensors=[memory_files_sensor, batch_jobs_sensor],
    schedules=[nightly_reconciliation_schedule],
    resources={"memory_config": MemoryConfigResource()},
)
