"""pyproject.toml's pins are the ones `make` installs: every one of them is in requirements.lock, equal."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _name(spec: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\[=<>!~ ]", spec, maxsplit=1)[0]).lower()


def test_every_pyproject_pin_equals_the_lock():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + [s for extra in project["optional-dependencies"].values() for s in extra]
    lock = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            lock[_name(line)] = line.split("==", 1)[1].split(";")[0].strip()
    assert specs, "no dependencies found"
    wrong = {}
    for spec in specs:
        assert "==" in spec, f"{spec} is not pinned exactly"
        name, version = _name(spec), spec.split("==", 1)[1].strip()
        if lock.get(name) != version:
            wrong[name] = (version, lock.get(name))
    assert not wrong, f"pyproject pin != requirements.lock: {wrong}"
