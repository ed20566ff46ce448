"""Fusion strategies: how a hybrid search orders candidates from their two legs' scores.

Each strategy is a small class behind ``Fusion``; ``fusion_for`` picks one by the name in
``query.fusion``. Relevance (what ``min_score`` compares) is computed before fusion and is the
same in every strategy, so abstention does not depend on the choice; fusion only sets the order.

* ``weighted``: the order is the relevance itself (the weighted noisy OR of both legs).
* ``rrf``: reciprocal rank fusion ``sum_l w_l / (k + rank_l)`` divided by its maximum
  ``sum_l w_l / (k + 1)``, so 1.0 means first in both legs; a candidate with no score in a
  leg gets nothing from it.
"""

from __future__ import annotations

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
    """Order by relevance: the weighted noisy OR of both legs."""

    name: ClassVar[str] = "weighted"

    @classmethod
    def from_config(cls, query: QueryConfig) -> WeightedFusion:
        return cls()

    def scores(self, cands: Sequence[Scored]) -> list[float]:
        return [c.relevance for c in cands]


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
