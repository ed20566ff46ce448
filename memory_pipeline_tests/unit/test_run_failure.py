"""What `memory index` says when a run fails outside the stages' own error handling: Dagster wraps
an error of an IO manager ("Error occurred while handling output ... of step ...:") and the
message alone ends at the colon; the cause under it is what the user can act on."""

from __future__ import annotations

import dagster as dg

from memory_pipeline.runner import _failure
from memory_pipeline.stages.report import RunResults


class _StoreGone(dg.IOManager):
    def handle_output(self, context, obj) -> None:
        raise OSError(
            "When initiating multiple part upload for key 'team/assets/memory_chunks/03.parquet' in bucket 'memory': "
            "AWS Error NETWORK_CONNECTION during CreateMultipartUpload operation: curlCode: 7, "
            "Couldn't connect to server (http://admin:hunter2@127.0.0.1:9/)"
        )

    def load_input(self, context):  # pragma: no cover - nothing reads it
        return None


@dg.asset(io_manager_key="gone")
def memory_chunks() -> int:
    return 1


def test_an_error_dagster_wraps_is_reported_with_its_cause_and_without_a_urls_password():
    result = dg.materialize([memory_chunks], resources={"gone": _StoreGone()}, raise_on_error=False)
    assert not result.success
    err = _failure(result, RunResults())
    text = str(err)
    assert text.startswith("the index run failed: ") and 'handling output "result" of step "memory_chunks"' in text, text
    assert "Couldn't connect to server" in text and "OSError" in text, text
    assert "hunter2" not in text and "\n" not in text, text
