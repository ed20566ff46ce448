"""A real `memory serve` in a subprocess on a temp memory folder, driven by a real HTTP client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
NOTES = {
    "2026-11-01.md": "# Standup\nThe daily standup moved to 9:30 in room Aurora.\n\n## Database\nWe chose LanceDB for the support bot vector store.\n",
    "2026-11-12.md": "# Deploy\nDeploys happen on Fridays after the freeze lifts.\nRollback plan: flip the PAY-2291 feature flag.\n",
    "people/dana.md": "# Dana\nDana owns routing-api and prefers async reviews.\nShe is on call in the first week of December.\n",
    "projects/warehouse.txt": "Warehouse scanning pilot starts in Rotterdam with twelve handheld scanners.\n",
}


def cli_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MEMORY_PIPELINE_CONFIG", "MEMORY_PIPELINE_TOKEN")}
    env.update({"HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}, **extra)
    return env


def memory(*args: str, cwd: Path, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    """`memory ...` as a new process (forked from the tests' fork server, see helpers.run_cli)."""
    return run_cli(*args, cwd=cwd, env=cli_env(**env), inherit_env=False, timeout=timeout)


def make_memory(root: Path, **config) -> Path:
    """A memory folder with a few notes, its config, indexed; returns the config path."""
    mem = root / "mem"
    for rel, text in NOTES.items():
        (mem / rel).parent.mkdir(parents=True, exist_ok=True)
        (mem / rel).write_text(text)
    cfg = write_config(root / "memory_pipeline.yaml", **config)
    done = memory("index", "--config", str(cfg), "--quiet", cwd=root)
    assert done.returncode == 0, done.stderr
    return cfg


class Server:
    """`memory serve --port 0` in a subprocess; its address read from the data folder's server file."""

    def __init__(self, config: Path, *args: str, token: str | None = None) -> None:
        self.config = config
        self.data_dir = config.parent / "index"
        self.token = token
        env = cli_env(**({"MEMORY_PIPELINE_TOKEN": token} if token else {}))
        self.log = open(config.parent / f"serve-{time.monotonic_ns()}.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memory_pipeline.cli", "serve", "--config", str(config), "--port", "0", *args],
            cwd=config.parent, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.url = self._wait_for_address()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, timeout=600, headers=headers)
        self.wait_ready()

    def _wait_for_address(self, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        path = self.data_dir / "server.json"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"memory serve exited {self.proc.returncode}: {self.output()}")
            try:
                record = json.loads(path.read_text())
                if record["pid"] == self.proc.pid:
                    return record["url"]
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"memory serve did not write {path}: {self.output()}")

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.http.get("/readyz").status_code == 200:
                return
            time.sleep(0.2)
        raise AssertionError(f"memory serve never ready: {self.output()}")

    def settle(self, timeout: float = 180) -> None:
        """Wait until the server has folded its writes' rows into the indices (the table then stays as
        it is: a search through it and one in-process see the same version)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.http.get("/api/memory/status").json()["fold_pending"]:
                return
            time.sleep(0.2)
        raise AssertionError(f"the server never settled: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def memory_config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("served")
    return make_memory(root, multimodal={"max_file_bytes": 2 * 1024 * 1024})


@pytest.fixture(scope="module")
def server(memory_config):
    srv = Server(memory_config)
    yield srv
    srv.stop()
