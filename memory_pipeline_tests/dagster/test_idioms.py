"""Dagster used the way its users expect: owners, tags, kinds and code references on every asset;
standard table metadata after a materialization; problem lists as tables; checks that run alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import dagster as dg
import lancedb
import pytest

from memory_pipeline.definitions import defs
from memory_pipeline.defs.assets import _MAX_LISTED, _problems, index_assets, index_coverage
from memory_pipeline.defs.checks import CHECKS, COVERAGE, index_coverage_checks
from memory_pipeline.defs.partitions import FULL_RANGE_TAGS
from memory_pipeline.defs.resources import index_resources
from memory_pipeline.models import CHUNKS_SCHEMA, DELETIONS_SCHEMA, EXTRACTION_STATUS_SCHEMA, INDEXED_STATE_SCHEMA, MANIFEST_SCHEMA, SEGMENTS_SCHEMA
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import LOGGERS, REPO, asset_metadata, materialize, memory_instance, partition_metadata, table_rows

ASSETS = ("source_files", "extracted_content", "memory_chunks", "chunk_embeddings", "memory_vectors", "index_coverage")
# The side files, assets of their own (so lineage shows them), each from its stage's multi_asset.
SIDE_ASSETS = {"file_deletions": "source_files", "extraction_status": "extracted_content", "indexed_state": "memory_vectors"}
LAYERS = {
    "source_files": "ingest",
    "file_deletions": "ingest",
    "extracted_content": "ingest",
    "extraction_status": "ingest",
    "memory_chunks": "ingest",
    "chunk_embeddings": "index",
    "memory_vectors": "index",
    "indexed_state": "index",
    "index_coverage": "analytics",
}
# What runner._summary reads back from the materializations.
RUNNER_KEYS = {
    "source_files": {"files_seen", "files_changed", "files_deleted", "files_repaired"},
    "memory_chunks": {"chunks"},
    "chunk_embeddings": {"embedded", "cached", "tokens_total", "est_cost_usd", "provider", "model", "dims", "mode", "batch", "requested_provider", "fallback_reason"},
    "memory_vectors": {"rows_written", "rows_deleted", "table_rows", "files_pending", "generation", "table"},
    "index_coverage": {"coverage"},
}  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sample indexed once, plus a file discovery skips and one extraction fails on; (config, result)."""
    root = tmp_path_factory.mktemp("idioms")
    mem = root / "mem"
    shutil.copytree(SAMPLE, mem, ignore=TEXT_ONLY)
    (mem / "empty.md").write_bytes(b"")
    (mem / "memory" / "latin1.md").write_bytes("caf\xe9\n".encode("latin-1"))
    config = write_config(root / "memory_pipeline.yaml")
    with memory_instance() as instance:
        result = materialize(config, instance, tags=dict(FULL_RANGE_TAGS))
        assert result.success
        yield config, result


@pytest.fixture(scope="module")
def built_in_pieces(tmp_path_factory):
    """The same, each shard made in pieces of one file each (``storage.PIECE_ROWS`` 1): a file of row groups."""
    from memory_pipeline import storage

    root = tmp_path_factory.mktemp("idioms-pieces")
    mem = root / "mem"
    shutil.copytree(SAMPLE, mem, ignore=TEXT_ONLY)
    config = write_config(root / "memory_pipeline.yaml")
    with pytest.MonkeyPatch.context() as patch, memory_instance() as instance:
        patch.setattr(storage, "PIECE_ROWS", 1)
        result = materialize(config, instance, tags=dict(FULL_RANGE_TAGS))
        assert result.success
        yield config, result


def _specs() -> dict[str, dg.AssetSpec]:
    return {spec.key.to_user_string(): spec for spec in defs.resolve_all_asset_specs()}


def test_pyproject_declares_the_dg_project():
    dg_config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["dg"]
    assert dg_config["directory_type"] == "project"
    assert dg_config["project"]["root_module"] == "memory_pipeline"
    assert dg_config["project"]["defs_module"] == "memory_pipeline.defs"
    # definitions.py loads the defs folder: what it yields is what lives there.
    repo = defs.get_repository_def()
    assert {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()} == set(ASSETS) | set(SIDE_ASSETS)
    assert {k.name for k in repo.asset_graph.asset_check_keys} == set(CHECKS)
    assert set(defs.resources) == {"memory_config", "embedder", "stage_hooks", "run_results", "io_manager"}


