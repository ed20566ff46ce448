"""The vector leg in memory (``FlatVectors``): a long-lived searcher over a table that fits
``FLAT_MAX_BYTES`` ranks chunks by one matrix product instead of a LanceDB scan per query. It
must answer exactly what LanceDB answers, follow the table as it changes, and stay out of the
way of filtered queries and large tables. Real local model, real LanceDB."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memory_pipeline.search.searcher as searcher_mod
from memory_pipeline.runner import run_index
from memory_pipeline.search import MemorySearcher
from memory_pipeline.search.searcher import FlatVectors
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import SEARCH_TOPICS

TOPICS = SEARCH_TOPICS
QUERIES = ["coffee maker maintenance", "payment retries", "certificate rollback", "where is the offsite", "slow consumer", "shelf 12 bin 3"]


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = tmp_path_factory.mktemp("flat")
    mem = root / "mem"
    (mem / "work").mkdir(parents=True)
    for i, topic in enumerate(TOPICS):
        sub = mem / "work" if i % 2 else mem
        (sub / f"2026-05-{i + 1:02d}.md").write_text(f"# Day {i}\n\n{topic.capitalize()}.\n\nOther notes of the day {i}.\n")
    # Enough rows that a query's pool is a small part of the table (the nearest rows are chosen,
    # not all of them, and taken from scattered positions).
    for i in range(150):
        (mem / "log").mkdir(exist_ok=True)
        (mem / "log" / f"entry-{i:03d}.md").write_text(f"Routine log entry {i}: checked shelf {i % 17} and bin {i % 11}, nothing to report.\n")
    settings = load_settings(write_config(root / "memory_pipeline.yaml", provider="local"))
    run_index(settings)
    return settings


def _key(results) -> list[tuple[str, str]]:
    return [(r.path, r.chunk_id) for r in results]


def _scores(results) -> list[float]:
    return [r.vector_score for r in results] + [r.score for r in results]


@pytest.mark.parametrize("mode, max_results", [("vector", 3), ("vector", 60), ("hybrid", 3), ("hybrid", 8)])
def test_in_memory_vectors_answer_exactly_what_lancedb_answers(indexed, monkeypatch, mode: str, max_results: int):
    flat = MemorySearcher(indexed)
    opts = flat.options(mode=mode, min_score=0.0, max_results=max_results)
    for q in QUERIES:
        flat.search(q, opts)  # the first query of a version reads no vectors
    assert flat._flat is not None  # from the second query on, they are in memory
    monkeypatch.setattr(searcher_mod, "FLAT_MAX_BYTES", 0)
    scan = MemorySearcher(indexed)
    for q in QUERIES:
        monkeypatch.setattr(searcher_mod, "FLAT_MAX_BYTES", 64 * 2**20)
        got = flat.search(q, opts)
        monkeypatch.setattr(searcher_mod, "FLAT_MAX_BYTES", 0)
        want = scan.search(q, opts)
        assert scan._flat is None
        assert _key(got) == _key(want), q
        np.testing.assert_allclose(_scores(got), _scores(want), atol=1e-5)


def test_a_one_query_searcher_reads_no_vectors(indexed):
    searcher = MemorySearcher(indexed)
    assert searcher.search("payment retries", searcher.options(mode="vector", min_score=0.0))
    assert searcher._flat is None


def test_filtered_queries_and_large_tables_are_searched_by_lancedb(indexed, monkeypatch):
    searcher = MemorySearcher(indexed)
    opts = searcher.options(mode="vector", min_score=0.0)
    searcher.search("payment retries", opts)
    searcher.search("payment retries", opts)
    assert searcher._flat is not None
    loads: list[int] = []
    real = FlatVectors.nearest
    monkeypatch.setattr(FlatVectors, "nearest", lambda self, q, k: loads.append(k) or real(self, q, k))
    from memory_pipeline.search.filters import SearchFilters

    in_work = searcher.options(mode="vector", min_score=0.0, filters=SearchFilters(path_glob="work/**"))
    results = searcher.search("payment retries", in_work)
    assert results and all("/mem/work/" in r.path for r in results) and loads == []
    # A table over the limit is never held in memory.
    monkeypatch.setattr(searcher_mod, "FLAT_MAX_BYTES", 1024)
    big = MemorySearcher(indexed)
    for _ in range(3):
        assert big.search("payment retries", opts)
    assert big._flat is None


def test_the_vectors_follow_the_table_as_it_changes(indexed, tmp_path):
    """A new version (another process indexed) is read again; the old version's vectors are never
    used on it, even by a query that checked the version just before the handle moved on (a server's
    other thread checks out the new version): that query scans instead of mixing row ids."""
    settings = _copy_of(indexed, tmp_path)
    root = tmp_path / "copy"
    searcher = MemorySearcher(settings)
    opts = searcher.options(mode="vector", min_score=0.0, max_results=3)
    searcher.search("snorkeling trip", opts)
    searcher.search("snorkeling trip", opts)
    before = searcher._flat
    assert before is not None and matrix_is_read_only(before)
    (root / "mem" / "2026-06-01.md").write_text("# Holiday\n\nWe booked a snorkeling trip to the coral reef.\n")
    (root / "mem" / "2026-05-01.md").unlink()
    (root / "mem" / "work" / "2026-05-02.md").write_text("# Day 1\n\nThe billing retry policy is now linear.\n")
    run_index(settings)
    searcher.table.checkout_latest()
    assert searcher._flat_rows(before, searcher.provider.embed_query("payment retries"), 20) is None
    searcher.search("snorkeling trip", opts)  # the new version's first query: LanceDB
    got = searcher.search("snorkeling trip", opts)  # the second: its vectors, read again
    assert searcher._flat is not None and searcher._flat.version != before.version
    assert Path(got[0].path).name == "2026-06-01.md"
    assert not any(Path(r.path).name == "2026-05-01.md" for r in searcher.search("espresso descaling", opts))


def _copy_of(indexed, tmp_path: Path):
    """The settings of a copy of the module's indexed folder (under ``tmp_path / "copy"``), to change."""
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(Path(indexed.sources[0].path).parent, root)
    return load_settings(str(root / "memory_pipeline.yaml"))


