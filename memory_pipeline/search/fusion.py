"""Fusion strategies: how a hybrid search orders candidates from their two legs' scores.

Each strategy is a small class behind ``Fusion``; ``fusion_for`` picks one by the name in
``query.fusion``. Relevance (what ``min_score`` and abstention read) is computed before fusion and
is the same in every strategy, so abstention does not depend on the choice; fusion only sets the order.

* ``weighted`` (the default): a convex combination of the two legs' scores *standardized over
  this query's candidates*, ``(wv * z(sv) + wt * z(st)) / (wv + wt)`` with ``z(x) = (x - mean) /
  std``, mapped to [0, 1] by the normal CDF. Standardizing makes the legs comparable whatever
  their raw scales (cosine similarities of one model bunch near 0.3, another's near 0.8; BM25
  shares spread over [0, 1]) and per query (a leg that separates its candidates sharply weighs
  more than one whose candidates all look alike). On the development sets it is the one fusion
  at or above the better leg on every set (see the README's search section for the numbers).
* ``rrf``: reciprocal rank fusion ``sum_l w_l / (k + rank_l)`` divided by its maximum
  ``sum_l w_l / (k + 1)``, so 1.0 means first in both legs; a candidate with no score in a
  leg gets nothing from it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from memory_pipeline.errors import ConfigError
from memory_pipeline.settings import QueryConfig


class Scored(Protocol):
    """What fusion reads of a candidate: its vector and text scores and its relevance."""

    sv: float
    st: float
    relevance: float


class Fusion(ABC):
    """Turns candidates' leg scores into the scores results are ordered by, one per candidate."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_config(cls, query: QueryConfig) -> Fusion:
        """The strategy with its knobs from ``settings.query``."""

    @abstractmethod
    def scores(self, cands: Sequence[Scored]) -> list[float]:
        """One score in [0, 1] per candidate, in the order given."""


@dataclass(frozen=True)
class WeightedFusion(Fusion):
    """Convex combination of the legs' scores standardized over the query's candidates."""

    vector_weight: float = 0.5
    text_weight: float = 0.5

    name: ClassVar[str] = "weighted"

    @classmethod
    def from_config(cls, query: QueryConfig) -> WeightedFusion:
        return cls(vector_weight=query.vector_weight, text_weight=query.text_weight)

    def scores(self, cands: Sequence[Scored]) -> list[float]:
        total = self.vector_weight + self.text_weight
        if not cands or total <= 0:
            return [0.0] * len(cands)
        if len(cands) < _VECTORISED:
            zv = standardize([c.sv for c in cands])
            zt = standardize([c.st for c in cands])
            return [normal_cdf((self.vector_weight * a + self.text_weight * b) / total) for a, b in zip(zv, zt)]
        # The same arithmetic over arrays (memory eval's depth fuses about a thousand candidates).
        import numpy as np

        n = len(cands)
        z = (self.vector_weight * _standardized(np.fromiter((c.sv for c in cands), np.float64, n))
             + self.text_weight * _standardized(np.fromiter((c.st for c in cands), np.float64, n))) / total  # fmt: skip
        erf, root2 = math.erf, math.sqrt(2.0)
        return [0.5 * (1.0 + erf(v / root2)) for v in z.tolist()]


def standardize(values: Sequence[float]) -> list[float]:
    """``(x - mean) / std`` over ``values``; all 0 when they do not vary (that leg cannot order them)."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    if var <= 1e-18:
        return [0.0] * n
    sd = math.sqrt(var)
    return [(v - mean) / sd for v in values]


_VECTORISED = 64  # candidates from which ``WeightedFusion`` standardizes with NumPy


def _standardized(values):
    """``standardize`` of a float64 array (NumPy's pairwise sums: equal to the last bits)."""
    mean = values.mean()
    var = ((values - mean) ** 2).mean()
    if var <= 1e-18:
        return values * 0.0
    return (values - mean) / math.sqrt(var)


def normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


@dataclass(frozen=True)
class RRFFusion(Fusion):
    """Weighted reciprocal rank fusion, normalised so first in both legs scores 1.0."""

    vector_weight: float
    text_weight: float
    k: int = 60

    name: ClassVar[str] = "rrf"

    @classmethod
    def from_config(cls, query: QueryConfig) -> RRFFusion:
        return cls(vector_weight=query.vector_weight, text_weight=query.text_weight, k=query.rrf_k)

    def scores(self, cands: Sequence[Scored]) -> list[float]:
        legs = ((self.vector_weight, "sv"), (self.text_weight, "st"))
        best = sum(w / (self.k + 1) for w, _ in legs)
        fused = [0.0] * len(cands)
        for w, attr in legs:
            # Stable: ties keep the order the candidates came in.
            ranked = sorted((i for i, c in enumerate(cands) if getattr(c, attr) > 0), key=lambda i: -getattr(cands[i], attr))
            for rank, i in enumerate(ranked, start=1):
                fused[i] += w / (self.k + rank)
        return [f / best if best else 0.0 for f in fused]


FUSION_STRATEGIES: dict[str, type[Fusion]] = {cls.name: cls for cls in (WeightedFusion, RRFFusion)}


def fusion_for(name: str, query: QueryConfig) -> Fusion:
    """The fusion strategy called ``name`` (``query.fusion``), configured from ``query``."""
    try:
        cls = FUSION_STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"fusion must be one of {', '.join(FUSION_STRATEGIES)}, got {name!r}", key="fusion") from None
    return cls.from_config(query)
