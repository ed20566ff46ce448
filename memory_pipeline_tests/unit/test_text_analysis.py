"""The in-memory full-text analysis (``search/textindex.py``) fed hostile text: any Unicode, control
characters, lone surrogates' neighbours, huge tokens, emoji sequences, mixed scripts. It never
raises, never yields an empty term, and BM25 over what it yields is finite and non-negative."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_pipeline.search.textindex import MAX_TOKEN_BYTES, Analyzer, EncodeCache, _Column

ANALYZER = Analyzer()
hostile = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400) | st.text(alphabet="aé ’'.,-_²½\u00ad\u200d️⃣ΟΣ", max_size=200)


@settings(max_examples=300, deadline=None)
@given(text=hostile)
def test_any_text_analyses_to_short_nonempty_terms(text):
    terms = ANALYZER.terms(text)
    assert all(isinstance(t, str) and t for t in terms)
    assert ANALYZER.terms(text) == terms  # the term cache answers as the first analysis did
    # A token of 40 UTF-8 bytes or more is dropped, whatever it is made of.
    assert ANALYZER.terms("x" * MAX_TOKEN_BYTES) == [] and ANALYZER.terms("é" * 20) == []


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(hostile, min_size=1, max_size=12), query=hostile)
def test_bm25_over_any_texts_is_finite_and_nonnegative(texts, query):
    cache = EncodeCache(Analyzer())
    encoded = [e for t in texts if (e := cache.encode(t)) is not None]
    column = _Column.build(np.arange(len(encoded), dtype=np.int32), encoded, len(cache.vocab))
    ids = [cache.vocab[t] for t in cache.analyzer.terms(query) if t in cache.vocab]
    scores = column.scores(ids + [len(cache.vocab) + 5])  # an id past the vocabulary is ignored
    assert scores.shape == (len(encoded),) and np.all(np.isfinite(scores)) and np.all(scores >= 0)
    assert (scores > 0).any() == bool(ids and any(len(e[0]) for e in encoded) and any(np.isin(ids, np.concatenate([e[0] for e in encoded]))))
