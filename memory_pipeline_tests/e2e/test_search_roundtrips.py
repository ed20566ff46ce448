"""The searcher's LanceDB round trips: queries batched on the table's asynchronous handle answer
what the synchronous builders answer, a failing query of a batch is reported as its own, the legs
read ids and the kept rows are taken once, the vector hits' document scores are measured while
the full-text leg runs, and an ANN query re-ranks a bounded number of candidates."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lancedb.index import FTS
from lancedb.query import MatchQuery, PhraseQuery

import memory_pipeline.search.fulltext as fulltext
import memory_pipeline.search.searcher as searcher_mod
from memory_pipeline.errors import FullTextUnavailable
from memory_pipeline.runner import run_index
from memory_pipeline.search import MemorySearcher, lanceaio
from memory_pipeline.search.folding import fold, fold_with_map
from memory_pipeline.search.lanceaio import TextQuery, VectorQuery
from memory_pipeline.settings import load_settings
from memory_pipeline.stores.lance import DOC_FTS_COLUMN, FTS_COLUMN, ann_query
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import SEARCH_TOPICS

TOPICS = SEARCH_TOPICS[:6]
QUERIES = ["espresso descaling", "billing retry backoff", "stale inventory shelf", "slow regex consumer", "certificate rotation rollback", "budget"]


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """Notes of several sections, so a document has several chunks (the document-level leg)."""
    root = tmp_path_factory.mktemp("roundtrips")
    mem = root / "mem"
    mem.mkdir()
    for i, topic in enumerate(TOPICS):
        sections = "\n\n".join(f"## Part {j}\n\n{topic if j == i % 3 else 'Routine work on the day, nothing to add.'} Entry {j}." for j in range(4))
        (mem / f"2026-05-{i + 1:02d}.md").write_text(f"# Day {i}\n\n{sections}\n")
    for i in range(60):  # more chunks than a query's candidate pool: some full-text hits are not vector hits
        (mem / f"log-{i:02d}.md").write_text(f"Log {i}: checked shelf {i % 7}, the espresso stock and the budget sheet; regex {i % 5}.\n")
    settings = load_settings(write_config(root / "memory_pipeline.yaml", provider="local", chunking={"tokens": 32, "overlap": 0}))
    run_index(settings)
    return settings


class _SyncOnly:
    """The same table seen through its synchronous builders only (no asynchronous handle)."""

    def __init__(self, table) -> None:
        self.search = table.search


def _ids_scores(t: pa.Table, key: str) -> tuple[list, list]:
    score = "_score" if "_score" in t.column_names else "_distance"
    return t.column(key).to_pylist(), t.column(score).to_pylist()


def test_a_batch_on_the_async_handle_answers_what_the_sync_builders_answer(indexed):
    searcher = MemorySearcher(indexed)
    table, provider = searcher.table, searcher.provider
    assert table is not None and provider is not None
    assert lanceaio.async_handle(table) is not None
    qvec = provider.embed_query("payment retries")
    queries = [
        TextQuery(MatchQuery("espresso", DOC_FTS_COLUMN), DOC_FTS_COLUMN, ["doc_id", "_score"], 5),  # pyright: ignore[reportCallIssue]
        TextQuery(MatchQuery("retry backoff", FTS_COLUMN), FTS_COLUMN, ["chunk_id", "_score"], 10),  # pyright: ignore[reportCallIssue]
        TextQuery("regex parser", FTS_COLUMN, ["chunk_id", "_score"], 10, "chunk_index < 2"),
        TextQuery(MatchQuery("budget", FTS_COLUMN), FTS_COLUMN, ["chunk_id", "_score"], 1),  # pyright: ignore[reportCallIssue]
        VectorQuery(qvec, "vector", ["chunk_id", "_distance"], 7),
        VectorQuery(qvec, "vector", ["chunk_id", "_distance"], 7, "chunk_index = 0", indexed.ann),
    ]
    fast = lanceaio.run(table, queries)
    slow = lanceaio.run(_SyncOnly(table), queries)
    assert len(fast) == len(slow) == len(queries)
    for q, a, b in zip(queries, fast, slow):
        key = "doc_id" if "doc_id" in q.columns else "chunk_id"
        (ids_a, sc_a), (ids_b, sc_b) = _ids_scores(a, key), _ids_scores(b, key)
        assert ids_a == ids_b and ids_a, q
        np.testing.assert_allclose(sc_a, sc_b, rtol=1e-6)


def _fts_table(tmp_path: Path):
    table = lancedb.connect(str(tmp_path)).create_table(
        "t", pa.table({"id": ["a", "b"], "search_text": ["duty manager on call", "manager of the duty roster"]})
    )
    table.create_index("search_text", config=FTS(with_position=False, remove_stop_words=False), replace=True)
    return table


@pytest.mark.parametrize("sync", [False, True])
def test_a_failing_query_of_a_batch_is_reported_as_its_own(tmp_path: Path, sync: bool):
    """A phrase needs positions: the batch fails with that query's reason, wherever it stands."""
    table = _fts_table(tmp_path)
    view = _Translating(table) if sync else table
    ok = TextQuery(MatchQuery("manager", "search_text"), "search_text", ["id", "_score"], 5)  # pyright: ignore[reportCallIssue]
    phrase = TextQuery(PhraseQuery("duty manager", "search_text"), "search_text", ["id", "_score"], 5)  # pyright: ignore[reportCallIssue]
    assert [len(rows) for rows in fulltext.fts_batch(view, [ok, ok])] == [2, 2]
    for batch in ([ok, phrase], [phrase, ok]):
        with pytest.raises(FullTextUnavailable, match="positions"):
            fulltext.fts_batch(view, batch)


