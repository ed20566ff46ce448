"""The ANN index in the asset graph: built by the run that crosses ann.min_rows, kept fresh and
measured by the nightly maintenance run; FTS settings take effect on a forced rebuild."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

from memory_pipeline.defs.assets import index_assets
from memory_pipeline.defs.partitions import FULL_RANGE_TAGS, MAINTENANCE_TAG
from memory_pipeline.defs.resources import index_resources
from memory_pipeline.search import search
from memory_pipeline.settings import FtsConfig, load_settings
from memory_pipeline.stores.lance import DOC_FTS_COLUMN, FTS_COLUMN, VectorStore
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import memory_instance

LOGGERS = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
TOPICS = ["kafka lag", "boiler pressure", "sourdough starter", "tls certificate", "tax refund", "piano lesson",
          "garlic planting", "vpn tunnel", "flight booking", "dentist crown"]  # fmt: skip


def _vectors_meta(result) -> dict:
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        if mat.asset_key.to_user_string() == "memory_vectors":
            return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    raise AssertionError("memory_vectors not materialized")


def _write_notes(mem: Path, numbers: range) -> None:
    """One-chunk notes ``note-NNNN.md`` on the topics, one per number."""
    for i in numbers:
        (mem / f"note-{i:04d}.md").write_text(f"# Note {i}\n\nAbout {TOPICS[i % len(TOPICS)]}: entry {i} with detail {i * 7 % 13}.\n")


def _notes(tmp_path: Path, n: int) -> Path:
    """``n`` one-chunk notes on the topics in tmp_path/mem, and a config with ann.min_rows 256."""
    mem = tmp_path / "mem"
    mem.mkdir()
    _write_notes(mem, range(n))
    return write_config(tmp_path / "memory_pipeline.yaml", ann={"min_rows": 256})


@pytest.mark.slow
def test_ann_built_above_threshold_and_measured_nightly(tmp_path: Path):
    cfg = _notes(tmp_path, 300)
    resources = index_resources(str(cfg))
    with memory_instance() as instance:
        first = dg.materialize(index_assets, instance=instance, resources=resources, run_config=LOGGERS, tags=dict(FULL_RANGE_TAGS))
        assert first.success and _vectors_meta(first)["ann"] == "built"
        settings = load_settings(cfg)
        assert VectorStore(settings.lancedb_uri, settings.table_name).vector_index() is not None
        nightly = dg.materialize(
            index_assets, instance=instance, resources=resources, run_config=LOGGERS,
            tags={**FULL_RANGE_TAGS, MAINTENANCE_TAG: "true"},
        )  # fmt: skip
        meta = _vectors_meta(nightly)
    assert meta["maintenance"] == "optimized" and meta["ann"] == "current"
    assert meta["ann_recall_at_10"] >= 0.9
    hits = search("boiler pressure", settings=settings, max_results=3)
    assert hits and all("boiler" in h.snippet.lower() for h in hits)  # searched through the ANN index


def test_fts_stemming_is_configurable(tmp_path: Path):
    store = VectorStore(str(tmp_path / "lancedb"), "memory_vectors")
    store.ensure(0, {"provider": "none", "model": "none", "dims": 0, "provider_key": "none"})
    table = store.open()
    rows = {f.name: [None, None] for f in table.schema}
    rows.update(chunk_id=["a", "b"], text=["we were deploying all day", "café au lait"])
    rows[FTS_COLUMN] = rows["text"]
    table.add(pa.table(rows, schema=table.schema))

    def hits(q: str) -> list[str]:
        return table.search(q, query_type="fts", fts_columns=FTS_COLUMN).select(["chunk_id"]).to_arrow().column("chunk_id").to_pylist()

    assert store.ensure_fts(FtsConfig())["fts"] == "created"
    assert hits("deploy") == ["a"] and hits("cafe") == ["b"]
    assert store.ensure_fts(FtsConfig(stem=False), rebuild=True)["fts"] == "created"
    assert hits("deploy") == [] and hits("deploying") == ["a"]
    store.ensure_fts(FtsConfig(stem=False, ascii_folding=False), rebuild=True)
    assert hits("cafe") == [] and hits("café") == ["b"]


@pytest.mark.slow
def test_a_run_folds_its_rows_into_the_vector_index_a_segment_at_a_time(tmp_path: Path, monkeypatch):
    """A run indexes its rows a segment at a time (``SEGMENT_ROWS``): the index is built once the
    table crosses ann.min_rows and later rows are folded in as delta indices over just them, so no
    build holds the whole table (at a million rows the whole build grew the process by 777 MB)."""
    from memory_pipeline.stages import write
    from memory_pipeline.stores import lance

    monkeypatch.setattr(lance, "SEGMENT_ROWS", 300)
    monkeypatch.setattr(write, "SEGMENT_ROWS", 300)
    cfg = _notes(tmp_path, 1000)
    resources = index_resources(str(cfg))
    with memory_instance() as instance:
        first = dg.materialize(index_assets, instance=instance, resources=resources, run_config=LOGGERS, tags=dict(FULL_RANGE_TAGS))
    meta = _vectors_meta(first)
    assert first.success and meta["ann"] == "built" and meta["ann_folds"] >= 2, meta
    settings = load_settings(cfg)
    store = VectorStore(settings.lancedb_uri, settings.table_name)
    index = store.vector_index()
    assert index is not None
    stats = store.open().index_stats(index.name)
    # The first build and a delta per later segment (LanceDB may merge a fold into the last delta),
    # not one index trained over every row.
    assert 2 <= stats.num_indices <= meta["ann_folds"] + 1
    assert stats.num_indexed_rows + stats.num_unindexed_rows == store.count_rows() == 1000
    recall = store.ann_recall(settings.ann, queries=40)
    assert recall is not None and recall >= 0.9
    # Maintenance keeps segments of SEGMENT_ROWS rows (each costs a query what a partition does).
    assert lance.delta_allowance(stats.num_indexed_rows, lance.ANN_MAX_DELTAS) >= stats.num_indices
    assert store.ensure_ann(settings.ann, max_deltas=lance.ANN_MAX_DELTAS)["ann"] in ("current", "folded")
    hits = search("boiler pressure", settings=settings, max_results=3)
    assert hits and all("boiler" in h.snippet.lower() for h in hits)


@pytest.mark.slow
def test_a_later_run_folds_its_segments_into_a_table_with_a_full_text_index_and_a_forced_run_retrains(tmp_path: Path, monkeypatch):
    """A run that adds many rows to a table that has its full-text index folds them a segment at a
    time too (folded at its end alone, its rows would be one delta built at once, in memory that
    grows with them); a forced run, which replaces every row, folds nothing and trains the vector
    index again over them instead of adding deltas beside the old index."""
    from memory_pipeline.stages import write
    from memory_pipeline.stores import lance

    monkeypatch.setattr(lance, "SEGMENT_ROWS", 300)
    monkeypatch.setattr(write, "SEGMENT_ROWS", 300)
    cfg = _notes(tmp_path, 700)
    resources = index_resources(str(cfg))
    settings = load_settings(cfg)
    store = VectorStore(settings.lancedb_uri, settings.table_name)
    with memory_instance() as instance:
        first = dg.materialize(index_assets, instance=instance, resources=resources, run_config=LOGGERS, tags=dict(FULL_RANGE_TAGS))
        assert first.success and _vectors_meta(first)["ann_folds"] >= 1
        assert any(idx.name == f"{FTS_COLUMN}_idx" for idx in store.open().list_indices())
        deltas_before = store.open().index_stats(store.vector_index().name).num_indices
        _write_notes(tmp_path / "mem", range(700, 1400))
        grown = dg.materialize(index_assets, instance=instance, resources=resources, run_config=LOGGERS, tags=dict(FULL_RANGE_TAGS))
        meta = _vectors_meta(grown)
        # 700 new rows in segments of 300: two folds while the run writes, the rest at its end.
        assert grown.success and meta["ann"] == "folded" and meta["ann_folds"] >= 2, meta
        store = VectorStore(settings.lancedb_uri, settings.table_name)  # the table as the run left it
        table = store.open()
        vector_stats = table.index_stats(store.vector_index().name)
        # A delta per segment; the run's end leaves fewer than 1,000 rows to the nightly maintenance.
        assert vector_stats.num_indices >= deltas_before + 2 and vector_stats.num_unindexed_rows < 300
        assert vector_stats.num_indexed_rows + vector_stats.num_unindexed_rows == store.count_rows() == 1400
        # The segments' folds folded the full-text index too: at most the run's last rows wait for it.
        for name in (f"{FTS_COLUMN}_idx", f"{DOC_FTS_COLUMN}_idx"):
            assert table.index_stats(name).num_unindexed_rows < 300, name
        hits = search("entry 1337", settings=settings, max_results=3, mode="fts")
        assert hits and hits[0].path.endswith("note-1337.md")
        forced = dg.materialize(
            index_assets, instance=instance, resources=resources, tags=dict(FULL_RANGE_TAGS),
            run_config={**LOGGERS, "ops": {"source_files": {"config": {"force": True}}, "memory_vectors": {"config": {"force": True}}}},
        )  # fmt: skip
    meta = _vectors_meta(forced)
    assert forced.success and meta["ann"] == "built" and meta["ann_folds"] == 0, meta
    store = VectorStore(settings.lancedb_uri, settings.table_name)
    stats = store.open().index_stats(store.vector_index().name)
    assert stats.num_indices == 1 and stats.num_unindexed_rows == 0 and store.count_rows() == 1400


@pytest.mark.slow
def test_a_table_under_the_threshold_gets_its_vector_index_as_soon_as_a_run_crosses_it(tmp_path: Path, monkeypatch):
    """A table that holds fewer than ann.min_rows rows and already has its full-text index (a small
    memory, then an archive added) gets its vector index as soon as a run takes it past
    ann.min_rows, not a segment of the run's rows later: the first build covers every row of the
    table, and over the old rows and a whole segment it could reach two IVF partitions, which the
    next fold merges in memory that grows with the index."""
    from memory_pipeline.stages import write
    from memory_pipeline.stores import lance

    monkeypatch.setattr(lance, "SEGMENT_ROWS", 300)
    monkeypatch.setattr(write, "SEGMENT_ROWS", 300)
    cfg = _notes(tmp_path, 200)  # ann.min_rows 256
    resources = index_resources(str(cfg))
    settings = load_settings(cfg)
    builds: list[int] = []  # rows in the table at each build of the vector index
    real = VectorStore.ensure_ann

    def ensure_ann(self, ann, **kwargs):
        out = real(self, ann, **kwargs)
        if out.get("ann") == "built":
            builds.append(self.count_rows())
        return out

    monkeypatch.setattr(VectorStore, "ensure_ann", ensure_ann)
    with memory_instance() as instance:
        small = dg.materialize(index_assets, instance=instance, resources=resources, run_config=LOGGERS, tags=dict(FULL_RANGE_TAGS))
        assert small.success and _vectors_meta(small)["ann"] == "exact"
        store = VectorStore(settings.lancedb_uri, settings.table_name)
        assert store.vector_index() is None and any(idx.name == f"{FTS_COLUMN}_idx" for idx in store.open().list_indices())
        _write_notes(tmp_path / "mem", range(200, 1000))
        grown = dg.materialize(index_assets, instance=instance, resources=resources, run_config=LOGGERS, tags=dict(FULL_RANGE_TAGS))
    meta = _vectors_meta(grown)
    # Built once, past 256 rows by at most a group of the run's pieces: not over the 200 old rows
    # and a segment of 300 new ones.
    assert grown.success and meta["ann"] == "built", meta
    assert len(builds) == 1 and 256 <= builds[0] < 200 + 300, builds
    assert meta["ann_folds"] >= 2, meta  # then a segment at a time
    store = VectorStore(settings.lancedb_uri, settings.table_name)
    stats = store.open().index_stats(store.vector_index().name)
    assert stats.num_indexed_rows + stats.num_unindexed_rows == store.count_rows() == 1000
    assert stats.num_unindexed_rows < 300
    hits = search("boiler pressure", settings=settings, max_results=3)
    assert hits and all("boiler" in h.snippet.lower() for h in hits)


@pytest.mark.slow
def test_a_vector_delta_added_by_the_full_text_upkeep_is_counted_as_a_fold(tmp_path: Path, monkeypatch):
    """A run's end keeps the full-text index current with ``optimize`` (here: the compaction of many
    fragments), which folds every index: the vector index's new rows too, as one more delta. The
    run's metadata says so (``ann: folded``, ``ann_folds``) rather than ``current``."""
    from memory_pipeline.stores import lance

    cfg = _notes(tmp_path, 300)  # ann.min_rows 256
    resources = index_resources(str(cfg))
    settings = load_settings(cfg)
    with memory_instance() as instance:
        first = dg.materialize(index_assets, instance=instance, resources=resources, run_config=LOGGERS, tags=dict(FULL_RANGE_TAGS))
        assert first.success and _vectors_meta(first)["ann"] == "built"
        store = VectorStore(settings.lancedb_uri, settings.table_name)
        deltas = store.open().index_stats(store.vector_index().name).num_indices
        monkeypatch.setattr(lance, "COMPACT_AT", 2)  # the run's commits are compacted at its end
        for i in range(0, 300, 15):
            (tmp_path / "mem" / f"note-{i:04d}.md").write_text(f"# Note {i}\n\nRevised: {TOPICS[i % len(TOPICS)]} entry {i}.\n")
        second = dg.materialize(index_assets, instance=instance, resources=resources, run_config=LOGGERS, tags=dict(FULL_RANGE_TAGS))
    meta = _vectors_meta(second)
    store = VectorStore(settings.lancedb_uri, settings.table_name)
    stats = store.open().index_stats(store.vector_index().name)
    # 20 changed rows: too few for the run's own fold (1,000), but the compaction folded them (as a
    # delta, or merged into the last one).
    assert second.success and stats.num_unindexed_rows == 0 and stats.num_indices >= deltas, (stats, deltas)
    assert meta["ann"] == "folded" and meta["ann_folds"] == 1, meta
