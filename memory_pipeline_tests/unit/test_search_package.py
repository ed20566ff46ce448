"""The search package's parts without an index: fusion strategies, SQL prefilters, path globs,
and the full-text leg's failures typed (pinned against the real LanceDB)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

import lancedb
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from lancedb.index import FTS

from memory_pipeline.errors import ConfigError, FullTextUnavailable, SearchError
from memory_pipeline.globs import compile_glob, glob_match, glob_regex, glob_to_rust_regex
from memory_pipeline.search import (
    FUSION_STRATEGIES,
    RRFFusion,
    SearchFilters,
    WeightedFusion,
    fts_rows,
    fusion_for,
    is_phrase_query,
)
from memory_pipeline.settings import FUSIONS, QueryConfig


@dataclass
class _C:
    sv: float
    st: float
    relevance: float = 0.0


# --- fusion -----------------------------------------------------------------------------------

K = 60
_RRF_CASES = [
    # (vector weight, text weight, candidates (sv, st), expected scores)
    pytest.param(0.7, 0.3, [(0.9, 0.5)], [1.0], id="first-in-both-legs-is-1"),
    pytest.param(
        0.7, 0.3, [(0.9, 0.1), (0.5, 0.8), (0.0, 0.3)],
        [(0.7 / 61 + 0.3 / 63) / (1 / 61), (0.7 / 62 + 0.3 / 61) / (1 / 61), (0.3 / 62) / (1 / 61)],
        id="hand-computed",
    ),
    pytest.param(0.5, 0.5, [(0.0, 0.0), (0.4, 0.0)], [0.0, (0.5 / 61) / (1 / 61)], id="no-score-no-share"),
    pytest.param(0.5, 0.5, [(0.6, 0.2), (0.6, 0.2)], [1.0, (0.5 / 62 + 0.5 / 62) / (1 / 61)], id="ties-keep-input-order"),
    pytest.param(0.0, 0.0, [(0.9, 0.9)], [0.0], id="zero-weights"),
    pytest.param(1.0, 0.0, [(0.2, 0.9), (0.8, 0.1)], [(1 / 62) / (1 / 61), 1.0], id="vector-only-weight"),
]  # fmt: skip


@pytest.mark.parametrize("wv, wt, legs, expected", _RRF_CASES)
def test_rrf_fusion(wv: float, wt: float, legs: list[tuple[float, float]], expected: list[float]):
    got = RRFFusion(vector_weight=wv, text_weight=wt, k=K).scores([_C(sv, st) for sv, st in legs])
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert math.isclose(g, e, rel_tol=1e-12, abs_tol=1e-15), (got, expected)
        assert 0.0 <= g <= 1.0


def _phi(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


@pytest.mark.parametrize(
    "wv, wt, legs, expected",
    [
        pytest.param(0.5, 0.5, [], [], id="empty"),
        pytest.param(0.5, 0.5, [(0.9, 0.1)], [0.5], id="one-candidate-is-average"),
        # sv z-scores (-1, 1), st z-scores (1, -1): equal weights cancel, the vector leg decides at 0.7.
        pytest.param(0.5, 0.5, [(0.2, 0.8), (0.4, 0.1)], [0.5, 0.5], id="equal-weights-cancel"),
        pytest.param(0.7, 0.3, [(0.2, 0.8), (0.4, 0.1)], [_phi(-0.4), _phi(0.4)], id="hand-computed"),
        pytest.param(0.5, 0.5, [(0.3, 0.0), (0.3, 0.6)], [_phi(-0.5), _phi(0.5)], id="a-flat-leg-does-not-vote"),
        pytest.param(0.0, 0.0, [(0.3, 0.1)], [0.0], id="zero-weights"),
    ],
)
def test_weighted_fusion_standardizes_each_leg(wv, wt, legs, expected):
    got = WeightedFusion(vector_weight=wv, text_weight=wt).scores([_C(sv, st_) for sv, st_ in legs])
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert math.isclose(g, e, abs_tol=1e-12), (got, expected)
    assert all(0.0 <= g <= 1.0 for g in got)


def test_weighted_fusion_is_scale_free():
    """Multiplying a leg's scores (another model's cosine range) does not change the order."""
    cands = [_C(0.31, 0.2), _C(0.35, 0.9), _C(0.28, 0.5), _C(0.40, 0.0)]
    scaled = [_C(c.sv * 2.2, c.st) for c in cands]
    assert WeightedFusion().scores(cands) == pytest.approx(WeightedFusion().scores(scaled))


@pytest.mark.parametrize(
    "name, query, expected",
    [
        ("weighted", QueryConfig(), WeightedFusion(vector_weight=QueryConfig().vector_weight, text_weight=QueryConfig().text_weight)),
        ("rrf", QueryConfig(), RRFFusion(vector_weight=0.5, text_weight=0.5, k=60)),
        ("rrf", QueryConfig(vector_weight=0.2, text_weight=0.8, rrf_k=5), RRFFusion(vector_weight=0.2, text_weight=0.8, k=5)),
    ],
)
def test_fusion_is_chosen_by_name_with_knobs_from_settings(name: str, query: QueryConfig, expected):
    got = fusion_for(name, query)
    assert got == expected and got.name == name


def test_every_configurable_fusion_has_a_strategy():
    assert tuple(FUSION_STRATEGIES) == FUSIONS
    with pytest.raises(ConfigError, match="fusion must be one of weighted, rrf"):
        fusion_for("borda", QueryConfig())


# --- path globs -------------------------------------------------------------------------------

_GLOB_CASES = [
    # (glob, path, matches)
    ("**/*.md", "MEMORY.md", True),
    ("**/*.md", "memory/2026-10-01.md", True),
    ("**/*.md", "a/b/c.md", True),
    ("**/*.md", "x.md.bak", False),
    ("*.md", "MEMORY.md", True),
    ("*.md", "memory/a.md", False),
    ("memory/*", "memory/a.md", True),
    ("memory/*", "memory/sub/a.md", False),
    ("memory/**", "memory/sub/a.md", True),
    ("memory/**", "memoryx/a.md", False),
    ("**", "anything/at/all", True),
    ("a/**/c.md", "a/c.md", True),
    ("a/**/c.md", "a/b/d/c.md", True),
    ("a/**/c.md", "ab/c.md", False),
    ("?EMORY.md", "MEMORY.md", True),
    ("?EMORY.md", "/EMORY.md", False),
    ("notes-x/y+z.txt", "notes-x/y+z.txt", True),
    ("notes-x/y+z.txt", "notes-x/yyz.txt", False),
    ("a.md", "aXmd", False),  # a dot is literal
    ("(x)|[y]{2}^$#&~\\.md", "(x)|[y]{2}^$#&~\\.md", True),  # every metacharacter literal
    ("my notes/*.md", "my notes/café.md", True),
    ("*.MD", "a.md", False),  # case-sensitive
    ("*.md", "a.md\n", False),  # the end is the end, not before a newline
    ("projects/", "projects/", True),  # a folder prefix (discovery prunes folders with "rel/")
    ("**/*.md", "odd\nfolder/note.md", True),  # a newline in a folder name: ** spans it
    ("notes/**", "notes/a\nb.md", True),
]  # fmt: skip


@pytest.mark.parametrize("glob, path, expected", _GLOB_CASES)
def test_glob_match_in_python(glob: str, path: str, expected: bool):
    assert glob_match(path, glob) is expected


def test_python_and_lancedb_select_the_same_paths(tmp_path: Path):
    """The Rust regex LanceDB runs selects exactly what the Python regex does, case by case."""
    paths = sorted({p for _, p, _ in _GLOB_CASES})
    table = lancedb.connect(str(tmp_path)).create_table("t", pa.table({"path": paths}))
    for glob in sorted({g for g, _, _ in _GLOB_CASES}):
        where = "regexp_like(path, '" + glob_to_rust_regex(glob).replace("'", "''") + "')"
        in_lance = set(table.search().where(where).select(["path"]).limit(100).to_arrow().column("path").to_pylist())
        in_python = {p for p in paths if glob_match(p, glob)}
        assert in_lance == in_python, glob


@pytest.mark.parametrize(
    "glob, rust",
    [
        ("**/*.md", r"(?s)^(.*/)?[^/]*\.md$"),
        ("memory/**", r"(?s)^memory/.*$"),
        ("?a-b", r"(?s)^[^/]a\-b$"),
    ],
)
def test_glob_translations(glob: str, rust: str):
    assert glob_to_rust_regex(glob) == rust
    assert glob_regex(glob) == rust[5:-1]
    assert compile_glob(glob).pattern == rust[5:-1] + r"\Z"


# --- SQL prefilters ---------------------------------------------------------------------------

_FILTER_CASES = [
    # (filters, the paths selected)
    (SearchFilters(), {"memory/2026-10-01.md", "memory/2026-10-20.md", "photos/receipt.png", "MEMORY.md", "work/it's.txt"}),
    (SearchFilters(source="work"), {"work/it's.txt"}),
    (SearchFilters(source="it's"), set()),
    (SearchFilters(modality=("image",)), {"photos/receipt.png"}),
    (SearchFilters(modality=("image", "text")), {"photos/receipt.png", "work/it's.txt"}),
    (SearchFilters(types=("image",)), {"photos/receipt.png"}),
    (SearchFilters(types=("text",)), {"memory/2026-10-01.md", "memory/2026-10-20.md", "MEMORY.md", "work/it's.txt"}),
    (SearchFilters(types=("image", "text")), {"memory/2026-10-01.md", "memory/2026-10-20.md", "photos/receipt.png", "MEMORY.md", "work/it's.txt"}),
    (SearchFilters(path_glob="memory/*.md"), {"memory/2026-10-01.md", "memory/2026-10-20.md"}),
    (SearchFilters(path_glob="**/it's.txt"), {"work/it's.txt"}),
    (SearchFilters(since=date(2026, 10, 10)), {"memory/2026-10-20.md", "MEMORY.md", "photos/receipt.png"}),
    (SearchFilters(until=date(2026, 10, 1)), {"memory/2026-10-01.md", "work/it's.txt"}),
    (SearchFilters(since=date(2026, 10, 20), until=date(2026, 10, 20)), {"memory/2026-10-20.md"}),
    (SearchFilters(source="mem", path_glob="memory/**", since=date(2026, 10, 2)), {"memory/2026-10-20.md"}),
]  # fmt: skip


@pytest.fixture(scope="module")
def filter_table(tmp_path_factory):
    rows = [
        # path, source, modality, memory_type, mtime
        ("memory/2026-10-01.md", "mem", "markdown", "text", datetime(2026, 12, 1, tzinfo=UTC)),
        ("memory/2026-10-20.md", "mem", "markdown", "text", datetime(2026, 12, 1, tzinfo=UTC)),
        ("photos/receipt.png", "mem", "image", "image", datetime(2026, 11, 5, tzinfo=UTC)),
        ("MEMORY.md", "mem", "markdown", "text", datetime(2026, 10, 15, tzinfo=UTC)),
        ("work/it's.txt", "work", "text", "text", datetime(2026, 9, 1, tzinfo=UTC)),
    ]
    cols = ("path", "source", "modality", "memory_type")
    data = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
    data["created_at"] = pa.array([r[4] for r in rows], pa.timestamp("us", tz="UTC"))
    return lancedb.connect(str(tmp_path_factory.mktemp("filters"))).create_table("t", pa.table(data))


@pytest.mark.parametrize("filters, expected", _FILTER_CASES)
def test_filters_select_inside_lancedb(filter_table, filters: SearchFilters, expected: set[str]):
    q = filter_table.search()
    where = filters.where()
    if where:
        q = q.where(where)
    assert set(q.select(["path"]).limit(100).to_arrow().column("path").to_pylist()) == expected


@pytest.mark.parametrize(
    "filters, message",
    [
        (SearchFilters(types=("photo",)), "--type must be one of"),
        (SearchFilters(since=date(2026, 2, 1), until=date(2026, 1, 1)), "empty"),
    ],
)
def test_bad_filters_are_config_errors(filters: SearchFilters, message: str):
    with pytest.raises(ConfigError, match=message):
        filters.where()


# --- the full-text leg: what LanceDB raises, typed --------------------------------------------

_DOCS = ["hello world ERR_PAYMENT_4471", "deploy notes for mon-03.fra.internal", "团建预算 café"]
_ODD_QUERIES = ['"unbalanced', "a AND", "(", "*", "!!!", "hello)", "foo:bar", "NOT", "\\", '"', '"hello']


def _fts_table(tmp_path: Path, *, index: bool, positions: bool = False):
    table = lancedb.connect(str(tmp_path)).create_table("t", pa.table({"id": ["a", "b", "c"], "search_text": _DOCS}))
    if index:
        config = FTS(base_tokenizer="icu", with_position=positions, remove_stop_words=False, ascii_folding=True)
        table.create_index("search_text", config=config, replace=True)
    return table


def _ids(table, query: str, where: str | None = None, column: str = "search_text") -> list[str]:
    return [r["id"] for r in fts_rows(table, query, column=column, where=where, limit=10, columns=["id", "_score"])]


@pytest.mark.parametrize("index, positions", [(False, False), (True, False), (True, True)])
def test_odd_syntax_and_a_missing_index_are_no_errors(tmp_path: Path, index: bool, positions: bool):
    table = _fts_table(tmp_path, index=index, positions=positions)
    assert _ids(table, "hello") == ["a"]
    assert _ids(table, "mon-03.fra.internal") == ["b"]
    for query in _ODD_QUERIES:
        assert isinstance(_ids(table, query), list), query


@pytest.mark.parametrize(
    "index, positions, phrase_ok",
    [(False, False, True), (True, True, True), (True, False, False)],
)
def test_a_phrase_needs_positions_or_no_index(tmp_path: Path, index: bool, positions: bool, phrase_ok: bool):
    table = _fts_table(tmp_path, index=index, positions=positions)
    if phrase_ok:
        assert _ids(table, '"hello world"') == ["a"]
    else:
        with pytest.raises(FullTextUnavailable, match="positions") as info:
            _ids(table, '"hello world"')
        assert isinstance(info.value.__cause__, ValueError) and info.value.query == '"hello world"'
    assert _ids(table, 'say "hello world" now') == ["a"]  # quotes inside: words, never a phrase


def test_other_failures_are_search_errors_not_swallowed(tmp_path: Path):
    table = _fts_table(tmp_path, index=True)
    with pytest.raises(SearchError) as info:
        _ids(table, "hello", where="no_such_column = 1")
    assert not isinstance(info.value, FullTextUnavailable)
    with pytest.raises(FullTextUnavailable, match="no full-text column"):
        _ids(table, "hello", column="no_such_column")


@pytest.mark.parametrize(
    "query, phrase",
    [('"a b"', True), ('""', True), ('"x"', True), ('"', False), ('"a b', False), ('a "b c"', False), ('"a" b', False), ("a", False)],
)
def test_is_phrase_query(query: str, phrase: bool):
    assert is_phrase_query(query) is phrase


# --- one match query for the words of a query ------------------------------------------------

_WORDS = "deploy deployed deploying notes billing retry policy mon-03.fra.internal ERR_PAYMENT_4471 café cafe the a of priya running runs"


@pytest.mark.parametrize(
    "query",
    [
        "deploy deployed",
        "deploy deploy billing",
        "retry mon-03.fra.internal café",
        "cafe café",
        "running runs billing",
        "ERR_PAYMENT_4471 priya",
        "priya -billing retry",
    ],
)
def test_the_words_as_one_match_query_score_as_their_boolean_query(tmp_path: Path, query: str):
    """The document-level leg sends a words-only query as one MatchQuery (``joined_words``): its
    BM25 scores must be those of the boolean query of one optional MatchQuery per word, on an index
    analysed as the product's (ICU, English stemming, ASCII folding, positions)."""
    import random

    from lancedb.query import BooleanQuery, MatchQuery, Occur

    from memory_pipeline.search.fulltext import joined_words
    from memory_pipeline.search.syntax import parse_query

    rng = random.Random(13)
    words = _WORDS.split()
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 30))) for _ in range(300)]
    table = lancedb.connect(str(tmp_path)).create_table("t", pa.table({"id": [str(i) for i in range(300)], "s": docs}))
    config = FTS(with_position=True, base_tokenizer="icu", language="English", stem=True, remove_stop_words=False, ascii_folding=True)
    table.create_index("s", config=config, replace=True)
    parsed = parse_query(query)
    joined = joined_words(parsed)
    assert joined is not None

    def scores(q) -> dict[str, float]:
        return {r["id"]: r["_score"] for r in table.search(q, query_type="fts").limit(300).select(["id", "_score"]).to_list()}

    boolean = scores(BooleanQuery([(Occur.SHOULD, MatchQuery(w, "s")) for w in parsed.words]))
    one = scores(MatchQuery(joined, "s"))
    assert boolean and one.keys() == boolean.keys()
    assert all(math.isclose(one[k], boolean[k], rel_tol=1e-6) for k in one)


