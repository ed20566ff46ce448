"""notebooks/coverage.ipynb runs against a real index, draws its charts inline and saves them as PNG;
`make notebook` serves it in Jupyter."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import REPO, free_port, run_json, stop_group, table_rows

pytestmark = pytest.mark.slow
CHARTS = ("coverage_by_modality.png", "failures_by_reason.png", "index_growth.png")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """The sample's text (and one broken note) indexed by two runs; returns the folder."""
    root = tmp_path_factory.mktemp("notebook")
    shutil.copytree(SAMPLE, root / "mem", ignore=TEXT_ONLY)
    (root / "mem" / "broken.md").write_bytes(b"\xff\xfe not utf-8\n")
    cfg = write_config(root / "memory_pipeline.yaml")
    run_json("index", "--config", str(cfg), "--json")
    (root / "mem" / "memory" / "extra.md").write_text("# Extra\nA second run grows the index.\n")
    run_json("index", "--config", str(cfg), "--json")
    return root


def test_coverage_notebook_executes_and_saves_charts(two_runs: Path, monkeypatch):
    cfg = two_runs / "memory_pipeline.yaml"
    nb = nbformat.read(REPO / "notebooks" / "coverage.ipynb", as_version=4)
    monkeypatch.setenv("MEMORY_PIPELINE_CONFIG", str(cfg))
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}})
    client.execute(env=dict(os.environ))

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "markdown" in text and "indexed 15/16" in text  # 14 notes + extra.md; broken.md failed
    assert "2 runs" in text
    # Each chart is drawn in the notebook itself (inline PNG outputs), not only saved.
    inline = [o for o in outputs if o.get("output_type") == "display_data" and "image/png" in o.get("data", {})]
    assert len(inline) == len(CHARTS)
    for name in CHARTS:
        png = two_runs / "index" / "charts" / name
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, name


def test_the_notebook_finds_the_data_folder_as_memory_does_and_counts_missing_rows(tmp_path: Path, monkeypatch):
    """The notebook joined `data_dir` to the config's folder itself: `~/…` (or an `s3://` data_dir)
    became a folder named `~` (or `s3:`) and DuckDB failed. And its reasons chart said "every file
    is indexed" over rows deleted from the table (only failed and skipped files were listed)."""
    import lancedb

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    mem = tmp_path / "mem"
    mem.mkdir()
    for i in range(3):
        (mem / f"n{i}.md").write_text(f"# Note {i}\n\nThe kiln note number {i}.\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none", data_dir="~/nbidx")
    run_json("index", "--config", str(cfg), "--json", env={"HOME": str(tmp_path / "home")})
    data = tmp_path / "home" / "nbidx"
    lancedb.connect(str(data / "lancedb")).open_table("memory_vectors").delete("path = 'n0.md'")
    nb = nbformat.read(REPO / "notebooks" / "coverage.ipynb", as_version=4)
    monkeypatch.setenv("MEMORY_PIPELINE_CONFIG", str(cfg))
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}).execute(env=dict(os.environ))
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs)
    assert str(data / "analytics.duckdb") in text and "missing_rows" in text, text
    assert (data / "charts" / "failures_by_reason.png").is_file() and not (tmp_path / "~").exists()


def _get(url: str, token: str) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_make_notebook_serves_the_notebook_on_an_up_to_date_index(two_runs: Path, tmp_path: Path):
    root = tmp_path / "copy"
    shutil.copytree(two_runs, root, symlinks=True)
    (root / "mem" / "memory" / "later.md").write_text("# Later\nWritten after the last run.\n")
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_TOKEN": token,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
        "HF_HUB_OFFLINE": "1",
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }
    log = tmp_path / "notebook.log"
    bin_dir = Path(sys.executable).parent
    with log.open("w") as out:
        proc = subprocess.Popen(
            # -o: never reinstall the virtualenv from inside a test run.
            ["make", "--no-print-directory", "-o", ".venv/.installed", "notebook", f"CONFIG={root / 'memory_pipeline.yaml'}",
             f"PORT={port}", f"BIN={bin_dir}", "JUPYTER_ARGS=--no-browser"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                _get(f"{base}/api/status", token)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1)
        # The index was brought up to date first: the note written after the last run is in it.
        assert "Indexed " in log.read_text(), log.read_text()[-3000:]
        assert any(r["path"].endswith("memory/later.md") for r in table_rows(root / "index", ("path",)))
        nb = _get(f"{base}/api/contents/coverage.ipynb?content=0", token)
        assert nb["type"] == "notebook" and nb["path"] == "coverage.ipynb"
        specs = _get(f"{base}/api/kernelspecs", token)
        assert specs["default"] == "python3" and "python3" in specs["kernelspecs"]
        # Without the token nothing is served.
        with pytest.raises(urllib.error.HTTPError):
            _get(f"{base}/api/contents/coverage.ipynb", "wrong")
    finally:
        stop_group(proc, timeout=60)
