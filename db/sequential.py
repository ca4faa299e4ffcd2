"""Seeds added until a comparison is decided: a group-sequential design over rounds of seeds.

`dapo sweep --until-decided` runs seeds in rounds and, after each round, looks at every open
comparison (A − B paired by seed). Looking again and again at a growing sample and stopping at
the first p < 0.05 would find "effects" far more often than 5% of the time (Armitage, McPherson
& Rowe 1969). The design here keeps the false-positive rate at α over all its looks:

* The looks are fixed in advance (`plan_looks`): the paired seed counts after each round, from
  the first at which the exact test can reach α at all (6 at 5%) up to the maximum.
* α is spent over them by Lan & DeMets' (1983) O'Brien-Fleming-type spending function
  α(t) = 2 − 2Φ(z_{1−α/2} / √t), t = n / n_max the share of the maximum seeds seen (or Pocock's
  α·ln(1 + (e − 1)t), `spending="pocock"`). Why O'Brien-Fleming: it spends almost nothing early,
  so a comparison that runs to the maximum is tested at nearly α itself (0.045 at the last of
  six looks against Pocock's 0.016): seeds are expensive, and most RL differences are small
  enough to need all of them. Early stops still happen for large effects, and futility stops
  (below) save the seeds of comparisons that are going nowhere.
* Each look's boundary is the |Z| that the looks before it leave exactly its share of α to
  cross (a look whose level the exact test cannot reach over its few seeds, 2/2^n above it,
  spends nothing and passes its share on), for Z_k the standardized sum at look k (a Brownian motion at times t_k under "no
  difference": corr(Z_j, Z_k) = √(t_j/t_k)). The joint law has no closed form beyond one look;
  the boundaries come from a seeded simulation of that Brownian motion (BOUNDARY_PATHS paths,
  so each is within about 1e-3 of the exact value, and the same every time).
* At look k the comparison's own test is the exact paired sign-flip test of db.stats (the one
  the table's star uses), rejected when its p is at most the boundary's nominal level
  2(1 − Φ(c_k)): the decision then says "real". Its false-positive rate over all looks is
  pinned by simulation in tests/db/test_sequential.py (normal, heavy-tailed and resampled real
  per-seed differences, 2,000+ sequential sweeps each).
* Futility (non-binding, so it can only lower the false-positive rate): before the last look,
  the conditional power under the current trend (Lan, Simon & Halperin 1982; the drift
  estimated from the look's own Z) is the chance that the remaining seeds would still reach
  the last boundary; below `futility` (10%) the comparison stops "undecided": more seeds are
  very unlikely to change the answer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from db import power, stats

if TYPE_CHECKING:
    import numpy as np

SPENDINGS = ("obrien-fleming", "pocock")
BOUNDARY_PATHS = 400_000
FUTILITY = 0.10
DECISIONS = ("real", "futile", "continue", "undecided")


def spent(t: float, alpha: float, spending: str) -> float:
    """Cumulative α spent by information fraction t ∈ (0, 1]."""
    from scipy.stats import norm

    if not 0.0 < t <= 1.0 + 1e-12:
        raise ValueError(f"information fraction must be in (0, 1], got {t}")
    if spending == "obrien-fleming":
        return float(2.0 - 2.0 * norm.cdf(norm.ppf(1.0 - alpha / 2.0) / math.sqrt(min(t, 1.0))))
    if spending == "pocock":
        return float(alpha * math.log(1.0 + (math.e - 1.0) * min(t, 1.0)))
    raise ValueError(f"spending {spending!r}: use one of {', '.join(SPENDINGS)}")


def plan_looks(first: int, per_round: int, most: int, alpha: float = stats.ALPHA) -> list[int]:
    """The paired seed counts at which the comparisons are tested: after each round (first
    `first` seeds, then `per_round` more, up to `most`), from the first count at which the exact
    test can reach α (power.exact_floor) on. ValueError for a plan with no such look."""
    if first < 1 or per_round < 1 or most < first:
        raise ValueError(
            f"rounds of seeds: first {first}, then {per_round} per round, at most {most}: "
            "each must be >= 1 and the maximum at least the first round"
        )
    rounds, n = [], first
    while True:
        rounds.append(n)
        if n >= most:
            break
        n = min(most, n + per_round)
    floor = power.exact_floor(alpha)
    looks = [n for n in rounds if n >= floor]
    if not looks:
        raise ValueError(
            f"at most {most} seeds: the exact test needs at least {floor} paired seeds to "
            f"reach {100 * alpha:g}%, so nothing could ever be decided; raise --max-seeds"
        )
    return looks


@dataclass(frozen=True)
class Design:
    """Looks (paired seeds at each), α, spending, their boundaries on |Z| and the nominal level
    each look's test must reach, 2(1 − Φ(c_k)) (0 where a look tests nothing)."""

    looks: tuple[int, ...]
    alpha: float
    spending: str
    boundaries: tuple[float, ...]
    nominal: tuple[float, ...]
    futility: float = FUTILITY

    def fraction(self, k: int) -> float:
        return self.looks[k] / self.looks[-1]


