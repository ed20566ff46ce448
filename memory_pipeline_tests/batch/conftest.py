"""Fixtures for the batch tests: the OpenAI fake with batch endpoints and configs pointing at it."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.fakes.batch_server import OpenAIBatchFake

DIMS = 256


@pytest.fixture
def openai_fake(monkeypatch):
    with OpenAIBatchFake(polls_to_complete=3) as fake:
        monkeypatch.setenv("OPENAI_API_KEY", fake.api_key)
        yield fake


def batch_config(path: Path, fake, *, enabled: bool = True, wait: bool = True, data_dir: str = "index", **batch) -> Path:
    """A config for provider openai at the fake; batching as asked."""
    return write_config(
        path,
        data_dir=data_dir,
        provider="openai",
        dims=DIMS,
        remote={
            "base_url": fake.base_url,
            "backoff_base_ms": 10,
            "batch": {"enabled": enabled, "wait": wait, "poll_interval_ms": 20, "timeout_ms": 60_000, **batch},
        },
    )
