"""What a failed run tells the user to check: a storage error (OSError) that is not ours to wrap
names the disk or the object store, not the Dagster UI (the store going down mid-run said "see the
run in the Dagster UI")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memory_pipeline.errors import MemoryPipelineError, ObjectStoreError
from memory_pipeline.runner import _failure
from memory_pipeline.stages.report import RunResults


@pytest.mark.parametrize(
    ("error", "remote", "hint"),
    [
        (OSError("When listing objects under key 'assets': AWS Error NETWORK_CONNECTION during ListObjectsV2"), True, ObjectStoreError.hint),
        (OSError(28, "No space left on device"), False, "a file or storage error: check the data folder's disk and permissions"),
        (ValueError("something of ours"), True, "see the run in the Dagster UI (make ui) for the traceback"),
    ],
)
def test_a_failed_runs_hint_names_what_to_check(error: BaseException, remote: bool, hint: str):
    results = RunResults()
    results.error = error
    err = _failure(SimpleNamespace(all_events=[]), results, remote=remote)
    assert isinstance(err, MemoryPipelineError), err
    assert err.hint == hint, err.hint
    assert str(err).startswith(f"the index run failed: {type(error).__name__}: ")
