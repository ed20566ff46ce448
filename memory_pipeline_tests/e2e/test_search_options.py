"""Search options on a real index: MMR, recency, filters, fusion, the CLI, `memory eval` by hand, ANN."""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from memory_pipeline.runner import run_index
from memory_pipeline.search import search
from memory_pipeline.settings import AnnConfig, load_settings
from memory_pipeline.stores.lance import VectorStore, table_schema
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import run_cli, run_json

pytestmark = pytest.mark.slow

LONG_NOTE = "# Kafka consumer lag runbook\n\n" + "\n\n".join(
    f"## Step {i}: kafka consumer lag on the payments topic\n\n"
    f"Kafka consumer lag check {i}: look at the consumer group lag of the payments topic, partition {i}, "
    f"and compare the lag with the poll interval before restarting consumers. "
    + " ".join(f"Record the lag of partition {i} at minute {m} in the incident channel, with the broker id and offsets." for m in range(8))
    for i in range(1, 7)
)


@pytest.fixture(scope="module")
def memory(tmp_path_factory):
    root = tmp_path_factory.mktemp("options")
    mem = root / "mem"
    (mem / "memory").mkdir(parents=True)
    (mem / "sessions").mkdir()
    (mem / "memory" / "2026-06-01.md").write_text(LONG_NOTE + "\n")
    (mem / "memory" / "2026-06-02.md").write_text(
        "# Queue notes\n\nThe kafka consumer lag alert fired again; lag on payments topic dropped after scaling consumers.\n"
    )
    (mem / "memory" / "2026-01-10.md").write_text("# Boiler\n\nThe boiler pressure dropped to 0.8 bar; topped it up to 1.5 bar.\n")
    (mem / "memory" / "2026-11-20.md").write_text("# Boiler\n\nThe boiler pressure dropped to 0.9 bar; topped it up to 1.4 bar.\n")
    (mem / "notes.md").write_text("# Kafka reading\n\nKafka: the definitive guide, chapter on consumer groups and lag.\n")
    (mem / "sessions" / "2026-06-03-kafka.jsonl").write_text(
        json.dumps({"role": "user", "content": "Why is kafka consumer lag growing on the payments topic?", "timestamp": "2026-06-03T10:00:00Z"})
        + "\n"
        + json.dumps({"role": "assistant", "content": "The consumers spend longer than the poll interval per batch.", "timestamp": "2026-06-03T10:01:00Z"})
        + "\n"
    )
    cfg = write_config(root / "memory_pipeline.yaml")
    settings = load_settings(cfg)
    run_index(settings)
    return settings, cfg


def _names(results) -> list[str]:
    return [Path(r.path).name for r in results]


def test_mmr_lets_other_notes_through(memory):
    settings, _ = memory
    plain = search("compare the consumer lag with the poll interval before restarting consumers", settings=settings, max_results=4, min_score=0.0)
    diverse = search(
        "compare the consumer lag with the poll interval before restarting consumers", settings=settings, max_results=4, min_score=0.0, mmr=True, mmr_lambda=0.5
    )
    same = search(
        "compare the consumer lag with the poll interval before restarting consumers", settings=settings, max_results=4, min_score=0.0, mmr=True, mmr_lambda=1.0
    )
    assert _names(plain).count("2026-06-01.md") >= 3, _names(plain)
    assert len(set(_names(diverse))) > len(set(_names(plain))), (_names(plain), _names(diverse))
    assert diverse[0].chunk_id == plain[0].chunk_id  # MMR keeps the best result first
    assert [r.chunk_id for r in same] == [r.chunk_id for r in plain]  # lambda 1 is plain relevance


