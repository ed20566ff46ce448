"""The nightly full reconciliation: every shard in one run."""

import dagster as dg

from memory_pipeline.defs.jobs import index_job
from memory_pipeline.defs.partitions import FULL_RANGE_TAGS, MAINTENANCE_TAG


@dg.schedule(job=index_job, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED)
def nightly_reconciliation_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    """Re-walk every source, index what changed, drop what vanished, then maintain the table.

    One run over all shards; the maintenance tag makes memory_vectors compact the table,
    fold new rows into the indices and prune old versions.
    """
    return dg.RunRequest(run_key=None, tags={**FULL_RANGE_TAGS, MAINTENANCE_TAG: "true"})
