"""How many seeds an answer needs: the power of a paired comparison, its minimum detectable
effect (MDE) at the seeds it has, and the seeds it would need for an effect.

A Δ in the ablation table is the mean of n per-seed differences d_i, tested by the exact
sign-flip test (db.stats). Its power is computed for the paired t-test on the same differences
(Student 1908; the noncentral t, Cohen 1988 ch. 2): with effect δ and spread σ of the d_i, the
statistic T = mean / (s/√n) follows a noncentral t with n − 1 degrees of freedom and
noncentrality δ√n/σ, and the two-sided test at α rejects when |T| > t(1 − α/2, n − 1). The
sign-flip test is asymptotically as powerful as the t-test on normal differences (Lehmann &
Romano, Testing Statistical Hypotheses, §15.2) and cannot reject at all below
`exact_floor(α)` seeds (its smallest p is 2/2^n), so every seed count here is at least that
floor. σ is the sample standard deviation of the differences observed: with few seeds it is
itself uncertain, and so are the MDE and the seed counts built on it (they are planning
figures, not guarantees).
"""

from __future__ import annotations

import math

from db.stats import ALPHA, smallest_p

POWER = 0.8  # the conventional target (Cohen 1988)
MAX_SEEDS = 10_000  # beyond this a seed count is "more than we would ever run"
# Beyond this noncentrality the power is 1 to double precision, and scipy's noncentral t can
# return NaN there.
_SURE = 38.0


def exact_floor(alpha: float = ALPHA) -> int:
    """The fewest differences at which the exact sign-flip test can reach `alpha` (two-sided):
    the smallest n with 2/2^n <= alpha, 6 at 5%."""
    n = 1
    while smallest_p(n) > alpha:
        n += 1
    return n


def power(effect: float, sd: float, n: int, *, alpha: float = ALPHA) -> float:
    """P(reject | mean difference `effect`, spread `sd`) of the two-sided paired t-test over
    n differences; NaN below two differences or without a spread. sd = 0 with a non-zero effect
    is power 1 (every difference equals the effect)."""
    if n < 2 or math.isnan(sd) or math.isnan(effect):
        return math.nan
    if sd == 0.0:
        return 1.0 if effect != 0.0 else alpha
    from scipy.stats import nct
    from scipy.stats import t as student

    df = n - 1
    nc = abs(effect) * math.sqrt(n) / sd
    if nc > _SURE:
        return 1.0
    critical = float(student.ppf(1.0 - alpha / 2.0, df))
    return float(nct.sf(critical, df, nc) + nct.cdf(-critical, df, nc))


def mde(sd: float, n: int, *, alpha: float = ALPHA, target: float = POWER) -> float:
    """The smallest |mean difference| the paired test over n differences detects with power
    `target`: the δ with power(δ, sd, n) = target. NaN below two differences or without a
    spread; 0 when the differences do not vary. Below exact_floor(alpha) seeds the exact test
    detects nothing at all: inf."""
    if n < 2 or math.isnan(sd):
        return math.nan
    if n < exact_floor(alpha):
        return math.inf
    if sd == 0.0:
        return 0.0
    from scipy.optimize import brentq

    high = sd
    while power(high, sd, n, alpha=alpha) < target:
        high *= 2.0
    return float(brentq(lambda x: power(x, sd, n, alpha=alpha) - target, 0.0, high, xtol=1e-12))


def seeds_needed(
    effect: float, sd: float, *, alpha: float = ALPHA, target: float = POWER
) -> int | None:
    """The fewest paired seeds at which a mean difference `effect` with spread `sd` is detected
    with power `target` (and the exact test can reach alpha at all); None when there is no
    effect to detect, no spread to plan from, or more than MAX_SEEDS would be needed."""
    if math.isnan(effect) or math.isnan(sd) or effect == 0.0:
        return None
    floor = exact_floor(alpha)
    if sd == 0.0:
        return floor
    if power(effect, sd, MAX_SEEDS, alpha=alpha) < target:
        return None
    low, high = floor, floor
    while power(effect, sd, high, alpha=alpha) < target:
        low, high = high, high * 2
    high = min(high, MAX_SEEDS)
    while low < high:  # the smallest n in [low, high] with enough power (power grows with n)
        middle = (low + high) // 2
        if power(effect, sd, middle, alpha=alpha) >= target:
            high = middle
        else:
            low = middle + 1
    return max(floor, low)
