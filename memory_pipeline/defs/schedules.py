"""The nightly full reconciliation: every shard in one run."""

import dagster as dg

from memory_pipeline.defs.jobs import index_job
from memory_pipeline.defs.partitions import FULL_RANGE_TAGS


@dg.schedule(job=index_job, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED)
def nightly_reconciliation_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    """Re-walk every source, index what changed, drop what vanished (one run over all shards)."""
    return dg.RunRequest(run_key=None, tags=dict(FULL_RANGE_TAGS))
