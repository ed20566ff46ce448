"""Sensors: runs only for the shards whose files changed; runs for finished batch jobs; and the
automation sensor that keeps coverage current after any run that changed the table."""

import json

import dagster as dg

from memory_pipeline.changes import manifest_fingerprints, shard_fingerprints
from memory_pipeline.defs.jobs import index_job
from memory_pipeline.defs.partitions import shard_partitions
from memory_pipeline.defs.resources import EmbedderResource, MemoryConfigResource


@dg.sensor(job=index_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED)
def memory_files_sensor(context: dg.SensorEvaluationContext, memory_config: MemoryConfigResource):
    """Stat-walk the sources (no reads, no hashing); one run per shard whose fingerprint moved."""
    settings = memory_config.settings()
    shards = shard_partitions.get_partition_keys()
    current = shard_fingerprints(settings)
    # Without a cursor, compare against what the last run saw (its manifests).
    seen = json.loads(context.cursor) if context.cursor else manifest_fingerprints(settings, shards)
    changed = [s for s in shards if current.get(s, "") != seen.get(s, "")]
    for shard in changed:
        yield dg.RunRequest(partition_key=shard, run_key=f"{shard}:{current.get(shard, 'empty')}")
    context.update_cursor(json.dumps(current, sort_keys=True))
    if not changed:
        yield dg.SkipReason("no file changed")


@dg.sensor(job=index_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.STOPPED)
def batch_jobs_sensor(context: dg.SensorEvaluationContext, memory_config: MemoryConfigResource, embedder: EmbedderResource):
    """With ``remote.batch.wait: false``: poll the open batch jobs; when one has finished, run its shards.

    The run resumes the job (no second submission), downloads its results into the
    cache and materializes the rest of the graph for the files that were waiting.
    """
    from memory_pipeline.batching.stage import poll_ready_jobs

    settings = memory_config.settings()
    jobs = poll_ready_jobs(settings, embedder.resolved(settings).provider, embedder.identity(settings))
    requested = 0
    for job in jobs:
        for shard in job.shards:
            requested += 1
            yield dg.RunRequest(partition_key=shard, run_key=f"batch:{job.local_id}:{shard}", tags={"memory_pipeline/batch_job": job.remote_id or ""})
    if not requested:
        yield dg.SkipReason("no batch job has finished")


# Evaluates index_coverage's automation condition (eager: after any shard of memory_vectors
# updated, once nothing upstream is in progress). Stopped by default like the others: turn it on
# in the UI (Automation) or with `dagster sensor start coverage_automation_sensor`.
coverage_automation_sensor = dg.AutomationConditionSensorDefinition(
    "coverage_automation_sensor",
    target=dg.AssetSelection.assets("index_coverage"),
    default_status=dg.DefaultSensorStatus.STOPPED,
    minimum_interval_seconds=60,
    description="Refreshes index_coverage once after any run that changed memory_vectors (e.g. a backfill of a few shards).",
)
