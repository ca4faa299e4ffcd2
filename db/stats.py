"""The statistics behind the ablation table: means over seeds, paired differences, the leader.

Pure Python (no pandas, no scipy), so `dapo table`, the dashboard and the Prefect artifact all
compute the same numbers from the same functions, and tests pin them by hand.

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
of the per-seed differences. One seed (n = 1) has no interval: `Estimate.has_interval` is False
and the table says "n=1, no interval". For that case `paired_problems` gives an interval over the
eval problems of one seed; it covers the sampling of problems (and of the k answers) only, not
a rerun with another seed, and is labelled so wherever it appears.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

LEVEL = 0.95
OVER_SEEDS = "t over seeds"
OVER_PROBLEMS = "t over problems (one seed: problem sampling only)"


@dataclass(frozen=True)
class Estimate:
    """A mean with its two-sided interval at `level`; low and high are NaN without one.

    n: how many values (seeds, or problems) the mean is over; keys: which seeds were paired
    (empty for a mean over problems or when not tracked).
    """

    n: int
    mean: float
    low: float = math.nan
    high: float = math.nan
    level: float = LEVEL
    method: str = OVER_SEEDS
    keys: tuple[int, ...] = field(default=())

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies wholly above or below 0 (a 'significant' difference)."""
        return self.has_interval and (self.low > 0.0 or self.high < 0.0)


EMPTY = Estimate(n=0, mean=math.nan)


# --- Student's t distribution -----------------------------------------------------------------


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < eps:
            break
    return h


def _regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    # The continued fraction converges fast for x < (a + 1) / (a + b + 2); use the symmetry
    # I_x(a, b) = 1 - I_{1-x}(b, a) on the other side.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom.

    P(|T| > |t|) = I_{df / (df + t²)}(df / 2, 1 / 2).
    """
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    tail = 0.5 * _regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (t_quantile(0.975, 2) = 4.303).

    Bisection on t_cdf: 200 halvings of a bracket of width < 2^40 reach double precision.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, 2.0 * high
    for _ in range(200):
        middle = 0.5 * (low + high)
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-13 * high:
            break
    return 0.5 * (low + high)


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
    return Estimate(n, mean, mean - half, mean + half, level, method, tuple(keys))


def paired(a: Mapping[int, float], b: Mapping[int, float], *, level: float = LEVEL) -> Estimate:
    """a − b paired by seed: the t-interval of the differences a[s] − b[s] over the seeds both
    have (a seed missing on either side is left out, never compared unpaired)."""
    common = sorted(set(a) & set(b))
    return t_interval([a[s] - b[s] for s in common], level=level, keys=common)


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
    lead is best − runner_up paired by seed. `significant` only when that interval excludes 0.
    """

    best: str | None
    best_mean: float
    runner_up: str | None
    lead: Estimate

    @property
    def significant(self) -> bool:
        return self.best is not None and self.runner_up is not None and self.lead.low > 0.0


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


def p_value(estimate: Estimate) -> float:
    """Two-sided p of the one-sample t-test behind a t-interval (H0: mean 0), NaN without an
    interval. The interval's half-width is t((1 + level) / 2, n − 1) · s / √n, so the standard
    error is read back from it and T = mean / se has n − 1 degrees of freedom; p < 1 − level
    exactly when the interval excludes 0. Differences equal on every seed (s = 0): p is 0 unless
    the mean is 0."""
    if not estimate.has_interval or estimate.n < 2:
        return math.nan
    df = estimate.n - 1
    se = (estimate.high - estimate.low) / (2.0 * t_quantile(0.5 + estimate.level / 2.0, df))
    if se <= 0.0:
        return 1.0 if estimate.mean == 0.0 else 0.0
    t = abs(estimate.mean) / se
    return min(1.0, 2.0 * (1.0 - t_cdf(t, df)))


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
    Strict `<`, so that with m = 1 it rejects exactly when the 95% interval excludes 0 (the
    table's unadjusted star)."""
    return {name: p < alpha for name, p in holm_adjusted(p_values).items()}
