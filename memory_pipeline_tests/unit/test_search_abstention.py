"""Calibrated abstention (issue 13): a result below min_score is still returned when it clearly
stands out from the other candidates; a crowd of look-alikes is not an answer."""

from __future__ import annotations

import pytest

from memory_pipeline.search.scoring import STANDOUT_FLOOR, STANDOUT_Z, Candidate, abstain, standout


def _cands(relevances: list[float]) -> list[Candidate]:
    return [Candidate(row={"i": i}, relevance=r) for i, r in enumerate(relevances)]


@pytest.mark.parametrize(
    "relevances, answered",
    [
        pytest.param([0.275] + [0.03] * 12, [0], id="voice-note-clearly-stands-out"),
        pytest.param([0.30, 0.29, 0.28, 0.28, 0.27, 0.27, 0.26, 0.25], [], id="crowd-of-look-alikes"),
        pytest.param([0.08] + [0.0] * 10, [], id="stands-out-but-too-weak"),
        # 9 deviations (0.18 over a spread floored at 0.02): a near-miss on the dev sets, not an answer
        pytest.param([0.21] + [0.03] * 12, [], id="nine-sigma-is-not-enough"),
        pytest.param([0.62, 0.30, 0.29, 0.28], [0], id="above-min-score"),
        pytest.param([0.62, 0.55, 0.10, 0.09, 0.09], [0, 1], id="two-above-min-score"),
        pytest.param([0.2, 0.1], [], id="too-few-to-tell"),
        pytest.param([], [], id="nothing"),
    ],
)
def test_answerable_and_no_answer_pairs(relevances: list[float], answered: list[int]):
    got = abstain(_cands(relevances), 0.5)
    assert [c.row["i"] for c in got] == answered


def test_min_score_zero_keeps_everything():
    cands = _cands([0.01, 0.0, 0.3])
    assert abstain(cands, 0.0) == cands


def test_standout_is_measured_against_the_other_best_candidates():
    z = standout([0.4] + [0.1, 0.12, 0.08] * 10)
    assert z[0] >= STANDOUT_Z and max(z[1:]) < STANDOUT_Z
    assert STANDOUT_FLOOR > 0
