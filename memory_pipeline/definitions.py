"""Gathers the Dagster definitions: everything under defs/, found by Dagster's defs-folder loader."""

import warnings
from pathlib import Path

import dagster as dg
from dagster.components.core.component_tree import ComponentTree

from memory_pipeline.defs.dagster_storage import enable_event_batches

enable_event_batches()  # runs the daemon and the UI launch batch their events too


def load_defs(path_within_project: Path) -> dg.Definitions:
    """The defs folder's definitions, as `dg.load_from_defs_folder` loads them, less its catalogue
    of every component type that the installed Dagster plugins offer.

    `load_from_defs_folder` builds the project root, which adds that catalogue: it imports each
    plugin (dagster-aws's components among them) and snapshots its types, for the UI's list of
    components to scaffold. This project declares no components, and every run process (one per
    shard, or one per step) loads these definitions, so that was 0.6-0.9 s of a run with nothing
    to do. Building the defs folder itself gives the same assets, checks, jobs, sensors,
    schedules, resources and executor; the component tree is kept on the result, as the root
    keeps it.
    """
    tree = ComponentTree.for_project(path_within_project=path_within_project)
    with warnings.catch_warnings():
        # the defs-folder loader reads plain modules through Dagster's preview module loaders;
        # load_from_defs_folder silences the same warnings
        warnings.simplefilter("ignore", dg.PreviewWarning)
        folder = tree.build_defs(tree.defs_module_path)
    return dg.Definitions.merge(folder, dg.Definitions(component_tree=tree))


# Module-level (not @dg.definitions) so callers read `defs` as a Definitions object; loading
# imports the defs modules and reads pyproject.toml's [tool.dg], nothing else.
defs = load_defs(Path(__file__).parent)
