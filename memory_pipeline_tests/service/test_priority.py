"""Index runs give a running server's searches the CPU first (``service.index_nice``).

A real `memory serve` is up for the data folder; index runs in other processes (a `memory index`
run through the runner, and a Dagster run materialized directly, as the UI's runs are) end with
every thread at the configured nice value. The server's own ingests never lower the server's
priority. Without a live server (none, a stale record, the setting at 0) nothing changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.service.conftest import NOTES, Server, cli_env, make_memory

pytestmark = pytest.mark.slow
RAG = "/api/agentos/rag/multimodal"

# Indexes the folder of argv[1]'s config in this new process (through the runner, or a Dagster
# materialization of the asset graph over one shard, as a run launched from the UI does), after
# a new note; prints the nice value of the process before, and of each of its threads after.
INDEX_AND_REPORT = r"""
import json, os, sys
from pathlib import Path
from memory_pipeline.settings import load_settings
config, how, note = sys.argv[1], sys.argv[2], sys.argv[3]
before = os.getpriority(os.PRIO_PROCESS, 0)
settings = load_settings(config)
(Path(config).parent / "mem" / note).write_text("# Extra\nThe ferry to Vlieland leaves at seven from Harlingen.\n")
if how == "runner":
    from memory_pipeline.runner import run_index
    run_index(settings)
else:
    import dagster as dg
    from memory_pipeline.defs.assets import index_assets
    from memory_pipeline.defs.resources import index_resources
    from memory_pipeline.discovery import shard_of
    from memory_pipeline.runner import ensure_dagster_home
    os.environ["DAGSTER_HOME"] = str(ensure_dagster_home(settings))
    with dg.DagsterInstance.from_config(os.environ["DAGSTER_HOME"]) as instance:
        done = dg.materialize(index_assets, instance=instance, resources=index_resources(config), partition_key=shard_of("mem", note))
        assert done.success
after = {t: os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
print(json.dumps({"before": before, "threads": after}))
"""


def index_in_new_process(config: Path, how: str, note: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", INDEX_AND_REPORT, str(config), how, note],
        cwd=config.parent, env=cli_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def thread_nices(pid: int) -> list[int]:
    return [os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    srv = Server(make_memory(tmp_path_factory.mktemp("nice")))
    yield srv
    srv.stop()


@pytest.mark.parametrize("how", ["runner", "dagster"])
def test_an_index_run_beside_a_server_gives_way(served, how):
    got = index_in_new_process(served.config, how, f"ferry-{how}.md")
    expected = max(got["before"], 10)
    assert len(got["threads"]) > 1  # the model's and LanceDB's pools: all of them moved, not the main thread alone
    assert set(got["threads"].values()) == {expected}, got
    found = served.http.post("/api/memory/search", json={"query": "ferry Vlieland Harlingen"}).json()
    assert any(r["path"].endswith(f"ferry-{how}.md") for r in found["results"]), found


def test_the_servers_own_ingests_keep_its_priority(served):
    before = thread_nices(served.proc.pid)
    resp = served.http.post(f"{RAG}/documents/ingest", files={"document": ("tide.txt", b"High tide at Terschelling is at 14:05.\n", "text/plain")})
    assert resp.status_code == 200, resp.text
    after = thread_nices(served.proc.pid)
    assert set(after) == set(before) == {os.getpriority(os.PRIO_PROCESS, 0)}


def _folder(root: Path, **config) -> Path:
    mem = root / "mem"
    for rel, text in NOTES.items():
        (mem / rel).parent.mkdir(parents=True, exist_ok=True)
        (mem / rel).write_text(text)
    return write_config(root / "memory_pipeline.yaml", **config)


# Asks ``yield_to_server`` in a new process (a nice value cannot be lowered again): prints the
# nice values of the process's threads before and after.
ASK = r"""
import json, os, sys, threading
from memory_pipeline.priority import yield_to_server
from memory_pipeline.settings import load_settings
settings = load_settings(sys.argv[1])
stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()  # a thread that exists before the call
nices = lambda: sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")})
before = nices()
got = yield_to_server(settings)
print(json.dumps({"before": before, "after": nices(), "returned": got}))
"""


@pytest.mark.parametrize("case", ["no server", "stale record", "setting off", "live server"])
def test_only_a_live_server_lowers_the_priority(tmp_path, case):
    config = _folder(tmp_path, **({"service": {"index_nice": 0}} if case == "setting off" else {}))
    data = tmp_path / "index"
    data.mkdir(exist_ok=True)
    sleeper = None
    if case != "no server":
        sleeper = subprocess.Popen(["sleep", "600"])
        pid = sleeper.pid
        if case == "stale record":
            sleeper.kill()
            sleeper.wait()
        (data / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": pid, "token_required": False, "config": str(config)}))
    try:
        done = subprocess.run([sys.executable, "-c", ASK, str(config)], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120)
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if case == "live server":
        assert got["returned"] == 10 and got["after"] == [max(got["before"][0], 10)], got
    else:
        assert got["returned"] is None and got["after"] == got["before"], got


def test_the_nice_value_is_a_bounded_setting(tmp_path):
    from memory_pipeline.errors import ConfigError
    from memory_pipeline.settings import load_settings

    assert load_settings(_folder(tmp_path)).service.index_nice == 10
    for bad in (-1, 20, "low"):
        with pytest.raises(ConfigError, match="index_nice"):
            load_settings(write_config(tmp_path / "memory_pipeline.yaml", service={"index_nice": bad}))


def _unindexed(root: Path) -> int:
    import lancedb

    table = lancedb.connect(str(root / "index" / "lancedb")).open_table("memory_vectors")
    return max(int(table.index_stats(i.name).num_unindexed_rows or 0) for i in table.list_indices() if i.index_type == "FTS")


@pytest.mark.parametrize("case", ["no server", "live server"])
def test_an_index_run_beside_a_server_folds_its_new_rows_into_the_indices(tmp_path, case):
    """Each fragment of rows the indices lack costs every search a scan (about 3 ms of CPU per
    fragment at 100k chunks): with a server up, an index run folds its rows in before it ends;
    without one, a few new rows wait for a larger backlog (the run's own cost)."""
    from memory_pipeline_tests.helpers import run_json

    config = _folder(tmp_path)
    run_json("index", "--config", str(config), "--json", cwd=tmp_path)
    assert _unindexed(tmp_path) == 0  # the first run builds the indices over every row
    sleeper = subprocess.Popen(["sleep", "600"]) if case == "live server" else None
    try:
        if sleeper is not None:
            record = {"url": "http://127.0.0.1:9", "pid": sleeper.pid, "token_required": False, "config": str(config)}
            (tmp_path / "index" / "server.json").write_text(json.dumps(record))
        (tmp_path / "mem" / "new-note.md").write_text("# Tides\nHigh tide at Terschelling is at 14:05.\n")
        done = run_json("index", "--config", str(config), "--json", cwd=tmp_path)
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
    assert done["rows_written"] > 0
    if case == "live server":
        assert _unindexed(tmp_path) == 0, done
    else:
        assert _unindexed(tmp_path) > 0, done