def test_definitions_are_what_dagsters_defs_folder_loader_gives_less_the_plugin_catalogue():
    """definitions.py builds the defs folder without the project root's catalogue of installed
    plugins' component types (a run process pays for it and never reads it): everything else
    must be exactly what `dg.load_from_defs_folder` loads, and the plugins must stay unimported."""
    reference = dg.load_from_defs_folder(path_within_project=REPO / "memory_pipeline")
    ours, theirs = defs.get_repository_def(), reference.get_repository_def()
    assert ours.asset_graph.get_all_asset_keys() == theirs.asset_graph.get_all_asset_keys()
    assert ours.asset_graph.asset_check_keys == theirs.asset_graph.asset_check_keys
    assert {j.name for j in ours.get_all_jobs()} == {j.name for j in theirs.get_all_jobs()}
    assert {s.name for s in ours.sensor_defs} == {s.name for s in theirs.sensor_defs}
    assert {s.name for s in ours.schedule_defs} == {s.name for s in theirs.schedule_defs}
    assert set(defs.resources or {}) == set(reference.resources or {})
    assert defs.executor is not None and reference.executor is not None
    assert defs.executor.name == reference.executor.name
    assert defs.component_tree is not None  # kept, as the root keeps it
    assert set(theirs.metadata or {}) - set(ours.metadata or {}) == {"plugin_component_types_json"}
    probe = "import sys, memory_pipeline.definitions; print(sorted(m for m in sys.modules if m.startswith('dagster_aws')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300).stdout
    assert out.strip() == "[]"


def test_every_asset_has_owners_tags_kinds_description_and_a_code_reference():
    specs = _specs()
    assert set(specs) == set(ASSETS) | set(SIDE_ASSETS)
    assets_py = (REPO / "memory_pipeline" / "defs" / "assets.py").read_text().splitlines()
    for name, spec in specs.items():
        assert spec.owners == ["team:memory"], name
        assert spec.tags.get("layer") == LAYERS[name], name
        assert spec.kinds, name
        assert spec.description, name
        refs = spec.metadata["dagster/code_references"].code_references
        assert refs, name
        ref = refs[0]
        assert isinstance(ref, dg.LocalFileCodeReference), name
        assert Path(ref.file_path) == REPO / "memory_pipeline" / "defs" / "assets.py", name
        # The line is where the asset's definition starts (its decorator), and its function follows
        # (a side file's is its stage's multi_asset).
        first_def = next(line for line in assets_py[ref.line_number - 1 :] if line.startswith("def "))
        assert assets_py[ref.line_number - 1].startswith(("@dg.asset(", "@dg.multi_asset(")), (name, ref.line_number)
        assert first_def.startswith(f"def {SIDE_ASSETS.get(name, name)}("), (name, ref.line_number)


def test_checks_are_defined_apart_from_the_asset_and_keep_their_blocking():
    graph = defs.get_repository_def().asset_graph
    for key in graph.asset_check_keys:
        spec = graph.get_check_spec(key)
        assert key.asset_key == COVERAGE
        assert spec.blocking == CHECKS[key.name][0], key.name
        assert spec.description == CHECKS[key.name][1]
    # index_coverage itself computes no check: running a check needs no materialization.
    assert list(index_coverage.check_specs) == []
    assert index_coverage_checks.check_keys == graph.asset_check_keys


