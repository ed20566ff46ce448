"""Partitions: stable hash shards of (source, path).

A file's shard never changes, so a backfill of a shard range re-indexes exactly
those files, parallel runs never touch the same file, and the partition count
stays fixed however large the memory grows (per-file dynamic partitions would
not scale).
"""

import dagster as dg

from memory_pipeline.discovery import SHARD_KEYS

shard_partitions = dg.StaticPartitionsDefinition(list(SHARD_KEYS))

MAINTENANCE_TAG = "memory_pipeline/maintenance"


def range_tags(first: str, last: str) -> dict[str, str]:
    """The tags of one run over the shards ``first``..``last``."""
    return {"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last}


FULL_RANGE_TAGS = range_tags(SHARD_KEYS[0], SHARD_KEYS[-1])
