"""Helpers shared by the Dagster and end-to-end tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lancedb

REPO = Path(__file__).resolve().parents[1]


def table_rows(data_dir: Path, columns=("chunk_id", "path", "text", "content_hash")) -> list[dict]:
    db = lancedb.connect(str(data_dir / "lancedb"))
    if "memory_vectors" not in db.list_tables().tables:
        return []
    table = db.open_table("memory_vectors").to_arrow().select(list(columns))
    return sorted(table.to_pylist(), key=lambda r: tuple(str(r[c]) for c in columns if c != "vector"))


def _drop_file_read_override() -> None:  # pragma: no cover - runs in the child
    """Drop root's CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH so file permissions apply to it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop = 24
    for cap in (1, 2):
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def run_cli(
    *args: str,
    env: dict | None = None,
    cwd: Path | None = None,
    honor_permissions: bool = False,
    timeout: int = 600,
    kill_at: str | None = None,
    embed_slice: int | None = None,
):
    """Run `memory ...` in a fresh process; returns CompletedProcess.

    ``honor_permissions``: when running as root, make the child subject to file
    permissions (so a chmod 000 file is really unreadable to it).
    ``kill_at``: the run kills itself with SIGKILL at this point (``stages.hooks.POINTS``),
    with vectors checkpointed every ``embed_slice`` chunks (see fault_cli.py).
    """
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1", **(env or {})}
    kwargs = {}
    if honor_permissions and os.geteuid() == 0:
        kwargs["preexec_fn"] = _drop_file_read_override
    command = [sys.executable, "-m", "memory_pipeline.cli", *args]
    if kill_at is not None:
        command = [sys.executable, "-m", "memory_pipeline_tests.fault_cli", "--kill-at", kill_at]
        if embed_slice is not None:
            command += ["--embed-slice", str(embed_slice)]
        command += ["--", *args]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=str(cwd or REPO),
        timeout=timeout,
        **kwargs,
    )


def run_json(*args: str, **kwargs) -> dict:
    proc = run_cli(*args, **kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str) -> dict:
    """One query against the Dagster webserver's GraphQL endpoint on 127.0.0.1."""
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


LOGGERS = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def materialize(config: Path, instance, **kwargs):
    """Every asset in-process, for the config at ``config``."""
    import dagster as dg

    from memory_pipeline.defs.assets import index_assets
    from memory_pipeline.defs.resources import index_resources

    return dg.materialize(
        index_assets,
        instance=instance,
        resources=index_resources(str(config)),
        run_config=LOGGERS,
        **kwargs,
    )


def asset_metadata(result, asset: str) -> dict:
    """The metadata values of ``asset``'s first materialization in ``result``."""
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        if mat.asset_key.to_user_string() == asset:
            return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    raise AssertionError(f"{asset} not materialized")
