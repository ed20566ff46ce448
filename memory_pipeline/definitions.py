"""Gathers the Dagster definitions: everything under defs/, found by Dagster's defs-folder loader."""

import warnings
from pathlib import Path

import dagster as dg

from memory_pipeline.defs.dagster_storage import enable_event_batches

enable_event_batches()  # runs the daemon and the UI launch batch their events too


def load_defs(path_within_project: Path) -> dg.Definitions:
    """The defs folder's definitions, as `dg.load_from_defs_folder` loads them, less what the
    project root adds beside the folder.

    `load_from_defs_folder` builds the project root, which adds two things: a catalogue of every
    component type the installed Dagster plugins offer (it imports each plugin, dagster-aws's
    components among them, and snapshots its types), and the components added in the UI. Both
    serve authoring components from the UI, a Dagster+ feature (open source Dagster does not
    permit it), and this project declares no components. Every run process (one per shard, or
    one per step) loads these definitions: without the catalogue their import takes about 1.1 s
    less, and a run with nothing to do about 0.4 s less (README, *Dagster*). The defs folder itself gives the same assets, checks, jobs, sensors, schedules,
    resources and executor (`dagster/test_idioms.py` compares them); the component tree is kept
    on the result, as the root keeps it, so the UI still shows the project's tree.
    """
    with warnings.catch_warnings():
        # what load_from_defs_folder silences (@suppress_dagster_warnings): its module loaders
        # are Dagster previews
        for category in (dg.PreviewWarning, dg.BetaWarning, dg.SupersessionWarning, DeprecationWarning):
            warnings.simplefilter("ignore", category)
        tree = dg.ComponentTree.for_project(path_within_project=path_within_project)
        folder = tree.build_defs(tree.defs_module_path)
    return dg.Definitions.merge(folder, dg.Definitions(component_tree=tree))


# Module-level (not @dg.definitions) so callers read `defs` as a Definitions object; loading
# imports the defs modules and reads pyproject.toml's [tool.dg], nothing else.
defs = load_defs(Path(__file__).parent)