def matrix_is_read_only(flat: FlatVectors) -> bool:
    try:
        flat.matrix[0, 0] = 1.0
    except ValueError:
        return True
    return False


def test_nearest_is_the_exact_cosine_order_ties_by_position():
    rng = np.random.default_rng(7)
    m = rng.standard_normal((200, 16)).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    m[50] = m[10]  # a tie: the earlier row first
    flat = FlatVectors(1, [f"c{i}" for i in range(200)], {f"c{i}": i for i in range(200)}, m, np.arange(200), [f"d{i}" for i in range(200)])
    q = m[10] + 0.01 * m[3]
    q /= np.linalg.norm(q)
    got = flat.nearest(q, 20)
    sims = m @ q
    want = sorted(range(200), key=lambda i: (-sims[i], i))[:20]
    assert [i for i, _ in got] == want and got[0][0] == 10 and got[1][0] == 50
    assert [s for _, s in got] == pytest.approx([float(sims[i]) for i in want])
    assert len(flat.nearest(q, 500)) == 200 and flat.nearest(q, 0) == []
    assert flat.vector("c7") is m[7] or np.array_equal(flat.vector("c7"), m[7])
    assert flat.vector("nope") is None


def _refuse_takes(monkeypatch) -> list[int]:
    """LanceDB refusing row ids (``fragment 3 not found``), as after a compaction moved the rows."""
    from memory_pipeline.search import lanceaio

    refused: list[int] = []
    real = lanceaio.run

    def run(table, queries):
        if any(isinstance(q, lanceaio.Take) for q in queries):
            refused.append(1)
            raise RuntimeError("fragment 3 not found")
        return real(table, queries)

    monkeypatch.setattr(lanceaio, "run", run)
    return refused


def test_rows_gone_from_under_the_vectors_fall_back_to_a_scan(indexed, monkeypatch):
    """A compaction committed between the version check and the take moves the rows: LanceDB
    refuses the stale row ids, the rows are looked up by chunk id instead (the same answer), and
    the vectors are dropped."""
    searcher = MemorySearcher(indexed)
    opts = searcher.options(mode="vector", min_score=0.0)
    want = _key(searcher.search("payment retries", opts))
    searcher.search("payment retries", opts)
    assert searcher._flat is not None
    refused = _refuse_takes(monkeypatch)
    assert _key(searcher.search("payment retries", opts)) == want
    assert refused and searcher._flat is None


def test_a_version_whose_rows_cannot_be_taken_is_not_read_again(indexed, monkeypatch):
    searcher = MemorySearcher(indexed)
    opts = searcher.options(mode="vector", min_score=0.0, max_results=3)
    want = _key(searcher.search("payment retries", opts))
    loads: list[int] = []
    real = FlatVectors.load.__func__

    def counting(cls, table, version, dims):
        loads.append(version)
        return real(cls, table, version, dims)

    monkeypatch.setattr(FlatVectors, "load", classmethod(counting))
    _refuse_takes(monkeypatch)
    for _ in range(4):
        assert _key(searcher.search("payment retries", opts)) == want
    assert len(loads) == 1 and searcher._flat is None


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(min_value=1, max_value=300),
    k=st.integers(min_value=-2, max_value=400),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    ties=st.integers(min_value=0, max_value=300),
)
def test_nearest_is_a_brute_force_sort_for_any_table_and_pool(rows: int, k: int, seed: int, ties: int):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((rows, 8)).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    source = rng.integers(rows)
    for i in rng.integers(rows, size=ties):  # copies of one row: a block of equal scores, ordered by position
        m[i] = m[source]
    flat = FlatVectors(1, [str(i) for i in range(rows)], {str(i): i for i in range(rows)}, m, np.arange(rows))
    q = m[source] if ties else rng.standard_normal(8).astype(np.float32)  # the tied block first
    sims = m @ q
    want = sorted(range(rows), key=lambda i: (-sims[i], i))[: max(k, 0)]
    assert [i for i, _ in flat.nearest(q, k)] == want


