"""Resources: where the config lives, and the provider/settings it yields at run time."""


import dagster as dg

from memory_pipeline.providers.registry import ResolvedProvider, resolve_provider
from memory_pipeline.settings import Settings, load_settings


class MemoryConfigResource(dg.ConfigurableResource):
    """The memory_pipeline.yaml to use; empty means MEMORY_PIPELINE_CONFIG, then ./memory_pipeline.yaml.

    The file is read when a run starts, never at import time.
    """

    config_path: str = ""

    def settings(self) -> Settings:
        return load_settings(self.config_path or None)

    def provider(self, settings: Settings) -> ResolvedProvider:
        return resolve_provider(settings)
