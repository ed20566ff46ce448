"""What the server does after its writes, for its searches' sake.

- Its index runs keep the model its searches use; one-shot runs hand its memory back. `memory
  serve` and its index runs (ingests, notes, deletes) share one cached provider; a run's tear-down
  used to release it after every ingest (a gc of the whole process, a reload on the next query).
- Once its writes settle, the rows they left outside the table's indices are folded in (each query
  scans unindexed rows: a few ingests made searches 60 % more costly at 100k chunks).
"""

from __future__ import annotations

import time
from pathlib import Path

import lancedb
import pytest

from memory_pipeline.providers.registry import resolve_provider
from memory_pipeline.runner import run_index
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.service.conftest import Server, make_memory

pytestmark = pytest.mark.slow


def _model_loaded(provider) -> bool:
    return provider._direct is not None or provider._st is not None


@pytest.mark.parametrize("keep", [True, False])
def test_a_run_keeps_or_releases_the_shared_model(tmp_path: Path, keep: bool):
    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "tides.md").write_text("# Tides\nHigh tide at Terschelling is at 14:05.\n")
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml"))
    provider = resolve_provider(settings).provider
    assert provider is not None and provider.name == "local"
    provider.embed_query("the searcher loads the model")
    summary = run_index(settings, keep_model=keep)
    assert summary.chunks_embedded >= 1
    assert resolve_provider(settings).provider is provider  # the one cached instance the searcher holds
    assert _model_loaded(provider) is keep


def _unindexed(data_dir: Path) -> dict[str, int]:
    table = lancedb.connect(str(data_dir / "lancedb")).open_table("memory_vectors")
    return {i.name: table.index_stats(i.name).num_unindexed_rows for i in table.list_indices()}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    srv = Server(make_memory(tmp_path_factory.mktemp("writes")))
    yield srv
    srv.stop()


def test_rows_written_through_the_server_are_folded_into_the_indices_once_writes_settle(served):
    srv = served
    assert set(_unindexed(srv.data_dir).values()) == {0}  # `memory index` left everything indexed
    for k in range(3):  # a burst of writes (folded once it settles, or in between when they come seconds apart)
        resp = srv.http.post(
            "/api/agentos/rag/multimodal/documents/ingest",
            files={"document": (f"tide-{k}.txt", f"High tide at pier {k} is at 14:0{k}.\n".encode(), "text/plain")},
        )
        assert resp.status_code == 200, resp.text
    note = srv.http.post("/api/memory/notes", json={"text": "The Terschelling ferry sails at nine.", "path": "ferries.md"})
    assert note.status_code == 200, note.text
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and set(_unindexed(srv.data_dir).values()) != {0}:
        time.sleep(0.5)
    assert set(_unindexed(srv.data_dir).values()) == {0}, _unindexed(srv.data_dir)
    fold = srv.http.get("/api/memory/status").json()["last_fold"]
    assert fold["fold"] == "optimized", fold  # once or more: writes seconds apart may fold in between
    found = srv.http.post("/api/memory/search", json={"query": "Terschelling ferry nine"}).json()["results"]
    assert found and found[0]["path"].endswith("ferries.md")
    pier = srv.http.post("/api/memory/search", json={"query": "tide pier 2", "mode": "fts"}).json()["results"]
    assert any("pier 2" in r["snippet"] for r in pier), pier


def test_errors_from_the_index_worker_keep_their_type_field_and_hint():
    from memory_pipeline.errors import ConfigError, StoreError
    from memory_pipeline.service.indexer import _described, _rebuilt

    err = _rebuilt(_described(ConfigError("sources[0].path: not a folder", key="sources", hint="fix the path")))
    assert type(err) is ConfigError and str(err) == "sources[0].path: not a folder" and err.key == "sources" and err.hint == "fix the path"
    assert type(_rebuilt(_described(StoreError("table busy")))) is StoreError
    other = _rebuilt(_described(ZeroDivisionError("division by zero")))
    assert type(other).__name__ == "IndexWorkerError" and "ZeroDivisionError: division by zero" in str(other)

    from memory_pipeline.service.app import _status_of

    assert _status_of(other) == 500 and _status_of(_rebuilt(_described(StoreError("x")))) == 503


def test_a_killed_index_worker_is_replaced_by_the_next_write(served):
    import os
    import signal

    srv = served
    first = srv.http.post("/api/memory/notes", json={"text": "Buoy 7 was repainted red.", "path": "buoys.md"})
    assert first.status_code == 200, first.text
    pid = srv.http.get("/api/memory/status").json()["index_worker_pid"]
    assert pid and pid != srv.proc.pid
    assert os.getpriority(os.PRIO_PROCESS, pid) >= 10  # the server's background writer yields the CPU
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    second = srv.http.post("/api/memory/notes", json={"text": "Buoy 9 lost its light.", "path": "buoys.md"})
    assert second.status_code == 200, second.text
    assert second.json()["indexed"] is True
    new_pid = srv.http.get("/api/memory/status").json()["index_worker_pid"]
    assert new_pid and new_pid != pid
    found = srv.http.post("/api/memory/search", json={"query": "buoy lost its light"}).json()["results"]
    assert found and found[0]["path"].endswith("buoys.md")
