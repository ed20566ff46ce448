"""The index never reports coverage it does not have: a lost, trimmed or restored table is
noticed and repaired by the next run; damaged asset files and a damaged cache are rebuilt;
content that used to stop whole runs (rules of dashes, long repetitive lines) is indexed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lancedb
import pytest

from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import run_cli, run_json, table_rows

pytestmark = pytest.mark.slow


def _ids(data_dir: Path) -> list[tuple[str, str]]:
    return [(r["path"], r["chunk_id"]) for r in table_rows(data_dir, ("chunk_id", "path"))]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[Path, dict]:
    """The sample's text indexed once; each test works on its own copy of folder and index."""
    root = tmp_path_factory.mktemp("baseline")
    shutil.copytree(SAMPLE, root / "mem", ignore=TEXT_ONLY)
    cfg = write_config(root / "memory_pipeline.yaml")
    first = run_json("index", "--config", str(cfg), "--json")
    assert first["table_rows"] > 0 and not first["errors"]
    return root, first


@pytest.fixture
def indexed(tmp_path: Path, baseline) -> tuple[Path, Path, dict]:
    root, first = baseline
    dest = tmp_path / "copy"
    shutil.copytree(root, dest, symlinks=True)
    cfg = dest / "memory_pipeline.yaml"
    # The copy's files have new inodes: one settling run re-hashes them (same content, nothing re-indexed).
    settled = run_json("index", "--config", str(cfg), "--json")
    assert settled["chunks_embedded"] == 0 and settled["table_rows"] == first["table_rows"]
    return cfg, dest / "index", first


def test_deleted_table_folder_is_rebuilt_not_reported_as_settled(indexed):
    cfg, data, first = indexed
    before = _ids(data)
    shutil.rmtree(data / "lancedb")

    again = run_json("index", "--config", str(cfg), "--json")
    assert again["skipped_run"] is False
    assert again["files_repaired"] == len({p for p, _ in before})
    assert again["table_rows"] == first["table_rows"]
    assert _ids(data) == before
    # Vectors came back from the cache: nothing was embedded again.
    assert again["chunks_embedded"] == 0 and again["chunks_cached"] == len(before)
    # And now it is settled for real.
    third = run_json("index", "--config", str(cfg), "--json")
    assert third["skipped_run"] is True and third["table_rows"] == first["table_rows"]


def test_rows_deleted_by_hand_are_put_back(indexed):
    cfg, data, first = indexed
    before = _ids(data)
    victim = before[0][0]
    table = lancedb.connect(str(data / "lancedb")).open_table("memory_vectors")
    table.delete(f"path = '{victim}'")
    assert table.count_rows() < first["table_rows"]

    again = run_json("index", "--config", str(cfg), "--json")
    assert again["skipped_run"] is False and again["files_repaired"] == 1
    assert _ids(data) == before


@pytest.mark.parametrize("doc_id", ["mem:ghost.md", "ghost-without-source"])
def test_rows_of_unknown_files_are_removed(indexed, doc_id):
    """Rows no file of the folder explains, whatever their doc_id (another program may have
    written one without the ``source:path`` form: that stopped the run with an IndexError)."""
    cfg, data, first = indexed
    table = lancedb.connect(str(data / "lancedb")).open_table("memory_vectors")
    ghost = table.search().limit(1).to_arrow()
    ghost = ghost.set_column(ghost.schema.get_field_index("doc_id"), "doc_id", [[doc_id]])
    ghost = ghost.set_column(ghost.schema.get_field_index("chunk_id"), "chunk_id", [["ghost-chunk"]])
    table.add(ghost.select(table.schema.names))

    again = run_json("index", "--config", str(cfg), "--json")
    assert again["files_repaired"] == 1
    assert again["table_rows"] == first["table_rows"]
    assert "ghost-chunk" not in {c for _, c in _ids(data)}


def test_an_older_table_version_restored_is_noticed(indexed):
    cfg, data, _ = indexed
    note = next((cfg.parent / "mem").rglob("*.md"))
    note.write_text(note.read_text() + "\nThe quartermaster ordered seventeen zeppelins.\n")
    run_json("index", "--config", str(cfg), "--json")
    table = lancedb.connect(str(data / "lancedb")).open_table("memory_vectors")
    versions = [v["version"] for v in table.list_versions()]
    # Back to the version before the edit was committed (same row count for the file, older content).
    table.restore(versions[0] if len(versions) < 3 else versions[-3])

    again = run_json("index", "--config", str(cfg), "--json")
    assert again["skipped_run"] is False and again["files_repaired"] >= 1
    hits = run_json("search", "--config", str(cfg), "--json", "quartermaster seventeen zeppelins")
    assert hits["results"] and hits["results"][0]["path"].endswith(note.name)


def test_damaged_state_records_and_cache_are_rebuilt(indexed):
    cfg, data, first = indexed
    before = _ids(data)
    for state in (data / "assets" / "memory_vectors").glob("*.state.parquet"):
        state.write_bytes(b"PAR1 not really parquet")
    cache = next(data.rglob("*.sqlite*"), None) or next(p for p in data.rglob("*") if "cache" in p.name and p.is_file())
    cache.write_bytes(b"this is not a database" * 100)

    proc = run_cli("index", "--config", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = json.loads(proc.stdout)
    assert again["table_rows"] == first["table_rows"]
    assert _ids(data) == before
    assert "damaged" in proc.stderr
    assert run_json("index", "--config", str(cfg), "--json")["skipped_run"] is True


def test_rules_and_repetitive_lines_no_longer_stop_the_run(tmp_path: Path):
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "a.md").write_text("# a\nalpha bravo charlie\n")
    for ch in "-=.*#_":
        (mem / f"rule-{ord(ch)}.md").write_text(f"# Contents\nIntro\n{ch * 260}\n")
    (mem / "rep.md").write_text("# rep\n" + "bigword " * 3000 + "\n")
    (mem / "xs.md").write_text("# xs\n" + "x" * 20000 + "\n")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")

    proc = run_cli("index", "--config", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["errors"] == []
    ids = [c for _, c in _ids(tmp_path / "index")]
    assert len(ids) == len(set(ids))
    paths = {p for p, _ in _ids(tmp_path / "index")}
    assert {"a.md", "rep.md", "xs.md"} <= paths and sum(p.startswith("rule-") for p in paths) == 6
    forced = run_json("index", "--config", str(cfg), "--json", "--force")
    assert forced["errors"] == [] and forced["table_rows"] == summary["table_rows"]