class _Translating(_SyncOnly):
    """A sync-only view that still answers the questions error translation asks of a table."""

    def __init__(self, table) -> None:
        super().__init__(table)
        self.schema = table.schema
        self.list_indices = table.list_indices


@pytest.mark.parametrize("in_memory", [True, False])
def test_hybrid_reads_ids_takes_the_kept_rows_once_and_measures_vector_hits_meanwhile(indexed, monkeypatch, in_memory: bool):
    """Both legs read ids and scores; the rows kept, with the vectors of the full-text-only
    chunks, are one take by row id (no lookup by chunk id), and the vector hits'
    whole-document scores are one query sent before the full-text leg is awaited. The results
    are those of legs that read whole rows, look the vectors up and measure the vector hits'
    document scores afterwards, score for score, in every mode."""
    if not in_memory:  # every query's vector leg is LanceDB's (ids and distances only)
        monkeypatch.setattr(searcher_mod, "FLAT_MAX_BYTES", 0)
    # The full-text leg's round trips to LanceDB (``TextIndex``, which sends none, is test_search_text_index.py's).
    monkeypatch.setattr(searcher_mod, "TEXT_INDEX_MAX_ROWS", 0)
    searcher = MemorySearcher(indexed)
    assert searcher._table_layout()[2]  # every document has its document text
    lookups: list[int] = []
    real_vectors_of = MemorySearcher._vectors_of
    monkeypatch.setattr(MemorySearcher, "_vectors_of", lambda self, ids, version: lookups.append(len(ids)) or real_vectors_of(self, ids, version))
    takes: list[int] = []
    real_run = lanceaio.run

    def counting_run(table, queries):
        takes.extend(len(q.row_ids) for q in queries if isinstance(q, lanceaio.Take))
        return real_run(table, queries)

    monkeypatch.setattr(lanceaio, "run", counting_run)
    completions: list[int] = []
    real_complete = fulltext.TextLeg.complete

    def complete(self, doc_ids, **kw):
        real = self._completer
        if real is not None:
            self._completer = lambda docs: completions.append(len(docs)) or real(docs)
        return real_complete(self, doc_ids, **kw)

    monkeypatch.setattr(fulltext.TextLeg, "complete", complete)

    def answers(s: MemorySearcher, mode: str) -> dict:
        opts = s.options(mode=mode, min_score=0.0, max_results=8)
        return {q: [(r.chunk_id, r.score, r.vector_score, r.text_score, r.snippet, r.path) for r in s.search(q, opts)] for q in QUERIES}

    got = {mode: answers(searcher, mode) for mode in ("hybrid", "fts", "vector")}
    assert (searcher._flat is not None) == in_memory
    assert lookups == [] and completions == [] and takes
    assert all(got["hybrid"].values())

    # The other way: whole rows from the legs, no document query shared with the leg (so no
    # early scores), the full-text-only chunks' vectors looked up by chunk id.
    monkeypatch.setattr(searcher_mod, "_IDS", list(searcher_mod._COLUMNS))
    monkeypatch.setattr(MemorySearcher, "_doc_query", lambda self, parsed, layout: None)
    real_full_rows = MemorySearcher._full_rows
    monkeypatch.setattr(MemorySearcher, "_full_rows", lambda self, cands, ids, *args: real_full_rows(self, cands, [], *args))
    monkeypatch.setattr(MemorySearcher, "_vectors_taken", lambda self, cands, ids, version: {})
    takes.clear()
    other = MemorySearcher(indexed)
    for mode in ("hybrid", "fts", "vector"):
        want = answers(other, mode)
        for q in QUERIES:
            assert [w[0] for w in want[q]] == [g[0] for g in got[mode][q]], (mode, q)
            assert [w[4:] for w in want[q]] == [g[4:] for g in got[mode][q]], (mode, q)
            np.testing.assert_allclose([w[1:4] for w in want[q]], [g[1:4] for g in got[mode][q]], atol=1e-6)
    assert completions and lookups  # that path did all of it the long way
    assert bool(takes) == in_memory  # (the in-memory vectors' hits are ids, taken either way)


