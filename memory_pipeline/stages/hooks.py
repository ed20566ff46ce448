"""Points where the caller of a run can act: injected, never read from the environment.

Production runs use :data:`NO_HOOKS`. Tests pass their own (see
``memory_pipeline_tests/fault_cli.py``) through ``cli.main(argv, hooks=...)`` →
``runner.run_index(..., hooks=...)`` → the ``stage_hooks`` resource → the stages, to
kill a run at a named point and prove that the next run recovers.
"""

from __future__ import annotations

from dataclasses import dataclass

# The named points a run passes, in order.
POINTS = ("batch_after_submit", "embed_after_first_batch", "write_after_first_commit")


@dataclass(frozen=True)
class StageHooks:
    """What a run's stages call back into.

    ``embed_slice``: vectors are checkpointed to the cache after every slice of this many chunks.
    """

    embed_slice: int = 512

    def at(self, point: str) -> None:
        """Called when the run passes ``point`` (one of :data:`POINTS`); does nothing here."""


NO_HOOKS = StageHooks()

__all__ = ["NO_HOOKS", "POINTS", "StageHooks"]
