"""The statistics behind the ablation table: means over seeds, paired differences with an exact
test, the leader.

`dapo table`, the dashboard and the Prefect artifact all compute the same numbers from the same
functions, and tests pin them by hand. Distributions come from scipy (imported where first
needed, so that `import db.stats` stays cheap for commands that never draw a table).

The interval is a Student t-interval over seeds: each seed is one independent training run,
scored once, and the interval is mean ± t(0.975, n − 1) · s / √n with s the sample standard
deviation of the n per-seed values. Why not a bootstrap: with the 2–5 seeds a sweep has, a
bootstrap over seeds has only a handful of distinct resamples and its percentile interval is far
too narrow (a 3-seed percentile bootstrap never reaches past the extreme seeds); the t-interval
is exact for normal per-seed scores and widens honestly as n shrinks (t = 12.71 at n = 2, 4.30
at n = 3). A bootstrap over problems would only cover the choice of eval problems, not the
training seed, which is where most of the spread of an RL run comes from.

Differences between two arms are *paired*: the same seed of both arms (same data order, same
eval problems, same eval sampling seed), so the seed's own luck cancels and the interval is that
of the per-seed differences. Whether a difference is real is decided by an exact test, not by
the interval: the paired sign-flip (permutation) test, which assumes only that under "no
difference" each seed's difference is as likely to be +d as −d (Fisher 1935; Good 2005). Its p
counts, over all 2^n ways to flip the signs of the n differences, those whose |sum| reaches the
observed one (up to EXACT_UP_TO seeds; beyond, MONTE_CARLO_FLIPS random flips, seeded, so a
table reads the same every time). With n seeds the smallest p it can give is 2 / 2^n: 0.25 at 3
seeds, 0.0625 at 5, 0.031 at 6, so no paired comparison over fewer than 6 seeds can be called
real at 5%, whatever the t-interval says (it leans on normal scores, which a handful of RL runs
cannot show). `Estimate.significant` (the table's `*`) is that test at 1 − LEVEL.

One seed (n = 1) has no interval: `Estimate.has_interval` is False and the table says "n=1, no
interval". For that case `paired_problems` gives an interval over the eval problems of one seed;
it covers the sampling of problems (and of the k answers) only, not a rerun with another seed,
and is labelled so wherever it appears.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

LEVEL = 0.95
ALPHA = 1.0 - LEVEL
OVER_SEEDS = "t over seeds"
OVER_PROBLEMS = "t over problems (one seed: problem sampling only)"
# Every sign assignment is enumerated up to this many differences (2^16 = 65,536 sums of 16
# terms, a few milliseconds); beyond, a fixed random sample of flips.
EXACT_UP_TO = 16
MONTE_CARLO_FLIPS = 100_000
# Two sums of the same differences in another order can differ by rounding; a flipped sum
# within this fraction of Σ|d| of the observed one counts as reaching it.
_TIE = 1e-9


@dataclass(frozen=True)
class Estimate:
    """A mean with its two-sided interval at `level`; low and high are NaN without one.

    n: how many values (seeds, or problems) the mean is over; keys: which seeds were paired
    (empty for a mean over problems or when not tracked); sd: the values' sample standard
    deviation (NaN below two values). A paired difference also carries `p`, the two-sided p of
    the exact sign-flip test of "no difference" (NaN for a plain mean: not a test), and whether
    it came from every flip (`exact`) or from MONTE_CARLO_FLIPS of them.
    """

    n: int
    mean: float
    low: float = math.nan
    high: float = math.nan
    level: float = LEVEL
    method: str = OVER_SEEDS
    keys: tuple[int, ...] = field(default=())
    sd: float = math.nan
    p: float = math.nan
    exact: bool = True

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies wholly above or below 0."""
        return self.has_interval and (self.low > 0.0 or self.high < 0.0)

    @property
    def tested(self) -> bool:
        """Whether this is a difference with an exact test behind it."""
        return not math.isnan(self.p)

    @property
    def significant(self) -> bool:
        """The table's `*`: the exact sign-flip test rejects "no difference" at 1 − level. A
        mean that is not a difference (no p) falls back on its interval excluding 0."""
        if self.tested:
            return self.p < 1.0 - self.level
        return self.excludes_zero


EMPTY = Estimate(n=0, mean=math.nan)