def test_every_materialization_reports_row_count_and_column_schema(built):
    config, result = built
    meta = {name: asset_metadata(result, name) for name in ASSETS}
    for name in ASSETS:
        assert isinstance(meta[name]["dagster/row_count"], int), name
        assert meta[name]["dagster/row_count"] > 0, name
        assert isinstance(meta[name]["dagster/column_schema"], dg.TableSchema), name
    columns = {name: [c.name for c in meta[name]["dagster/column_schema"].columns] for name in ASSETS}
    assert columns["source_files"] == MANIFEST_SCHEMA.names
    assert columns["extracted_content"] == SEGMENTS_SCHEMA.names
    assert columns["memory_chunks"] == CHUNKS_SCHEMA.names
    assert columns["chunk_embeddings"] == ["content_hash", "vector"]
    vector_type = {c.name: c.type for c in meta["memory_vectors"]["dagster/column_schema"].columns}["vector"]
    assert "384" in vector_type
    assert {"chunk_id", "path", "text", "embedding_model"} <= set(columns["memory_vectors"])
    assert {"source", "modality", "files_indexed", "coverage"} <= set(columns["index_coverage"])
    # The numbers are the truth.
    table = lancedb.connect(load_settings(config).lancedb_uri).open_table("memory_vectors")
    assert meta["memory_vectors"]["dagster/row_count"] == meta["memory_vectors"]["table_rows"] == table.count_rows()
    assert meta["source_files"]["dagster/row_count"] == meta["source_files"]["files_seen"] == 19
    assert meta["extracted_content"]["dagster/row_count"] == meta["extracted_content"]["segments"]
    assert meta["memory_chunks"]["dagster/row_count"] == meta["memory_chunks"]["chunks"]
    assert meta["chunk_embeddings"]["dagster/row_count"] == meta["chunk_embeddings"]["unique"]
    assert meta["index_coverage"]["dagster/row_count"] == 2  # mem × markdown, mem × session
    # A full-range run holds every partition.
    for name in ("source_files", "extracted_content", "memory_chunks", "chunk_embeddings"):
        assert meta[name]["dagster/partition_row_count"] == meta[name]["dagster/row_count"], name
    # The side files: their rows, schema and folder, like the assets they sit beside.
    side_schemas = {"file_deletions": DELETIONS_SCHEMA, "extraction_status": EXTRACTION_STATUS_SCHEMA, "indexed_state": INDEXED_STATE_SCHEMA}
    for name, schema in side_schemas.items():
        side = asset_metadata(result, name)
        assert [c.name for c in side["dagster/column_schema"].columns] == schema.names, name
        assert side["dagster/partition_row_count"] == side["dagster/row_count"], name
        assert Path(side["dagster/uri"]).name == SIDE_ASSETS[name], name
    assert asset_metadata(result, "extraction_status")["dagster/row_count"] == meta["extracted_content"]["files"]
    assert asset_metadata(result, "indexed_state")["dagster/row_count"] == meta["memory_vectors"]["files_replaced"]
    for name in ("source_files", "extracted_content", "memory_chunks", "chunk_embeddings"):
        assert Path(meta[name]["dagster/uri"]) == load_settings(config).data_dir / "assets" / name, name
    # The keys the CLI's summary reads are still there.
    for name, keys in RUNNER_KEYS.items():
        assert keys <= set(meta[name]), (name, keys - set(meta[name]))


@pytest.mark.parametrize("made", ["built", "built_in_pieces"])
def test_each_partition_reports_its_own_numbers(made, request):
    """A run over all 16 shards: every partition's materialization carries that shard's numbers,
    checked against the shard's own files, Parquet and table rows (not the run's totals on each);
    also when the stages make each shard in pieces (a partition's numbers add up its pieces')."""
    import collections

    import pyarrow.parquet as pq

    from memory_pipeline.discovery import SHARD_KEYS, shard_of

    config, result = request.getfixturevalue(made)
    settings = load_settings(config)
    mem = config.parent / "mem"
    files = collections.Counter(shard_of("mem", p.relative_to(mem).as_posix()) for p in mem.rglob("*") if p.is_file())
    rows = collections.Counter(r["shard"] for r in table_rows(settings.data_dir, columns=("shard",)))
    assets = settings.data_dir / "assets"

    def parquet_rows(asset: str, shard: str, suffix: str = "") -> int:
        path = assets / asset / f"{shard}{suffix}.parquet"
        return pq.ParquetFile(path).metadata.num_rows if path.is_file() else 0

    meta = {name: partition_metadata(result, name) for name in (*ASSETS[:5], *SIDE_ASSETS)}
    for name in meta:
        assert set(meta[name]) == set(SHARD_KEYS), name
    empty = [s for s in SHARD_KEYS if not files[s]]
    assert empty and len(empty) < len(SHARD_KEYS)  # the sample leaves some shards empty: they must say 0
    pieces = max(pq.ParquetFile(assets / "memory_chunks" / f"{s}.parquet").num_row_groups for s in SHARD_KEYS if files[s])
    assert (pieces >= 2) if made == "built_in_pieces" else (pieces == 1), pieces  # a shard of several files: several pieces
    for shard in SHARD_KEYS:
        src, chunks, emb, vec = (meta[n][shard] for n in ("source_files", "memory_chunks", "chunk_embeddings", "memory_vectors"))
        assert src["files_seen"] == src["dagster/partition_row_count"] == files[shard], shard
        assert src["files_changed"] + src["files_unchanged"] + src["files_skipped"] + src["files_failed"] == files[shard], shard
        assert meta["extracted_content"][shard]["dagster/partition_row_count"] == parquet_rows("extracted_content", shard), shard
        assert chunks["chunks"] == chunks["dagster/partition_row_count"] == parquet_rows("memory_chunks", shard), shard
        assert emb["chunks"] == chunks["chunks"] and emb["unique"] == emb["dagster/partition_row_count"] == parquet_rows("chunk_embeddings", shard), shard
        assert vec["rows_written"] == rows[shard], shard  # a first run: every row of the shard was written by it
        for side, (asset, suffix) in {
            "file_deletions": ("source_files", ".deletions"),
            "extraction_status": ("extracted_content", ".status"),
            "indexed_state": ("memory_vectors", ".state"),
        }.items():
            assert meta[side][shard]["dagster/partition_row_count"] == parquet_rows(asset, suffix=suffix, shard=shard), (side, shard)
    # Every embedding of this first run was made by it, and the partitions add up to the run.
    assert sum(m["embedded"] + m["cached"] for m in meta["chunk_embeddings"].values()) == sum(m["unique"] for m in meta["chunk_embeddings"].values())
    assert sum(m["rows_written"] for m in meta["memory_vectors"].values()) == sum(rows.values())
    # What stays the run's or the asset's: the whole asset's rows, the same on every partition.
    assert len({m["dagster/row_count"] for m in meta["memory_chunks"].values()}) == 1
    # Tokens and cost are each shard's own (they were the run's on every partition: an empty shard
    # said the run's tokens, and a paid provider's cost showed once per partition); what only the
    # run has (seconds, requests, batch jobs) is named as the run's.
    emb = meta["chunk_embeddings"]
    for shard in SHARD_KEYS:
        assert (emb[shard]["tokens_total"] > 0) == (emb[shard]["embedded"] > 0), (shard, emb[shard])
        assert emb[shard]["est_cost_usd"] == 0.0, shard  # the local model costs nothing
        assert {"tokens", "embed_seconds", "requests", "retries"}.isdisjoint(emb[shard]), (shard, sorted(emb[shard]))
        assert {"run_tokens_total", "run_embed_seconds", "run_requests", "run_est_cost_usd", "provider", "model"} <= set(emb[shard]), shard
    assert sum(m["tokens_total"] for m in emb.values()) == emb["00"]["run_tokens_total"] > 0


