"""The full-text leg in memory (``TextIndex``): a long-lived searcher over a table of at most
``TEXT_INDEX_MAX_ROWS`` chunks scores BM25 itself instead of sending the document-level leg's
queries to LanceDB. It must score what LanceDB's FTS index scores (the same analysis: ICU words,
lower case, long tokens out, Snowball stems, ASCII folding), answer what the LanceDB path answers,
follow the table as it changes, and leave to LanceDB what it cannot reproduce (phrases, prefixes,
required or excluded words, filters, scripts segmented by dictionary). Real LanceDB, real model."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lancedb.query import MatchQuery

import memory_pipeline.search.searcher as searcher_mod
import memory_pipeline.search.textindex as textindex
from memory_pipeline import storage
from memory_pipeline.runner import run_index
from memory_pipeline.search import MemorySearcher
from memory_pipeline.search.filters import SearchFilters
from memory_pipeline.settings import load_settings
from memory_pipeline.stores import generations
from memory_pipeline.stores.lance import DOC_FTS_COLUMN, FTS_COLUMN, VectorStore
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import SEARCH_TOPICS

pytestmark = pytest.mark.slow

# Words whose analysis is not plain: accents and ligatures, apostrophes (straight and curly),
# abbreviations, decimals and thousands, subscripts and superscripts, identifiers with
# underscores, hyphens and colons, stems, full-width letters, emoji, tokens at LanceDB's length
# limit, upper case.
TRICKY = [
    "café", "Naïve", "naive", "Ærø", "œuvre", "Straße", "strasse", "don't", "dont", "l’amour", "l'été", "U.S.A.", "e.g.",
    "3.14", "1,000", "1000", "H₂O₂", "kg/m²", "½", "foo_bar", "mon-03.fra.internal", "ERR_PAYMENT_4471", "ef:gh",
    "ＡＢＣ", "abc", "running", "runners", "ran", "😀", "x" * 39, "y" * 40, "z" * 45, "Zürich", "ZURICH", "déjà-vu",
    "co-operate", "it's", "O'Brien", "v1.2.3", "#42", "$5", "50%", "naïveté", "Ⅻ", "résumé", "RESUME",
    "Kommunikations\u00adwissenschaft", "it‘s", "ΟΔΟΣ", "Ⓐbc", "\u200fשלום\u200f", "zero\u200dwidth", "---", "🙂",
    "2026-05-01", "10:30", "https://example.com/a_b?c=1", "ops@example.com", "src/app/main.py", "#release",
]  # fmt: skip
PLAIN = ["coffee", "budget", "review", "retry", "policy", "shelf", "inventory", "the", "and", "of", "deploy", "rollback"]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(TRICKY if rng.random() < 0.35 else PLAIN) for _ in range(words))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """Notes of several sections (documents of several chunks) of plain and tricky words."""
    root = tmp_path_factory.mktemp("text-index")
    mem = root / "mem"
    mem.mkdir(parents=True)
    rng = random.Random(11)
    for i in range(40):
        sections = [f"# Note {i}", "", _text(rng, rng.randint(5, 40))]
        for j in range(rng.randint(0, 4)):
            sections += ["", f"## Part {j}", "", _text(rng, rng.randint(20, 120))]
        (mem / f"note-{i:02d}.md").write_text("\n".join(sections) + "\n")
    for i, topic in enumerate(SEARCH_TOPICS):
        (mem / f"2026-05-{i + 1:02d}.md").write_text(f"# Day {i}\n\n{topic.capitalize()}.\n\nOther notes of the day {i}.\n")
    settings = load_settings(write_config(root / "memory_pipeline.yaml", provider="local", chunking={"tokens": 64, "overlap": 8}))
    run_index(settings)
    return settings


def _table(settings):
    table = VectorStore(storage.of(settings).lancedb_uri, generations.current(settings)[0]).open()
    assert table is not None
    return table


def _index(settings) -> textindex.TextIndex:
    table = _table(settings)
    fts = settings.fts
    built = textindex.TextIndex.build(
        table, int(table.version), chunk_column=FTS_COLUMN, doc_column=DOC_FTS_COLUMN,
        analyzer=textindex.Analyzer(language=fts.language, stem=fts.stem, ascii_folding=fts.ascii_folding),
    )  # fmt: skip
    assert built is not None
    return built


def _lancedb_scores(table, column: str, query: str) -> dict[str, float]:
    match = MatchQuery(query, column)  # pyright: ignore[reportCallIssue] - lancedb's query models have defaults its stubs hide
    rows = table.search(match, query_type="fts").select(["chunk_id", "_score"]).limit(10_000).to_list()
    return {r["chunk_id"]: float(r["_score"]) for r in rows}


@pytest.fixture(scope="module")
def built(indexed):
    return _index(indexed)


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.sampled_from(TRICKY + PLAIN), min_size=1, max_size=4))
def test_bm25_in_memory_is_lancedbs_score_for_score(indexed, built, words):
    """Every chunk and document LanceDB's index finds for the query, with its score (float32
    rounding apart), and none it does not find: the analysis and the BM25 statistics are the same."""
    table = _table(indexed)
    query = " ".join(words)
    ids = built.term_ids(query)
    assert ids is not None
    for column, scores, rows in (
        (FTS_COLUMN, built.chunk_scores(ids), np.arange(len(built.chunk_ids))),
        (DOC_FTS_COLUMN, built.doc_scores(ids), built.docs.rows),
    ):
        mine = {built.chunk_ids[r]: float(s) for r, s in zip(rows.tolist(), scores.tolist()) if s > 0}
        want = _lancedb_scores(table, column, query)
        assert set(mine) == set(want), (column, query)
        for cid, score in want.items():
            assert mine[cid] == pytest.approx(score, rel=2e-4), (column, query, cid)


def test_a_word_found_nowhere_and_an_unknown_script_are_told_apart(built):
    assert built.term_ids("zzqx") == []  # no term: nothing scores
    assert built.term_ids("会议 budget") is None  # ICU's dictionary segmentation: LanceDB answers


QUERIES = [
    "coffee budget",
    "Naïve café",
    "retry policy",
    "don't",
    "mon-03.fra.internal",
    "the espresso machine",
    "ERR_PAYMENT_4471 inventory",
    "where is the offsite",
]


def _answers(searcher: MemorySearcher, mode: str, queries=QUERIES, **kw) -> dict:
    opts = searcher.options(mode=mode, min_score=0.0, max_results=10, **kw)
    return {q: [(r.path, r.chunk_id, r.line_start, r.score, r.text_score, r.vector_score) for r in searcher.search(q, opts)] for q in queries}


def _same(got: dict, want: dict) -> None:
    """The same results in the same order; the scores LanceDB's up to float rounding, and the fused
    score within 1 % (it is standardised over all candidates, and chunks tied at the candidate
    pool's cut may be kept by one path and not the other: LanceDB's order among ties is its own).
    So two results whose fused scores are that close may come in either order (0.8518 and 0.8516
    on one path, 0.8524 and 0.8523 on the other), and nothing else may differ."""
    for q in want:
        g, w = got[q], want[q]
        assert len(g) == len(w), q
        theirs = {b[:3]: b for b in w}
        for a, b in zip(g, w):
            c = theirs.get(a[:3])
            assert c is not None, (q, a[:3])
            if a[:3] != b[:3]:  # a near-tie swapped: the two it stands for score alike on both paths
                assert c[3] == pytest.approx(b[3], rel=1e-2), (q, a[:3], b[:3])
            assert a[4:] == pytest.approx(c[4:], rel=1e-3, abs=1e-4), q
            assert a[3] == pytest.approx(c[3], rel=1e-2), q


def _warm(searcher: MemorySearcher) -> None:
    searcher.warm()
    assert searcher._text is not None and searcher._text.version == searcher._table_layout()[0]


@pytest.mark.parametrize("mode", ["hybrid", "fts"])
def test_a_long_lived_searcher_answers_what_lancedb_answers(indexed, monkeypatch, mode):
    memory = MemorySearcher(indexed)
    _warm(memory)
    sent: list[int] = []
    real = searcher_mod.doc_text_leg
    monkeypatch.setattr(searcher_mod, "doc_text_leg", lambda *a, **kw: sent.append(1) or real(*a, **kw))
    got = _answers(memory, mode)
    assert sent == []  # not one query of the full-text leg went to LanceDB
    assert all(got.values())
    monkeypatch.setattr(searcher_mod, "TEXT_INDEX_MAX_ROWS", 0)
    lancedb_path = MemorySearcher(indexed)
    want = _answers(lancedb_path, mode)
    assert sent and lancedb_path._text is None
    _same(got, want)


def test_hybrid_runs_the_in_memory_leg_beside_the_query_embedding_and_inline_when_workers_are_busy(indexed, monkeypatch):
    """Hybrid: the in-memory full-text leg runs on the searcher's pool while the query thread embeds
    the query; with every slot taken (a loaded server) the query runs its own, with the same answers;
    full text alone runs it inline (nothing to overlap)."""
    memory = MemorySearcher(indexed)
    _warm(memory)
    threads: list[str] = []
    real = searcher_mod.doc_leg
    monkeypatch.setattr(searcher_mod, "doc_leg", lambda *a, **kw: threads.append(threading.current_thread().name) or real(*a, **kw))
    beside = _answers(memory, "hybrid")
    assert threads and all(t.startswith("memory-fts") for t in threads)
    threads.clear()
    held = 0
    while memory._leg_slots.acquire(blocking=False):
        held += 1
    try:
        inline = _answers(memory, "hybrid")
    finally:
        for _ in range(held):
            memory._leg_slots.release()
    assert held == 2 and threads and all(t == threading.current_thread().name for t in threads)
    _same(inline, beside)
    threads.clear()
    _answers(memory, "fts")
    assert threads and all(t == threading.current_thread().name for t in threads)
    assert memory._leg_slots.acquire(blocking=False) and memory._leg_slots.acquire(blocking=False)  # every slot given back


def test_syntax_and_filters_are_left_to_lancedb(indexed, monkeypatch):
    memory = MemorySearcher(indexed)
    _warm(memory)
    used: list[int] = []
    real = searcher_mod.doc_leg
    monkeypatch.setattr(searcher_mod, "doc_leg", lambda *a, **kw: used.append(1) or real(*a, **kw))
    queries = ['"retry policy"', "retr*", "budget -coffee", "budget AND review", "budget OR coffee"]
    got = _answers(memory, "fts", queries)
    filtered = _answers(memory, "hybrid", ["coffee budget"], filters=SearchFilters(path_glob="2026-*"))
    assert len(used) == 1  # "budget OR coffee" is plain words ranked; the others are LanceDB's
    monkeypatch.setattr(searcher_mod, "TEXT_INDEX_MAX_ROWS", 0)
    plain = MemorySearcher(indexed)
    _same(got, _answers(plain, "fts", queries))
    _same(filtered, _answers(plain, "hybrid", ["coffee budget"], filters=SearchFilters(path_glob="2026-*")))
    assert all("/2026-" in r[0] for r in filtered["coffee budget"])


def _wait_for_index(searcher: MemorySearcher, version: int) -> None:
    for _ in range(200):
        thread = searcher._text_thread
        if searcher._text is not None and searcher._text.version == version:
            return
        if thread is not None:
            thread.join(timeout=0.1)
        else:
            time.sleep(0.05)
    raise AssertionError(f"the full-text statistics were never built ({searcher._text_failed=}, {version=})")


def test_built_from_the_second_query_in_the_background_and_never_by_a_one_query_searcher(indexed):
    once = MemorySearcher(indexed)
    assert once.search("coffee budget", once.options(mode="fts"))
    assert once._text is None and once._text_thread is None
    twice = MemorySearcher(indexed)
    opts = twice.options(mode="fts", min_score=0.0)
    twice.search("coffee budget", opts)
    twice.search("retry policy", opts)  # starts the build; this query still asks LanceDB
    _wait_for_index(twice, twice._table_layout()[0])


def test_the_index_follows_the_table_and_reads_only_new_texts(tmp_path, monkeypatch):
    root = tmp_path
    (root / "mem").mkdir()
    for i, topic in enumerate(SEARCH_TOPICS):
        (root / "mem" / f"2026-05-{i + 1:02d}.md").write_text(f"# Day {i}\n\n{topic.capitalize()}.\n\nOther notes of the day {i}.\n")
    settings = load_settings(write_config(root / "memory_pipeline.yaml", provider="none"))
    run_index(settings)
    searcher = MemorySearcher(settings)
    _warm(searcher)
    before = searcher._text
    assert before is not None
    (root / "mem" / "2026-06-01.md").write_text("# Holiday\n\nWe booked a snorkeling trip to the coral reef.\n")
    (root / "mem" / "2026-05-01.md").unlink()
    run_index(settings)
    assert searcher.table is not None
    searcher.table.checkout_latest()
    version = searcher._table_layout()[0]
    assert version != before.version
    encoded: list[str] = []
    real = textindex.EncodeCache.encode

    def encode(self, text):
        if (hash(text), len(text)) not in self._enc:
            encoded.append(text)
        return real(self, text)

    monkeypatch.setattr(textindex.EncodeCache, "encode", encode)
    opts = searcher.options(mode="fts", min_score=0.0)
    first = searcher.search("snorkeling coral", opts)  # the new version's first query: LanceDB (the old index is not this version's)
    searcher.search("snorkeling coral", opts)
    _wait_for_index(searcher, version)
    assert [Path(r.path).name for r in first][:1] == ["2026-06-01.md"]
    assert [Path(r.path).name for r in searcher.search("snorkeling coral", opts)][:1] == ["2026-06-01.md"]
    assert not any(Path(r.path).name == "2026-05-01.md" for r in searcher.search("espresso descaling", opts))
    # Only the new file's texts were analysed again (its chunk and its document text).
    assert encoded and all("snorkeling" in t for t in encoded)


def test_a_table_in_a_dictionary_script_is_left_to_lancedb(tmp_path):
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "zh.md").write_text("# 会议\n\n团建预算已经批准了。\n")
    (mem / "en.md").write_text("# Budget\n\nThe offsite budget was approved.\n")
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml", provider="none"))
    run_index(settings)
    searcher = MemorySearcher(settings)
    searcher.warm()
    assert searcher._text is None and searcher._text_failed == searcher._table_layout()[0]
    opts = searcher.options(mode="fts", min_score=0.0)
    assert [Path(r.path).name for r in searcher.search("budget approved", opts)][:1] == ["en.md"]
    assert [Path(r.path).name for r in searcher.search("团建预算", opts)][:1] == ["zh.md"]


def test_rows_without_a_token_count_for_nothing(tmp_path):
    """Empty rows and rows of punctuation or emoji only are left out of BM25's N and average length,
    as LanceDB leaves them out (a chunk row carries an empty document text)."""
    import lancedb
    import pyarrow as pa
    from lancedb.index import FTS

    texts = ["alpha beta gamma delta", "alpha zeta", "", "--- 🙂", "beta"]
    table = lancedb.connect(str(tmp_path)).create_table(
        "t", pa.table({"chunk_id": [f"c{i}" for i in range(5)], "doc_id": [f"d{i}" for i in range(5)], FTS_COLUMN: texts, DOC_FTS_COLUMN: texts})
    )
    for column in (FTS_COLUMN, DOC_FTS_COLUMN):
        table.create_index(
            column, config=FTS(with_position=True, base_tokenizer="icu", language="English", stem=True, remove_stop_words=False, ascii_folding=True)
        )
    index = textindex.TextIndex.build(table, int(table.version), chunk_column=FTS_COLUMN, doc_column=DOC_FTS_COLUMN, analyzer=textindex.Analyzer())
    assert index is not None
    for query in ("alpha", "beta", "zeta gamma"):
        ids = index.term_ids(query)
        assert ids is not None
        scores = index.chunk_scores(ids)
        mine = {index.chunk_ids[i]: float(s) for i, s in enumerate(scores.tolist()) if s > 0}
        want = _lancedb_scores(table, FTS_COLUMN, query)
        assert set(mine) == set(want) and all(mine[c] == pytest.approx(w, rel=2e-4) for c, w in want.items()), query