# --- Student's t --------------------------------------------------------------------------------


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom (scipy's)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    from scipy.special import stdtr  # what scipy.stats.t.cdf evaluates, without its import

    return float(stdtr(df, t))


@lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (t_quantile(0.975, 2) = 4.303).

    scipy.special.stdtrit is what scipy.stats.t.ppf evaluates; called directly, a table costs
    scipy.special's import (0.13 s here) instead of scipy.stats' (0.6 s)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


# --- the exact paired test ----------------------------------------------------------------------


@lru_cache(maxsize=EXACT_UP_TO + 1)
def _flips(n: int) -> np.ndarray:
    """Every assignment of signs to n values, `[2^n, n]` of ±1.0."""
    import numpy as np

    bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
    return 1.0 - 2.0 * bits


def smallest_p(n: int) -> float:
    """The smallest two-sided p the sign-flip test can give over n differences: 2 / 2^n (every
    difference of one sign; its mirror image is the other extreme). 1 when n is 0."""
    return 1.0 if n <= 0 else min(1.0, 2.0 ** (1 - n))


def sign_flip_p(values: Sequence[float]) -> tuple[float, bool]:
    """(two-sided p, exact) of the paired sign-flip test of H0 "the differences are symmetric
    about 0": the share of sign assignments whose |Σ ±d_i| reaches |Σ d_i|.

    Every one of the 2^n assignments up to EXACT_UP_TO values (exact); beyond, scipy.stats'
    permutation_test over MONTE_CARLO_FLIPS random flips with a fixed seed. NaN for no values.
    Hand-countable: d = (1, 2, 3) has |Σ| = 6, reached only by (+,+,+) and (−,−,−): p = 2/8.
    """
    import numpy as np

    d = np.asarray([float(v) for v in values], dtype=float)
    n = len(d)
    if n == 0:
        return math.nan, True
    if np.isnan(d).any():
        raise ValueError("sign_flip_p needs numbers, got NaN")
    observed = abs(float(d.sum()))
    if n <= EXACT_UP_TO:
        tie = _TIE * float(np.abs(d).sum())
        null = np.abs(_flips(n) @ d)
        return float(np.mean(null >= observed - tie)), True
    from scipy.stats import permutation_test

    result = permutation_test(
        (d,),
        lambda x, axis: np.sum(x, axis=axis),
        permutation_type="samples",
        n_resamples=MONTE_CARLO_FLIPS,
        alternative="two-sided",
        vectorized=True,
        rng=np.random.default_rng(0),
    )
    return float(result.pvalue), False


def sign_flip_p_many(rows: np.ndarray) -> np.ndarray:
    """sign_flip_p of each row of `rows` `[S, n]` (n <= EXACT_UP_TO): the simulations of
    tests/db/test_sequential.py test thousands of comparisons per look.

    Counted by halves rather than over all 2^n flips at once: a flip's sum is a + b, a from the
    2^h flips of the first h values and b from the rest, so the flips whose |a + b| reaches
    the observed |Σ d| are, for each a, the b >= |Σ d| − a and the b <= −|Σ d| − a: two
    binary searches in the sorted b per a (2^h · log 2^(n−h) work instead of 2^n)."""
    import numpy as np

    d = np.asarray(rows, dtype=float)
    n = d.shape[1]
    if n > EXACT_UP_TO:
        return np.array([sign_flip_p(row)[0] for row in d])
    h = n // 2
    firsts = d[:, :h] @ _flips(h).T  # [S, 2^h]
    seconds = np.sort(d[:, h:] @ _flips(n - h).T, axis=1)  # [S, 2^(n−h)]
    reach = np.abs(d.sum(axis=1)) - _TIE * np.abs(d).sum(axis=1)  # [S]
    width = seconds.shape[1]
    out = np.ones(len(d))
    for i in np.flatnonzero(reach > 0):  # reach <= 0: every flip reaches it, p = 1
        a, b = firsts[i], seconds[i]
        upper = width - np.searchsorted(b, reach[i] - a, side="left")
        lower = np.searchsorted(b, -reach[i] - a, side="right")
        out[i] = (upper.sum() + lower.sum()) / 2.0**n
    return out


# --- intervals --------------------------------------------------------------------------------


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation with n − 1); NaN where undefined (n = 0; sd at n = 1)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def t_interval(
    values: Sequence[float],
    *,
    level: float = LEVEL,
    method: str = OVER_SEEDS,
    keys: Sequence[int] = (),
) -> Estimate:
    """The mean of `values` with the t-interval mean ± t((1 + level) / 2, n − 1) · s / √n.

    No interval below two values: one seed says nothing about the spread between seeds.
    """
    clean = [float(v) for v in values]
    if any(math.isnan(v) for v in clean):
        raise ValueError("t_interval needs numbers, got NaN")
    mean, sd = mean_sd(clean)
    n = len(clean)
    if n < 2:
        return Estimate(n=n, mean=mean, level=level, method=method, keys=tuple(keys))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Estimate(n, mean, mean - half, mean + half, level, method, tuple(keys), sd=sd)


def within(estimate: Estimate, low: float, high: float) -> Estimate:
    """The estimate with its interval cut at [low, high], the values the quantity can take (a
    share lies in [0, 1], a difference of shares in [−1, 1]). The quantity is never outside,
    so the cut interval covers it exactly as often as the whole one, and says nothing
    impossible: two seeds' t-interval of a share of 0.83 runs past 100% otherwise."""
    if not estimate.has_interval:
        return estimate
    return replace(estimate, low=max(estimate.low, low), high=min(estimate.high, high))


