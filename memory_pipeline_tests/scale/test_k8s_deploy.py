"""The Kubernetes deployment files (issue 16), checked without a cluster.

- ``deploy/k8s/dagster.yaml`` against Dagster's own config schema for an instance, and its storage,
  run coordinator and run launcher sections against the config schemas of the classes they name
  (dagster-postgres, the queued coordinator, dagster-k8s's K8sRunLauncher).
- ``deploy/k8s/values.yaml``: the run launcher section, as the chart turns it into the
  K8sRunLauncher's config (camelCase keys to snake_case, secret and config-map objects to names,
  plus the fields the chart fills in itself), against the same schema; the user deployment's
  module is the one the image serves.
- ``deploy/Dockerfile``: its CMD, run here as the image would run it (on 127.0.0.1 and a free
  port), serves the definitions: the code location answers and lists index_job.
- ``deploy/k8s/memory_pipeline.yaml`` is a valid configuration of this project.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from memory_pipeline_tests.helpers import REPO, default_sigint, free_port, stop_group

DEPLOY = REPO / "deploy"
BIN = Path(sys.executable).parent


def _validated(config_type, value) -> None:
    from dagster._config import process_config  # the schema check Dagster runs on these files

    result = process_config(config_type, value)
    assert result.success, [e.message for e in result.errors or []]


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def test_instance_file_is_valid_for_dagster_and_its_classes(monkeypatch):
    from dagster._core.instance.config import dagster_instance_config
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_k8s import K8sRunLauncher
    from dagster_postgres import DagsterPostgresStorage

    path = DEPLOY / "k8s" / "dagster.yaml"
    for name in ("DAGSTER_PG_HOST", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB"):
        monkeypatch.setenv(name, "set-by-the-secret")  # what the pod's environment holds
    config, _ = dagster_instance_config(str(path.parent), config_filename=path.name)  # raises on a schema error
    raw = yaml.safe_load(path.read_text())
    assert raw["run_launcher"]["class"] == "K8sRunLauncher" and raw["run_launcher"]["module"] == "dagster_k8s"
    _validated(K8sRunLauncher.config_type(), raw["run_launcher"]["config"])
    _validated(DagsterPostgresStorage.config_type(), raw["storage"]["postgres"])
    _validated(QueuedRunCoordinator.config_type(), raw["run_coordinator"]["config"])
    # Credentials come from the environment, never from the file.
    assert all(isinstance(v, dict) and set(v) == {"env"} for k, v in raw["storage"]["postgres"]["postgres_db"].items() if k != "port")
    env = dict(e.split("=", 1) for e in raw["run_launcher"]["config"]["env_vars"])
    assert env["MEMORY_PIPELINE_EXECUTOR"] == "in_process"
    assert config["run_launcher"]["class"] == "K8sRunLauncher"


def test_helm_values_give_a_valid_run_launcher_and_serve_our_module():
    from dagster_k8s import K8sRunLauncher

    values = yaml.safe_load((DEPLOY / "k8s" / "values.yaml").read_text())
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    launcher = {}
    for key, value in values["runLauncher"]["config"]["k8sRunLauncher"].items():
        if key in ("envSecrets", "envConfigMaps"):
            value = [item["name"] for item in value]
        elif key == "runK8sConfig":  # the chart renders its sections as container_config, pod_spec_config, ...
            value = {_snake(k): v for k, v in value.items()}
        launcher[_snake(key)] = value
    # What the chart fills in from its own release.
    launcher |= {
        "instance_config_map": "dagster-instance",
        "dagster_home": "/opt/dagster/dagster_home",
        "postgres_password_secret": "dagster-postgresql-secret",
        "service_account_name": "dagster",
        "job_namespace": "dagster",
        "load_incluster_config": True,
    }
    _validated(K8sRunLauncher.config_type(), launcher)
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "memory_pipeline.definitions"]
    env = {e["name"]: e["value"] for e in deployment["env"]}
    run_env = dict(e.split("=", 1) for e in launcher["env_vars"])
    assert env == run_env  # the code location and the runs see the same configuration
    mounts = {m["mountPath"] for m in deployment["volumeMounts"]}
    assert Path(env["MEMORY_PIPELINE_CONFIG"]).parent.as_posix() in mounts


def test_cluster_config_is_a_valid_memory_pipeline_config():
    from memory_pipeline.settings import load_settings

    settings = load_settings(DEPLOY / "k8s" / "memory_pipeline.yaml")
    assert str(settings.data_dir) == "/data/index"


def _dockerfile() -> tuple[list[str], dict[str, str]]:
    """The image's CMD and ENV, read from deploy/Dockerfile."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    cmd: list[str] = []
    env: dict[str, str] = {}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "CMD":
            cmd = json.loads(rest)
        elif word == "ENV":
            env |= dict(part.split("=", 1) for part in shlex.split(rest))
    return cmd, env


def test_the_image_entry_point_serves_the_definitions(tmp_path: Path):
    cmd, image_env = _dockerfile()
    assert cmd[:3] == ["dagster", "code-server", "start"]
    assert image_env["HF_HUB_OFFLINE"] == "1" and image_env["MEMORY_PIPELINE_EXECUTOR"] == "in_process"
    port = free_port()
    args = [str(BIN / cmd[0]), *cmd[1:]]
    args[args.index("-h") + 1] = "127.0.0.1"  # listens on loopback here
    args[args.index("-p") + 1] = str(port)
    env = {**os.environ, **{k: v for k, v in image_env.items() if not k.startswith(("PIP_", "DAGSTER_HOME", "MEMORY_PIPELINE_CONFIG"))}}
    env["DAGSTER_HOME"] = str(tmp_path)
    import dagster as dg

    # The instance made (and its SQLite schema stamped) once, before the server and the CLI below
    # both open it: two processes creating it at once can stamp it twice.
    with dg.DagsterInstance.from_config(str(tmp_path)):
        pass
    log = tmp_path / "code-server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 180
        while True:  # serving first (no instance needed), then the definitions through it
            assert proc.poll() is None, log.read_text()[-3000:]
            health = subprocess.run([str(BIN / "dagster"), "api", "grpc-health-check", "-p", str(port)], env=env, capture_output=True, timeout=60)
            if health.returncode != 0:
                assert time.monotonic() < deadline, f"the code server did not serve in 180s:\n{log.read_text()[-3000:]}"
                time.sleep(1)
                continue
            listed = subprocess.run(
                [str(BIN / "dagster"), "job", "list", "--grpc-host", "127.0.0.1", "--grpc-port", str(port)],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if listed.returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"the code server did not serve in 180s:\n{listed.stderr[-2000:]}\n{log.read_text()[-3000:]}")
            time.sleep(1)
        assert "index_job" in listed.stdout, listed.stdout
    finally:
        stop_group(proc, timeout=30)
