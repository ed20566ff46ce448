"""The stages of the index, as plain functions over one or more partitions (shards).

    discover  → source_files        walk, hash what changed, decide per file (stages/discover.py)
    extract   → extracted_content   text segments with line locators          (stages/extract.py)
    chunk     → memory_chunks       token-aware chunks with stable ids        (stages/chunk.py)
    embed     → chunk_embeddings    cache, batch API, live requests           (stages/embed.py)
    write     → memory_vectors      one commit per changed file               (stages/write.py)

Each stage takes its upstream data as mappings shard -> polars DataFrame and yields its
own frames one shard at a time, filling in a counts object as it goes; whoever consumes
them writes each shard (in a Dagster run, the IO manager; in the unit tests, the storage
layer directly). The per-file records beside them (deletions, extraction status, indexed
state) are written by the stages through the storage layer (``memory_pipeline.storage``),
atomically. The write stage commits to the LanceDB table. Nothing here knows about
Dagster: the assets in ``defs/`` call these and report what they return; ``report.py``
builds the run summary from the same counts. ``hooks.py`` holds the points
a caller (a test) can act at, injected, never read from the environment.
"""

from memory_pipeline.stages.chunk import ChunkCounts, make_chunks
from memory_pipeline.stages.discover import DiscoverCounts, TableCheck, check_table, discover
from memory_pipeline.stages.embed import EmbedCounts, embed_chunks
from memory_pipeline.stages.extract import ExtractCounts, extract_content
from memory_pipeline.stages.hooks import NO_HOOKS, StageHooks
from memory_pipeline.stages.report import EmbedInfo, RunResults, RunSummary, run_errors, settled_summary
from memory_pipeline.stages.write import WriteStats, reset_index_state, write_vectors

__all__ = [
    "NO_HOOKS",
    "ChunkCounts",
    "DiscoverCounts",
    "EmbedCounts",
    "EmbedInfo",
    "ExtractCounts",
    "RunResults",
    "RunSummary",
    "StageHooks",
    "TableCheck",
    "WriteStats",
    "check_table",
    "discover",
    "embed_chunks",
    "extract_content",
    "make_chunks",
    "reset_index_state",
    "run_errors",
    "settled_summary",
    "write_vectors",
]
