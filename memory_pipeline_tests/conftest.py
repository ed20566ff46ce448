"""Shared fixtures: configs on temp dirs, a copy of the shipped sample, a clean environment."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from memory_pipeline.providers.local import _offline_env

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
# The text part of the sample (its media are indexed by memory_pipeline_tests/multimodal).
TEXT_ONLY = shutil.ignore_patterns("media")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The variables the local model sets in any process that loads it (HF_*, TRANSFORMERS_*), set
# here before the fork server starts: otherwise the first test that loads the model in-process
# adds them to this process's environment, every later `memory` call of the worker differs from
# the fork server's in a variable read at import time, and each one starts a new interpreter.
_offline_env()


def pytest_sessionstart(session: pytest.Session) -> None:
    """The fork server starts from the environment as it is before any test patches it."""
    from memory_pipeline_tests.helpers import _ZYGOTE

    _ZYGOTE.baseline = dict(os.environ)


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch):
    monkeypatch.delenv("MEMORY_PIPELINE_CONFIG", raising=False)


def write_config(path: Path, **overrides) -> Path:
    """Write a memory_pipeline.yaml; ``sources`` defaults to one source 'mem' at ./mem."""
    cfg = {
        "data_dir": "index",
        "sources": [{"name": "mem", "path": "mem"}],
        "provider": "local",
        "chunking": {"tokens": 400, "overlap": 80},
    }
    cfg.update(overrides)
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return path


@pytest.fixture
def sample_dir(tmp_path: Path) -> Path:
    """A private copy of the shipped sample memory folder, its text part (notes and transcripts).

    The sample's media (data/sample/media) are left out here so the many text tests stay
    fast; memory_pipeline_tests/multimodal indexes them (and media of its own).
    """
    dest = tmp_path / "mem"
    shutil.copytree(SAMPLE, dest, ignore=TEXT_ONLY)
    return dest


@pytest.fixture
def sample_config(tmp_path: Path, sample_dir: Path) -> Path:
    return write_config(tmp_path / "memory_pipeline.yaml")