def test_phrases_and_single_words_keep_their_own_queries():
    from memory_pipeline.search.fulltext import joined_words
    from memory_pipeline.search.syntax import parse_query

    assert joined_words(parse_query('"duty manager" rota')) is None
    assert joined_words(parse_query("rota")) is None
    assert joined_words(parse_query("duty manager rota")) == "duty manager rota"


def test_term_weights_are_kept_per_table_version_and_filter():
    from memory_pipeline.search.fulltext import TermWeights

    cache = TermWeights(size=3)
    w = cache.at(7)
    w.put("billing", None, 3.5)
    w.put("billing", "source = 'a'", 1.25)
    assert w.get("billing", None) == 3.5 and w.get("billing", "source = 'a'") == 1.25 and w.get("retry", None) is None
    assert cache.at(8).get("billing", None) is None  # another version: measured again
    cache.at(8).put("billing", None, 4.0)
    assert cache.at(7).get("billing", None) == 3.5 and cache.at(8).get("billing", None) == 4.0
    w.get("billing", "source = 'a'")  # used: billing at version 7 without a filter is the oldest now ...
    cache.at(8).get("billing", None)
    w.put("retry", None, 2.0)  # ... and goes first when the cache is full
    assert w.get("billing", None) is None and w.get("retry", None) == 2.0 and w.get("billing", "source = 'a'") == 1.25