def test_recency_half_life(memory):
    settings, _ = memory
    now = datetime(2026, 11, 30, tzinfo=UTC)
    flat = search("boiler pressure topped up", settings=settings, max_results=2)
    dated = search("boiler pressure topped up", settings=settings, max_results=2, recency_half_life_days=30, now=now)
    assert set(_names(flat)) == {"2026-01-10.md", "2026-11-20.md"}
    assert _names(dated)[0] == "2026-11-20.md"
    old = next(r for r in dated if r.path.endswith("2026-01-10.md"))
    old_flat = next(r for r in flat if r.path.endswith("2026-01-10.md"))
    age = (date(2026, 11, 30) - date(2026, 1, 10)).days
    assert old.score == pytest.approx(old_flat.score * 0.5 ** (age / 30), abs=2e-4)
    assert old.relevance == old_flat.relevance  # abstention does not depend on age
    undated = search("kafka definitive guide consumer groups", settings=settings, max_results=1, recency_half_life_days=1, now=now)
    undated_flat = search("kafka definitive guide consumer groups", settings=settings, max_results=1)
    # An undated (evergreen) note does not age: its score is the one it has without recency.
    assert _names(undated) == ["notes.md"] and undated[0].score == undated_flat[0].score


def test_filters(memory):
    settings, _ = memory
    q = "kafka consumer lag"
    assert set(_names(search(q, settings=settings, modality="session", min_score=0))) == {"2026-06-03-kafka.jsonl"}
    june2 = search(q, settings=settings, since="2026-06-02", until="2026-06-02", min_score=0)
    assert set(_names(june2)) == {"2026-06-02.md"}
    assert set(_names(search(q, settings=settings, path_glob="*.md", min_score=0))) == {"notes.md"}
    assert "2026-06-01.md" not in _names(search(q, settings=settings, since="2026-06-02", min_score=0))


def test_rrf_fusion_scores_in_unit_range(memory):
    settings, _ = memory
    results = search("kafka consumer lag payments", settings=settings, fusion="rrf", max_results=6)
    assert results and all(0 < r.score <= 1 and r.relevance >= settings.query.min_score for r in results)
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)


def test_cli_search_output_and_usage_errors(memory):
    _, cfg = memory
    out = run_json("search", "boiler pressure", "--config", str(cfg), "--json", "--since", "2026-11-01")
    (hit,) = out["results"]
    assert hit["date"] == "2026-11-20" and hit["snippet_locator"].startswith("L") and hit["highlights"]
    s, e = hit["highlights"][0]
    assert hit["snippet"][s:e].lower() in ("boiler", "pressure")
    human = run_cli("search", "boiler pressure", "--config", str(cfg), "--max-results", "1")
    assert human.returncode == 0 and "**Boiler**" in human.stdout or "**boiler**" in human.stdout
    assert ".md:L" in human.stdout
    bad = run_cli("search", "x", "--config", str(cfg), "--since", "yesterday")
    assert bad.returncode == 2 and "YYYY-MM-DD" in bad.stderr


