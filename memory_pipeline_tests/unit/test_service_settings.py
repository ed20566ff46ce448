"""The config's `service:` section: validated like every other; `memory serve` flags override it."""

from __future__ import annotations

import pytest

from memory_pipeline.cli import build_parser
from memory_pipeline.errors import ConfigError
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import write_config


def test_defaults_and_values(tmp_path):
    (tmp_path / "mem").mkdir()
    s = load_settings(write_config(tmp_path / "a.yaml"))
    assert (s.service.host, s.service.port, s.service.assets_source, s.service.cors_origins) == ("127.0.0.1", 8765, None, ())
    s = load_settings(write_config(tmp_path / "b.yaml", service={"port": 0, "cors_origins": ["http://localhost:3000"], "assets_source": "mem"}))
    assert s.service.port == 0 and s.service.cors_origins == ("http://localhost:3000",) and s.service.assets_source == "mem"


@pytest.mark.parametrize(
    ("service", "key"),
    [({"port": 70000}, "service.port"), ({"port": "8765"}, "service.port"), ({"hots": "x"}, "service.hots"), ({"cors_origins": "x"}, "service.cors_origins")],
)
def test_bad_values_name_the_key(tmp_path, service, key):
    (tmp_path / "mem").mkdir(exist_ok=True)
    with pytest.raises(ConfigError) as err:
        load_settings(write_config(tmp_path / "c.yaml", service=service))
    assert err.value.key == key and "\n" not in str(err.value)


def test_serve_flags_default_to_the_config():
    args = build_parser().parse_args(["serve"])
    assert args.host is None and args.port is None and args.assets_source is None and args.cors_origin is None
    args = build_parser().parse_args(["serve", "--port", "9000"])
    assert args.port == 9000
