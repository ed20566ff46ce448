"""The searcher's bounded LRU (``search.lru``) against a plain reference model, over arbitrary
sequences of reads and writes: same contents, same order of eviction, cost never over the bound."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from memory_pipeline.search.lru import LRU

OPS = st.lists(st.tuples(st.sampled_from(["get", "put"]), st.integers(0, 12), st.integers(1, 5)), max_size=80)


@given(OPS, st.integers(1, 20))
def test_lru_matches_a_reference_model(ops, bound):
    lru: LRU[int, int] = LRU(bound, cost=lambda v: v)
    model: list[tuple[int, int]] = []  # least recently used first
    for op, key, value in ops:
        if op == "get":
            found = next((v for k, v in model if k == key), None)
            assert lru.get(key) == found
            if found is not None:
                model = [(k, v) for k, v in model if k != key] + [(key, found)]
        else:
            lru.put(key, value)
            model = [(k, v) for k, v in model if k != key] + [(key, value)]
            while sum(v for _, v in model) > bound and model:
                model.pop(0)
        assert sum(v for _, v in model) <= bound
        assert lru.get_many(k for k, _ in model) == dict(model)
        # get_many marks them used in that order: the model's order is unchanged by it
        assert len(lru) == len(model)


def test_lru_is_safe_under_threads():
    lru: LRU[int, int] = LRU(100)

    def work(seed):
        for i in range(2000):
            lru.put((seed * 7 + i) % 300, i)
            lru.get((seed + i) % 300)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(lru) == 100