def test_eval_matches_a_hand_computed_example(tmp_path: Path):
    """Full-text ranking of four tiny documents is known; the metrics are worked out by hand."""
    (tmp_path / "mem").mkdir()
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    (tmp_path / "corpus.jsonl").write_text(
        "\n".join(
            json.dumps(d)
            for d in [
                {"_id": "A", "title": "", "text": "alpha alpha alpha"},
                {"_id": "B", "title": "", "text": "alpha beta zeta eta theta iota kappa"},
                {"_id": "C", "title": "", "text": "gamma"},
                {"_id": "D", "title": "", "text": "delta"},
            ]
        )
        + "\n"
    )
    (tmp_path / "queries.jsonl").write_text(
        "\n".join(json.dumps({"_id": q, "text": t}) for q, t in [("q1", "alpha"), ("q2", "gamma"), ("q3", "delta"), ("q4", "omega")]) + "\n"
    )
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tB\t1\nq2\tC\t2\nq2\tD\t1\nq3\tA\t1\n")
    out = run_json(
        "eval", "--config", str(cfg), "--corpus", str(tmp_path / "corpus.jsonl"), "--queries", str(tmp_path / "queries.jsonl"),
        "--qrels", str(tmp_path / "qrels.tsv"), "--mode", "fts", "--json",
    )  # fmt: skip
    # q1 ranks A, B (A has more "alpha"): B relevant at rank 2 -> nDCG 1/log2(3), R@10 1, MRR 1/2.
    # q2 ranks C: DCG 2; ideal C(2), D(1) -> 2 + 1/log2(3); R@10 1/2; MRR 1.
    # q3 ranks D: nothing relevant -> 0 everywhere.  q4 is not judged and not counted.
    ndcg = (1 / math.log2(3) + 2 / (2 + 1 / math.log2(3)) + 0) / 3
    m = out["modes"]["fts"]
    assert out["documents"] == 4 and out["queries"] == 3 and out["queries_without_judgements"] == 1
    assert m["ndcg@10"] == pytest.approx(ndcg, abs=1e-4)
    assert m["recall@10"] == pytest.approx(0.5, abs=1e-4) and m["recall@100"] == pytest.approx(0.5, abs=1e-4)
    assert m["mrr@10"] == pytest.approx(0.5, abs=1e-4)
    assert m["latency_ms_p95"] >= m["latency_ms_p50"] > 0
    # Abstention: a separate pass, the search as configured; q4 ("omega", no qrels) matches nothing.
    ab = m["abstention"]
    assert ab["answerable"] == 3 and ab["no_answer"] == 1 and ab["no_answer_answered"] == 0 and ab["no_answer_answer"] == 0.0
    assert 0 <= ab["answerable_abstained"] <= 3 and ab["answerable_abstain"] == pytest.approx(ab["answerable_abstained"] / 3, abs=1e-4)
    human = run_cli(
        "eval", "--config", str(cfg), "--corpus", str(tmp_path / "corpus.jsonl"), "--queries", str(tmp_path / "queries.jsonl"),
        "--qrels", str(tmp_path / "qrels.tsv"), "--mode", "fts",
    )  # fmt: skip
    assert human.returncode == 0 and "nDCG@10" in human.stdout and f"{ndcg:.4f}" in human.stdout
    missing = run_cli("eval", "--config", str(cfg), "--corpus", "nope.jsonl", "--queries", "q", "--qrels", "r")
    assert missing.returncode == 2 and "file not found" in missing.stderr
    bad_mode = run_cli("eval", "--config", str(cfg), "--corpus", "a", "--queries", "b", "--qrels", "c", "--mode", "bm99")
    assert bad_mode.returncode == 2 and "--mode" in bad_mode.stderr