def test_problem_lists_are_table_metadata(built):
    from memory_pipeline.discovery import shard_of

    config, result = built
    problems = _event_metadata(result, "source_files")["run_problems"]  # a run over every shard: the run's list
    failures = _event_metadata(result, "extracted_content")["run_failures"]
    chunk_failures = _event_metadata(result, "memory_chunks")["run_failures"]
    for value in (problems, failures, chunk_failures):
        assert isinstance(value, dg.TableMetadataValue)
        assert [c.name for c in value.schema.columns] == ["path", "status", "reason"]
    rows = {Path(r.data["path"]).name: r.data for r in problems.records}
    assert rows["empty.md"]["status"] == "skipped" and rows["empty.md"]["reason"]
    failed = {Path(r.data["path"]).name: r.data for r in failures.records}
    assert failed["latin1.md"]["status"] == "failed" and failed["latin1.md"]["reason"]
    # Each partition lists its own shard's problem files (it listed the run's on every partition).
    # So do extracted_content's and memory_chunks' failures.
    mem = config.parent / "mem"
    for asset, name, run_list in (
        ("source_files", "problems", problems),
        ("extracted_content", "failures", failures),
        ("memory_chunks", "failures", chunk_failures),
    ):
        own = {
            e.partition: e.event_specific_data.materialization.metadata[name]
            for e in result.get_asset_materialization_events()
            if e.event_specific_data.materialization.asset_key.to_user_string() == asset
        }
        assert len(own) == 16, asset
        for shard, table in own.items():
            assert all(shard_of("mem", Path(r.data["path"]).relative_to(mem).as_posix()) == shard for r in table.records), (asset, shard)
        assert sorted(r.data["path"] for t in own.values() for r in t.records) == sorted(r.data["path"] for r in run_list.records), asset
    assert failures.records  # the sample has files that fail extraction


def test_problem_lists_are_capped():
    rows = [{"path": f"/m/{i}.md", "status": "failed", "reason": "unreadable"} for i in range(_MAX_LISTED + 7)]
    table = _problems(rows)
    assert len(table.records) == _MAX_LISTED + 1
    assert table.records[-1].data == {"path": "…", "status": "", "reason": "7 more"}
    assert len(_problems(rows[:3]).records) == 3 and _problems([]).records == []


def _event_metadata(result, asset: str) -> dict:
    """The metadata values as Dagster recorded them (MetadataValue objects)."""
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        if mat.asset_key.to_user_string() == asset:
            return dict(mat.metadata)
    raise AssertionError(f"{asset} not materialized")


