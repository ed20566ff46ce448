"""Resources: the config a run indexes with, and what it yields at run time (settings, provider, coverage)."""

from typing import TYPE_CHECKING

import dagster as dg

from memory_pipeline.providers.registry import ResolvedProvider, resolve_provider
from memory_pipeline.settings import Settings, load_settings

if TYPE_CHECKING:
    from memory_pipeline.pipeline import EmbeddingIdentity
    from memory_pipeline.stores.analytics import CoverageReport


class MemoryConfigResource(dg.ConfigurableResource):
    """The memory_pipeline.yaml to use; empty means MEMORY_PIPELINE_CONFIG, then ./memory_pipeline.yaml.

    The file is read when a step starts, never at import time. The resource hands the
    steps what they share: the validated settings, the resolved embedding provider, the
    identity of its vectors and the coverage report of the index.
    """

    config_path: str = ""

    def settings(self) -> Settings:
        return load_settings(self.config_path or None)

    def provider(self, settings: Settings) -> ResolvedProvider:
        return resolve_provider(settings)

    def identity(self, settings: Settings) -> "EmbeddingIdentity":
        """The provider, model and dims that vectors are made with now."""
        from memory_pipeline.pipeline import EmbeddingIdentity

        return EmbeddingIdentity.of(self.provider(settings))

    def parquet_rows(self, settings: Settings, asset: str, shards) -> int:
        """Rows in an intermediate asset's Parquet files for these shards (read from the footers only)."""
        import pyarrow.parquet as pq

        from memory_pipeline.pipeline import asset_path

        paths = (asset_path(settings, asset, shard) for shard in shards)
        return sum(pq.ParquetFile(p).metadata.num_rows for p in paths if p.is_file())

    def coverage(self, settings: Settings, ident: "EmbeddingIdentity") -> "CoverageReport":
        """Rebuild data_dir/analytics.duckdb from the manifests and the current table; its report."""
        from memory_pipeline.stores import generations
        from memory_pipeline.stores.analytics import refresh_analytics

        return refresh_analytics(settings, ident.model, generations.table_for(settings, ident.meta()))


@dg.definitions
def resources() -> dg.Definitions:
    """The resources every asset, check and sensor of the defs folder is bound to."""
    return dg.Definitions(resources={"memory_config": MemoryConfigResource()})