def paired(a: Mapping[int, float], b: Mapping[int, float], *, level: float = LEVEL) -> Estimate:
    """a − b paired by seed: the t-interval of the differences a[s] − b[s] over the seeds both
    have (a seed missing on either side is left out, never compared unpaired), with the exact
    sign-flip p of "no difference" (`Estimate.p`)."""
    common = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in common]
    estimate = t_interval(diffs, level=level, keys=common)
    if not diffs:
        return estimate
    p, exact = sign_flip_p(diffs)
    return Estimate(
        estimate.n,
        estimate.mean,
        estimate.low,
        estimate.high,
        level,
        estimate.method,
        estimate.keys,
        sd=estimate.sd,
        p=p,
        exact=exact,
    )


def paired_problems(
    correct_a: Sequence[int], correct_b: Sequence[int], k: int, *, level: float = LEVEL
) -> Estimate:
    """a − b of one seed, paired by eval problem: the t-interval over problems of
    (c_a[i] − c_b[i]) / k, where c[i] is the number of correct samples (of k) of problem i.

    Its mean is avg@k(a) − avg@k(b). It covers the sampling of eval problems and of the k
    answers only: a rerun with another training seed may land outside it.
    """
    if len(correct_a) != len(correct_b):
        raise ValueError(
            f"paired problems need the same eval set: {len(correct_a)} vs {len(correct_b)} problems"
        )
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    diffs = [(float(x) - float(y)) / k for x, y in zip(correct_a, correct_b, strict=True)]
    return t_interval(diffs, level=level, method=OVER_PROBLEMS)


# --- the headline -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Leader:
    """Which arm has the highest mean final score, and whether its lead is real.

    best and runner_up are the two highest means (runner_up None when only one arm is scored);
    lead is best − runner_up paired by seed. `significant` only when the exact paired test of
    that lead rejects "no difference" (Estimate.significant).
    """

    best: str | None
    best_mean: float
    runner_up: str | None
    lead: Estimate

    @property
    def significant(self) -> bool:
        """The lead passes the exact paired test (best − runner-up is ≥ 0 by construction)."""
        return (
            self.best is not None
            and self.runner_up is not None
            and self.lead.significant
            and self.lead.mean > 0.0
        )


def leader(scores: Mapping[str, Mapping[int, float]], *, level: float = LEVEL) -> Leader:
    """The arm with the highest mean over its seeds and its paired lead over the runner-up.

    `scores` maps arm -> {seed: final score}; arms without scores are ignored. Ties keep the
    earlier arm (ladder order). The runner-up is picked by mean, so the lead is tested against
    the closest competitor only.
    """
    means = [(arm, mean_sd(list(by_seed.values()))[0]) for arm, by_seed in scores.items()]
    ranked = [(arm, mean) for arm, mean in means if not math.isnan(mean)]
    # stable sort: among equal means the earlier (ladder) arm stays first
    ranked.sort(key=lambda pair: -pair[1])
    if not ranked:
        return Leader(None, math.nan, None, EMPTY)
    best, best_mean = ranked[0]
    if len(ranked) == 1:
        return Leader(best, best_mean, None, EMPTY)
    runner_up = ranked[1][0]
    return Leader(best, best_mean, runner_up, paired(scores[best], scores[runner_up], level=level))


def leader_of_rows(rows: Iterable[Mapping[str, Any]]) -> Leader:
    """stats.leader over ablation rows (each with `arm`, `seeds` and `scores`, the per-seed
    final scores of the attempts behind it)."""
    return leader(
        {
            str(row["arm"]): dict(zip(row["seeds"] or [], row["scores"] or [], strict=True))
            for row in rows
        }
    )


# --- many Δs at once ----------------------------------------------------------------------------


def holm_adjusted(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm's adjusted p-values (Holm 1979): sorted by p, the i-th smallest of m (i = 1..m)
    becomes max over j <= i of min(1, (m − j + 1) · p_(j)). Rejecting where the adjusted p is
    below alpha is Holm's step-down test at family-wise level alpha: p_(1) against alpha / m,
    p_(2) against alpha / (m − 1), ..., stopping at the first that fails. NaN p-values (no
    interval) are not tests: they are left out of m and stay NaN. Ties keep their input order."""
    tested = sorted(
        ((name, p) for name, p in p_values.items() if not math.isnan(p)), key=lambda np: np[1]
    )
    m = len(tested)
    out = {name: math.nan for name in p_values}
    running = 0.0
    for i, (name, p) in enumerate(tested):
        running = max(running, min(1.0, (m - i) * p))
        out[name] = running
    return out


def holm(p_values: Mapping[str, float], *, alpha: float = 1.0 - LEVEL) -> dict[str, bool]:
    """Which hypotheses Holm's step-down correction rejects, keeping the chance of any false
    rejection among them at most `alpha`: those whose adjusted p (holm_adjusted) is below it.
    Strict `<`, so that with m = 1 it rejects exactly when the exact test alone does (the
    table's unadjusted star, Estimate.significant)."""
    return {name: p < alpha for name, p in holm_adjusted(p_values).items()}