def _run_check_alone(config: Path, instance, name: str):
    return dg.materialize(
        index_assets,
        instance=instance,
        resources=index_resources(str(config)),
        selection=dg.AssetSelection.checks(dg.AssetCheckKey(COVERAGE, name)),
        run_config=LOGGERS,
        raise_on_error=False,
    )


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_each_check_runs_alone_on_the_built_index(built, name: str):
    config, _ = built
    with memory_instance() as instance:
        result = _run_check_alone(config, instance, name)
        assert result.success
        assert result.get_asset_materialization_events() == []  # nothing was materialized
        [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.check_name == name and evaluation.asset_key == COVERAGE
    assert evaluation.passed, evaluation.metadata
    assert "count" in evaluation.metadata and "offending_paths" in evaluation.metadata


def test_a_check_run_alone_judges_the_table_as_it_is_now(built):
    """A fault planted after the last materialization is found by the check alone, and a blocking one fails its run."""
    config, _ = built
    table = lancedb.connect(load_settings(config).lancedb_uri).open_table("memory_vectors")
    row = {k: v for k, v in table.search().limit(1).to_list()[0].items() if not k.startswith("_")}
    table.add([row | {"chunk_id": "f" * 32, "doc_id": "mem:gone.md", "path": "gone.md"}])
    try:
        with memory_instance() as instance:
            result = _run_check_alone(config, instance, "index_coverage_no_orphans_check")
            [evaluation] = result.get_asset_check_evaluations()
            assert not result.success  # blocking
            assert result.get_asset_materialization_events() == []
        assert not evaluation.passed
        assert evaluation.metadata["offending_paths"].value == ["gone.md"]
    finally:
        table.delete(f"chunk_id = '{'f' * 32}'")


def test_coverage_follows_a_partial_run_through_its_automation_condition(tmp_path: Path):
    """index_coverage is eager: a run of one shard that leaves coverage out gets it refreshed once."""
    mem = tmp_path / "mem"
    mem.mkdir()
    for i in range(6):
        (mem / f"note-{i}.md").write_text(f"# Note {i}\nThe automation test note number {i}.\n")
    config = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    partitioned = dg.AssetSelection.all(include_sources=False) - dg.AssetSelection.assets(COVERAGE)
    graph = dg.Definitions(assets=index_assets, resources=index_resources(str(config)))
    with memory_instance() as instance:
        assert materialize(config, instance, tags=dict(FULL_RANGE_TAGS)).success
        first = dg.evaluate_automation_conditions(defs=graph, instance=instance)
        assert first.total_requested == 0  # coverage is as new as the table

        (mem / "note-0.md").write_text("# Note 0\nChanged after the first run.\n")
        shard = sorted(_shards_of(config))[0]
        one = materialize(config, instance, partition_key=shard, selection=partitioned.without_checks())
        assert one.success
        assert COVERAGE not in {e.asset_key for e in one.get_asset_materialization_events()}
        second = dg.evaluate_automation_conditions(defs=graph, instance=instance, cursor=first.cursor)
        assert second.get_requested_partitions(COVERAGE) == {None}  # unpartitioned: requested once

        assert materialize(config, instance, selection=dg.AssetSelection.assets(COVERAGE)).success
        third = dg.evaluate_automation_conditions(defs=graph, instance=instance, cursor=second.cursor)
        assert third.total_requested == 0


def _shards_of(config: Path) -> set[str]:
    from memory_pipeline import storage

    data = storage.of(load_settings(config))
    return {p.stem for p in (data.assets_dir / "source_files").glob("*.parquet") if "." not in p.stem}


def _executor_of_definitions(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = (
        "from memory_pipeline.definitions import defs\n"
        "import dagster as dg\n"
        "print(defs.resolve_job_def('index_job').executor_def.name)\n"
        "print(defs.resolve_implicit_global_asset_job_def().executor_def.name)\n"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def test_runs_execute_their_steps_in_one_process_unless_the_deployment_says_otherwise():
    """index_job and the UI's asset jobs (backfills from Materialize all…) run every step in the run's
    process by default; MEMORY_PIPELINE_EXECUTOR picks another, and a wrong name is one clear error."""
    default = _executor_of_definitions({"MEMORY_PIPELINE_EXECUTOR": ""})
    assert default.returncode == 0, default.stderr
    assert default.stdout.split() == ["in_process", "in_process"]
    multi = _executor_of_definitions({"MEMORY_PIPELINE_EXECUTOR": "multiprocess"})
    assert multi.returncode == 0, multi.stderr
    assert multi.stdout.split() == ["multiprocess", "multiprocess"]
    wrong = _executor_of_definitions({"MEMORY_PIPELINE_EXECUTOR": "threads"})
    assert wrong.returncode != 0
    assert "MEMORY_PIPELINE_EXECUTOR='threads' is not an executor this project knows" in wrong.stderr
