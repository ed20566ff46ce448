"""LanceDB's caches of the stores that write are bounded (issue 16's flat memory).

LanceDB keeps file metadata and index pages in a per-connection cache whose defaults (1 GiB and
6 GiB) suit a process that answers queries. A write run's commits and folds read the table's
metadata again and again, and the cache kept all of it: at a million chunks the run's resident
floor rose by every fold. The write stage and the server's folds open their table with
``WRITE_CACHE_MIB``; searches and the nightly maintenance (whose recall check queries the index)
keep LanceDB's defaults.
"""

from __future__ import annotations

import numpy as np

from memory_pipeline.stages import write as write_stage
from memory_pipeline.stores.lance import WRITE_CACHE_MIB, VectorStore
from memory_pipeline_tests.unit.test_compaction import DIMS, META, _rows
from memory_pipeline_tests.unit.test_stages import _run, memory  # noqa: F401 - the fixture


def _write_and_fold(store: VectorStore, docs: int = 80) -> list[int]:
    """Commits of one file each, as the writer makes them, with a fold every 40; the cache's size after each fold."""
    rng = np.random.default_rng(0)
    table = store.ensure(DIMS, META)
    sizes = []
    for i in range(docs):
        store.replace_docs(_rows(table.schema, f"d{i}", 20, rng), [f"d{i}"])
        if i % 40 == 39:
            store.fold_new_rows()
            sizes.append(store.cache_bytes())
    return sizes


def test_a_bounded_store_keeps_its_cache_under_the_bound_where_lances_default_grows(tmp_path):
    roomy = _write_and_fold(VectorStore(str(tmp_path / "roomy"), "t", cache_mib=1024))
    bounded_store = VectorStore(str(tmp_path / "bounded"), "t", cache_mib=1)
    bounded = _write_and_fold(bounded_store)
    assert roomy[-1] > 4 * 2**20 and roomy[-1] > roomy[0], roomy  # the same work fills a roomy cache
    assert all(size <= 2 * 2**20 for size in bounded), bounded  # both caches together, each bounded to 1 MiB
    assert bounded_store.count_rows() == 80 * 20
    # A store for searches is LanceDB's own connection: nothing bounded, nothing tracked.
    assert VectorStore(str(tmp_path / "roomy"), "t").cache_bytes() is None


def test_the_write_stage_writes_through_a_bounded_store(memory, monkeypatch):  # noqa: F811
    _, settings, embedder, ident = memory
    seen: list[tuple[int | None, int | None]] = []
    real = VectorStore.replace_docs

    def replace_docs(self, rows, doc_ids):
        done = real(self, rows, doc_ids)
        seen.append((self.cache_mib, self.cache_bytes()))
        return done

    monkeypatch.setattr(VectorStore, "replace_docs", replace_docs)
    results = _run(settings, embedder, ident)
    assert results.write.rows_inserted > 0 and seen
    assert all(mib == WRITE_CACHE_MIB and size is not None and size <= 2 * WRITE_CACHE_MIB * 2**20 for mib, size in seen), seen
    assert write_stage.WRITE_CACHE_MIB == WRITE_CACHE_MIB


def test_the_servers_fold_goes_through_a_bounded_store(memory, monkeypatch):  # noqa: F811
    from memory_pipeline.service import indexer

    _, settings, embedder, ident = memory
    _run(settings, embedder, ident)
    seen: list[int | None] = []
    real = VectorStore.fold_new_rows

    def fold_new_rows(self):
        seen.append(self.cache_mib)
        return real(self)

    monkeypatch.setattr(VectorStore, "fold_new_rows", fold_new_rows)
    assert "fold" in indexer.fold(settings)
    assert seen == [WRITE_CACHE_MIB]