def test_eval_baseline_prints_no_native_lancedb_warnings_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`memory eval`'s plain-LanceDB baseline selects columns without the score, which LanceDB's
    native logger warned about on stderr for every query. A `memory` process shows LanceDB's errors
    only, and its warnings when the user sets LANCEDB_LOG; any process that imports memory_pipeline
    before lancedb gets the same default."""
    import subprocess
    import sys

    monkeypatch.delenv("LANCEDB_LOG", raising=False)
    (tmp_path / "mem").mkdir()
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    docs = [("A", "coral reef bleaching in warm oceans"), ("B", "kafka consumer lag on the payments topic"), ("C", "a recipe for sourdough bread")]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n" for d, t in docs))
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{d}", "text": t.split()[0]}) + "\n" for d, t in docs))
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{d}\t{d}\t1\n" for d, _ in docs))
    args = [
        "eval", "--config", str(cfg), "--corpus", str(tmp_path / "corpus.jsonl"), "--queries", str(tmp_path / "queries.jsonl"),
        "--qrels", str(tmp_path / "qrels.tsv"), "--mode", "lancedb-rrf", "--keep", str(tmp_path / "work"), "--json",
    ]  # fmt: skip
    # A new interpreter whose environment has no LANCEDB_LOG (this test process has one: importing
    # memory_pipeline set it, and every process started from here would inherit it).
    quiet = run_cli(*args, fresh=True)
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["modes"]["lancedb-rrf"]["queries"] == 3
    assert "lance::" not in quiet.stderr, quiet.stderr
    asked = run_cli(*args, env={"LANCEDB_LOG": "warn"})
    assert asked.returncode == 0, asked.stderr
    assert "lance::" in asked.stderr and "WARN" in asked.stderr  # the baseline's warnings exist: the runs above had them silenced
    # Dagster's code servers and runs load memory_pipeline.definitions: the package sets the default first.
    probe = "import os, memory_pipeline.definitions, lancedb; print(os.environ.get('LANCEDB_LOG'))"
    for preset, expected in ((None, "error"), ("info", "info")):
        env = dict(os.environ) | ({"LANCEDB_LOG": preset} if preset else {})  # without it: deleted above
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.split()[-1] == expected, out.stderr[-2000:]


def test_eval_keeps_no_document_of_an_earlier_corpus_and_fails_clearly_on_an_empty_index(tmp_path: Path):
    """A kept folder loses the documents of an earlier, larger corpus (they would be indexed and
    ranked too); a corpus of which nothing could be indexed is a clear error, not a report of zeros."""
    from memory_pipeline.evaluation import index_corpus, load_beir
    from memory_pipeline_tests.helpers import table_rows

    (tmp_path / "mem").mkdir()
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml", provider="none"))
    docs = [{"_id": "T", "title": "Reef bleaching", "text": "Coral reef bleaching and ocean heat."}, {"_id": "U", "title": "", "text": "An untitled turn."}]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "reef"}) + "\n")
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq\tT\t1\n")
    beir = load_beir(tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl", tmp_path / "qrels.tsv")
    work = tmp_path / "work"
    (work / "docs").mkdir(parents=True)
    (work / "docs" / "d0000007.txt").write_text("a document of an earlier corpus about reef bleaching\n")
    (work / "docs" / "README.md").write_text("not the eval's: left alone\n")
    eval_settings, path_to_id, _ = index_corpus(settings, beir, work)
    assert sorted(path_to_id.items()) == [("d0000000.txt", "T"), ("d0000001.txt", "U")]
    assert sorted(p.name for p in (work / "docs").iterdir()) == ["README.md", "d0000000.txt", "d0000001.txt"]
    assert sorted({r["path"] for r in table_rows(eval_settings.data_dir, columns=("path",))}) == ["d0000000.txt", "d0000001.txt"]

    too_small = write_config(tmp_path / "small.yaml", provider="none", limits={"max_file_bytes": 8})
    failed = run_cli(
        "eval", "--config", str(too_small), "--corpus", str(tmp_path / "corpus.jsonl"), "--queries", str(tmp_path / "queries.jsonl"),
        "--qrels", str(tmp_path / "qrels.tsv"), "--mode", "fts",
    )  # fmt: skip
    assert failed.returncode != 0 and "none of the corpus's 2 documents was indexed" in failed.stderr
    assert "Traceback" not in failed.stderr


TOPICS = [
    ("kafka", "Kafka consumer lag on the payments topic: check the consumer group offsets, then scale the consumers."),
    ("boiler", "The boiler pressure dropped below one bar; the heating engineer bled the radiators and topped it up."),
    ("sourdough", "Feed the sourdough starter twice a day with rye flour and water, keep it at room temperature."),
    ("passport", "Passport renewal: the photo booth at the post office, the form and the fee of 75 pounds."),
    ("garden", "Planted tomatoes, basil and courgettes in the raised bed; water every evening in July."),
    ("dentist", "Dentist appointment moved to Thursday at 9; bring the insurance card."),
    ("bike", "The road bike needs a new chain and brake pads before the club ride on Sunday."),
    ("postgres", "Postgres vacuum ran for hours on the orders table; autovacuum thresholds were raised."),
]


def test_eval_reports_abstention_of_answerable_and_no_answer_queries(tmp_path: Path):
    """Per mode, the product's search as configured: a query that clearly matches its document
    answers, a nonsense query without qrels (a no-answer query) returns nothing; nDCG unchanged."""
    from memory_pipeline.evaluation import format_report, run_eval

    (tmp_path / "mem").mkdir()
    settings = load_settings(write_config(tmp_path / "memory_pipeline.yaml"))
    docs = [{"_id": f"{topic}-{i}", "title": f"{topic} note {i}", "text": f"{text} Entry {i}."} for topic, text in TOPICS for i in range(3)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    queries = [
        ("q1", "kafka consumer lag on the payments topic"),
        ("q2", "sourdough starter feeding with rye flour"),
        ("n1", "zorblax quiffle vemmering snarth"),
    ]
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries))
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tkafka-0\t1\nq2\tsourdough-1\t1\n")
    report = run_eval(settings, tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl", tmp_path / "qrels.tsv", modes=("fts", "vector", "hybrid"))
    assert report["queries"] == 2 and report["queries_without_judgements"] == 1
    for mode, m in report["modes"].items():
        ab = m["abstention"]
        assert ab["min_score"] == settings.query.min_score and ab["answerable"] == 2 and ab["no_answer"] == 1, mode
        assert ab["answerable_abstained"] == 0 and ab["answerable_abstain"] == 0.0, (mode, ab)
        assert ab["no_answer_answered"] == 0 and ab["no_answer_answer"] == 0.0, (mode, ab)
        assert m["ndcg@10"] > 0, mode
    text = format_report(report)
    assert "abstain" in text and "no-ans" in text and "0.0%" in text


def _store_of(tmp_path: Path, vecs: np.ndarray) -> VectorStore:
    """A table of one chunk per vector (unit length, float32)."""
    n, dims = vecs.shape
    store = VectorStore(str(tmp_path / "lancedb"), "memory_vectors")
    meta = {"provider": "test", "model": "test", "dims": dims, "provider_key": "k"}
    store.ensure(dims, meta)
    schema = table_schema(dims, meta)
    rows = {f.name: [None] * n for f in schema}
    rows.update(chunk_id=[f"c{i}" for i in range(n)], doc_id=[f"s:d{i}" for i in range(n)], text=[f"t{i}" for i in range(n)])
    rows["vector"] = pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), type=pa.float32()), dims)
    store.open().add(pa.table(rows, schema=schema))
    return store


def test_ann_index_is_built_above_the_threshold_and_measured(tmp_path: Path):
    dims, n = 32, 3000
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(60, dims)).astype(np.float32)
    vecs = centers[rng.integers(0, 60, n)] + 0.15 * rng.normal(size=(n, dims)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    store = _store_of(tmp_path, vecs)
    ann = AnnConfig(min_rows=5000, index_type="IVF_HNSW_SQ", nprobes=20)
    assert store.ensure_ann(ann)["ann"] == "exact"  # below the threshold: exact search
    low = AnnConfig(min_rows=1000, index_type="IVF_HNSW_SQ", nprobes=20)
    built = store.ensure_ann(low)
    assert built["ann"] == "built" and store.vector_index() is not None
    assert store.ensure_ann(low)["ann"] == "current"
    recall = store.ann_recall(low, queries=40)
    assert recall is not None and recall >= 0.9
    report = store.maintain(ann=low)
    assert report["ann"] == "current" and report["ann_recall_at_10"] >= 0.9


def test_an_hnsw_index_is_built_in_partitions_of_bounded_rows(tmp_path: Path, monkeypatch):
    """The HNSW graph of a partition is built whole in memory: a large table's index is split into
    partitions of at most HNSW_PARTITION_ROWS rows (LanceDB's default puts a million in one,
    2.4 GB of RSS to build), and probing every partition keeps the recall."""
    from memory_pipeline.stores import lance

    assert lance.hnsw_partitions(1) == 1 and lance.hnsw_partitions(lance.HNSW_PARTITION_ROWS) == 1
    assert lance.hnsw_partitions(lance.HNSW_PARTITION_ROWS + 1) == 2 and lance.hnsw_partitions(1_000_000) == 16
    monkeypatch.setattr(lance, "HNSW_PARTITION_ROWS", 1000)
    dims, n = 32, 3000
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(n, dims)).astype(np.float32)  # no clusters: a point's neighbours lie in several partitions
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    store = _store_of(tmp_path, vecs)
    ann = AnnConfig(min_rows=1000, index_type="IVF_HNSW_SQ", nprobes=20)
    built = store.ensure_ann(ann)
    assert built["ann"] == "built" and built["ann_partitions"] == 3
    stats = store.open().index_stats(store.vector_index().name)
    assert stats.num_indexed_rows == n
    recall = store.ann_recall(ann, queries=40)
    assert recall is not None and recall >= 0.9
    # The partitions are there: probing one of the three loses neighbours that probing all finds.
    one = store.ann_recall(AnnConfig(min_rows=1000, index_type="IVF_HNSW_SQ", nprobes=1), queries=40)
    assert one is not None and one < recall


def test_folds_of_new_rows_add_delta_indices_until_the_ann_index_is_trained_again(tmp_path: Path):
    """Each optimize folds new rows in as a delta vector index that every query searches; past
    ANN_MAX_DELTAS the index is trained again as one (the server folds after each burst of writes)."""
    from memory_pipeline.stores.lance import ANN_MAX_DELTAS

    dims = 16
    rng = np.random.default_rng(1)
    store = VectorStore(str(tmp_path / "lancedb"), "memory_vectors")
    meta = {"provider": "test", "model": "test", "dims": dims, "provider_key": "k"}
    store.ensure(dims, meta)
    schema = table_schema(dims, meta)

    def add(start: int, n: int) -> None:
        vecs = rng.normal(size=(n, dims)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        rows = {f.name: [None] * n for f in schema}
        rows.update(
            chunk_id=[f"c{i}" for i in range(start, start + n)],
            doc_id=[f"s:d{i}" for i in range(start, start + n)],
            text=[f"t{i}" for i in range(start, start + n)],
        )
        rows["vector"] = pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), type=pa.float32()), dims)
        store.open().add(pa.table(rows, schema=schema))

    add(0, 1200)
    ann = AnnConfig(min_rows=1000, index_type="IVF_HNSW_SQ", nprobes=20)
    assert store.ensure_ann(ann)["ann"] == "built"
    assert store.fold_new_rows()["fold"] == "current"  # everything indexed, one fragment
    deltas = 1
    for k in range(ANN_MAX_DELTAS + 3):
        add(10_000 + 10 * k, 10)
        folded = store.fold_new_rows()
        assert folded["fold"] == "optimized" and folded["unindexed_rows"] == 10, folded
        assert store.ensure_ann(ann)["ann"] == "current"  # a plain index run never retrains for deltas
        got = store.ensure_ann(ann, max_deltas=ANN_MAX_DELTAS)
        if got["ann"] == "built":
            break
        deltas = got["ann_deltas"]
        assert got["ann"] == "current" and deltas <= ANN_MAX_DELTAS
    else:
        raise AssertionError(f"never trained again; {deltas} deltas")
    assert deltas > 1  # folds did add deltas before the index was trained again
    stats = store.open().index_stats(store.vector_index().name)
    assert stats.num_unindexed_rows == 0 and stats.num_indices == 1
    # Many new rows at once (more than a fifth) are folded in as a delta over just them, not
    # trained again with the whole table (whose build grows with the table).
    add(20_000, 1200)
    got = store.ensure_ann(ann)
    stats = store.open().index_stats(store.vector_index().name)
    assert got["ann"] == "folded" and got["unindexed_rows"] == 1200, got
    assert stats.num_unindexed_rows == 0 and stats.num_indices == 2


def test_a_run_that_folded_segments_folds_its_rest_into_the_vector_index(tmp_path: Path):
    """Rows the index lacks are read from disk by every query: a plain run leaves a few (up to a
    fifth of the table) to the nightly maintenance, but a run that folded segments folds its rest
    (1,000 rows or more) at its end, so a big first run leaves its table fully indexed."""
    dims = 16
    rng = np.random.default_rng(3)

    def unit(n: int) -> np.ndarray:
        vecs = rng.normal(size=(n, dims)).astype(np.float32)
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)

    store = _store_of(tmp_path, unit(6000))
    ann = AnnConfig(min_rows=1000, index_type="IVF_HNSW_SQ", nprobes=20)
    assert store.ensure_ann(ann)["ann"] == "built"
    more = _store_of(tmp_path / "more", unit(1100)).open().to_arrow()
    more = more.set_column(more.schema.get_field_index("chunk_id"), "chunk_id", pa.array([f"m{i}" for i in range(more.num_rows)]))
    store.open().add(more)
    assert store.ensure_ann(ann) == {"ann": "current", "unindexed_rows": 1100, "ann_deltas": 1}  # 1,100 <= 6,000 / 5
    got = store.ensure_ann(ann, fold_rest=True)
    stats = store.open().index_stats(store.vector_index().name)
    assert got["ann"] == "folded" and stats.num_unindexed_rows == 0 and stats.num_indices == 2, got


def test_a_runs_first_segment_is_one_partition_and_its_folds_add_deltas_beside_it(tmp_path: Path, monkeypatch):
    """The write stage's first build (``fold_segment``) makes partitions of at least
    ``HNSW_PARTITION_ROWS`` rows: its first segment, a few rows past ``SEGMENT_ROWS``, is one
    partition, and each later segment is folded in as a delta beside it. LanceDB merges the first
    fold into an index of two partitions instead (shown here too), in memory that grows with the
    index: the merge and the fold after it were the million-row run's peak."""
    from memory_pipeline.stores import lance

    monkeypatch.setattr(lance, "HNSW_PARTITION_ROWS", 3000)
    dims = 16
    rng = np.random.default_rng(5)

    def unit(n: int) -> np.ndarray:
        vecs = rng.normal(size=(n, dims)).astype(np.float32)
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)

    def add(store: VectorStore, n: int, tag: str) -> None:
        more = _store_of(tmp_path / f"more-{tag}", unit(n)).open().to_arrow()
        store.open().add(more.set_column(more.schema.get_field_index("chunk_id"), "chunk_id", pa.array([f"{tag}{i}" for i in range(n)])))

    ann = AnnConfig(min_rows=1000, index_type="IVF_HNSW_SQ", nprobes=20)
    segmented = _store_of(tmp_path / "segmented", unit(3100))
    first = segmented.fold_segment(ann)
    assert first["ann"] == "built" and first["ann_partitions"] == 1, first
    for k in range(2):
        add(segmented, 3000, f"s{k}")
        assert segmented.fold_segment(ann) == {"ann": "folded"}
    stats = segmented.open().index_stats(segmented.vector_index().name)
    assert stats.num_indices == 3 and stats.num_unindexed_rows == 0 and stats.num_indexed_rows == 9100
    assert (segmented.ann_recall(ann, queries=30) or 0) >= 0.9
    # Built whole (a forced run, maintenance): partitions by the ceiling, none over HNSW_PARTITION_ROWS.
    assert segmented.ensure_ann(ann, rebuild=True)["ann_partitions"] == 4

    # What one partition avoids: the same first segment in two partitions, and LanceDB's fold.
    two = _store_of(tmp_path / "two", unit(3100))
    assert two.ensure_ann(ann)["ann_partitions"] == 2
    add(two, 3000, "t")
    assert two.fold_segment(ann) == {"ann": "folded"}
    assert two.open().index_stats(two.vector_index().name).num_indices == 1  # merged into the first index