def design(
    looks: tuple[int, ...],
    alpha: float = stats.ALPHA,
    spending: str = "obrien-fleming",
    futility: float = FUTILITY,
) -> Design:
    """The boundaries of `looks` (strictly increasing seed counts) at family-wise α."""
    if not looks or any(b <= a for a, b in itertools.pairwise(looks)):
        raise ValueError(f"looks must be increasing seed counts, got {looks}")
    if spending not in SPENDINGS:
        raise ValueError(f"spending {spending!r}: use one of {', '.join(SPENDINGS)}")
    if not 0.0 <= futility < 1.0:
        raise ValueError(f"futility {futility}: a conditional power in [0, 1)")
    from scipy.stats import norm

    bounds = _boundaries(tuple(int(n) for n in looks), float(alpha), spending)
    nominal = tuple(float(2.0 * norm.sf(c)) for c in bounds)
    return Design(tuple(int(n) for n in looks), alpha, spending, bounds, nominal, futility)


@lru_cache(maxsize=64)
def _boundaries(looks: tuple[int, ...], alpha: float, spending: str) -> tuple[float, ...]:
    import numpy as np
    from scipy.stats import norm

    times = np.asarray(looks, dtype=float) / looks[-1]
    z = _null_paths(times)  # [paths, looks]
    going = np.ones(len(z), dtype=bool)
    bounds, before = [], 0.0
    for k, t in enumerate(times):
        share = spent(float(t), alpha, spending) - before
        if k == 0:
            c = float(norm.isf(share / 2.0))  # one look alone: exact
        else:
            size = np.abs(z[going, k])
            cross = round(share * len(z))
            c = math.inf if cross <= 0 else float(np.sort(size)[len(size) - cross])
        if stats.smallest_p(int(looks[k])) > 2.0 * norm.sf(c):
            # The exact test over this few seeds cannot reach this look's level: it spends
            # nothing here, and its share of α passes on to the next look.
            c = math.inf
        else:
            before += share
        bounds.append(c)
        going &= np.abs(z[:, k]) < c
    return tuple(bounds)


def _null_paths(times: np.ndarray) -> np.ndarray:
    """Z at each look of BOUNDARY_PATHS Brownian paths (seeded): Z_k = W(t_k) / √t_k."""
    import numpy as np

    rng = np.random.default_rng(20251)
    steps = np.diff(np.concatenate([[0.0], times]))
    w = np.cumsum(rng.standard_normal((BOUNDARY_PATHS, len(times))) * np.sqrt(steps), axis=1)
    return w / np.sqrt(times)


@dataclass(frozen=True)
class Look:
    """One look at a comparison: its paired seeds, Δ, exact p and what was decided."""

    look: int  # 0-based index into the design's looks
    n: int
    mean: float
    p: float
    nominal: float
    conditional_power: float
    decision: str  # one of DECISIONS


def _z_of(p: float, mean: float) -> float:
    from scipy.stats import norm

    return math.copysign(float(norm.isf(max(p, 1e-300) / 2.0)), mean if mean != 0 else 1.0)


def conditional_power(d: Design, k: int, z: float) -> float:
    """P(the last look rejects | Z_k = z) under the current trend (drift = z/√t_k)."""
    from scipy.stats import norm

    t = d.fraction(k)
    if t >= 1.0:
        return math.nan
    b = abs(z) * math.sqrt(t)  # the Brownian motion's value at t, in the trend's direction
    drift = b / t
    need = d.boundaries[-1] - b - drift * (1.0 - t)
    return float(norm.sf(need / math.sqrt(1.0 - t)))


def look(d: Design, k: int, diffs: Sequence[float]) -> Look:
    """Test one comparison at look k of the design on its paired differences (as many as the
    look's seed count; more or fewer is a mistake in the caller)."""
    if len(diffs) != d.looks[k]:
        raise ValueError(f"look {k} is at {d.looks[k]} paired seeds, got {len(diffs)}")
    p, _ = stats.sign_flip_p(diffs)
    mean = math.fsum(diffs) / len(diffs)
    nominal = d.nominal[k]
    last = k == len(d.looks) - 1
    cp = math.nan if last else conditional_power(d, k, _z_of(p, mean))
    if p <= nominal:
        decision = "real"
    elif last:
        decision = "undecided"
    elif cp < d.futility:
        decision = "futile"
    else:
        decision = "continue"
    return Look(k, len(diffs), mean, p, nominal, cp, decision)


