"""The full-text build holds a bounded budget of postings, whatever the table's size.

Lance's builder kept up to 2,048 MiB of postings in memory before writing a partition, so its
memory grew with the table (+281 MB for the chunk index of a million generated chunks). The
product builds with ``FTS_BUILD_MIB`` (``LANCE_FTS_PARTITION_SIZE`` wins) in one worker: past the
budget the postings go out as further partitions. These tests build the same rows with a budget
small enough to split them and with the default, and check that the split changes nothing a
search sees: the same rows with the same BM25 scores, for words, phrases and
AND queries (Lance scores across partitions with the whole index's statistics).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from memory_pipeline.search.fulltext import fts_rows
from memory_pipeline.stores import lance as lance_store
from memory_pipeline.stores.lance import FTS_COLUMN, VectorStore, fts_build_mib
from memory_pipeline_tests.helpers import REPO, empty_column

DIMS = 8
META = {"provider": "local", "model": "m", "dims": DIMS, "provider_key": "k"}
VOCAB = [f"term{i}" for i in range(2500)] + ["duty", "manager", "rollback", "budget"]


def _rows(schema: pa.Schema, n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    vec = np.random.default_rng(seed)
    texts = []
    for i in range(n):
        words = [rng.choice(VOCAB) for _ in range(rng.randint(15, 30))]
        if i % 50 == 0:
            words[3:5] = ["duty", "manager"]
        texts.append(" ".join(words))
    data: dict[str, list] = {}
    for f in schema:
        if f.name == "vector":
            data[f.name] = vec.random((n, DIMS), dtype=np.float32).tolist()
        elif f.name == "chunk_id":
            data[f.name] = [f"src:doc{i // 10:05d}.md#{i % 10}" for i in range(n)]
        elif f.name == "doc_id":
            data[f.name] = [f"src:doc{i // 10:05d}.md" for i in range(n)]
        elif f.name in ("text", FTS_COLUMN):
            data[f.name] = texts
        elif f.name == "chunk_index":
            data[f.name] = [i % 10 for i in range(n)]
        else:
            data[f.name] = empty_column(f.type, n)
    return pa.table(data, schema=schema)


def _indexed(path: Path, rows: int) -> VectorStore:
    store = VectorStore(str(path), "t")
    table = store.ensure(DIMS, META)
    data = _rows(table.schema, rows, seed=7)
    store.replace_docs(data, sorted(set(data.column("doc_id").to_pylist())))
    assert store.ensure_fts().get("fts") == "created"
    return store


def _partitions(store: VectorStore) -> int:
    table = store.open()
    idx = next(i for i in table.list_indices() if i.name == f"{FTS_COLUMN}_idx")
    folder = Path(store.uri) / f"{store.table_name}.lance" / "_indices" / str(idx.index_uuid)
    return len(list(folder.glob("part_*_docs.lance")))


def test_importing_the_store_sets_lances_own_default_unless_the_environment_has_one():
    """Lance reads LANCE_FTS_PARTITION_SIZE once, for its folds of new rows too: set on import."""
    code = "import os, memory_pipeline.stores.lance; print(os.environ['LANCE_FTS_PARTITION_SIZE'])"
    env = {k: v for k, v in os.environ.items() if k != "LANCE_FTS_PARTITION_SIZE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    assert out == lance_store.FTS_BUILD_MIB == "32"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "LANCE_FTS_PARTITION_SIZE": "1024"}, cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1024"


def test_the_budget_comes_from_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv("LANCE_FTS_PARTITION_SIZE", raising=False)
    assert fts_build_mib() == int(lance_store.FTS_BUILD_MIB)
    monkeypatch.setenv("LANCE_FTS_PARTITION_SIZE", "3")
    assert fts_build_mib() == 3
    monkeypatch.setenv("LANCE_FTS_PARTITION_SIZE", "lots")
    assert fts_build_mib() == int(lance_store.FTS_BUILD_MIB)


@pytest.fixture(scope="module")
def split_and_whole(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("LANCE_FTS_PARTITION_SIZE", "1")
        split = _indexed(tmp_path_factory.mktemp("split") / "lancedb", 8000)
        mp.setenv("LANCE_FTS_PARTITION_SIZE", lance_store.FTS_BUILD_MIB)
        whole = _indexed(tmp_path_factory.mktemp("whole") / "lancedb", 8000)
    finally:
        mp.undo()
    return split, whole


def test_a_small_budget_splits_the_index_and_the_default_does_not(split_and_whole):
    split, whole = split_and_whole
    assert _partitions(split) >= 2
    assert _partitions(whole) == 1


def _scores(store: VectorStore, query) -> dict[str, float]:
    """Every matching row's BM25 score (all of them: rows of equal score come in no set order)."""
    rows = fts_rows(store.open(), query, column=FTS_COLUMN, where=None, limit=10_000, columns=["chunk_id"])
    return {r["chunk_id"]: r["_score"] for r in rows}


@pytest.mark.parametrize("query", ["term17", "term5 term1234 rollback", "duty", "manager budget"])
def test_word_queries_answer_the_same_across_partitions(split_and_whole, query):
    split, whole = (_scores(s, query) for s in split_and_whole)
    assert split, query
    assert split.keys() == whole.keys()
    assert [split[k] for k in sorted(split)] == pytest.approx([whole[k] for k in sorted(whole)], rel=1e-6)


def test_phrase_and_and_queries_answer_the_same_across_partitions(split_and_whole):
    from lancedb.query import MatchQuery, PhraseQuery

    for make in (
        lambda: PhraseQuery("duty manager", FTS_COLUMN),  # pyright: ignore[reportCallIssue]
        lambda: MatchQuery("duty manager", FTS_COLUMN, operator="AND"),  # pyright: ignore[reportCallIssue]
    ):
        split, whole = (_scores(s, make()) for s in split_and_whole)
        # every 50th row holds the phrase: at least 160 of the 8,000 rows, found both ways
        assert len(split) >= 160
        assert split.keys() == whole.keys()
        assert [split[k] for k in sorted(split)] == pytest.approx([whole[k] for k in sorted(whole)], rel=1e-6)
