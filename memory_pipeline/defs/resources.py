"""Resources: the config a run indexes with, the embedding provider, and what the caller injects.

- ``memory_config`` (:class:`MemoryConfigResource`): which memory_pipeline.yaml; read when a
  step starts, never at import time.
- ``embedder`` (:class:`EmbedderResource`): the embedding provider, resolved once per run
  (set-up) and released when the run's steps are done (tear-down).
- ``stage_hooks``: points a caller can act at (tests kill a run there); none by default.
- ``run_results``: where the stages' counts are collected for the run summary; a fresh
  collector per run by default, the caller's own when `memory index` runs the graph.
- ``io_manager`` (:class:`~memory_pipeline.defs.io_managers.PolarsParquetIOManager`): the
  polars DataFrames between the assets, as one Parquet file per shard under the data folder.
"""

from typing import TYPE_CHECKING

import dagster as dg
from pydantic import PrivateAttr

from memory_pipeline.changes import EmbeddingIdentity
from memory_pipeline.priority import yield_to_server
from memory_pipeline.providers.registry import ResolvedProvider, resolve_provider
from memory_pipeline.settings import Settings, load_settings
from memory_pipeline.stages.hooks import NO_HOOKS
from memory_pipeline.stages.report import RunResults

if TYPE_CHECKING:
    from memory_pipeline.stores.analytics import CoverageReport


class MemoryConfigResource(dg.ConfigurableResource):
    """The memory_pipeline.yaml to use; empty means MEMORY_PIPELINE_CONFIG, then ./memory_pipeline.yaml."""

    config_path: str = ""

    def settings(self) -> Settings:
        return load_settings(self.config_path or None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # A run's process (or a step's, with the multiprocess executor) gives a running server's
        # searches the CPU first. A config that does not load is left to the steps to report.
        # Sensors set resources up too, in the long-lived code server: never there.
        if getattr(context, "dagster_run", None) is None:
            return
        try:
            yield_to_server(self.settings())
        except Exception:  # noqa: BLE001 - priority is a courtesy; the steps report config errors
            pass

    def coverage(self, settings: Settings, ident: EmbeddingIdentity) -> "CoverageReport":
        """Rebuild data_dir/analytics.duckdb from the manifests and the current table; its report."""
        from memory_pipeline.changes import fingerprint
        from memory_pipeline.stores import generations
        from memory_pipeline.stores.analytics import refresh_analytics

        return refresh_analytics(settings, ident.model, generations.table_for(settings, ident.meta()), fingerprint(settings, ident))


class EmbedderResource(dg.ConfigurableResource):
    """The embedding provider of a run: the configured one, auto's pick, the fallback, or none.

    Resolved once, on first use in a run (a run that has nothing to embed never loads a
    model); released when the run's steps end, so a long-lived process (the daemon, the
    webserver) does not keep a model's memory between runs.
    """

    memory_config: dg.ResourceDependency[MemoryConfigResource]
    # A long-lived process that searches with the same model (`memory serve`) keeps it loaded:
    # its runs share the one cached provider with the searcher, and a release would drop the
    # searcher's model after every ingest (a gc of the whole server, and a reload on the next query).
    keep_model: bool = False
    _resolved: ResolvedProvider | None = PrivateAttr(default=None)

    def resolved(self, settings: Settings | None = None) -> ResolvedProvider:
        if self._resolved is None:
            self._resolved = resolve_provider(settings or self.memory_config.settings())
        return self._resolved

    def identity(self, settings: Settings | None = None) -> EmbeddingIdentity:
        """The provider, model and dims that vectors are made with now."""
        return EmbeddingIdentity.of(self.resolved(settings))

    def release(self) -> None:
        """Hand the model's memory back (it reloads on next use); not with ``keep_model``."""
        if self._resolved is not None and self._resolved.provider is not None and not self.keep_model:
            self._resolved.provider.release()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.release()
        self._resolved = None


@dg.resource(description="Points a caller can act at during a run (none: production runs).")
def stage_hooks(_context) -> object:
    return NO_HOOKS


@dg.resource(description="Collects what each stage of a run returned, for the run summary.")
def run_results(_context) -> RunResults:
    return RunResults()


def index_resources(config_path: str = "", *, hooks=NO_HOOKS, results: RunResults | None = None, keep_model: bool = False) -> dict:
    """The resources one index run is bound to (the defs folder's, or the CLI's with its own hooks and
    collector; ``keep_model``: the model stays loaded after the run, for the server's searches)."""
    from memory_pipeline.defs.io_managers import PolarsParquetIOManager  # it builds on MemoryConfigResource

    memory_config = MemoryConfigResource(config_path=config_path)
    return {
        "memory_config": memory_config,
        "io_manager": PolarsParquetIOManager(memory_config=memory_config),
        "embedder": EmbedderResource(memory_config=memory_config, keep_model=keep_model),
        "stage_hooks": dg.ResourceDefinition.hardcoded_resource(hooks) if hooks is not NO_HOOKS else stage_hooks,
        "run_results": dg.ResourceDefinition.hardcoded_resource(results) if results is not None else run_results,
    }


@dg.definitions
def resources() -> dg.Definitions:
    """The resources every asset, check and sensor of the defs folder is bound to."""
    return dg.Definitions(resources=index_resources())
