"""The mechanism scoreboard: did each DAPO mechanism do anything, where, and how sure are we?

The ablation table asks whether a change helped; a researcher first asks whether it did
anything. Each DAPO mechanism (arXiv 2503.14476, §3) has a check here (CHECKS): the task and
preset where the platform shows it acting, the arm that adds it and the arm it is compared
with, the metric it moves, and the command whose sweep measures it. `scoreboard` reads each
check's sweep from the store by its name (the newest sweep of that name) and gives one row per
check: the paired Δ with its 95% interval over seeds, n and the exact sign-flip p (db.stats),
or "not measured" and the command that would measure it. Nothing is typed by hand.

Two checks need more than a window mean of a logged metric, and have their own tables:
- `dose_response`, Clip-Higher's dose-response on the lookup task (ladder clip-dose): per arm
  (ε_high 0.1, 0.2, 0.28, 0.5) the gradient updates until the held-out accuracy first reaches
  50% (db.efficiency.reach), the area under the held-out curve (db.ablation's area), the share
  of tokens at the upper bound over the first rollout steps, and the cap-only prediction: if
  the rewarded token's probability grows at most ×(1 + ε_high) per rollout step (DAPO §3.1),
  p0 reaches the threshold after ln(threshold / p0) / ln(1 + ε_high) steps at the earliest.
  A monotone dose-response is judged per seed by Page's trend test (scipy.stats.
  page_trend_test, Page 1963: ordered alternatives over blocks, here the seeds), beside the
  adjacent paired Δs;
- `entropy_probe`, the clip's own pull on the entropy under a coin-flip reward (ladder
  clip-entropy; Park et al. arXiv 2509.26114, Chen et al. arXiv 2512.16912): per seed the
  least-squares slope of `entropy/decision` over the run's steps (scipy.stats.linregress), per
  arm its mean and the paired Δ to the parent, and whether its sign is the one the papers
  predict.

db imports no torch: everything here reads the store (db.reads, db.mechanism_table,
db.efficiency, db.ablation) and computes with db.stats and scipy.stats.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import sqlalchemy as sa

from dapo_common import metric_names as M
from db import ablation, efficiency, mechanisms, stats
from db.mechanism_table import mechanism_table
from db.models import RUNS, SWEEPS
from db.reads import (
    arm_order,
    metric_curves,
    parents,
    runs_of_sweep,
    selected_attempts,
    sweep_row,
)
from db.table_format import (
    FORMATS,
    MISSING,
    _aligned,
    _escape,
    _markdown,
    estimate_text,
    metric_label,
)

# --- the checks --------------------------------------------------------------------------------
WINDOW = "window"  # the mechanism table's first-window Δ of a logged metric
REACH = "reach"  # gradient updates until the held-out curve first reaches a threshold
AREA = "area"  # the mean held-out score over the run's evaluations (area under the curve)
SLOPE = "slope"  # least-squares slope of a logged metric over the run's steps

TINY_SWEEP = "scoreboard-tiny"
DOSE_SWEEP = "mechanisms-clip-dose"
ENTROPY_SWEEP = "mechanisms-clip-entropy"
REAL_SWEEP = "scoreboard-smollm2"
SEEDS = "0,1,2,3,4,5"
TINY_COMMAND = f"dapo sweep --preset tiny --seeds {SEEDS} --steps 10 --name {TINY_SWEEP}"
DOSE_COMMAND = f"dapo sweep --preset lookup --ladder clip-dose --seeds {SEEDS} --name {DOSE_SWEEP}"
ENTROPY_COMMAND = (
    f"dapo sweep --preset lookup --ladder clip-entropy --seeds {SEEDS} --name {ENTROPY_SWEEP}"
)
REAL_COMMAND = (
    "dapo sweep --preset smollm2-135m --arms overlong_filter,clip_higher --seeds 0,1,2 "
    f"--steps 5 --set algo.ppo_epochs=4 --name {REAL_SWEEP}"
)
THRESHOLD = 0.5  # the dose-response's held-out accuracy to reach
EARLY = 5  # rollout steps at a run's start over which clip_ratio/high is averaged


@dataclass(frozen=True)
class Check:
    """Where the platform shows one mechanism acting: `arm` against `parent` in the sweep named
    `sweep` (made by `command`), on `metric` measured as `kind`, over `window` steps."""

    mechanism: str
    preset: str
    sweep: str
    command: str
    arm: str
    parent: str
    metric: str
    kind: str = WINDOW
    window: int = 10
    about: str = ""
    """What the row shows, in a few words (the metric's meaning for a derived measure)."""


CHECKS: tuple[Check, ...] = (
    Check(
        "overlong filter",
        "tiny",
        TINY_SWEEP,
        TINY_COMMAND,
        "overlong_filter",
        "grpo",
        M.LOSS_TRUNCATED_SHARE,
        about="truncated responses' share of the loss, first 10 steps",
    ),
    Check(
        "Clip-Higher",
        "lookup",
        DOSE_SWEEP,
        DOSE_COMMAND,
        "eps_high=0.28",
        "eps_high=0.2",
        "updates to 50%, interpolated",
        REACH,
        about="gradient updates until held-out accuracy first reaches 50% (the crossing "
        "interpolated between evaluations)",
    ),
    Check(
        "Clip-Higher",
        "lookup",
        DOSE_SWEEP,
        DOSE_COMMAND,
        "eps_high=0.28",
        "eps_high=0.2",
        "area under the curve",
        AREA,
        about="mean held-out accuracy over the run's evaluations (pp)",
    ),
    Check(
        "Clip-Higher",
        "lookup",
        ENTROPY_SWEEP,
        ENTROPY_COMMAND,
        "eps_high=0.28",
        "eps=0.2_0.2",
        M.ENTROPY_DECISION,
        SLOPE,
        about="slope of the decision's entropy under a coin-flip reward (mnat/step)",
    ),
    Check(
        "soft overlong punishment",
        "tiny",
        TINY_SWEEP,
        TINY_COMMAND,
        "soft_punish",
        "clip_higher",
        M.OVERLONG_PENALTY_MEAN,
        about="penalty per response, first 10 steps",
    ),
    Check(
        "token-level loss",
        "tiny",
        TINY_SWEEP,
        TINY_COMMAND,
        "token_loss",
        "soft_punish",
        M.LOSS_LONG_SHARE,
        about="longer half of the responses' share of the loss, first 10 steps",
    ),
    Check(
        "dynamic sampling",
        "tiny",
        TINY_SWEEP,
        TINY_COMMAND,
        "dapo",
        "token_loss",
        M.TRAIN_INFORMATIVE,
        about="informative groups in the training batch, first 10 steps",
    ),
    Check(
        "Clip-Higher, real model",
        "smollm2-135m",
        REAL_SWEEP,
        REAL_COMMAND,
        "clip_higher",
        "overlong_filter",
        M.CLIP_RATIO_HIGH,
        window=5,
        about="tokens at the upper clip bound, first 5 steps (μ = 4)",
    ),
)


# --- reading the store ---------------------------------------------------------------------------
def find_sweep(engine: sa.Engine, name: str) -> int | None:
    """The newest sweep named `name`, None when the store has none."""
    s = SWEEPS.c
    query = sa.select(s.id).where(s.name == name).order_by(s.id.desc()).limit(1)
    with engine.connect() as conn:
        found = conn.execute(query).scalar()
    return None if found is None else int(found)


def _completed(engine: sa.Engine, sweep_id: int) -> pd.DataFrame:
    """The runs that speak for each (arm, seed) of the sweep (db.reads' rule), completed, with
    their stored config (a `config` column)."""
    runs = runs_of_sweep(engine, sweep_id)
    if runs.empty:
        return runs.assign(config=pd.Series(dtype=object))
    chosen = selected_attempts(runs)
    done = chosen[chosen["status"] == "completed"]
    ids = [int(r) for r in done["run_id"]]
    r = RUNS.c
    with engine.connect() as conn:
        configs = dict(conn.execute(sa.select(r.id, r.config).where(r.id.in_(ids))).all())
    return done.assign(config=[configs.get(i) or {} for i in ids])


def _curves(engine: sa.Engine, runs: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    return metric_curves(engine, [int(r) for r in runs["run_id"]], list(names))


def per_seed_mean(
    curves: pd.DataFrame, name: str, steps: int | None = None
) -> dict[str, dict[int, float]]:
    """arm -> seed -> the metric's mean over the run's first `steps` logged steps (None: all);
    non-finite values (stored as NaN) are left out, a run with none is left out."""
    rows = curves[curves["name"] == name].dropna(subset=["value"]).sort_values("step")
    out: dict[str, dict[int, float]] = {}
    for (arm, seed), group in rows.groupby(["arm", "seed"]):
        values = group["value"].astype(float).tolist()
        values = values[:steps] if steps is not None else values
        if values:
            out.setdefault(str(arm), {})[int(seed)] = math.fsum(values) / len(values)
    return out


def per_seed_slope(curves: pd.DataFrame, name: str) -> dict[str, dict[int, float]]:
    """arm -> seed -> the least-squares slope of the metric against the rollout step over the
    run's logged steps (scipy.stats.linregress); runs with fewer than 3 finite values are left
    out (a line through two points has no spread to speak of)."""
    from scipy.stats import linregress

    rows = curves[curves["name"] == name].dropna(subset=["value"])
    out: dict[str, dict[int, float]] = {}
    for (arm, seed), group in rows.groupby(["arm", "seed"]):
        if len(group) >= 3:
            fit = linregress(group["step"].astype(float), group["value"].astype(float))
            out.setdefault(str(arm), {})[int(seed)] = float(fit.slope)
    return out


def _estimate(values: Mapping[int, float]) -> stats.Estimate:
    return stats.t_interval(list(values.values()), keys=list(values))


def _config_value(runs: pd.DataFrame, arm: str, key: str) -> Any:
    """A dotted key of the arm's stored run config (the first run that has one)."""
    for config in runs[runs["arm"] == arm]["config"]:
        node: Any = config or {}
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            return node
    return None


# --- Clip-Higher's dose-response -----------------------------------------------------------------
@dataclass(frozen=True)
class DoseArm:
    """One dose of the dose-response (see dose_response)."""

    arm: str
    parent: str | None
    clip_low: float
    clip_high: float
    seeds: tuple[int, ...]
    reached: str  # "k/n" seeds whose held-out curve reached the threshold
    updates: stats.Estimate  # gradient updates to the threshold, over the seeds that reached it
    steps: stats.Estimate  # the same in rollout steps
    predicted_steps: float  # cap-only: ln(threshold / p0) / ln(1 + ε_high)
    area: stats.Estimate  # mean held-out accuracy over the run's evaluations, step 0 included
    clip_high_early: stats.Estimate  # clip_ratio/high over the first EARLY steps
    eligible_early: stats.Estimate  # clip_ratio/high_eligible, the same steps
    natural_early: stats.Estimate  # clip_ratio/high_natural, when the runs logged it
    decision_early: stats.Estimate  # clip_ratio/high_decision, when the runs logged it
    ratio_max_early: stats.Estimate  # ratio/max (the step's largest token ratio), the same steps
    delta_updates: stats.Estimate  # − the parent's, paired by seed
    delta_area: stats.Estimate
    updates_by_seed: Mapping[int, float]  # inf: never reached (for the trend test's ranks)
    area_by_seed: Mapping[int, float]
    # rollout steps to the threshold, the crossing interpolated linearly between the two
    # evaluations around it (crossing_step): finer than the evaluation's one-step grid
    crossing: stats.Estimate = stats.EMPTY
    delta_crossing: stats.Estimate = stats.EMPTY
    crossing_by_seed: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Dose:
    """The dose-response of a clip-dose sweep: arms in ladder order, the start, the trend."""

    sweep_id: int
    threshold: float
    start: float  # mean step-0 held-out accuracy over every run (p0 of the prediction)
    updates_per_step: float
    arms: tuple[DoseArm, ...]
    trend_updates: tuple[float, float, int]  # Page's L, its p, seeds (blocks) in the test
    trend_area: tuple[float, float, int]
    trend_crossing: tuple[float, float, int] = (math.nan, math.nan, 0)
    label: str = ""  # the evaluation, "lookup-eval avg@16"
    early: int = EARLY


def cap_only_steps(start: float, threshold: float, clip_high: float) -> float:
    """Rollout steps from `start` to `threshold` when a probability grows by at most the
    factor 1 + ε_high per step (DAPO §3.1): ln(threshold / start) / ln(1 + ε_high).
    15% → 50%: 12.6, 6.6, 4.9, 3.0 steps at ε_high 0.1, 0.2, 0.28, 0.5."""
    if not 0.0 < start <= threshold or clip_high <= 0.0:
        return math.nan if start <= 0.0 or clip_high <= 0.0 else 0.0
    return math.log(threshold / start) / math.log1p(clip_high)


def crossing_step(curve: Mapping[int, float], threshold: float) -> float:
    """The rollout step at which a held-out curve (step -> score) first reaches `threshold`,
    linear between the last evaluation below it and the first at or above it; inf when it never
    does. (0.3 at step 3, 0.6 at step 4, threshold 0.5: 3 + 0.2/0.3 = 3.67.)"""
    steps = sorted(curve)
    for before, at in itertools.pairwise(steps):
        if curve[at] >= threshold > curve[before]:
            return before + (at - before) * (threshold - curve[before]) / (
                curve[at] - curve[before]
            )
    if steps and curve[steps[0]] >= threshold:
        return float(steps[0])
    return math.inf


def page_trend(
    by_seed: Sequence[Mapping[int, float]], *, increasing: bool
) -> tuple[float, float, int]:
    """Page's test (scipy.stats.page_trend_test) that the treatments, in the given order, are
    ranked increasingly (`increasing`) or decreasingly within each seed, over the seeds every
    treatment has: (L, one-sided p, seeds). inf values rank last (a seed that never reached a
    threshold took longest). NaN p below 2 seeds or 3 treatments (the test's minimum)."""
    import numpy as np
    from scipy.stats import page_trend_test

    common = sorted(set.intersection(*(set(d) for d in by_seed))) if by_seed else []
    m = len(by_seed)
    if len(common) < 2 or m < 3:
        return math.nan, math.nan, len(common)
    data = np.array([[d[s] for d in by_seed] for s in common], dtype=float)
    ranks = list(range(1, m + 1)) if increasing else list(range(m, 0, -1))
    result = page_trend_test(data, predicted_ranks=ranks)
    return float(result.statistic), float(result.pvalue), len(common)


def dose_response(
    engine: sa.Engine, sweep_id: int, threshold: float = THRESHOLD, early: int = EARLY
) -> Dose:
    """Clip-Higher's dose-response over a sweep of the clip-dose ladder (or any sweep whose arms
    differ in algo.clip_high): see the module docstring. The held-out evaluation is the
    ablation table's (its primary data set and k)."""
    table = ablation.ablation_table(engine, sweep_id)
    reach = efficiency.reach(engine, sweep_id, table, threshold)
    runs = _completed(engine, sweep_id)
    names = [
        M.CLIP_RATIO_HIGH,
        M.CLIP_RATIO_HIGH_ELIGIBLE,
        M.CLIP_RATIO_HIGH_NATURAL,
        M.RATIO_MAX,
        M.CLIP_RATIO_HIGH_DECISION,
    ]
    curves = _curves(engine, runs, names)
    high, eligible, natural, ratio_max, decision = (per_seed_mean(curves, n, early) for n in names)
    dataset = next((d for d in table["eval_dataset"] if isinstance(d, str)), None)
    k = next((int(v) for v in table["eval_k"] if not pd.isna(v)), None)
    curves_by = ablation.sweep_curves(engine, sweep_id, dataset, k) if dataset and k else {}
    area_by = {
        key: math.fsum(p.value for p in curve.values()) / len(curve)
        for key, curve in curves_by.items()
        if 0 in curve
    }
    starts = [float(s) for ss in table["start_scores"] for s in (ss or []) if s == s]
    start = math.fsum(starts) / len(starts) if starts else math.nan
    reach_of = {a.arm: a for a in reach.arms} if reach is not None else {}
    epochs = _config_value(runs, str(table["arm"].iloc[0]), "algo.ppo_epochs") if len(table) else 1
    train = _config_value(runs, str(table["arm"].iloc[0]), "batch.train_batch_size") or 1
    mini = _config_value(runs, str(table["arm"].iloc[0]), "batch.mini_batch_size") or 1
    per_step = float(epochs or 1) * float(train) / float(mini)
    arms: list[DoseArm] = []
    for row in table.to_dict("records"):
        arm = str(row["arm"])
        parent = None if pd.isna(row["parent"]) else str(row["parent"])
        seeds = tuple(int(s) for s in row["seeds"] or [])
        got = reach_of.get(arm)
        spent = dict(got.spent["updates"]) if got is not None else {}
        eps_high = float(_config_value(runs, arm, "algo.clip_high") or math.nan)
        arms.append(
            DoseArm(
                arm=arm,
                parent=parent,
                clip_low=float(_config_value(runs, arm, "algo.clip_low") or math.nan),
                clip_high=eps_high,
                seeds=seeds,
                reached=got.reached_text if got is not None else f"0/{len(seeds)}",
                updates=_estimate(spent),
                steps=_estimate({s: v / per_step for s, v in spent.items()}),
                predicted_steps=cap_only_steps(start, threshold, eps_high),
                area=row["area"],
                clip_high_early=_estimate(high.get(arm, {})),
                eligible_early=_estimate(eligible.get(arm, {})),
                natural_early=_estimate(natural.get(arm, {})),
                decision_early=_estimate(decision.get(arm, {})),
                ratio_max_early=_estimate(ratio_max.get(arm, {})),
                delta_updates=(
                    got.delta_parent["updates"] if got is not None and parent else stats.EMPTY
                ),
                delta_area=row["area_delta_parent"] if parent else stats.EMPTY,
                updates_by_seed={s: spent.get(s, math.inf) for s in seeds},
                area_by_seed={s: area_by[(arm, s)] for s in seeds if (arm, s) in area_by},
            )
        )
    arms = _with_crossings(arms, curves_by, threshold)
    arms.sort(key=lambda a: a.clip_high)
    return Dose(
        sweep_id=sweep_id,
        threshold=threshold,
        start=start,
        updates_per_step=per_step,
        arms=tuple(arms),
        trend_updates=page_trend([a.updates_by_seed for a in arms], increasing=False),
        trend_area=page_trend([a.area_by_seed for a in arms], increasing=True),
        trend_crossing=page_trend([a.crossing_by_seed for a in arms], increasing=False),
        label=metric_label(table) if len(table) else "",
        early=early,
    )


def _with_crossings(
    arms: list[DoseArm], curves: Mapping[tuple[str, int], Mapping[int, Any]], threshold: float
) -> list[DoseArm]:
    """The arms with their interpolated crossings (crossing_step of each seed's held-out
    curve), their mean over the seeds that crossed and the paired Δ to the parent."""
    import dataclasses

    by_seed = {
        a.arm: {
            s: crossing_step({k: p.value for k, p in curves.get((a.arm, s), {}).items()}, threshold)
            for s in a.seeds
        }
        for a in arms
    }

    def finite(d: Mapping[int, float]) -> dict[int, float]:
        return {s: v for s, v in d.items() if math.isfinite(v)}

    return [
        dataclasses.replace(
            a,
            crossing_by_seed=by_seed[a.arm],
            crossing=_estimate(finite(by_seed[a.arm])),
            delta_crossing=(
                stats.paired(finite(by_seed[a.arm]), finite(by_seed[a.parent]))
                if a.parent in by_seed
                else stats.EMPTY
            ),
        )
        for a in arms
    ]


def monotone(estimates: Sequence[stats.Estimate], *, increasing: bool) -> bool:
    """Whether the means are strictly ordered (a missing mean breaks the order)."""
    means = [e.mean for e in estimates]
    if any(math.isnan(m) for m in means) or len(means) < 2:
        return False
    pairs = list(itertools.pairwise(means))
    return all(b > a for a, b in pairs) if increasing else all(b < a for a, b in pairs)


# --- the entropy probe ---------------------------------------------------------------------------
# The sign the papers predict for each comparison of the probe: Park et al. (arXiv 2509.26114)
# and Chen et al. (arXiv 2512.16912): under a reward independent of the answer, clipping at
# 1 + ε_high lowers the entropy and clipping at 1 − ε_low raises it, so the symmetric clip
# lowers it (a slope < 0), a larger ε_high lowers it less (Δ slope > 0 against the smaller) and
# a tighter ε_low raises it (Δ slope > 0 against the symmetric clip).
LOWERS, RAISES = -1, +1


@dataclass(frozen=True)
class ProbeArm:
    arm: str
    parent: str | None
    clip_low: float
    clip_high: float
    seeds: tuple[int, ...]
    slope: stats.Estimate  # nats per rollout step, over seeds
    delta_parent: stats.Estimate  # slope − the parent's, paired by seed
    first: stats.Estimate  # the metric's mean over the first 5 steps
    last: stats.Estimate  # ... and the last 5
    clip_high_mean: stats.Estimate  # clip_ratio/high over the run
    clip_low_mean: stats.Estimate
    expected: int  # the papers' sign: of the slope (no parent) or of Δ parent
    verdict: str  # "as predicted" / "opposite" / "not decided"


@dataclass(frozen=True)
class Probe:
    sweep_id: int
    metric: str
    arms: tuple[ProbeArm, ...]


def _verdict(estimate: stats.Estimate, expected: int) -> str:
    """The papers' sign against the measured one: decided by the exact sign-flip test for a
    paired Δ (as every Δ of the platform), by the interval for the first arm's own slope."""
    if estimate.n == 0 or math.isnan(estimate.mean):
        return "not measured"
    agrees = (estimate.mean > 0) == (expected > 0)
    if estimate.significant:
        return "as predicted" if agrees else "opposite"
    lean = "as predicted" if agrees else "the other way"
    why = f"p = {estimate.p:.2g}" if estimate.tested else "interval spans 0"
    return f"not decided ({why}); leans {lean}"


def entropy_probe(engine: sa.Engine, sweep_id: int, metric: str = M.ENTROPY_DECISION) -> Probe:
    """The clip-entropy sweep's slopes (see the module docstring), arms in ladder order."""
    with engine.connect() as conn:
        sweep = sweep_row(conn, engine, sweep_id)
    runs = _completed(engine, sweep_id)
    names = [metric, M.CLIP_RATIO_HIGH, M.CLIP_RATIO_LOW]
    curves = _curves(engine, runs, names)
    slopes = per_seed_slope(curves, metric)
    firsts = per_seed_mean(curves, metric, 5)
    lasts = per_seed_mean(
        curves.assign(step=-curves["step"]) if not curves.empty else curves, metric, 5
    )
    highs, lows = per_seed_mean(curves, M.CLIP_RATIO_HIGH), per_seed_mean(curves, M.CLIP_RATIO_LOW)
    order = arm_order(sweep, runs)
    parent_of = parents(sweep, order)
    clips = {
        arm: (
            float(_config_value(runs, arm, "algo.clip_low") or math.nan),
            float(_config_value(runs, arm, "algo.clip_high") or math.nan),
        )
        for arm in order
    }
    arms = []
    for arm in order:
        parent = parent_of.get(arm)
        mine = slopes.get(arm, {})
        if parent is None:
            expected, delta = LOWERS, _estimate(mine)
        else:
            expected = RAISES  # a larger ε_high, or a tighter ε_low, than the parent's
            delta = stats.paired(mine, slopes.get(str(parent), {}))
        arms.append(
            ProbeArm(
                arm=arm,
                parent=None if parent is None else str(parent),
                clip_low=clips[arm][0],
                clip_high=clips[arm][1],
                seeds=tuple(sorted(mine)),
                slope=_estimate(mine),
                delta_parent=delta if parent is not None else stats.EMPTY,
                first=_estimate(firsts.get(arm, {})),
                last=_estimate(lasts.get(arm, {})),
                clip_high_mean=_estimate(highs.get(arm, {})),
                clip_low_mean=_estimate(lows.get(arm, {})),
                expected=expected,
                verdict=_verdict(delta, expected),
            )
        )
    return Probe(sweep_id=sweep_id, metric=metric, arms=tuple(arms))


# --- the scoreboard ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One check's result: its Δ (arm − parent, paired by seed) or why there is none."""

    check: Check
    sweep_id: int | None
    delta: stats.Estimate = field(default=stats.EMPTY)
    status: str = "not measured"


def _check_delta(engine: sa.Engine, check: Check, sweep_id: int) -> stats.Estimate:
    if check.kind == WINDOW:
        frame = mechanism_table(engine, sweep_id, [check.metric], window=check.window)
        row = frame[(frame["arm"] == check.arm) & (frame["metric"] == check.metric)]
        if row.empty or row["parent"].iloc[0] != check.parent:
            return stats.EMPTY
        estimate: stats.Estimate = row["delta_parent_first"].iloc[0]
        return estimate
    if check.kind in (REACH, AREA):
        dose = dose_response(engine, sweep_id)
        arms = {a.arm: a for a in dose.arms}
        if check.arm not in arms or check.parent not in arms:
            return stats.EMPTY
        if check.kind == AREA:
            return stats.paired(arms[check.arm].area_by_seed, arms[check.parent].area_by_seed)
        # the interpolated crossing, in updates: finer than the evaluation's one-step grid
        mine, theirs = arms[check.arm].crossing_by_seed, arms[check.parent].crossing_by_seed
        both = {s for s in mine if math.isfinite(mine[s])} & {
            s for s in theirs if math.isfinite(theirs[s])
        }
        per = dose.updates_per_step
        return stats.paired({s: per * mine[s] for s in both}, {s: per * theirs[s] for s in both})
    if check.kind == SLOPE:
        runs = _completed(engine, sweep_id)
        slopes = per_seed_slope(_curves(engine, runs, [check.metric]), check.metric)
        return stats.paired(slopes.get(check.arm, {}), slopes.get(check.parent, {}))
    raise ValueError(f"unknown check kind {check.kind!r}")


def scoreboard(engine: sa.Engine, checks: Sequence[Check] = CHECKS) -> list[Row]:
    """One Row per check, from the newest sweep of its name in the store."""
    rows = []
    for check in checks:
        sweep_id = find_sweep(engine, check.sweep)
        if sweep_id is None:
            rows.append(Row(check, None, status=f"not measured: run `{check.command}`"))
            continue
        delta = _check_delta(engine, check, sweep_id)
        status = "measured" if delta.n > 0 else "no completed pair of runs in the sweep yet"
        rows.append(Row(check, sweep_id, delta, status))
    return rows


# --- as text -------------------------------------------------------------------------------------
def _number(check: Check) -> Any:
    if check.kind == REACH:
        return lambda x: f"{x:+,.1f}"
    if check.kind == AREA:
        return lambda x: f"{100 * x:+.1f}"
    if check.kind == SLOPE:
        return lambda x: f"{1000 * x:+.2f}"
    scale = mechanisms.scale(check.metric)
    places = 2 if scale == 100 else 3
    return lambda x: f"{scale * x:+.{places}f}"


def _unit(check: Check) -> str:
    if check.kind == REACH:
        return "updates"
    if check.kind == AREA:
        return "pp"
    if check.kind == SLOPE:
        return "mnat/step"
    return "pp" if mechanisms.unit(check.metric) == "%" else "per response"


def p_text(estimate: stats.Estimate) -> str:
    return MISSING if math.isnan(estimate.p) else f"{estimate.p:.3f}"


def scoreboard_records(rows: Sequence[Row]) -> list[dict[str, str]]:
    out = []
    for row in rows:
        c = row.check
        measured = row.delta.n > 0
        out.append(
            {
                "mechanism": c.mechanism,
                "task": c.preset,
                "arm − parent": f"{c.arm} − {c.parent}",
                "metric": f"{c.metric} ({_unit(c)})",
                "Δ [95% CI]": (
                    estimate_text(row.delta, signed=True, number=_number(c))
                    if measured
                    else MISSING
                ),
                "n": str(row.delta.n) if measured else MISSING,
                "p": p_text(row.delta) if measured else MISSING,
                "sweep": (
                    f"{c.sweep} (#{row.sweep_id})" if row.sweep_id is not None else "not measured"
                ),
                "command": c.command,
            }
        )
    return out


CAPTION = (
    "Per DAPO mechanism, where the platform shows it acting: the paired Δ (arm − parent, by "
    "seed) of the metric it moves, with its 95% t-interval over seeds, n seeds and the exact "
    "sign-flip p (* when p < 0.05, which needs 6 seeds or more); from the newest sweep of the "
    "name shown, made by the command beside it (--store as for any dapo command)."
)


def render_scoreboard(rows: Sequence[Row], fmt: str = "text") -> str:
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    records = scoreboard_records(rows)
    left = {"mechanism", "task", "arm − parent", "metric", "sweep", "command"}
    if fmt == "csv":
        return _csv_scoreboard(rows)
    if fmt == "markdown":
        for r in records:
            r["command"] = f"`{r['command']}`"
        return f"{_markdown(records, left=left)}\n\n*{_escape(CAPTION)}*\n"
    return f"{CAPTION}\n\n{_aligned(records, left=left)}\n"


def _csv_scoreboard(rows: Sequence[Row]) -> str:
    import csv
    import io

    buffer = io.StringIO()
    columns = ["mechanism", "preset", "arm", "parent", "metric", "kind", "sweep", "sweep_id"]
    columns += ["delta_mean", "delta_low", "delta_high", "n", "p", "command"]
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()

    def num(x: float) -> Any:
        return "" if math.isnan(x) else round(x, 9)

    for row in rows:
        c, d = row.check, row.delta
        writer.writerow(
            {
                "mechanism": c.mechanism,
                "preset": c.preset,
                "arm": c.arm,
                "parent": c.parent,
                "metric": c.metric,
                "kind": c.kind,
                "sweep": c.sweep,
                "sweep_id": "" if row.sweep_id is None else row.sweep_id,
                "delta_mean": num(d.mean),
                "delta_low": num(d.low),
                "delta_high": num(d.high),
                "n": d.n,
                "p": num(d.p),
                "command": c.command,
            }
        )
    return buffer.getvalue()


def _clips(low: float, high: float) -> str:
    return MISSING if math.isnan(low) or math.isnan(high) else f"{low:g}/{high:g}"


def _pct(e: stats.Estimate, signed: bool = False) -> str:
    return estimate_text(e, signed=signed, number=lambda x: f"{100 * x:{'+' if signed else ''}.1f}")


def _pct2(e: stats.Estimate) -> str:
    return estimate_text(e, number=lambda x: f"{100 * x:.2f}")


def _count(e: stats.Estimate, signed: bool = False) -> str:
    return estimate_text(e, signed=signed, number=lambda x: f"{x:{'+' if signed else ''},.1f}")


def dose_records(dose: Dose) -> list[dict[str, str]]:
    t = f"{100 * dose.threshold:.0f}%"
    out = []
    for a in dose.arms:
        out.append(
            {
                "arm": a.arm,
                "ε_low/ε_high": _clips(a.clip_low, a.clip_high),
                "n": str(len(a.seeds)),
                f"reached {t}": a.reached,
                f"updates to {t}": _count(a.updates),
                "Δ parent (updates)": _count(a.delta_updates, True),
                f"steps to {t}": _count(a.steps),
                f"steps to {t}, interpolated": _count(a.crossing),
                "Δ parent (interpolated)": estimate_text(
                    a.delta_crossing, signed=True, number=lambda x: f"{x:+.2f}"
                ),
                "cap-only steps": MISSING
                if math.isnan(a.predicted_steps)
                else f"{a.predicted_steps:.1f}",
                "area (%)": _pct(a.area),
                "Δ parent (area, pp)": _pct(a.delta_area, True),
                f"clip_ratio/high, first {dose.early} (%)": _pct2(a.clip_high_early),
                f"high_eligible, first {dose.early} (%)": _pct2(a.eligible_early),
                **(
                    {
                        f"high_natural, first {dose.early} (%)": _pct2(a.natural_early),
                        f"ratio/max, first {dose.early}": estimate_text(
                            a.ratio_max_early, number=lambda x: f"{x:.2f}"
                        ),
                    }
                    if any(b.natural_early.n for b in dose.arms)
                    else {}
                ),
                **(
                    {f"at the decision, first {dose.early} (%)": _pct2(a.decision_early)}
                    if any(b.decision_early.n for b in dose.arms)
                    else {}
                ),
            }
        )
    return out


def dose_caption(dose: Dose) -> str:
    t = f"{100 * dose.threshold:.0f}%"
    l_u, p_u, n_u = dose.trend_updates
    l_a, p_a, n_a = dose.trend_area
    l_c, p_c, n_c = dose.trend_crossing
    mono_c = monotone([a.crossing for a in dose.arms], increasing=False)
    mono_u = monotone([a.updates for a in dose.arms], increasing=False)
    mono_a = monotone([a.area for a in dose.arms], increasing=True)
    return (
        f"Clip-Higher's dose-response (sweep {dose.sweep_id}, {dose.label}): per arm, the "
        f"gradient updates until a seed's held-out curve first reaches {t} (over the seeds that "
        f"reach it; {dose.updates_per_step:g} updates a rollout step) and in rollout steps, "
        "also with the crossing interpolated between the two evaluations around it; the "
        f"cap-only prediction ln({t} / p0) / ln(1 + ε_high) from the measured start p0 = "
        f"{100 * dose.start:.1f}%; the area under the held-out curve (mean over its "
        f"evaluations, step 0 included); over the first {dose.early} rollout steps, the share "
        "of tokens at the upper bound, of tokens that could reach it (eligible) and, where the "
        "runs logged them, of eligible tokens whose unclipped ratio passed 1 + ε_high (natural) "
        "and the step's largest token ratio; means over seeds "
        f"[95% t-interval], Δ parent paired by seed (* exact sign-flip p < 0.05). "
        f"Monotone in ε_high: updates {'yes' if mono_u else 'no'} (Page's L = {l_u:g}, "
        f"one-sided p = {p_u:.3g} over {n_u} seeds, a seed that never reached {t} ranked "
        f"slowest), interpolated steps {'yes' if mono_c else 'no'} (L = {l_c:g}, p = "
        f"{p_c:.3g}, {n_c} seeds), area {'yes' if mono_a else 'no'} (L = {l_a:g}, p = {p_a:.3g}, {n_a} seeds)."
    )


def _mnat(x: float) -> str:
    return f"{1000 * x:+.2f}"


def probe_records(probe: Probe) -> list[dict[str, str]]:
    out = []
    for a in probe.arms:
        out.append(
            {
                "arm": a.arm,
                "parent": a.parent or MISSING,
                "ε_low/ε_high": _clips(a.clip_low, a.clip_high),
                "n": str(len(a.seeds)),
                "slope (mnat/step)": estimate_text(a.slope, signed=True, number=_mnat),
                "Δ parent (mnat/step)": estimate_text(a.delta_parent, signed=True, number=_mnat),
                "papers": (
                    ("slope < 0" if a.expected < 0 else "slope > 0")
                    if a.parent is None
                    else ("Δ > 0" if a.expected > 0 else "Δ < 0")
                ),
                "verdict": a.verdict,
                "first 5 (nats)": estimate_text(a.first, number=lambda x: f"{x:.3f}"),
                "last 5 (nats)": estimate_text(a.last, number=lambda x: f"{x:.3f}"),
                "clip high (%)": _pct2(a.clip_high_mean),
                "clip low (%)": _pct2(a.clip_low_mean),
            }
        )
    return out


def probe_caption(probe: Probe) -> str:
    return (
        f"The entropy probe (sweep {probe.sweep_id}): a reward that is a fair coin, independent "
        f"of the answer; per seed the least-squares slope of {probe.metric} over the run's "
        "rollout steps, mean over seeds [95% t-interval], Δ parent paired by seed (* exact "
        "sign-flip p < 0.05; on the first arm's slope, which is no difference: its interval "
        "excludes 0); `papers`: the sign Park et al. (arXiv 2509.26114) and Chen et al. "
        "(arXiv 2512.16912) predict (the symmetric clip lowers the entropy, a larger ε_high "
        "lowers it less, a tighter ε_low raises it); a verdict needs the exact test's p < 0.05 "
        "(the first arm's slope: its interval to exclude 0); the entropy's mean over the first and last 5 steps; the clip fractions over the run."
    )


def render_detail(records: list[dict[str, str]], caption: str, fmt: str = "text") -> str:
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if not records:
        return "(no completed runs)\n"
    left = {"arm", "parent", "papers", "verdict"}
    if fmt == "markdown":
        return f"{_markdown(records, left=left)}\n\n*{_escape(caption)}*\n"
    if fmt == "csv":
        import csv
        import io

        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(records[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        return buffer.getvalue()
    return f"{caption}\n\n{_aligned(records, left=left)}\n"


def detail(engine: sa.Engine, sweep_id: int, fmt: str = "text") -> str:
    """The detail table of a check's sweep: the dose-response of a sweep whose arms differ in
    ε_high only and are evaluated on the way (clip-dose), the entropy probe of a sweep trained
    on a coin-flip reward (clip-entropy)."""
    runs = _completed(engine, sweep_id)
    trains = {
        str((c or {}).get("data", {}).get("train")) for c in runs["config"]
    } if not runs.empty else set()  # fmt: skip
    if trains & {"lookup-coin"}:
        probe = entropy_probe(engine, sweep_id)
        return render_detail(probe_records(probe), probe_caption(probe), fmt)
    dose = dose_response(engine, sweep_id)
    return render_detail(dose_records(dose), dose_caption(dose), fmt)


def render_all(engine: sa.Engine, fmt: str = "text", *, sweep_id: int | None = None) -> str:
    """`dapo table --scoreboard`: the scoreboard, then the detail of each clip check's newest
    sweep in the store (dose-response, entropy probe); `sweep_id`: that sweep's detail only.
    CSV: the scoreboard alone (one table per file)."""
    if sweep_id is not None:
        return detail(engine, sweep_id, fmt)
    out = render_scoreboard(scoreboard(engine), fmt)
    if fmt == "csv":
        return out
    for name in (DOSE_SWEEP, ENTROPY_SWEEP):
        found = find_sweep(engine, name)
        if found is not None:
            out += "\n" + detail(engine, found, fmt)
    return out
