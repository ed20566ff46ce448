"""index_coverage: numbers equal the truth; each check fails on its planted fault and passes after a clean run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import lancedb
import pytest

from memory_pipeline.defs.assets import index_assets
from memory_pipeline.defs.checks import REMEDY
from memory_pipeline.defs.partitions import FULL_RANGE_TAGS
from memory_pipeline.defs.resources import index_resources
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.helpers import asset_metadata, memory_instance

CHECKS = (
    "index_coverage_no_orphans_check",
    "index_coverage_no_duplicates_check",
    "index_coverage_single_model_check",
    "index_coverage_threshold_check",
    "index_coverage_fts_current_check",
    "index_coverage_rows_present_check",
)


def _run(config: Path, instance, force: bool = False):
    return dg.materialize(
        index_assets,
        instance=instance,
        resources=index_resources(str(config)),
        tags=dict(FULL_RANGE_TAGS),
        run_config={
            "ops": {"source_files": {"config": {"force": force}}, "memory_vectors": {"config": {"force": force}}},
            "loggers": {"console": {"config": {"log_level": "ERROR"}}},
        },
        raise_on_error=False,
    )


def _checks(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def _coverage_meta(result) -> dict:
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        if mat.asset_key.to_user_string() == "index_coverage":
            return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    raise AssertionError("index_coverage not materialized")


def _query(settings, sql: str) -> list[dict]:
    import duckdb

    con = duckdb.connect(str(settings.data_dir / "analytics.duckdb"), read_only=True)
    try:
        return con.sql(sql).to_arrow_table().to_pylist()
    finally:
        con.close()


def test_coverage_equals_the_truth(sample_config: Path, sample_dir: Path):
    settings = load_settings(sample_config)
    with memory_instance() as instance:
        assert _run(sample_config, instance).success
        # Now: one new bad file, one good note broken (stale: its old rows stay), one note deleted.
        (sample_dir / "memory" / "latin1.md").write_bytes("caf\xe9\n".encode("latin-1"))
        broken = sample_dir / "memory" / "2026-10-19.md"
        broken.write_bytes(broken.read_bytes() + b"\n\xff\xfe broken tail\n")
        (sample_dir / "memory" / "2026-10-01.md").unlink()
        (sample_dir / "empty.md").write_bytes(b"")
        result = _run(sample_config, instance)
        assert result.success
        checks = _checks(result)
    rows = {(r["source"], r["modality"]): r for r in _query(settings, "SELECT * FROM coverage")}
    md = rows[("mem", "markdown")]
    # 14 markdown notes shipped, one deleted, two added (latin1 + empty)
    assert md["files_discovered"] == 15
    assert md["files_skipped"] == 1  # empty.md
    assert md["files_failed"] == 2  # latin1.md (never indexed) and the broken note
    assert md["files_stale"] == 1  # the broken note still has its old rows
    assert md["files_indexed"] == 12 and md["files_indexable"] == 14
    sessions = rows[("mem", "session")]
    assert sessions["files_indexed"] == sessions["files_discovered"] == 3
    table = lancedb.connect(settings.lancedb_uri).open_table("memory_vectors")
    assert sum(r["rows"] for r in rows.values()) == table.count_rows()
    problems = {(p["kind"], p["path"]) for p in _query(settings, "SELECT kind, path FROM problems")}
    assert ("stale_rows", "memory/2026-10-19.md") in problems
    assert ("failed", "memory/latin1.md") in problems and ("failed", "memory/2026-10-19.md") in problems
    assert ("skipped", "empty.md") in problems
    assert not any(path == "memory/2026-10-01.md" for _, path in problems)  # deleted: gone everywhere
    assert not any(kind in ("orphan_rows", "duplicate_chunk_id", "model_mismatch") for kind, _ in problems)
    # coverage 15/17 indexable files; the threshold check (0.9) therefore fails and names the failures
    assert not checks["index_coverage_threshold_check"].passed
    failing = checks["index_coverage_threshold_check"].metadata["offending_paths"].value
    assert failing == ["memory/2026-10-19.md", "memory/latin1.md"]
    for name in (
        "index_coverage_no_orphans_check",
        "index_coverage_no_duplicates_check",
        "index_coverage_single_model_check",
        "index_coverage_fts_current_check",
        "index_coverage_rows_present_check",
    ):
        assert checks[name].passed, name


def _check_alone(config: Path, instance, name: str):
    """Only the check, against the table as it is now (nothing materialized first)."""
    return dg.materialize(
        index_assets,
        instance=instance,
        resources=index_resources(str(config)),
        selection=dg.AssetSelection.checks(dg.AssetCheckKey(dg.AssetKey("index_coverage"), name)),
        run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
        raise_on_error=False,
    )


@pytest.mark.parametrize("fault, check, repaired", [
    ("orphan", "index_coverage_no_orphans_check", True),
    ("duplicate", "index_coverage_no_duplicates_check", False),
    ("model", "index_coverage_single_model_check", True),
])  # fmt: skip
def test_each_check_fails_on_its_fault_and_passes_after_a_clean_run(sample_config: Path, fault: str, check: str, repaired: bool):
    """The check alone finds its planted fault (and, blocking, fails its run). A normal run first
    repairs what the records can tell is wrong (rows of an unknown file, an extra row of a known
    file) and then passes; a duplicated chunk id survives it and stops the run; --force clears all."""
    settings = load_settings(sample_config)
    with memory_instance() as instance:
        first = _run(sample_config, instance)
        assert first.success and all(e.passed for e in _checks(first).values())
        table = lancedb.connect(settings.lancedb_uri).open_table("memory_vectors")
        row = table.search().limit(1).to_list()[0]
        row = {k: v for k, v in row.items() if not k.startswith("_")}
        if fault == "orphan":
            row |= {"chunk_id": "f" * 32, "doc_id": "mem:gone.md", "path": "gone.md"}
        elif fault == "model":
            row |= {"chunk_id": "e" * 32, "embedding_model": "some-other-model"}
        table.add([row])  # "duplicate": the same chunk id a second time
        # Touch nothing in the sources: only the table holds the fault.
        alone = _check_alone(sample_config, instance, check)
        [evaluation] = alone.get_asset_check_evaluations()
        assert not evaluation.passed and not alone.success
        assert evaluation.metadata["count"].value >= 1
        assert row["path"] in evaluation.metadata["offending_paths"].value
        # What is wrong and what to do, in the result itself (the UI's check result).
        assert row["path"] in evaluation.description and REMEDY[check] in evaluation.description, evaluation.description
        planted = _run(sample_config, instance)
        repairs = asset_metadata(planted, "source_files")["files_repaired"]  # summed over the run's partitions
        if repaired:
            assert repairs == 1 and planted.success
            assert all(e.passed for e in _checks(planted).values())
        else:
            assert not planted.success and not _checks(planted)[check].passed  # blocking: the run stops
        clean = _run(sample_config, instance, force=True)
        assert clean.success
        assert all(e.passed for e in _checks(clean).values()), {k: e.passed for k, e in _checks(clean).items()}


def test_rows_deleted_by_hand_fail_the_rows_check_and_are_written_again(sample_config: Path, sample_dir: Path):
    """A file's rows deleted from the table outside a run: a run of another shard (the UI's run of
    one partition) said coverage 1.0 with every check passed. The file is now pending, its rows a
    ``missing_rows`` problem, the rows check fails with what to do, and the next run writes them."""
    from memory_pipeline.discovery import SHARD_KEYS, shard_of

    settings = load_settings(sample_config)
    with memory_instance() as instance:
        assert _run(sample_config, instance).success
        table = lancedb.connect(settings.lancedb_uri).open_table("memory_vectors")
        victim = "memory/2026-10-19.md"
        chunks = table.count_rows(f"path = '{victim}'")
        assert chunks >= 1
        table.delete(f"path = '{victim}'")
        other = next(s for s in SHARD_KEYS if s != shard_of("mem", victim))
        one = dg.materialize(
            index_assets, instance=instance, resources=index_resources(str(sample_config)), partition_key=other,
            run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}}, raise_on_error=False,
        )  # fmt: skip
        assert one.success  # not blocking: another shard's run is not stopped by it
        check = _checks(one)["index_coverage_rows_present_check"]
        assert not check.passed and check.metadata["offending_paths"].value == [victim]
        assert "the table holds 0" in check.description and REMEDY["index_coverage_rows_present_check"] in check.description
        [problem] = _query(settings, "SELECT kind, path, rows FROM problems WHERE kind = 'missing_rows'")
        assert problem == {"kind": "missing_rows", "path": victim, "rows": chunks}
        [status] = _query(settings, f"SELECT state, chunks, table_rows FROM file_status WHERE path = '{victim}'")
        assert status == {"state": "pending", "chunks": chunks, "table_rows": 0}
        # Files recorded for another fingerprint (a generation being built: not rewritten into it yet)
        # are not missing rows of this table, nor indexed into it: pending (they were counted indexed
        # beside the new table's few rows).
        from memory_pipeline.stores.analytics import refresh_analytics

        other_fp = refresh_analytics(settings, "all-MiniLM-L6-v2", None, "f" * 16)
        assert "missing_rows" not in other_fp.problems and other_fp.files_indexed == 0 and other_fp.files_indexable > 0
        assert _query(settings, "SELECT DISTINCT state FROM file_status WHERE discovery_status = 'ok'") == [{"state": "pending"}]
        again = _run(sample_config, instance)
        assert again.success and all(e.passed for e in _checks(again).values())
    assert lancedb.connect(settings.lancedb_uri).open_table("memory_vectors").count_rows(f"path = '{victim}'") == chunks


def test_a_file_indexed_in_part_is_a_problem_with_its_reason(sample_config: Path, sample_dir: Path):
    """`memory analytics` lists the files that are not fully indexed: a file indexed in part (a NUL
    removed, broken transcript lines) was in `index --json`'s errors as partial but not among the
    problems."""
    settings = load_settings(sample_config)
    (sample_dir / "memory" / "nul.md").write_bytes(b"# Nul\n\n" + b"x" * 9000 + b"\x00 the kiln log after a stray NUL\n")
    (sample_dir / "broken.jsonl").write_text('{"role": "user", "content": "the wombat census"}\nnot json\n')
    with memory_instance() as instance:
        assert _run(sample_config, instance).success
    partial = {p["path"]: p["detail"] for p in _query(settings, "SELECT path, detail FROM problems WHERE kind = 'partial'")}
    assert set(partial) == {"memory/nul.md", "broken.jsonl"}, partial
    assert "control character" in partial["memory/nul.md"] and "2" in partial["broken.jsonl"], partial


def test_duckdb_file_is_queryable_without_project_code(sample_config: Path, tmp_path: Path):
    settings = load_settings(sample_config)
    with memory_instance() as instance:
        assert _run(sample_config, instance).success
    code = (
        "import json, sys, duckdb;"
        f"con = duckdb.connect({str(settings.data_dir / 'analytics.duckdb')!r}, read_only=True);"
        "out = {t: con.sql(f'SELECT count(*) FROM {t}').fetchall()[0][0] for t in "
        "['coverage', 'problems', 'file_status', 'source_files', 'vector_rows', 'indexed_state', 'extraction_status']};"
        "out['modules'] = [m for m in sys.modules if m.startswith('memory_pipeline')];"
        "out['cols'] = [r[0] for r in con.sql('DESCRIBE vector_rows').fetchall()];"
        "print(json.dumps(out))"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["modules"] == []
    assert out["file_status"] == out["source_files"] == 17
    assert out["vector_rows"] > 40 and out["coverage"] == 2
    assert "vector" not in out["cols"] and "chunk_id" in out["cols"]


def test_tokens_and_estimated_cost_per_provider(sample_config: Path, sample_dir: Path):
    """embedding_cost: tokens in the table equal the rows' tokens; tokens embedded equal what the runs reported."""
    from memory_pipeline_tests.helpers import run_json

    first = run_json("index", "--config", str(sample_config), "--json")
    (sample_dir / "memory" / "2026-11-16.md").open("a").write("\n## Later\n\nWe moved the standup to 9:30 on Tuesdays.\n")
    second = run_json("index", "--config", str(sample_config), "--json")
    assert first["tokens_embedded"] > 0 and 0 < second["tokens_embedded"] < first["tokens_embedded"]
    assert first["est_cost_usd"] == 0.0  # the local model costs nothing per token
    settings = load_settings(sample_config)
    table = lancedb.connect(settings.lancedb_uri).open_table("memory_vectors")
    tokens = sum(table.search().select(["tokens"]).limit(table.count_rows()).to_arrow().column("tokens").to_pylist())
    [cost] = _query(settings, "SELECT * FROM embedding_cost")
    assert (cost["provider"], cost["model"]) == ("local", "all-MiniLM-L6-v2")
    assert cost["rows"] == table.count_rows() and cost["tokens_in_table"] == tokens
    assert cost["tokens_embedded"] == first["tokens_embedded"] + second["tokens_embedded"]
    assert cost["usd_per_mtok"] == 0.0 and cost["est_usd_table"] == 0.0 and cost["est_usd_spent"] == 0.0
    out = run_json("analytics", "--config", str(sample_config), "--json")
    assert out["embedding_cost"] == [cost]