@pytest.fixture(scope="module")
def stemmed_table(tmp_path_factory):
    import random

    rng = random.Random(29)
    words = _WORDS.split() + ["naïve", "Zürich", "数据库", "x_1", "AND", "OR", "NOT", "a*b", "(x)", "'quoted'"]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 25))) for _ in range(200)]
    table = lancedb.connect(str(tmp_path_factory.mktemp("joined"))).create_table("t", pa.table({"id": [str(i) for i in range(200)], "s": docs}))
    config = FTS(with_position=True, base_tokenizer="icu", language="English", stem=True, remove_stop_words=False, ascii_folding=True)
    table.create_index("s", config=config, replace=True)
    return table


@hypothesis_settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=80))
def test_any_query_text_joined_scores_as_its_boolean_query(stemmed_table, text: str):
    """Whatever the user typed (operators, quotes, punctuation, any script): when the words are sent
    as one MatchQuery, LanceDB accepts it and gives every row the boolean query's score."""
    from lancedb.query import BooleanQuery, MatchQuery, Occur

    from memory_pipeline.search.fulltext import joined_words
    from memory_pipeline.search.syntax import parse_query

    parsed = parse_query(text)
    joined = joined_words(parsed)
    if joined is None:
        return

    def scores(q) -> dict[str, float]:
        return {r["id"]: r["_score"] for r in stemmed_table.search(q, query_type="fts").limit(200).select(["id", "_score"]).to_list()}

    boolean = scores(BooleanQuery([(Occur.SHOULD, MatchQuery(w, "s")) for w in parsed.words]))
    one = scores(MatchQuery(joined, "s"))
    assert one.keys() == boolean.keys()
    assert all(math.isclose(one[k], boolean[k], rel_tol=1e-5) for k in one)


