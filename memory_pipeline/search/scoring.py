"""Scoring one candidate: text score, identifier check, calibrated relevance, recency, MMR.

Every score is in [0, 1]; the formulas are explained in the package docstring
(``memory_pipeline.search``). How relevance becomes the order of results is ``fusion``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

import numpy as np

from memory_pipeline.search.folding import TERM_RE, fold, term_coverage

BM25_HALF = 3.0


@dataclass
class Candidate:
    """One chunk found by either leg, with its scores as they are computed."""

    row: dict
    sv: float = 0.0
    st: float = 0.0
    relevance: float = 0.0
    score: float = 0.0
    vector: np.ndarray | None = None
    st_chunk: float = 0.0  # the chunk's own full-text share (st is its document's)
    pending_ids: tuple[str, ...] = ()  # the query's identifiers, not yet checked in the row's text (a light ranking)


def haystack(row: dict) -> str:
    """The folded text a row's terms and identifiers are looked for in: text, heading, path."""
    return fold(row["text"] + "\n" + (row["heading"] or "") + "\n" + row["path"])


def text_score(terms: list[str], row: dict, bm25: float) -> float:
    """``coverage**2 * (0.6 + 0.4 * bm25 / (bm25 + 3))``; 0 without a BM25 hit."""
    if bm25 <= 0:
        return 0.0
    coverage = term_coverage(terms, haystack(row))
    return coverage * coverage * (0.6 + 0.4 * bm25 / (bm25 + BM25_HALF))


def identifier_factor(ids: list[str], text: str) -> float:
    """1 when every identifier of the query is in the text; down to 0.25 when none is.

    An id is a hard fact: a note about ERR_PAYMENT_4417 does not answer ERR_PAYMENT_9999
    however similar the two look to an embedding model.
    """
    if not ids:
        return 1.0
    found = sum(1 for i in ids if i in text)
    return 0.25 + 0.75 * found / len(ids)


def relevance(sv: float, st: float, mode: str, vector_weight: float, text_weight: float) -> float:
    """The calibrated evidence ``min_score`` compares: one leg's score, or in hybrid mode their
    weighted noisy OR ``1 - (1 - sv)**(wv/w) * (1 - st)**(wt/w)`` with ``w = max(wv, wt)``."""
    if mode == "vector":
        return sv
    if mode == "fts":
        return st
    top = max(vector_weight, text_weight) or 1.0
    ev, et = vector_weight / top, text_weight / top
    return 1.0 - (1.0 - sv) ** ev * (1.0 - min(st, 0.999999)) ** et


def relevances(cands: Sequence[Candidate], mode: str, vector_weight: float, text_weight: float) -> list[float]:
    """``relevance`` of each candidate, over arrays when there are many (the same arithmetic)."""
    if len(cands) < 64 or mode != "hybrid":
        return [relevance(c.sv, c.st, mode, vector_weight, text_weight) for c in cands]
    n = len(cands)
    sv = np.fromiter((c.sv for c in cands), np.float64, n)
    st = np.minimum(np.fromiter((c.st for c in cands), np.float64, n), 0.999999)
    top = max(vector_weight, text_weight) or 1.0
    return (1.0 - (1.0 - sv) ** (vector_weight / top) * (1.0 - st) ** (text_weight / top)).tolist()


STANDOUT_Z = 10.0  # how far above the other candidates a result must stand to be answered anyway
STANDOUT_FLOOR = 0.1  # ... and the least relevance it must still have
STANDOUT_POOL = 20  # the best candidates the comparison is made among (independent of the pool size)
_MIN_SPREAD = 0.02  # a floor under the others' spread: identical near-zero scores are not "spread 0"


def standout(relevances: list[float]) -> list[float]:
    """For each relevance, how many standard deviations it sits above the *other* best candidates
    (the top ``STANDOUT_POOL`` relevances, itself left out); 0 when there are too few to tell."""
    top = sorted(relevances, reverse=True)[:STANDOUT_POOL]
    if len(top) < 3:
        return [0.0] * len(relevances)
    out = []
    n = len(top)
    total, total_sq = sum(top), sum(r * r for r in top)
    for r in relevances:
        # The others: the top list without this candidate (or without its last entry if it is not in it).
        drop = r if r >= top[-1] else top[-1]
        m = (total - drop) / (n - 1)
        var = max((total_sq - drop * drop) / (n - 1) - m * m, 0.0)
        out.append((r - m) / max(var**0.5, _MIN_SPREAD))
    return out


def abstain(cands: list[Candidate], min_score: float, *, standout_z: float | None = STANDOUT_Z) -> list[Candidate]:
    """The candidates worth returning: relevance at least ``min_score``, or, below it, a candidate
    that clearly stands out from the rest (``STANDOUT_Z`` deviations above the other best
    candidates, relevance at least ``STANDOUT_FLOOR``): one voice note at 0.28 when everything
    else scores 0.03 is the answer; a crowd of look-alikes at 0.3 is not. ``min_score`` 0 keeps all;
    ``standout_z`` None turns the standout rule off (what ``benchmarks/abstention.py`` compares)."""
    if min_score <= 0:
        return list(cands)
    z = standout([c.relevance for c in cands])
    return [c for c, zi in zip(cands, z) if c.relevance >= min_score or (standout_z is not None and c.relevance >= STANDOUT_FLOOR and zi >= standout_z)]


def recency_factor(day: date, today: date, half_life_days: float) -> float:
    """``0.5 ** (age_days / half_life)``; a note dated in the future counts as today's."""
    age = max((today - day).days, 0)
    return 0.5 ** (age / half_life_days)


def mmr(cands: list[Candidate], terms: list[str], lam: float, *, limit: int) -> list[Candidate]:
    """Greedy maximal marginal relevance: ``lam * score - (1 - lam) * max similarity to the picked``."""
    use_vectors = all(c.vector is not None for c in cands)
    if use_vectors:
        mat = np.stack([c.vector for c in cands if c.vector is not None])  # all of them (use_vectors)
        sims = mat @ mat.T
    else:
        sets = [set(TERM_RE.findall(fold(c.row["text"]))) for c in cands]
        sims = np.array([[len(a & b) / max(len(a | b), 1) for b in sets] for a in sets], dtype=np.float32)
    scores = np.array([c.score for c in cands], dtype=np.float32)
    picked: list[int] = []
    max_sim = np.zeros(len(cands), dtype=np.float32)
    remaining = set(range(len(cands)))
    while remaining and len(picked) < limit:
        best = max(remaining, key=lambda i: (lam * scores[i] - (1 - lam) * max_sim[i], scores[i], -i))
        picked.append(best)
        remaining.discard(best)
        max_sim = np.maximum(max_sim, sims[best])
    return [cands[i] for i in picked]
