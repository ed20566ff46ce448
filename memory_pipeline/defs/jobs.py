"""Jobs over the asset graph."""

import dagster as dg

from memory_pipeline.defs.assets import GROUP
from memory_pipeline.defs.partitions import shard_partitions

index_job = dg.define_asset_job(
    "index_job",
    selection=dg.AssetSelection.groups(GROUP),
    partitions_def=shard_partitions,
    description="Index the memory folder: one shard per run, or a shard range in one run.",
)
