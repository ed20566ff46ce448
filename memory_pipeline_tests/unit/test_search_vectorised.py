"""Relevance and the weighted fusion over many candidates run on arrays: the same numbers as the
per-candidate arithmetic they replace (the full-text leg in memory made ranking a thousand
candidates the bulk of a query at ``memory eval``'s depth)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_pipeline.search.fusion import WeightedFusion, normal_cdf, standardize
from memory_pipeline.search.scoring import Candidate, relevance, relevances

unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
legs = st.lists(st.tuples(unit, unit), min_size=64, max_size=400)
weights = st.tuples(st.floats(min_value=0.0, max_value=3.0), st.floats(min_value=0.0, max_value=3.0)).filter(lambda w: sum(w) > 0)


@settings(max_examples=60, deadline=None)
@given(legs=legs, w=weights, mode=st.sampled_from(["hybrid", "vector", "fts"]))
def test_relevances_are_relevance_of_each(legs, w, mode):
    cands = [Candidate({}, sv=a, st=b) for a, b in legs]
    assert relevances(cands, mode, *w) == pytest.approx([relevance(a, b, mode, *w) for a, b in legs], rel=1e-12, abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(legs=legs, w=weights)
def test_weighted_fusion_on_arrays_is_the_per_candidate_formula(legs, w):
    cands = [Candidate({}, sv=a, st=b) for a, b in legs]
    zv, zt = standardize([a for a, _ in legs]), standardize([b for _, b in legs])
    want = [normal_cdf((w[0] * a + w[1] * b) / sum(w)) for a, b in zip(zv, zt)]
    got = WeightedFusion(vector_weight=w[0], text_weight=w[1]).scores(cands)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    # Equal legs fuse to equal scores (ties stay ties).
    twins = [Candidate({}, sv=legs[0][0], st=legs[0][1]) for _ in range(70)]
    assert len(set(WeightedFusion(vector_weight=w[0], text_weight=w[1]).scores(twins))) == 1