def test_storage_failing_every_read_of_the_rows_is_a_store_error(indexed, monkeypatch):
    """The take fails and so does the lookup by chunk id (the storage is down, not the row ids
    stale): the search says so as a store error (HTTP 503), not with LanceDB's own exception."""
    from memory_pipeline.errors import StoreError

    monkeypatch.setattr(searcher_mod, "FLAT_MAX_BYTES", 0)
    searcher = MemorySearcher(indexed)
    opts = searcher.options(mode="hybrid", min_score=0.0)
    assert searcher.search("payment retries", opts)
    refused = _refuse_takes(monkeypatch)
    assert searcher.table is not None
    real_search = searcher.table.search

    def failing(*args, **kw):
        if not args and not kw:  # the lookup by chunk id (the legs go through lanceaio)
            raise OSError("connection reset by peer")
        return real_search(*args, **kw)

    monkeypatch.setattr(searcher.table, "search", failing)
    with pytest.raises(StoreError, match="rows could not be read"):
        searcher.search("payment retries", opts)
    assert refused


@pytest.mark.parametrize("in_memory", [True, False])
@pytest.mark.parametrize("min_score", [0.0, 0.3])
def test_a_light_ranking_shows_what_ranking_whole_rows_shows(indexed, monkeypatch, in_memory: bool, min_score: float):
    """``search`` ranks on a few columns (from the in-memory vectors) or none (a table without media
    rows, no recency) and takes the results' whole rows afterwards: the same results, scores and
    relevances as ranking whole rows, identifiers ('shelf 12 bin 3') included, at a pool under
    ``LIGHT_MIN_ROWS`` and one over it; no take reads more rows than are shown."""
    from memory_pipeline.search import lanceaio
    from memory_pipeline.search.folding import query_terms
    from memory_pipeline.search.syntax import parse_query

    if not in_memory:
        monkeypatch.setattr(searcher_mod, "FLAT_MAX_BYTES", 0)
    searcher = MemorySearcher(indexed)
    takes: list[tuple[int, bool]] = []
    real_run = lanceaio.run

    def counting_run(table, queries):
        takes.extend((len(q.row_ids), "text" in q.columns) for q in queries if isinstance(q, lanceaio.Take))
        return real_run(table, queries)

    monkeypatch.setattr(lanceaio, "run", counting_run)
    for max_results in (3, 40):  # pools of 20 and 160 candidates a leg
        opts = searcher.options(mode="hybrid", min_score=min_score, max_results=max_results)
        for q in QUERIES:
            searcher.search(q, opts)  # from the second query on, the vectors are in memory
        assert (searcher._flat is not None) == in_memory
        for q in QUERIES:
            takes.clear()
            shown = [r.to_json() for r in searcher.search(q, opts)]
            light_takes = list(takes)
            terms = parse_query(q).highlight_terms or query_terms(q)
            whole = [searcher._result(c, terms).to_json() for c in searcher.ranked(q, opts)[:max_results]]
            assert shown == whole, q
            text_rows = [n for n, text in light_takes if text]
            if min_score > 0 and "12" in q:
                continue  # abstention reads relevance, whose identifier factor reads every candidate's text
            # Ranking reads the rank columns from memory, or none at all (no media, no recency).
            # (Takes without text: the vectors of the chunks only full text found.)
            assert all(n <= max_results for n in text_rows), (q, light_takes)


