"""Gathers the Dagster definitions: everything under defs/, found by Dagster's defs-folder loader."""

from pathlib import Path

import dagster as dg

from memory_pipeline.defs.dagster_storage import enable_event_batches

enable_event_batches()  # runs the daemon and the UI launch batch their events too

# Module-level (not @dg.definitions) so callers read `defs` as a Definitions object; loading
# imports the defs modules and reads pyproject.toml's [tool.dg], nothing else.
defs = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