def test_cost_estimate_uses_the_price_list(tmp_path: Path):
    import duckdb
    import pyarrow as pa

    from memory_pipeline.providers.pricing import estimate_usd, usd_per_mtok
    from memory_pipeline.settings import Settings
    from memory_pipeline.stores.analytics import _embedding_cost, _table_tokens

    assert usd_per_mtok("openai", "text-embedding-3-small") == 0.02
    assert usd_per_mtok("openai", "text-embedding-3-small", batch=True) == 0.01
    assert estimate_usd("openai", "text-embedding-3-large", 2_000_000) == 0.26
    assert usd_per_mtok("openai", "some-future-model") is None  # unknown: no estimate, not zero
    assert usd_per_mtok("ollama", "nomic-embed-text") == 0.0
    settings = Settings(data_dir=tmp_path, sources=())
    rows = pa.table({"embedding_model": ["text-embedding-3-small"] * 3 + [""], "tokens": [500_000, 400_000, 100_000, 7]})  # noqa: F841 - read by DuckDB
    con = duckdb.connect()
    con.execute("CREATE TABLE vector_rows AS SELECT * FROM rows")
    assert _table_tokens(con, "openai") == {("openai", "text-embedding-3-small"): (3, 1_000_000)}  # rows without a model left out
    [cost] = _embedding_cost(settings, _table_tokens(con, "openai")).to_pylist()
    assert cost["tokens_in_table"] == 1_000_000 and cost["est_usd_table"] == 0.02 and cost["tokens_embedded"] == 0


