"""Hybrid search over the memory table: vector + native full-text, fused, diversified, dated.

Modules: ``filters`` (SQL prefilters, note dates), ``folding`` (text folding, query terms),
``fulltext`` (the LanceDB FTS calls, their errors typed), ``lanceaio`` (the searcher's LanceDB
queries batched on the table's asynchronous handle), ``scoring`` (text score, identifiers,
relevance, recency, MMR), ``fusion`` (weighted / RRF strategies), ``snippets``, ``searcher``
(``MemorySearcher`` and ``search()``). Everything other modules use is re-exported here.

Scores are in [0, 1] in every mode and fusion:

* vector similarity ``sv`` = cosine similarity of the query and the chunk, clipped at 0;
* text score ``st`` = the document's share of the query's full-text evidence: BM25 over the
  whole document (one query per word and phrase, summed), divided by the sum over the query's
  words of the best score any document reached (``fulltext.TextLeg``); the result points at
  the document's best chunk;
* identifiers: a query token holding a digit (ERR_PAYMENT_4471, PAY-2291, 1.47.0) is a
  hard fact; a chunk missing its digit runs keeps only ``0.25 + 0.75 * found / all`` of its
  relevance, however close its vector (the model sees 4417 and 4471 as near twins);
* ``relevance`` (what ``min_score`` compares, so abstention is the same in every fusion):
  vector mode ``sv``, fts mode ``st``, hybrid ``1 - (1 - sv)**(wv/w) * (1 - st)**(wt/w)``
  with ``w = max(wv, wt)``: a weighted "noisy OR". Either leg alone can make a result
  relevant (a paraphrase that shares no word; an id, a name or a CJK phrase the English
  model does not understand), so a strong keyword hit is never drowned by a weak vector
  leg; agreement raises the score; the lighter-weighted leg counts for less.
* ``score`` (what results are ordered by): with ``fusion: weighted`` the relevance; with
  ``fusion: rrf`` reciprocal rank fusion ``sum_l w_l / (k + rank_l)`` divided by its maximum
  ``sum_l w_l / (k + 1)``, so 1.0 means first in both legs. Ranks are taken over the union
  of both candidate pools with both scores computed for every candidate (the vector of an
  FTS hit is compared with the query exactly), so a candidate missing from one pool is
  ranked by its real score there, not dropped to "unranked", and the pools are sized from
  ``max_results`` (a deep pool lets weak vector neighbours outvote a strong keyword hit).
* recency (``recency_half_life_days`` > 0): a dated note (``YYYY-MM-DD`` at the start of its
  file name) has its score multiplied by ``0.5 ** (age_days / half_life)``; relevance and
  undated notes are untouched.
* MMR (``mmr``): results are picked greedily by ``lambda * score - (1 - lambda) * max_sim``
  where ``max_sim`` is the cosine similarity (term overlap without vectors) to the results
  already picked, so five chunks of one note do not crowd out the rest.

``min_score`` drops weak results: a query about nothing in memory returns nothing.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from memory_pipeline.globs import glob_to_rust_regex
from memory_pipeline.search.filters import RESULT_TYPES, SearchFilters, date_range_regex, file_name_date, note_date
from memory_pipeline.search.folding import identifier_terms, query_terms, term_coverage
from memory_pipeline.search.fulltext import fts_rows, is_phrase_query
from memory_pipeline.search.fusion import FUSION_STRATEGIES, Fusion, RRFFusion, WeightedFusion, fusion_for
from memory_pipeline.search.scoring import BM25_HALF, Candidate, identifier_factor
from memory_pipeline.search.scoring import mmr as _mmr  # noqa: F401 - the tests reach MMR through the package
from memory_pipeline.search.searcher import MIN_POOL, MODES, MemorySearcher, QueryOptions, SearchResult, search
from memory_pipeline.search.snippets import highlight, make_snippet

__all__ = [
    "BM25_HALF",
    "FUSION_STRATEGIES",
    "MIN_POOL",
    "MODES",
    "RESULT_TYPES",
    "Candidate",
    "Fusion",
    "MemorySearcher",
    "QueryOptions",
    "RRFFusion",
    "SearchFilters",
    "SearchResult",
    "WeightedFusion",
    "date_range_regex",
    "file_name_date",
    "fts_rows",
    "fusion_for",
    "glob_to_rust_regex",
    "highlight",
    "identifier_factor",
    "identifier_terms",
    "is_phrase_query",
    "make_snippet",
    "note_date",
    "query_terms",
    "search",
    "term_coverage",
]


class _CallableModule(types.ModuleType):
    """``memory_pipeline.search`` is both this package and the package's ``search()`` function:
    importing it rebinds the ``memory_pipeline.search`` attribute to it, so it answers calls too."""

    def __call__(self, query: str, **kwargs: Any) -> list[SearchResult]:
        return search(query, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
