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
    return sorted(table.to_pylist(), key=lambda r: r["chunk_id"])


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None, user: int | None = None, timeout: int = 600):
    """Run `memory ...` in a fresh process; returns CompletedProcess."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1", **(env or {})}
    kwargs = {}
    if user is not None:
        def demote():  # pragma: no cover - runs in the child
            os.setgid(user)
            os.setuid(user)

        kwargs["preexec_fn"] = demote
    return subprocess.run(
        [sys.executable, "-m", "memory_pipeline.cli", *args],
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
