"""A table written by many small commits is compacted by the write stage's index upkeep.

Each commit of a run adds a fragment and every query opens every fragment, so a table written
by many small runs answered several times slower than the same rows in one fragment (369 rows
in 16 fragments: 23 ms per vector query). ``ensure_fts`` merges them once COMPACT_AT have piled
up; the rows, the full-text index and search stay the same.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from memory_pipeline.stores.lance import COMPACT_AT, DATA_STORAGE_VERSION, VectorStore, _fragment_count
from memory_pipeline_tests.helpers import empty_column

DIMS = 8
META = {"provider": "local", "model": "m", "dims": DIMS, "provider_key": "k"}


def _rows(schema: pa.Schema, doc: str, n: int, rng: np.random.Generator) -> pa.Table:
    data: dict[str, list] = {}
    for f in schema:
        if f.name == "vector":
            data[f.name] = [rng.random(DIMS, dtype=np.float32).tolist() for _ in range(n)]
        elif f.name in ("doc_id",):
            data[f.name] = [doc] * n
        elif f.name == "chunk_id":
            data[f.name] = [f"{doc}#{i}" for i in range(n)]
        elif f.name == "chunk_index":
            data[f.name] = list(range(n))
        elif pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            data[f.name] = [
                f"{doc} word{i} zebra" if f.name in ("text", "search_text") else ("" if f.name == "doc_search_text" and i else doc) for i in range(n)
            ]
        else:
            data[f.name] = empty_column(f.type, n)
    return pa.table(data, schema=schema)


def _committed(tmp_path, commits: int, *, rows: int, seed: int) -> VectorStore:
    """A new table written by ``commits`` one-file commits of ``rows`` rows each."""
    store = VectorStore(str(tmp_path / "lancedb"), "t")
    table = store.ensure(DIMS, META)
    rng = np.random.default_rng(seed)
    for k in range(commits):
        doc = f"src:doc{k:02d}.md"
        store.replace_docs(_rows(table.schema, doc, rows, rng), [doc])
    return store


def test_many_small_commits_are_compacted_and_nothing_changes(tmp_path):
    store = _committed(tmp_path, COMPACT_AT + 2, rows=3, seed=0)
    before = _fragment_count(store.open())
    assert before >= COMPACT_AT
    rows_before = sorted(store.open().to_arrow().column("chunk_id").to_pylist())
    out = store.ensure_fts()
    assert out.get("compacted_fragments") == before
    after = store.open()
    assert _fragment_count(after) < before and _fragment_count(after) <= 2
    assert sorted(after.to_arrow().column("chunk_id").to_pylist()) == rows_before
    hits = after.search("zebra", query_type="fts", fts_columns="search_text").limit(100).to_list()
    assert len(hits) == len(rows_before)
    # Below the threshold nothing is rewritten.
    assert "compacted_fragments" not in store.ensure_fts()


def test_a_first_build_compacts_before_the_full_text_index(tmp_path, monkeypatch):
    """With no full-text index yet, the fragments are merged first and the index built once over
    the merged rows (merged after, the new index would be remapped, its partitions loaded whole);
    once it exists, fragments that pile up are merged after the upkeep as before."""
    store = _committed(tmp_path, COMPACT_AT + 1, rows=3, seed=1)
    table = store.open()
    calls: list[str] = []
    for name in ("optimize", "create_index"):
        real = getattr(table, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name if _name == "optimize" else f"index:{args[0] if args else kwargs.get('column')}")
            return _real(*args, **kwargs)

        monkeypatch.setattr(table, name, spy)
    monkeypatch.setattr(store, "open", lambda: table)
    out = store.ensure_fts()
    assert out["fts"] == "created" and out["compacted_fragments"] >= COMPACT_AT
    assert calls[0] == "optimize" and calls.count("optimize") == 1, calls
    assert {"index:search_text", "index:doc_search_text"} <= set(calls)
    assert _fragment_count(table) == 1
    hits = table.search("zebra", query_type="fts", fts_columns="search_text").limit(100).to_list()
    assert len(hits) == (COMPACT_AT + 1) * 3


def test_key_columns_get_btree_indices_that_filters_use(tmp_path):
    """``ensure_fts`` also indexes chunk_id and doc_id (the searcher's ``IN (…)`` prefilters and
    lookups); rows written after it are still found, and optimize folds them in."""
    from memory_pipeline.stores.lance import KEY_COLUMNS

    store = VectorStore(str(tmp_path / "lancedb"), "t")
    table = store.ensure(DIMS, META)
    rng = np.random.default_rng(1)
    assert store.ensure_fts() == {"fts": "empty"}  # an empty table gets no index of any kind
    assert not store.open().list_indices()
    store.replace_docs(_rows(table.schema, "src:a.md", 4, rng), ["src:a.md"])
    store.ensure_fts()
    indices = {i.name: i for i in store.open().list_indices()}
    for column in KEY_COLUMNS:
        assert indices[f"{column}_idx"].index_type == "BTree" and list(indices[f"{column}_idx"].columns) == [column]
    store.replace_docs(_rows(table.schema, "src:b.md", 3, rng), ["src:b.md"])  # not in the index yet
    table = store.open()
    assert table.count_rows("doc_id IN ('src:b.md')") == 3 and table.count_rows("chunk_id IN ('src:a.md#1', 'src:b.md#2')") == 2
    table.optimize()
    assert table.index_stats("doc_id_idx").num_unindexed_rows == 0
    assert table.count_rows("doc_id IN ('src:a.md', 'src:b.md')") == 7


def test_new_files_are_appended_and_changed_files_merged_to_exactly_their_rows(tmp_path):
    """``replace_docs``: files the table does not hold are a plain append (a merge would join the
    whole table); a file it holds is merged (its removed chunks deleted, the others updated); an
    append of a file whose rows are already there (a run killed before its state was recorded)
    goes through the merge, so nothing is duplicated."""
    store = VectorStore(str(tmp_path / "lancedb"), "t")
    table = store.ensure(DIMS, META)
    rng = np.random.default_rng(2)
    both = pa.concat_tables([_rows(table.schema, "src:a.md", 4, rng), _rows(table.schema, "src:b.md", 3, rng)])
    first = store.replace_docs(both, ["src:a.md", "src:b.md"])
    assert (first.inserted, first.updated, first.deleted, first.commits) == (7, 0, 0, 1)
    again = store.replace_docs(both, ["src:a.md", "src:b.md"])  # the same rows once more: updated in place
    assert (again.inserted, again.updated) == (0, 7)
    shorter = store.replace_docs(_rows(table.schema, "src:a.md", 2, rng), ["src:a.md"])
    assert (shorter.inserted, shorter.updated, shorter.deleted) == (0, 2, 2)
    ids = sorted(store.open().to_arrow().column("chunk_id").to_pylist())
    assert ids == ["src:a.md#0", "src:a.md#1", "src:b.md#0", "src:b.md#1", "src:b.md#2"]
    gone = store.replace_docs(_rows(table.schema, "src:b.md", 0, rng), ["src:b.md"])  # a deleted file
    assert gone.deleted == 3 and store.open().count_rows() == 2


def _file_formats(table_dir) -> set[tuple[int, int]]:
    """The Lance file format (major, minor) of every data file of a table, read from each file's
    footer (two little-endian u16 then the magic ``LANC``)."""
    found = set()
    for f in (table_dir / "data").glob("*.lance"):
        tail = f.read_bytes()[-8:]
        assert tail[4:] == b"LANC", f
        found.add((int.from_bytes(tail[0:2], "little"), int.from_bytes(tail[2:4], "little")))
    return found


def test_tables_are_written_in_the_random_access_format_before_and_after_compaction(tmp_path):
    """New tables use DATA_STORAGE_VERSION (2.1): LanceDB's default 2.2 made a search's take of
    its results' rows six times the CPU at a million rows (lance.py). Rows written later and the
    compacted fragment keep it."""
    store = _committed(tmp_path, COMPACT_AT + 1, rows=2, seed=1)
    table_dir = tmp_path / "lancedb" / "t.lance"
    assert _file_formats(table_dir) == {(2, 1)}
    assert DATA_STORAGE_VERSION == "2.1"
    store.ensure_fts()  # compacts
    assert _fragment_count(store.open()) <= 2
    assert _file_formats(table_dir) == {(2, 1)}


def test_a_fold_for_a_server_leaves_no_index_lacking_rows_even_after_a_rebuild(tmp_path):
    """A server waits out a version any of whose indices lacks rows (``service/warm.py``): when the
    writer folds for it (``fold``), the rebuilt full-text indices are not enough, the key indices
    must have the new rows too; without ``fold`` a small backlog is left for later."""
    from memory_pipeline.stores.lance import unindexed_rows

    store = _committed(tmp_path, 2, rows=3, seed=3)
    store.ensure_fts()
    assert unindexed_rows(store.open()) == 0
    rng = np.random.default_rng(4)
    store.replace_docs(_rows(store.open().schema, "src:new.md", 3, rng), ["src:new.md"])
    store.ensure_fts(rebuild=True)  # no server: the key indices may lag
    assert unindexed_rows(store.open()) > 0
    store.replace_docs(_rows(store.open().schema, "src:new2.md", 3, rng), ["src:new2.md"])
    store.ensure_fts(rebuild=True, fold=True)
    assert unindexed_rows(store.open()) == 0


def _row_ids(table, docs: list[str]) -> dict[str, int]:
    """Each chunk's row id (with LanceDB's default ids, its fragment and offset: a row that is
    rewritten gets a new one)."""
    quoted = ", ".join(f"'{d}'" for d in docs)
    found = table.search().where(f"doc_id IN ({quoted})").with_row_id(True).select(["chunk_id"]).limit(100_000).to_arrow()
    return dict(zip(found.column("chunk_id").to_pylist(), found.column("_rowid").to_pylist()))


def test_a_runs_first_vector_build_is_over_merged_fragments_so_its_first_fold_rewrites_none_of_them(tmp_path, monkeypatch):
    """``fold_segment`` merges the segment's fragments (one per commit) before the first build, and
    gives the heap's free pages back before building (the merge left 19 MB more resident under a
    100k-chunk run's build). Left for the first fold, LanceDB rewrites those indexed rows there
    and remaps the new index over them: at a million chunks that fold was the run's peak
    (lance.py). The first fold then only indexes the rows written since, as a delta, and the first
    segment's rows keep their ids."""
    from memory_pipeline import allocator
    from memory_pipeline.settings import AnnConfig
    from memory_pipeline.stores import lance

    commits = 20
    store = _committed(tmp_path, commits, rows=15, seed=6)
    first_docs = [f"src:doc{k:02d}.md" for k in range(commits)]
    table = store.open()
    assert _fragment_count(table) == commits
    calls: list[str] = []
    for name in ("optimize", "create_index"):
        real = getattr(table, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(table, name, spy)
    real_trim = allocator.trim_heap
    monkeypatch.setattr(lance, "trim_heap", lambda: (calls.append("trim"), real_trim())[1])
    monkeypatch.setattr(store, "open", lambda: table)
    ann = AnnConfig(min_rows=256, nprobes=20)
    built = store.fold_segment(ann)
    assert built["ann"] == "built", built
    assert calls == ["optimize", "trim", "create_index"], calls
    monkeypatch.undo()
    assert _fragment_count(store.open()) == 1
    ids = _row_ids(store.open(), first_docs)
    assert len(ids) == commits * 15

    rng = np.random.default_rng(7)
    for k in range(3):
        doc = f"src:later{k}.md"
        store.replace_docs(_rows(store.open().schema, doc, 15, rng), [doc])
    assert store.fold_segment(ann) == {"ann": "folded"}
    table = store.open()
    assert _row_ids(table, first_docs) == ids  # not rewritten by the fold
    stats = table.index_stats(store.vector_index().name)
    assert stats.num_indices == 2 and stats.num_unindexed_rows == 0 and stats.num_indexed_rows == (commits + 3) * 15
    assert (store.ann_recall(ann, queries=20) or 0) >= 0.9


def test_a_first_build_over_one_fragment_merges_nothing_and_a_failed_merge_still_builds(tmp_path, monkeypatch):
    """No merge where the rows are one fragment already; and the merge is best effort: when it
    fails (other writers' commits kept conflicting), the first build goes on over the fragments as
    they are, rather than waiting for the next segment (a build over two segments is in two
    partitions, which LanceDB's folds then merge, the spike ``ensure_ann`` describes)."""
    from memory_pipeline.errors import StoreError
    from memory_pipeline.settings import AnnConfig

    ann = AnnConfig(min_rows=256, nprobes=20)
    one = _committed(tmp_path / "one", 1, rows=300, seed=8)
    assert _fragment_count(one.open()) == 1
    merges: list[object] = []
    monkeypatch.setattr(one, "_fold", lambda table: merges.append(table))
    assert one.fold_segment(ann)["ann"] == "built" and merges == []

    many = _committed(tmp_path / "many", 20, rows=15, seed=9)

    def refuse(table):
        raise StoreError("folding new rows into the indices of t failed: commit conflict")

    monkeypatch.setattr(many, "_fold", refuse)
    built = many.fold_segment(ann)
    assert built["ann"] == "built" and built["ann_partitions"] == 1, built
    table = many.open()
    assert _fragment_count(table) == 20
    assert table.index_stats(many.vector_index().name).num_unindexed_rows == 0


def test_a_write_runs_first_vector_build_comes_once_the_table_holds_min_rows_and_a_failed_one_is_retried(tmp_path, monkeypatch):
    """The write stage (``_Segments``) asks for the first build as soon as the table holds
    ``ann.min_rows`` rows, not a segment later; a build that failed (a commit conflict) is asked for
    again at the next group's end; then only whole segments fold. A table without vectors is never
    asked."""
    from types import SimpleNamespace

    from memory_pipeline.errors import StoreError
    from memory_pipeline.settings import AnnConfig
    from memory_pipeline.stages import write
    from memory_pipeline.stores.lance import WriteCounts

    monkeypatch.setattr(write, "SEGMENT_ROWS", 1000)
    settings = SimpleNamespace(ann=AnnConfig(min_rows=256))
    store = _committed(tmp_path, 16, rows=15, seed=8)  # 240 rows: under min_rows
    calls: list[str] = []
    real = VectorStore.fold_segment

    def fold_segment(self, ann, **kwargs):
        if not calls:
            calls.append("conflict")
            raise StoreError("commit conflict")
        calls.append("fold")
        return real(self, ann, **kwargs)

    monkeypatch.setattr(VectorStore, "fold_segment", fold_segment)
    segments = write._Segments(store, settings)  # pyright: ignore[reportArgumentType]
    segments.wrote(WriteCounts(inserted=240, commits=16))
    segments.fold_if_due()
    assert calls == []  # 240 rows: exact search, nothing to build
    rng = np.random.default_rng(9)
    for k, doc in enumerate(("src:late0.md", "src:late1.md")):
        store.replace_docs(_rows(store.open().schema, doc, 16, rng), [doc])  # 256 rows, then 272
        segments.wrote(WriteCounts(inserted=16, commits=1))
        segments.fold_if_due()
        assert calls == ["conflict", "fold"][: k + 1], calls
    assert segments.ann == "built" and store.vector_index() is not None
    store.replace_docs(_rows(store.open().schema, "src:late2.md", 15, rng), ["src:late2.md"])
    segments.wrote(WriteCounts(inserted=15, commits=1))
    segments.fold_if_due()
    assert calls == ["conflict", "fold"]  # indexed now: the next fold waits for a segment

    bare = VectorStore(str(tmp_path / "bare"), "t")
    table = bare.ensure(0, {"provider": "none", "model": "none", "dims": 0, "provider_key": "none"})
    bare.replace_docs(_rows(table.schema, "src:bare.md", 300, rng), ["src:bare.md"])
    calls.clear()
    plain = write._Segments(bare, settings)  # pyright: ignore[reportArgumentType]
    plain.wrote(WriteCounts(inserted=300, commits=1))
    plain.fold_if_due()
    assert calls == []
