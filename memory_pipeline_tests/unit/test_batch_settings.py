"""remote.batch in the YAML: defaults, validation."""

from __future__ import annotations

import pytest

from memory_pipeline.errors import ConfigError
from memory_pipeline.settings import settings_from_dict


def _cfg(tmp_path, **extra):
    (tmp_path / "mem").mkdir(exist_ok=True)
    return settings_from_dict({"sources": [{"name": "mem", "path": "mem"}], **extra}, base_dir=tmp_path)


def test_batch_defaults_off_and_waiting(tmp_path):
    b = _cfg(tmp_path).remote.batch
    assert (b.enabled, b.wait, b.concurrency) == (False, True, 2)


@pytest.mark.parametrize(
    ("batch", "key"),
    [
        ({"concurrency": 0}, "remote.batch.concurrency"),
        ({"poll_interval_ms": 0}, "remote.batch.poll_interval_ms"),
        ({"timeout_ms": -5}, "remote.batch.timeout_ms"),
        ({"wait": "yes"}, "remote.batch.wait"),
        ({"speed": 3}, "remote.batch.speed"),
    ],
)
def test_bad_batch_values_name_the_key(tmp_path, batch, key):
    with pytest.raises(ConfigError) as info:
        _cfg(tmp_path, remote={"batch": batch})
    assert info.value.key == key


def test_batching_needs_the_cache(tmp_path):
    with pytest.raises(ConfigError, match="needs cache.enabled"):
        _cfg(tmp_path, remote={"batch": {"enabled": True}}, cache={"enabled": False})
