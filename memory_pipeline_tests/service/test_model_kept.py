"""The server's index runs keep the model its searches use; one-shot runs hand its memory back.

`memory serve` and its index runs (ingests, notes, deletes) share one cached provider. A run's
tear-down used to release it: after every ingest the server's searcher lost its model (a gc of the
whole process, and a reload on the next query).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_pipeline.providers.registry import resolve_provider
from memory_pipeline.runner import run_index
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import write_config

pytestmark = pytest.mark.slow


def _model_loaded(provider) -> bool:
    return provider._direct is not None or provider._st is not None


@pytest.mark.parametrize("keep", [True, False])
def test_a_run_keeps_or_releases_the_shared_model(tmp_path: Path, keep: bool):
    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "tides.md").write_text("# Tides\nHigh tide at Terschelling is at 14:05.\n")
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml"))
    provider = resolve_provider(settings).provider
    assert provider is not None and provider.name == "local"
    provider.embed_query("the searcher loads the model")
    summary = run_index(settings, keep_model=keep)
    assert summary.chunks_embedded >= 1
    assert resolve_provider(settings).provider is provider  # the one cached instance the searcher holds
    assert _model_loaded(provider) is keep