def test_coverage_is_rebuilt_exactly_when_what_it_reads_changed(sample_config: Path, sample_dir: Path):
    """refresh_analytics reuses the database while the table, every asset file and the ledgers are
    as they were when it was built (a run's coverage step and its checks), and rebuilds on any change."""
    from memory_pipeline.stores.analytics import refresh_analytics

    settings = load_settings(sample_config)
    with memory_instance() as instance:
        assert _run(sample_config, instance).success
    db = settings.data_dir / "analytics.duckdb"

    def built_at():
        return _query(settings, "SELECT refreshed_at FROM refresh_state")[0]["refreshed_at"]

    first = built_at()
    inode = db.stat().st_ino
    [fp] = [r["fingerprint"] for r in _query(settings, "SELECT DISTINCT fingerprint FROM indexed_state")]  # the run's
    same = refresh_analytics(settings, "all-MiniLM-L6-v2", None, fp)
    assert built_at() == first and db.stat().st_ino == inode  # nothing changed: the database is reused
    assert same.files_indexed == 17 and same.table_rows > 40
    # A row deleted from the table (a new table version) is seen at once.
    lancedb.connect(str(settings.data_dir / "lancedb")).open_table("memory_vectors").delete("path LIKE '%2026-10-06.md'")
    after_delete = refresh_analytics(settings, "all-MiniLM-L6-v2")
    assert built_at() != first and after_delete.table_rows < same.table_rows
    # An asset file rewritten (a manifest) is seen too; so is another model asked about.
    second = built_at()
    state = next((settings.data_dir / "assets" / "memory_vectors").glob("*.state.parquet"))
    state.write_bytes(state.read_bytes())
    refresh_analytics(settings, "all-MiniLM-L6-v2")
    third = built_at()
    assert third != second
    assert refresh_analytics(settings, "other-model").problems.get("model_mismatch")
    assert built_at() != third


