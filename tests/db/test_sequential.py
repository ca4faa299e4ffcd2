"""db.sequential: the group-sequential design behind `dapo sweep --until-decided`.

Hand-computed pieces first (the spending functions, the looks of a plan, one look's decision),
then the guarantees by simulation, each over thousands of sequential sweeps drawn with a fixed
seed: under "no difference" the design calls a comparison real at most α of the time (plus its
Monte Carlo error), for normal, heavy-tailed and real (resampled) per-seed differences; under an
effect at the design's MDE its power and stopping time are what the design says.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from db import sequential as sq
from db import stats

ALPHA = 0.05
PLAN = (6, 2, 16)  # 6 seeds, then 2 a round, at most 16: looks at 6, 8, ..., 16
# A one-sided 99% bound on a simulated rate: the test fails only when the design is off, not
# by bad luck (with a fixed seed it cannot be flaky either way).
Z99 = 2.326


def _bound(sims: int, rate: float = ALPHA) -> float:
    return rate + Z99 * math.sqrt(rate * (1.0 - rate) / sims)


def test_spending_functions_by_hand() -> None:
    # O'Brien-Fleming type: 2 − 2Φ(z_{0.975}/√t); at t = 1/2: 2 − 2Φ(1.959964 · √2) =
    # 2 − 2Φ(2.771808) = 0.005575; all of α by t = 1
    assert sq.spent(0.5, ALPHA, "obrien-fleming") == pytest.approx(0.005575, abs=1e-6)
    assert sq.spent(1.0, ALPHA, "obrien-fleming") == pytest.approx(ALPHA)
    # Pocock type: α ln(1 + (e − 1) t); at t = 1/2: 0.05 · ln(1.859141) = 0.05 · 0.620115 = 0.031006
    assert sq.spent(0.5, ALPHA, "pocock") == pytest.approx(0.031006, abs=1e-6)
    assert sq.spent(1.0, ALPHA, "pocock") == pytest.approx(ALPHA)
    with pytest.raises(ValueError, match="spending"):
        sq.spent(0.5, ALPHA, "haybittle")


def test_plan_looks() -> None:
    # rounds 3, 5, 7, ..., 15, 16; the exact test reaches 5% from 6 seeds: looks from 7 on
    assert sq.plan_looks(3, 2, 16) == [7, 9, 11, 13, 15, 16]
    assert sq.plan_looks(*PLAN) == [6, 8, 10, 12, 14, 16]
    assert sq.plan_looks(8, 8, 8) == [8]
    with pytest.raises(ValueError, match="raise --max-seeds"):
        sq.plan_looks(2, 1, 5)  # 5 seeds can never decide anything
    with pytest.raises(ValueError, match="at least the first round"):
        sq.plan_looks(6, 2, 4)


def test_one_look_is_the_plain_test_and_unreachable_looks_spend_nothing() -> None:
    one = sq.design((10,))
    assert one.boundaries[0] == pytest.approx(norm.isf(ALPHA / 2))  # 1.959964
    assert one.nominal[0] == pytest.approx(ALPHA)
    d = sq.design(tuple(sq.plan_looks(*PLAN)))
    # O'Brien-Fleming's first two levels (0.0014 at 6 seeds, about 0.005 at 8) lie below the
    # smallest p over 6 and 8 seeds (2/64, 2/256): those looks spend nothing ...
    assert d.boundaries[:2] == (math.inf, math.inf) and d.nominal[:2] == (0.0, 0.0)
    # ... and the third tests at what O'Brien-Fleming spends by t = 10/16 (about 0.0132)
    assert d.nominal[2] == pytest.approx(sq.spent(10 / 16, ALPHA, "obrien-fleming"), abs=1e-3)
    assert all(a < b for a, b in zip(d.nominal[2:], d.nominal[3:], strict=False))
    assert 0.03 < d.nominal[-1] < ALPHA  # the last look tests at nearly α itself


def test_a_look_decides_by_the_exact_p() -> None:
    d = sq.design(tuple(sq.plan_looks(*PLAN)))
    # ten differences of one sign: p = 2/2^10 = 0.00195 <= 0.0134: real at the third look
    seen = sq.look(d, 2, [0.01 * (i + 1) for i in range(10)])
    assert (seen.decision, seen.n) == ("real", 10)
    assert seen.p == pytest.approx(2 / 1024)
    # six differences of one sign at the first look: p = 2/64, but that look tests nothing
    assert sq.look(d, 0, [0.01] * 6).decision != "real"
    # no trend at all: the remaining seeds will not get there: futile
    flat = sq.look(d, 2, [0.01, -0.01] * 5)
    assert flat.p == 1.0 and flat.decision == "futile" and flat.conditional_power < 0.1
    # at the last look, what is not real is undecided
    assert sq.look(d, 5, [0.01, -0.01] * 8).decision == "undecided"
    with pytest.raises(ValueError, match="16 paired seeds"):
        sq.look(d, 5, [0.1] * 15)
    # the whole sequence stops at its decision
    steps = sq.run(d, [0.01 * (i + 1) for i in range(16)])
    assert [s.decision for s in steps] == ["continue", "continue", "real"]


def test_the_designs_own_false_positive_rate_is_alpha() -> None:
    # the large-sample model the boundaries come from, without futility: exactly α spent
    d = sq.design(tuple(sq.plan_looks(*PLAN)), futility=0.0)
    assert sq.theory(d, 0.0).real == pytest.approx(ALPHA, abs=0.003)


# --- the procedure itself, simulated -------------------------------------------------------------

SIMS = 3000


def _null_normal(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((SIMS, 16))


def _null_heavy(rng: np.random.Generator) -> np.ndarray:
    # Student's t with 2 degrees of freedom: no finite variance, a run that lands far away
    return rng.standard_t(2, (SIMS, 16))


# The per-seed differences dapo − grpo of the 8-seed explore sweep (docs/explore.md, measured
# 2026-11-26), centred: two arms of one score distribution, with that sweep's shape of spread.
EXPLORE = np.array([4.3, -2.0, 10.1, 9.8, -2.3, 12.9, 1.2, 5.3])


def _null_resampled(rng: np.random.Generator) -> np.ndarray:
    centred = EXPLORE - EXPLORE.mean()
    return rng.choice(centred, size=(SIMS, 16), replace=True)


@pytest.mark.parametrize("draw", [_null_normal, _null_heavy, _null_resampled])
@pytest.mark.parametrize("futility", [sq.FUTILITY, 0.0])  # futility only ever lowers it
def test_false_positive_rate_over_sequential_sweeps(draw: object, futility: float) -> None:
    d = sq.design(tuple(sq.plan_looks(*PLAN)), futility=futility)
    result = sq.simulate(d, draw(np.random.default_rng(11)))  # type: ignore[operator]
    assert result.sims >= 2000
    assert result.real <= _bound(result.sims), result
    if futility:
        # with nothing to find, most comparisons stop for futility well before 16 seeds
        assert result.futile > 0.5 and result.mean_seeds < 12, result


def test_power_and_stopping_at_the_designs_mde_are_what_it_says() -> None:
    d = sq.design(tuple(sq.plan_looks(*PLAN)))
    mde = sq.design_mde(d)  # in standard deviations of the per-seed differences
    promised = sq.theory(d, mde)
    assert promised.real == pytest.approx(0.8, abs=0.01)
    rng = np.random.default_rng(5)
    seen = sq.simulate(d, rng.standard_normal((SIMS, 16)) + mde)
    # The exact test over a handful of seeds is a little weaker than the large-sample z-test
    # the design is built on (it does not know σ): a few points of power, about half a round.
    assert seen.real == pytest.approx(promised.real, abs=0.06), (seen, promised)
    assert seen.mean_seeds == pytest.approx(promised.mean_seeds, abs=1.0), (seen, promised)
    # and it saves seeds against the fixed design of 16, with or without an effect
    assert seen.mean_seeds < 16


@pytest.mark.parametrize("n", [1, 2, 7, 12, 16])
def test_many_p_values_at_once_equal_one_at_a_time(n: int) -> None:
    rng = np.random.default_rng(n)
    rows = np.round(rng.standard_normal((40, n)), 1)  # one decimal: many ties between sums
    rows[0] = 0.0  # every flip reaches 0: p = 1
    rows[1] = np.abs(rows[1]) + 0.1  # all of one sign: the smallest p
    many = stats.sign_flip_p_many(rows)
    assert many.tolist() == pytest.approx([stats.sign_flip_p(r)[0] for r in rows], abs=1e-12)
    assert many[0] == 1.0 and many[1] == pytest.approx(stats.smallest_p(n))
