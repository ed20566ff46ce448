"""Writes through the server index only the shards that hold the changed files: an ingest, a note and
a delete each run the partitions of their files (the other shards' records are not touched), and
the index they leave is the one a full `memory index` makes (a full run afterwards has nothing to
do, and a fresh full index of the same folder holds the same rows). Concurrent ingests lose nothing."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import dagster as dg
import pytest

from memory_pipeline.discovery import SHARD_KEYS, shard_of
from memory_pipeline_tests.helpers import table_rows
from memory_pipeline_tests.service.conftest import Server, make_memory, memory

pytestmark = pytest.mark.slow
RAG = "/api/agentos/rag/multimodal"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    cfg = make_memory(tmp_path_factory.mktemp("shards"))
    srv = Server(cfg)
    yield srv
    srv.stop()


def manifests(data_dir: Path) -> dict[str, int | None]:
    """Each shard's manifest file and its mtime: a run over a shard rewrites it, other runs do not
    (None: no run has covered the shard yet; `memory index` runs only the shards with work)."""
    paths = {s: data_dir / "assets" / "source_files" / f"{s}.parquet" for s in SHARD_KEYS}
    return {s: p.stat().st_mtime_ns if p.exists() else None for s, p in paths.items()}


def last_runs(data_dir: Path, n: int) -> list[dg.DagsterRun]:
    with dg.DagsterInstance.from_config(str(data_dir / "dagster")) as instance:
        return list(instance.get_runs(limit=n))


def run_shards(run: dg.DagsterRun) -> list[str]:
    """The partitions a Dagster run covered: its partition key, or its range."""
    tags = run.tags
    if "dagster/partition" in tags:
        return [tags["dagster/partition"]]
    first, last = tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]
    return list(SHARD_KEYS[SHARD_KEYS.index(first) : SHARD_KEYS.index(last) + 1])


def asset_files(srv: Server, record: dict) -> list[str]:
    """The indexed files of an ingested asset, relative to the source folder."""
    root = srv.config.parent / "mem"
    folder = Path(record["path"])
    return sorted(p.relative_to(root).as_posix() for p in folder.rglob("*") if p.is_file() and "/." not in p.relative_to(root).as_posix())


def assert_settled_and_equal_to_a_full_index(srv: Server, tmp_path: Path) -> None:
    """Nothing is left for a full run, and a fresh full index of a copy of the folder holds the same rows."""
    done = memory("index", "--config", str(srv.config), "--json", cwd=srv.config.parent)
    assert done.returncode == 0, done.stderr
    full = json.loads(done.stdout)
    assert full["skipped_run"] is True and full["files_changed"] == 0, full
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copytree(srv.config.parent / "mem", copy / "mem")
    shutil.copy(srv.config, copy / "memory_pipeline.yaml")
    fresh = memory("index", "--config", str(copy / "memory_pipeline.yaml"), "--json", cwd=copy)
    assert fresh.returncode == 0, fresh.stderr
    cols = ("chunk_id", "doc_id", "path", "text", "content_hash")
    assert table_rows(copy / "index", cols) == table_rows(srv.data_dir, cols)
    analytics = memory(
        "analytics", "--config", str(srv.config), "--sql", "SELECT kind, count(*) AS n FROM problems GROUP BY kind", "--json", cwd=srv.config.parent
    )
    assert analytics.returncode == 0, analytics.stderr
    assert not [p for p in json.loads(analytics.stdout)["rows"] if p["kind"] in ("orphan_rows", "stale_rows", "duplicate_chunk_id")], analytics.stdout


def test_ingest_runs_only_the_shard_of_its_file(served: Server, tmp_path: Path):
    before = manifests(served.data_dir)
    body = b"Quarterly harbour dredging contract: the tender closes on the ninth of March.\n"
    resp = served.http.post(f"{RAG}/documents/ingest", files={"document": ("dredging.txt", body, "text/plain")})
    assert resp.status_code == 200, resp.text
    record = resp.json()
    assert record["chunkCount"] >= 1
    files = asset_files(served, record)
    assert files == [f"agentos/default/{record['assetId']}/asset.md"]
    shard = shard_of("mem", files[0])
    # The run: one Dagster run over that partition, and the summary says so.
    (run,) = last_runs(served.data_dir, 1)
    assert run_shards(run) == [shard]
    status = served.http.get("/api/memory/status").json()
    assert status["last_run"]["shards"] == [shard] and status["last_run"]["files_changed"] == 1
    # Only that shard's records were rewritten.
    after = manifests(served.data_dir)
    assert {s for s in SHARD_KEYS if after[s] != before[s]} == {shard}
    hits = served.http.post("/api/memory/search", json={"query": "harbour dredging tender"}).json()["results"]
    assert hits and hits[0]["path"].endswith("asset.md")
    assert_settled_and_equal_to_a_full_index(served, tmp_path)


def test_a_stored_payload_runs_the_shards_of_both_files(served: Server, tmp_path: Path):
    body = b"Lighthouse keeper rota: Ines takes the winter weekends, Kofi the summer nights.\n"
    resp = served.http.post(f"{RAG}/documents/ingest", files={"document": ("rota.txt", body, "text/plain")}, data={"storePayload": "true"})
    assert resp.status_code == 200, resp.text
    record = resp.json()
    files = asset_files(served, record)
    assert len(files) == 2  # the record and the payload
    shards = sorted({shard_of("mem", f) for f in files})
    status = served.http.get("/api/memory/status").json()
    assert sorted(status["last_run"]["shards"]) == shards
    covered = sorted(s for run in last_runs(served.data_dir, 2) for s in run_shards(run))
    assert set(shards) <= set(covered) and len(covered) <= 2 * len(shards)  # one run per contiguous range
    # Delete: the asset's shards again, its rows gone, nothing else.
    before = manifests(served.data_dir)
    gone = served.http.delete(f"{RAG}/assets/{record['assetId']}")
    assert gone.status_code == 200, gone.text
    assert gone.json()["rowsDeleted"] == record["chunkCount"] >= 1
    after = manifests(served.data_dir)
    assert {s for s in SHARD_KEYS if after[s] != before[s]} == set(shards)
    assert sorted(served.http.get("/api/memory/status").json()["last_run"]["shards"]) == shards
    assert_settled_and_equal_to_a_full_index(served, tmp_path)


def test_a_note_runs_the_shard_of_its_file(served: Server):
    resp = served.http.post("/api/memory/notes", json={"text": "The boiler service is due in April.", "path": "memory/boiler.md"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["run"]["shards"] == [shard_of("mem", "memory/boiler.md")]
    assert resp.json()["run"]["files_changed"] == 1


def test_concurrent_ingests_lose_nothing(served: Server, tmp_path: Path):
    texts = {
        f"topic-{k}.txt": f"Memo {k}: the {word} review is set for week {k + 10}.\n".encode()
        for k, word in enumerate(("kiln", "sluice", "glacier", "orchard", "quarry", "tundra"))
    }
    answers: dict[str, object] = {}

    def ingest(name: str, body: bytes) -> None:
        answers[name] = served.http.post(f"{RAG}/documents/ingest", files={"document": (name, body, "text/plain")})

    threads = [threading.Thread(target=ingest, args=item) for item in texts.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = {}
    for name, resp in answers.items():
        assert resp.status_code == 200, resp.text  # pyright: ignore[reportAttributeAccessIssue]
        records[name] = resp.json()  # pyright: ignore[reportAttributeAccessIssue]
    for name, record in records.items():
        got = served.http.get(f"{RAG}/assets/{record['assetId']}").json()
        assert got["chunkCount"] >= 1, (name, got)
    for word in ("kiln", "sluice", "glacier", "orchard", "quarry", "tundra"):
        hits = served.http.post("/api/memory/search", json={"query": f"{word} review"}).json()["results"]
        assert hits and word in hits[0]["snippet"], (word, hits[:1])
    assert_settled_and_equal_to_a_full_index(served, tmp_path)