def test_a_shard_run_on_a_fresh_index_counts_the_files_of_shards_not_run_yet(sample_config: Path):
    """Coverage is computed over the runs' records. One partition run on a fresh index (from the UI)
    recorded one shard, and the files of the other shards were not counted at all: coverage 1.000 and
    the threshold check passed over a few files of the folder. Those files are now counted as pending,
    found by a stat walk while some shard has no record yet."""
    from memory_pipeline.discovery import SHARD_KEYS, walk_all
    from memory_pipeline.stores.analytics import UNRUN_REASON

    settings = load_settings(sample_config)
    files = [f for f in walk_all(settings) if f.status == "ok"]
    shard = max(SHARD_KEYS, key=lambda s: sum(f.shard == s for f in files))
    in_shard = sum(f.shard == shard for f in files)
    with memory_instance() as instance:
        one = dg.materialize(
            index_assets, instance=instance, resources=index_resources(str(sample_config)), partition_key=shard,
            run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}}, raise_on_error=False,
        )  # fmt: skip
        assert one.success
        check = _checks(one)["index_coverage_threshold_check"]
        assert not check.passed and check.metadata["coverage"].value == round(in_shard / len(files), 4), check.metadata
        rows = _query(settings, "SELECT sum(files_indexable) AS n, sum(files_indexed) AS done, sum(files_pending) AS pending FROM coverage")
        assert rows == [{"n": len(files), "done": in_shard, "pending": len(files) - in_shard}], rows
        reasons = _query(settings, f"SELECT count(*) AS n FROM file_status WHERE reason = '{UNRUN_REASON}'")
        assert reasons == [{"n": len(files) - in_shard}]
        assert _run(sample_config, instance).success  # every shard: nothing left pending
    assert _query(settings, "SELECT sum(files_pending) AS pending, min(coverage) AS c FROM coverage")[0]["pending"] == 0