def test_a_result_deleted_between_ranking_and_showing_gives_its_place_to_the_next(indexed, tmp_path):
    """A chunk deleted by another process after the ranking, before its row is taken: it is not
    shown, and the next candidate fills the list (no error, no short answer)."""
    import lancedb

    settings = _copy_of(indexed, tmp_path)
    searcher = MemorySearcher(settings)
    opts = searcher.options(mode="hybrid", min_score=0.0, max_results=3)
    searcher.search("payment retries", opts)
    want = searcher.search("payment retries", opts)  # ranked on the in-memory rank columns
    assert searcher._flat is not None and searcher.table is not None and len(want) == 3
    wider = searcher.search("payment retries", searcher.options(mode="hybrid", min_score=0.0, max_results=4))
    real = searcher.materialize
    deleted: list[str] = []

    def deleting(cands):
        if not deleted:
            other = lancedb.connect(settings.lancedb_uri).open_table(searcher.store.table_name)
            other.delete(f"chunk_id = '{want[0].chunk_id}'")
            searcher.table.checkout_latest()
            deleted.append(want[0].chunk_id)
        return real(cands)

    searcher.materialize = deleting  # pyright: ignore[reportAttributeAccessIssue]
    got = searcher.search("payment retries", opts)
    assert deleted
    assert [r.chunk_id for r in got] == [r.chunk_id for r in wider[1:4]]


def test_ties_at_the_cut_go_by_path_when_ranking_read_no_columns(tmp_path):
    """A ranking that read no columns leaves ties of the three scores in any order: the rows of the
    candidates tied with the last one shown are taken too, so the first path wins, as it does when
    ranking whole rows."""
    mem = tmp_path / "mem"
    mem.mkdir()
    note = "# Boiler\n\nThe boiler pressure dropped below one bar; the engineer bled the radiators.\n"
    for name in ("c-copy.md", "a-copy.md", "b-copy.md"):
        (mem / name).write_text(note)
    for i in range(12):
        (mem / f"other-{i:02d}.md").write_text(f"# Day {i}\n\nRoutine entry {i} about the garden and the bike.\n")
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml", provider="local"))
    run_index(settings)
    for max_results in (1, 2, 3):
        searcher = MemorySearcher(settings)  # one query each: no in-memory vectors, ranking reads no columns
        opts = searcher.options(mode="hybrid", min_score=0.0, max_results=max_results)
        got = [Path(r.path).name for r in searcher.search("boiler pressure radiators", opts)]
        assert searcher._flat is None
        assert got == ["a-copy.md", "b-copy.md", "c-copy.md"][:max_results]
        whole = [Path(c.row["path"]).name for c in MemorySearcher(settings).ranked("boiler pressure radiators", opts)[:max_results]]
        assert got == whole


def test_vectors_taken_once_serve_later_queries_unchanged(indexed, monkeypatch):
    """Over a table too large for the in-memory vectors, the full-text hits' vectors are taken from
    the table once: a later query finding the same hits takes none, and answers exactly what a
    fresh searcher (nothing kept) answers."""
    from memory_pipeline.search import lanceaio

    monkeypatch.setattr(searcher_mod, "FLAT_MAX_BYTES", 0)
    monkeypatch.setattr(searcher_mod, "TEXT_INDEX_MAX_ROWS", 0)  # too large for the full-text statistics too: LanceDB's scores each time
    vector_takes = []
    real_run = lanceaio.run

    def counting_run(table, queries):
        vector_takes.extend(q for q in queries if isinstance(q, lanceaio.Take) and "vector" in q.columns)
        return real_run(table, queries)

    monkeypatch.setattr(lanceaio, "run", counting_run)
    kept = MemorySearcher(indexed)
    opts = kept.options(mode="hybrid", min_score=0.0, max_results=8)
    first = {q: kept.search(q, opts) for q in QUERIES}
    assert vector_takes, "the full-text hits' vectors were never taken: the test does not reach the cache"
    assert len(kept._taken_vectors) > 0
    vector_takes.clear()
    again = {q: kept.search(q, opts) for q in QUERIES}
    assert vector_takes == []
    for q in QUERIES:
        fresh = MemorySearcher(indexed).search(q, opts)
        assert _key(again[q]) == _key(first[q]) == _key(fresh)
        assert _scores(again[q]) == _scores(first[q]) == _scores(fresh)


def test_vector_cache_stays_within_its_bytes():
    from memory_pipeline.search.searcher import VectorCache

    cache = VectorCache(max_bytes=10 * 384 * 4)
    big = np.ones((30, 384), dtype=np.float32)
    cache.put_many({f"c{i}": big[i] for i in range(30)})
    assert len(cache) == 10
    assert set(cache.get_many(f"c{i}" for i in range(30))) == {f"c{i}" for i in range(20, 30)}  # the latest kept
    got = cache.get_many(["c25"])["c25"]
    assert got.base is None or got.base is not big  # a copy: the take it came from is not kept alive
    assert not got.flags.writeable


def test_a_searcher_holding_vectors_runs_blas_on_one_thread(indexed):
    """The products over the in-memory vectors are bound by memory: a second BLAS thread only
    spins on the cores the server's other searches need (``_one_blas_thread``)."""
    from threadpoolctl import threadpool_info

    searcher = MemorySearcher(indexed)
    searcher.warm()
    assert searcher._flat is not None
    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    assert blas and all(p["num_threads"] == 1 for p in blas)