# Query text as a user types it: words, the syntax's operators and quotes, any script.
_SYNTAX_TEXT = st.lists(
    st.one_of(st.sampled_from(['"', "-", "+", "*", "OR", "AND", "NOT", "(", ")", " ", "zebra", "Zürich", "数据"]), st.text(max_size=8)),
    max_size=12,
).map(" ".join)


@hypothesis_settings(max_examples=200, deadline=None)
@given(_SYNTAX_TEXT, st.lists(st.text(max_size=40), max_size=6))
def test_the_clause_check_skipped_without_clauses_keeps_what_the_check_keeps(query: str, texts: list[str]):
    """``accepted`` skips folding every row when the query has no required or excluded clause:
    for any query and any rows it must keep exactly the rows ``accepts`` keeps."""
    from memory_pipeline.search.folding import fold
    from memory_pipeline.search.fulltext import accepted
    from memory_pipeline.search.syntax import parse_query

    parsed = parse_query(query)
    rows = [{"text": t} for t in texts]
    got = accepted(parsed, rows, lambda r: fold(r["text"]))
    assert got == [r for r in rows if parsed.accepts(fold(r["text"]))]
    if not parsed.constrains:
        assert got is rows


@pytest.mark.parametrize(
    ("query", "words", "excluded"),
    [
        ("Differentiated E2f-1, -2, -3 TKO cells", ("differentiated", "e2f", "1", "2", "3", "tko", "cells"), []),
        ("fridge at -5 degrees", ("fridge", "at", "5", "degrees"), []),
        ("refund -$5 and -.5", ("refund", "5", "and", "5"), []),
        ('"duty" rota', ("duty", "rota"), []),
        ("Horatio -venue", ("horatio",), [("venue",)]),
        ("Horatio NOT 5", ("horatio",), [("5",)]),
        ('budget -"offsite plan"', ("budget",), [("offsite", "plan")]),
    ],
)
def test_a_minus_before_a_digit_is_a_number_not_an_exclusion(query, words, excluded):
    """A SciFact claim (``E2f-1, -2, -3``) once excluded every abstract holding a 2 or a 3,
    the answer's among them; ``-word`` and ``NOT`` still exclude."""
    from memory_pipeline.search.syntax import parse_query

    parsed = parse_query(query)
    assert tuple(w for c in parsed.positive for t in c.terms for w in t.words) == words
    assert [t.words for c in parsed.clauses if c.negated for t in c.terms] == excluded
    assert all(w for w in parsed.words)  # a quoted single word is asked for (it was an empty word)


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('ab "*-()ORANDNOT:_.é团5$½')), max_size=30))
def test_the_vector_leg_keeps_every_exclusion_and_operator_whatever_the_query(query):
    """Hostile queries parse, and hybrid's vector leg drops only what a quoted phrase alone requires:
    every excluded clause and every clause an operator (AND, a prefix) requires stays, and a '-'
    before a digit or a sign never excludes."""
    from memory_pipeline.search.syntax import parse_query

    parsed = parse_query(query)
    kept = parsed.vector_clauses.clauses
    assert set(kept) <= set(parsed.clauses)
    for c in parsed.clauses:
        if c.negated or c.operator or not c.required:
            assert c in kept
        else:
            assert c not in kept and any(t.kind == "phrase" for t in c.terms)  # required only for its phrase
    for tok in query.split():
        if len(tok) > 1 and tok[0] == "-" and (tok[1].isdigit() or tok[1] in "$½"):
            assert not any(c.negated and set(t.raw for t in c.terms) & {tok[1:]} for c in parsed.clauses)
