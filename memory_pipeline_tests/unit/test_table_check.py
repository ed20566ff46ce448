"""The settle check compares the table with the index records a shard at a time (issue 16's flat
memory): a no-op run over a million chunks had read every row's keys into Python at once (peak
644 MB against 227 MB at 100k chunks). What it finds is unchanged (`e2e/test_index_integrity.py`
covers the repairs); here, that it reads one shard at a time, and that the per-file counts it now
takes in Arrow equal counting the rows one by one."""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_pipeline.discovery import SHARD_KEYS
from memory_pipeline.stages import check_table
from memory_pipeline.stages.discover import _held
from memory_pipeline.stores.lance import VectorStore
from memory_pipeline_tests.unit.test_stages import _run, memory  # noqa: F401 - the fixture


@given(st.lists(st.tuples(st.sampled_from("abcde"), st.sampled_from(["h1", "h2", "h3", None])), max_size=40))
@settings(max_examples=200, deadline=None)
def test_per_file_counts_in_arrow_equal_counting_rows_one_by_one(rows):
    table = pa.table(
        {"doc_id": [d for d, _ in rows], "shard": ["00"] * len(rows), "file_sha256": [h for _, h in rows]},
        schema=pa.schema([("doc_id", pa.string()), ("shard", pa.string()), ("file_sha256", pa.string())]),
    )
    counts: dict[str, int] = defaultdict(int)
    hashes: dict[str, set] = defaultdict(set)
    for d, h in rows:
        counts[d] += 1
        hashes[d].add(h)
    assert _held(table) == {d: (counts[d], hashes[d]) for d in counts}


def test_the_check_reads_the_table_a_shard_at_a_time_and_still_finds_a_lost_row(memory, monkeypatch):  # noqa: F811
    _, settings_, embedder, ident = memory
    _run(settings_, embedder, ident)
    asked: list[list[str]] = []
    real = VectorStore.doc_rows

    def doc_rows(self, shards):
        asked.append(list(shards))
        return real(self, shards)

    monkeypatch.setattr(VectorStore, "doc_rows", doc_rows)
    clean = check_table(settings_, ident, SHARD_KEYS)
    assert clean.ok and clean.table_rows == VectorStore(settings_.lancedb_uri, settings_.table_name).count_rows() > 0
    assert asked == [[s] for s in SHARD_KEYS]

    store = VectorStore(settings_.lancedb_uri, settings_.table_name)
    victim = store.open().search().select(["doc_id"]).limit(1).to_arrow().column("doc_id")[0].as_py()
    store.open().delete(f"doc_id = '{victim}'")
    found = check_table(settings_, ident, SHARD_KEYS)
    assert not found.ok and victim in set().union(*found.stale.values())


def test_a_files_rows_copied_into_another_shard_are_orphans_there_and_stale_where_recorded(memory):  # noqa: F811
    """Removing the orphans deletes the file's rows in every shard (by ``doc_id``), so the shard that
    records the file re-indexes it in the same run: the next run finds the table whole."""
    import pyarrow.compute as pc

    _, settings_, embedder, ident = memory
    _run(settings_, embedder, ident)
    store = VectorStore(settings_.lancedb_uri, settings_.table_name)
    table = store.open()
    rows = table.search().limit(None).to_arrow()
    victim, home = rows.column("doc_id")[0].as_py(), rows.column("shard")[0].as_py()
    elsewhere = next(s for s in SHARD_KEYS if s != home)
    copied = rows.filter(pc.equal(rows.column("doc_id"), victim))  # pyright: ignore[reportAttributeAccessIssue]
    copied = copied.set_column(copied.schema.get_field_index("shard"), "shard", pa.array([elsewhere] * copied.num_rows, pa.string()))
    copied = copied.set_column(
        copied.schema.get_field_index("chunk_id"), "chunk_id", pa.array([f"{c}-copy" for c in copied.column("chunk_id").to_pylist()], pa.string())
    )
    table.add(copied)
    found = check_table(settings_, ident, SHARD_KEYS)
    assert victim in found.orphans[elsewhere] and victim in found.stale[home], (found.orphans, found.stale)
    _run(settings_, embedder, ident)
    again = check_table(settings_, ident, SHARD_KEYS)
    assert again.ok, (again.orphans, again.stale)
    fresh = VectorStore(settings_.lancedb_uri, settings_.table_name).open()  # the table as it is now
    held = fresh.search().where(f"doc_id = '{victim}'").select(["shard"]).limit(None).to_arrow().column("shard").to_pylist()
    assert held and set(held) == {home}