def run(d: Design, diffs: Sequence[float]) -> list[Look]:
    """The whole sequence on one comparison's differences in seed order (at least as many as
    the last look needs, or fewer: it stops where the data does): every look until a decision."""
    out: list[Look] = []
    for k, n in enumerate(d.looks):
        if len(diffs) < n:
            break
        result = look(d, k, list(diffs[:n]))
        out.append(result)
        if result.decision != "continue":
            break
    return out


@dataclass(frozen=True)
class Operating:
    """What a design does over simulated sequential sweeps: the share that ended "real", that
    stopped for futility, and the paired seeds used on average (and their spread)."""

    sims: int
    real: float
    futile: float
    mean_seeds: float


def simulate(d: Design, diffs: np.ndarray) -> Operating:
    """Run the design on every row of `diffs` `[sims, n_max]` (each row one comparison's
    per-seed differences in seed order), all rows at a look together; the same decisions as
    `look`, vectorized."""
    import numpy as np
    from scipy.stats import norm

    sims = len(diffs)
    going = np.ones(sims, dtype=bool)
    real = np.zeros(sims, dtype=bool)
    futile = np.zeros(sims, dtype=bool)
    used = np.zeros(sims, dtype=int)
    for k, n in enumerate(d.looks):
        rows = np.flatnonzero(going)
        if not len(rows):
            break
        p = stats.sign_flip_p_many(diffs[rows, :n])
        used[rows] = n
        hit = p <= d.nominal[k]
        real[rows[hit]] = True
        going[rows[hit]] = False
        if k < len(d.looks) - 1 and d.futility > 0:
            t = d.fraction(k)
            b = norm.isf(np.maximum(p, 1e-300) / 2.0) * np.sqrt(t)  # |Z_k| √t_k
            cp = norm.sf((d.boundaries[-1] - b - (b / t) * (1.0 - t)) / np.sqrt(1.0 - t))
            stop = ~hit & (cp < d.futility)
            futile[rows[stop]] = True
            going[rows[stop]] = False
    return Operating(
        sims=sims,
        real=float(real.mean()),
        futile=float(futile.mean()),
        mean_seeds=float(used.mean()),
    )


def theory(d: Design, effect: float, paths: int = 200_000) -> Operating:
    """What the design promises for a true mean difference of `effect` standard deviations of
    the per-seed differences, in the large-sample (normal) model it was built on: Z_k =
    (W(t_k) + θ·t_k)/√t_k with θ = effect·√n_max, the same boundaries and futility rule. The
    simulation tests check the real procedure (the exact test at each look's seed count)
    against it."""
    import numpy as np
    from scipy.stats import norm

    times = np.asarray(d.looks, dtype=float) / d.looks[-1]
    theta = effect * math.sqrt(d.looks[-1])
    rng = np.random.default_rng(7)
    steps = np.diff(np.concatenate([[0.0], times]))
    w = np.cumsum(rng.standard_normal((paths, len(times))) * np.sqrt(steps), axis=1)
    z = (w + theta * times) / np.sqrt(times)
    going = np.ones(paths, dtype=bool)
    real = np.zeros(paths, dtype=bool)
    futile = np.zeros(paths, dtype=bool)
    used = np.zeros(paths)
    c_last = d.boundaries[-1]
    for k, t in enumerate(times):
        used[going] = d.looks[k]
        hit = going & (np.abs(z[:, k]) >= d.boundaries[k])
        real |= hit
        going &= ~hit
        if k < len(times) - 1:
            b = np.abs(z[:, k]) * math.sqrt(t)
            cp = norm.sf((c_last - b - (b / t) * (1.0 - t)) / math.sqrt(1.0 - t))
            stop = going & (cp < d.futility)
            futile |= stop
            going &= ~stop
    return Operating(paths, float(real.mean()), float(futile.mean()), float(used.mean()))


def design_mde(d: Design, target: float = power.POWER) -> float:
    """The effect (in standard deviations of the per-seed differences) the design detects with
    power `target` in its own model (`theory`)."""
    from scipy.optimize import brentq

    return float(brentq(lambda e: theory(d, e, 50_000).real - target, 0.01, 5.0, xtol=1e-3))