def test_rows_taken_after_the_table_moved_on_are_looked_up_or_dropped(tmp_path: Path, monkeypatch):
    """A server's threads share one table handle, moved to the latest version between the legs
    and the take: chunks deleted meanwhile are not results (no error), and the others, whose
    row ids compaction changed, are found by chunk id with the same leg scores (the fused score
    is standardized over the candidates, so it follows the smaller pool)."""
    mem = tmp_path / "mem"
    mem.mkdir()
    for i, topic in enumerate(TOPICS):
        (mem / f"2026-05-{i + 1:02d}.md").write_text(f"# Day {i}\n\n{topic}.\n")
    for i in range(40):
        (mem / f"log-{i:02d}.md").write_text(f"Log {i}: the espresso stock and the budget sheet were checked, shelf {i % 7}.\n")
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml", provider="local"))
    run_index(settings)
    monkeypatch.setattr(searcher_mod, "FLAT_MAX_BYTES", 0)
    searcher = MemorySearcher(settings)
    assert searcher.table is not None
    opts = searcher.options(mode="hybrid", min_score=0.0, max_results=60)
    before = {r.chunk_id: (r.path, r.vector_score, r.text_score) for r in searcher.search("espresso budget review", opts)}
    gone = {c for c, (path, _, _) in before.items() if Path(path).name.startswith("log-")}
    assert gone and len(gone) < len(before)
    real_run = lanceaio.run
    moved: list[int] = []

    def moving_run(table, queries):
        if any(isinstance(q, lanceaio.Take) for q in queries) and not moved:
            other = lancedb.connect(settings.lancedb_uri).open_table(searcher.store.table_name)
            other.delete("path LIKE '%log-%'")
            other.optimize()  # most rows deleted: the fragment is rewritten, row ids change
            table.checkout_latest()
            moved.append(table.version)
        return real_run(table, queries)

    monkeypatch.setattr(lanceaio, "run", moving_run)
    after = {r.chunk_id: (r.path, r.vector_score, r.text_score) for r in searcher.search("espresso budget review", opts)}
    assert moved
    assert after == {c: v for c, v in before.items() if c not in gone}


def test_an_ann_query_re_ranks_as_many_candidates_as_ten_results_would(indexed):
    table = MemorySearcher(indexed).table
    assert table is not None
    ann = replace(indexed.ann, refine_factor=20)

    def factor(limit):
        return ann_query(table.search(np.zeros(384, np.float32)), ann, limit).to_query_object().refine_factor

    assert factor(None) == 20 and factor(6) == 20 and factor(10) == 20
    assert factor(24) == 9 and 24 * factor(24) >= 200  # never fewer than refine_factor x 10
    assert factor(60) == 4 and factor(1000) == 1
    assert ann_query(table.search(np.zeros(384, np.float32)), replace(ann, refine_factor=0), 24).to_query_object().refine_factor is None


@given(st.text(max_size=300))
def test_fold_with_map_folds_like_fold_and_maps_every_character_to_its_source(text: str):
    folded, origin = fold_with_map(text)
    assert len(origin) == len(folded)
    assert origin == sorted(origin) and all(0 <= i < len(text) for i in origin)
    for i in set(origin):
        assert "".join(c for c, o in zip(folded, origin) if o == i) == fold(text[i])
    if text.isascii():
        assert folded == fold(text) and origin == list(range(len(text)))


def test_a_hybrid_query_costs_the_same_round_trips_whatever_its_length(indexed, monkeypatch):
    """The document-level leg's per-word queries share one round trip with the summed query: a
    query of eight new words costs LanceDB as many round trips as one of two (batch, chunk query,
    vector leg, the vector hits' document scores, the full-text hits' vectors, the shown rows),
    and more queries only inside them."""
    monkeypatch.setattr(searcher_mod, "FLAT_MAX_BYTES", 0)
    trips: list[int] = []
    real_run = lanceaio.run

    def counting_run(table, queries):
        trips.append(len(queries))
        return real_run(table, queries)

    monkeypatch.setattr(lanceaio, "run", counting_run)
    counts = {}
    for query in ("espresso budget", "espresso budget descaling retry backoff inventory regex certificate"):
        searcher = MemorySearcher(indexed)  # no word's best score known yet
        opts = searcher.options(mode="hybrid", min_score=0.0)
        trips.clear()
        assert searcher.search(query, opts)
        counts[query] = (len(trips), sum(trips))
    again = len(trips), sum(trips)
    trips.clear()
    assert searcher.search("espresso budget descaling retry backoff inventory regex certificate", opts)
    # Asked again: no best-score query at all, and no take of the full-text hits' vectors (the
    # searcher keeps vectors it took: ``VectorCache``).
    assert (len(trips), sum(trips)) == (again[0] - 1, again[1] - 8 - 1)
    (short_trips, short_queries), (long_trips, long_queries) = counts.values()
    assert short_trips == long_trips == 6
    assert long_queries == short_queries + 6  # one best-score query per further word, in the same trip
