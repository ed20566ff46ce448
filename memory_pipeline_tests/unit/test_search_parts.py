"""Search building blocks without an index: metrics, date and glob prefilters, snippets, terms."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, date, timedelta
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_pipeline.discovery import glob_match
from memory_pipeline.errors import ConfigError
from memory_pipeline.evaluation import load_beir, mrr_at_k, ndcg_at_k, percentile, recall_at_k, score_rankings
from memory_pipeline.search import (
    Candidate,
    SearchFilters,
    _mmr,
    date_range_regex,
    glob_to_rust_regex,
    highlight,
    identifier_factor,
    identifier_terms,
    make_snippet,
    note_date,
    query_terms,
)
from memory_pipeline.settings import settings_from_dict

# --- metrics, by hand -----------------------------------------------------------------------


def test_ndcg_hand_computed():
    # Ranking d3 d1 d2; d1 has grade 2, d2 grade 1, d3 is not relevant.
    rels = {"d1": 2, "d2": 1, "d3": 0}
    dcg = 2 / math.log2(3) + 1 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at_k(["d3", "d1", "d2"], rels, 10) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(["d1", "d2"], rels, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["d3", "d9"], rels, 10) == 0.0
    # Cut at k: the relevant document at rank 2 is outside @1.
    assert ndcg_at_k(["d3", "d1"], rels, 1) == 0.0


def test_recall_and_mrr_hand_computed():
    rels = {"a": 1, "b": 1, "c": 0}
    ranking = ["x", "a", "y", "b"]
    assert recall_at_k(ranking, rels, 2) == 0.5
    assert recall_at_k(ranking, rels, 10) == 1.0
    assert mrr_at_k(ranking, rels, 10) == 0.5
    assert mrr_at_k(["x", "y"], rels, 10) == 0.0
    assert mrr_at_k(["x"] * 10 + ["a"], rels, 10) == 0.0  # first hit at rank 11 is outside @10


def test_score_rankings_averages_judged_queries_only():
    qrels = {"q1": {"a": 1}, "q2": {"b": 2}, "q3": {"c": 0}}  # q3 has no relevant document
    out = score_rankings({"q1": ["a"], "q2": ["x", "b"]}, qrels, [10.0, 20.0, 30.0, 40.0])
    assert out["queries"] == 2
    assert out["ndcg@10"] == pytest.approx(round((1 + (2 / math.log2(3)) / 2) / 2, 4))
    assert out["mrr@10"] == 0.75 and out["recall@10"] == 1.0
    assert out["latency_ms_p50"] == 25.0 and out["latency_ms_p95"] == pytest.approx(38.5)
    assert percentile([], 50) == 0.0


def test_load_beir_reports_bad_lines(tmp_path: Path):
    corpus = tmp_path / "corpus.jsonl"
    queries = tmp_path / "queries.jsonl"
    qrels = tmp_path / "qrels.tsv"
    corpus.write_text('{"_id": "d1", "title": "", "text": "x"}\n{"_id": "d2", "text": "y"}\n')
    queries.write_text('{"_id": "q1", "text": "x"}\n')
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    beir = load_beir(corpus, queries, qrels)
    assert beir.qrels == {"q1": {"d1": 1}} and set(beir.corpus) == {"d1", "d2"}
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\tnope\t1\n")
    with pytest.raises(ConfigError, match="line 2: corpus id 'nope'"):
        load_beir(corpus, queries, qrels)
    corpus.write_text('{"_id": "d1", "text": "x"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        load_beir(corpus, queries, qrels)


@pytest.mark.parametrize(
    ("corpus_text", "qrels_text", "said"),
    [
        # A repeated _id was kept once without a word (three lines read as two documents).
        ('{"_id": "d1", "text": "x"}\n{"_id": "d2", "text": "y"}\n{"_id": "d1", "text": "z"}\n', "q1\td1\t1\n", "line 3: _id 'd1' is already on line 1"),
        # A text of another type became its string ("5", "None").
        ('{"_id": "d1", "text": 5}\n', "q1\td1\t1\n", "line 1: text is int, not a string"),
        ('{"_id": "d1", "text": "x", "title": ["a"]}\n', "q1\td1\t1\n", "line 1: title is list, not a string"),
        # Nothing to measure: every metric printed 0.0000 for "0 judged queries", with exit 0.
        ('{"_id": "d1", "text": "x"}\n', "query-id\tcorpus-id\tscore\n", "no query has a relevant document"),
        ('{"_id": "d1", "text": "x"}\n', "q1\td1\t0\n", "no query has a relevant document"),
    ],
)
def test_load_beir_refuses_what_it_would_misread(tmp_path: Path, corpus_text: str, qrels_text: str, said: str):
    corpus, queries, qrels = tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl", tmp_path / "qrels.tsv"
    corpus.write_text(corpus_text)
    queries.write_text('{"_id": "q1", "text": "x"}\n')
    qrels.write_text(qrels_text)
    with pytest.raises(ConfigError, match=re.escape(said)) as caught:
        load_beir(corpus, queries, qrels)
    assert "configuration file" not in caught.value.hint and "BEIR format" in caught.value.hint
    corpus.write_text('{"_id": "d1", "text": null}\n{"_id": 2, "text": "y"}\n')  # null is an empty text; an int id is its string
    qrels.write_text("q1\t2\t1\n")
    assert load_beir(corpus, queries, qrels).corpus == {"d1": ("", ""), "2": ("", "y")}


# --- prefilters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lo,hi",
    [
        (date(2026, 10, 5), date(2026, 10, 5)),
        (date(2026, 10, 5), date(2026, 12, 3)),
        (date(2025, 11, 30), date(2027, 2, 1)),
        (date(2026, 1, 1), date(2026, 12, 31)),
        (date(2024, 2, 28), date(2024, 3, 1)),
    ],
)
def test_date_range_regex_matches_exactly_the_range(lo: date, hi: date):
    pattern = re.compile("^(" + "|".join(date_range_regex(lo, hi)) + ")$")
    day = lo - timedelta(days=400)
    while day <= hi + timedelta(days=400):
        assert bool(pattern.match(day.isoformat())) == (lo <= day <= hi), day
        day += timedelta(days=1)
    assert len(date_range_regex(lo, hi)) <= 2 * 31 + 2 * 12 + (hi.year - lo.year + 1)


def test_glob_regex_agrees_with_discovery_globs():
    paths = ["memory/2026-10-01.md", "sessions/a.jsonl", "MEMORY.md", "a/b/c.md", "notes-x/y+z.txt", "x.md.bak"]
    globs = ["**/*.md", "memory/*", "*.md", "sessions/**", "**", "notes-x/y+z.txt", "a/**/c.md", "?EMORY.md"]
    for g in globs:
        rx = re.compile(glob_to_rust_regex(g))
        for p in paths:
            assert bool(rx.match(p)) == glob_match(p, g), (g, p)


def test_filters_run_inside_lancedb(tmp_path: Path):
    """The WHERE clause is valid LanceDB SQL and selects what it says, dated and undated."""
    from datetime import datetime

    db = lancedb.connect(str(tmp_path))
    rows = [
        ("memory/2026-10-01.md", "markdown", "mem", datetime(2026, 12, 1, tzinfo=UTC)),
        ("memory/2026-10-20.md", "markdown", "mem", datetime(2026, 12, 1, tzinfo=UTC)),
        ("sessions/2026-11-03-trip.jsonl", "session", "mem", datetime(2026, 12, 1, tzinfo=UTC)),
        ("MEMORY.md", "markdown", "mem", datetime(2026, 10, 15, tzinfo=UTC)),
        ("other/notes.txt", "text", "work", datetime(2026, 9, 1, tzinfo=UTC)),
    ]
    table = db.create_table(
        "t",
        pa.table(
            {
                "path": [r[0] for r in rows],
                "modality": [r[1] for r in rows],
                "source": [r[2] for r in rows],
                "created_at": pa.array([r[3] for r in rows], pa.timestamp("us", tz="UTC")),
            }
        ),
    )

    def paths(**kw) -> set[str]:
        where = SearchFilters(**kw).where()
        return set(table.search().where(where).select(["path"]).limit(100).to_arrow().column("path").to_pylist())

    assert paths(since=date(2026, 10, 10), until=date(2026, 10, 31)) == {"memory/2026-10-20.md", "MEMORY.md"}
    assert paths(since=date(2026, 11, 1)) == {"sessions/2026-11-03-trip.jsonl"}
    assert paths(until=date(2026, 9, 30)) == {"other/notes.txt"}
    assert paths(modality=("session", "text")) == {"sessions/2026-11-03-trip.jsonl", "other/notes.txt"}
    assert paths(source="work") == {"other/notes.txt"}
    assert paths(path_glob="memory/*.md", since=date(2026, 10, 2)) == {"memory/2026-10-20.md"}
    assert paths(source="it's") == set()  # quotes are escaped, not SQL
    with pytest.raises(ConfigError, match="empty"):
        SearchFilters(since=date(2026, 2, 1), until=date(2026, 1, 1)).where()


# --- terms, snippets, ids ---------------------------------------------------------------------


def test_query_terms_fold_stem_and_split_cjk():
    assert query_terms("What did Tomás say about the Café?") == ["tomas", "say", "cafe"]
    assert query_terms("团建预算") == ["团建", "建预", "预算"]
    assert query_terms("deployments") == ["deploymen"]


def test_identifiers_constrain_relevance():
    assert identifier_terms("ERR_PAYMENT_4471 on db-07 (openai==1.47.0)") == ["4471", "07", "47"]
    assert identifier_terms("no ids here") == []
    assert identifier_factor(["4471"], "err_payment_4471 failed") == 1.0
    assert identifier_factor(["9999"], "err_payment_4471 failed") == 0.25
    assert identifier_factor(["4471", "9999"], "4471") == pytest.approx(0.625)


def test_snippet_picks_matching_lines_and_highlights():
    text = "# Title\nintro line\n\nwe chose LanceDB for the bot\nbecause it is embedded\nunrelated tail\nmore tail"
    snippet, first, last, spans = make_snippet(text, query_terms("why LanceDB for the chatbot"), max_lines=2)
    assert first == 3 and last == 4
    assert snippet.startswith("… we chose LanceDB")
    assert highlight(snippet, spans).count("**LanceDB**") == 1
    # Accents are folded for matching but the original text is highlighted.
    snippet, *_rest, spans = make_snippet("Dinner at Café Lumière", query_terms("cafe"))
    assert highlight(snippet, spans, before="[", after="]") == "Dinner at [Café] Lumière"


def test_note_date_from_file_name_else_mtime():
    from datetime import datetime

    assert note_date("memory/2026-10-14.md", None) == date(2026, 10, 14)
    assert note_date("sessions/2026-10-14-deploy.jsonl", None) == date(2026, 10, 14)
    assert note_date("MEMORY.md", datetime(2026, 1, 2, tzinfo=UTC)) == date(2026, 1, 2)
    assert note_date("x/2026-13-45.md", None) is None


def test_mmr_prefers_a_different_note_over_a_near_duplicate():
    base = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    near = np.array([0.99, 0.14, 0.0], dtype=np.float32)
    other = np.array([0.0, 0.0, 1.0], dtype=np.float32)
    cands = [
        Candidate({"text": "a"}, score=0.9, vector=base),
        Candidate({"text": "a2"}, score=0.85, vector=near / np.linalg.norm(near)),
        Candidate({"text": "b"}, score=0.6, vector=other),
    ]
    assert [c.row["text"] for c in _mmr(cands, [], 0.5, limit=3)] == ["a", "b", "a2"]
    assert [c.row["text"] for c in _mmr(cands, [], 1.0, limit=3)] == ["a", "a2", "b"]


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "section,value,key",
    [
        ("query", {"fusion": "max"}, "query.fusion"),
        ("query", {"mmr_lambda": 1.5}, "query.mmr_lambda"),
        ("query", {"recency_half_life_days": -1}, "query.recency_half_life_days"),
        ("query", {"rrf_k": 0}, "query.rrf_k"),
        ("query", {"vector_weight": 0, "text_weight": 0}, "query.vector_weight"),
        ("ann", {"index_type": "HNSW"}, "ann.index_type"),
        ("ann", {"min_rows": 10}, "ann.min_rows"),
        ("fts", {"stem": "yes"}, "fts.stem"),
    ],
)
def test_search_settings_are_validated(tmp_path: Path, section: str, value: dict, key: str):
    raw = {"sources": [{"name": "m", "path": "m"}], section: value}
    with pytest.raises(ConfigError) as err:
        settings_from_dict(raw, base_dir=tmp_path)
    assert err.value.key == key


def test_search_settings_defaults(tmp_path: Path):
    s = settings_from_dict({"sources": [{"name": "m", "path": "m"}]}, base_dir=tmp_path)
    assert (s.query.fusion, s.query.mmr, s.query.recency_half_life_days, s.query.min_score) == ("weighted", False, 0.0, 0.5)
    assert s.ann.min_rows == 50_000 and s.fts.stem is True


def test_mmr_without_vectors_uses_word_overlap():
    cands = [
        Candidate({"text": "kafka consumer lag on payments"}, score=0.9),
        Candidate({"text": "kafka consumer lag on payments again"}, score=0.8),
        Candidate({"text": "boiler pressure topped up"}, score=0.5),
    ]
    assert [c.row["text"][:6] for c in _mmr(cands, [], 0.5, limit=2)] == ["kafka ", "boiler"]


_BEIR_LINE = st.one_of(
    st.text(max_size=80),
    st.builds(
        lambda i, t, title: json.dumps({"_id": i, "text": t, "title": title}),
        st.one_of(st.text(max_size=4), st.integers(), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)),
        st.one_of(st.text(max_size=20), st.none(), st.integers(), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
        st.one_of(st.text(max_size=10), st.none(), st.floats(allow_nan=True)),
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    corpus=st.lists(_BEIR_LINE, max_size=6),
    queries=st.lists(_BEIR_LINE, max_size=4),
    qrels=st.lists(st.text(alphabet="q0d1\t -x", max_size=12), max_size=5),
)
def test_load_beir_answers_any_input_with_a_set_or_one_clear_error(tmp_path: Path, corpus: list[str], queries: list[str], qrels: list[str]):
    """Hostile BEIR files (arbitrary lines, ids and texts of any JSON type, broken qrels): a BeirSet,
    or a ConfigError naming the file, never another exception."""
    paths = {}
    for name, lines in (("corpus.jsonl", corpus), ("queries.jsonl", queries), ("qrels.tsv", qrels)):
        paths[name] = tmp_path / name
        paths[name].write_text("\n".join(line.replace("\n", " ") for line in lines) + "\n", encoding="utf-8", errors="surrogatepass")
    try:
        beir = load_beir(paths["corpus.jsonl"], paths["queries.jsonl"], paths["qrels.tsv"])
    except ConfigError as err:
        assert str(tmp_path) in str(err) and err.hint, err
    else:
        assert beir.corpus and all(isinstance(t, str) and isinstance(x, str) for t, x in beir.corpus.values())
        assert any(score > 0 for rels in beir.qrels.values() for score in rels.values())
