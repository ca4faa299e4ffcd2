"""Time to a threshold (`dapo table --efficiency`, the dashboard's ablation page): per seed, the
gradient updates and the generated tokens it took until its held-out curve first reached a
score; per arm, their mean over the seeds that reached it, and the paired Δ to the parent over
the seeds where both arms reached it.

The counts are the trainer's cumulative progress counters at the evaluated step
(dapo_common.metric_names: `progress/grad_updates`, optimizer steps applied; `progress/tokens`,
response tokens of every generated rollout, dynamic sampling's filtered groups included: they
cost generation). An evaluation at step s follows step s's update, so the counters logged at s
are what that score cost; step 0 (the starting model) costs nothing. Nothing is interpolated
between evaluations, and a seed that never reaches the threshold is censored: counted in
"k/n reached", left out of the mean (which is then optimistic: the slow seeds are missing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import sqlalchemy as sa

from dapo_common import metric_names as M
from db import stats
from db.ablation import CurvePoint, sweep_curves
from db.reads import metric_curves, runs_of_sweep, selected_attempts
from db.table_format import MISSING, SIGNIFICANT_RULE, estimate_text, metric_label, pct

# What a seed spends on the way to the threshold: name -> the cumulative counter behind it.
COUNTERS: dict[str, str] = {"updates": M.GRAD_UPDATES, "tokens": M.TOKENS_TOTAL}
# An avg@k is a ratio of counts; a threshold computed as a midpoint may sit one rounding error
# above a score that equals it.
_EPS = 1e-12


@dataclass(frozen=True)
class ArmReach:
    """One arm's way to the threshold.

    seeds: the seeds that score its row of the table (a completed, evaluated run); reached:
    seed -> the step of its first evaluation at or above the threshold; spent[name]: seed ->
    the COUNTERS[name] value there (reached seeds whose run logged it); estimate[name]: their
    mean with a 95% t-interval; delta_parent[name]: minus the parent's, paired by seed over the
    seeds where both reached it (stats.EMPTY for the base arm).
    """

    arm: str
    parent: str | None
    seeds: tuple[int, ...]
    reached: Mapping[int, int]
    spent: Mapping[str, Mapping[int, float]]
    estimate: Mapping[str, stats.Estimate]
    delta_parent: Mapping[str, stats.Estimate]

    @property
    def reached_text(self) -> str:
        return f"{len(self.reached)}/{len(self.seeds)}"


@dataclass(frozen=True)
class Reach:
    """The threshold (a fraction, like the scores), how it was chosen, and each arm's way
    there, in the table's order."""

    threshold: float
    rule: str
    label: str  # the evaluation, "aime avg@4"
    arms: tuple[ArmReach, ...]


def default_threshold(table: pd.DataFrame) -> tuple[float, str] | None:
    """Midway between the starting model (the mean step-0 score over every run of the table)
    and the best arm's mean final score: a level the best arm reaches and slower arms reach
    later, if at all. None without a step-0 evaluation or a final score."""
    starts = [
        float(s)
        for scores in table["start_scores"]
        for s in (scores or [])
        if not math.isnan(float(s))
    ]
    finals = table[table["n_seeds"] > 0]
    if not starts or finals.empty:
        return None
    start = math.fsum(starts) / len(starts)
    best = finals.loc[finals["score_mean"].astype(float).idxmax()]
    final = float(best["score_mean"])
    rule = (
        f"default: midway between the starting model's {pct(start)}% and the best arm "
        f"{best['arm']}'s final {pct(final)}%"
    )
    return (start + final) / 2.0, rule


def _counters(engine: sa.Engine, sweep_id: int) -> dict[tuple[str, int, int, str], float]:
    """(arm, seed, step, counter) -> value, over the attempts up to each (arm, seed)'s selected
    one (those its held-out curve is drawn from), the newest attempt winning. A resumed attempt
    restores the counters from its checkpoint, so attempts agree; an evaluated step's counters
    may sit in an older attempt (a resume from that step's checkpoint does not log it again)."""
    runs = runs_of_sweep(engine, sweep_id)
    if runs.empty:
        return {}
    upto = {(str(r.arm), int(r.seed)): int(r.attempt) for r in selected_attempts(runs).itertuples()}
    attempt = {
        int(r.run_id): int(r.attempt)
        for r in runs.itertuples()
        if int(r.attempt) <= upto[(str(r.arm), int(r.seed))]
    }
    frame = metric_curves(engine, list(attempt), list(COUNTERS.values()))
    frame = frame.assign(attempt=frame["run_id"].map(attempt)).sort_values("attempt")
    out: dict[tuple[str, int, int, str], float] = {}
    for row in frame.itertuples():  # oldest attempt first: the newest one's value stays
        if not math.isnan(float(row.value)):
            out[(str(row.arm), int(row.seed), int(row.step), str(row.name))] = float(row.value)
    return out


def _first_reached(curve: Mapping[int, CurvePoint], threshold: float) -> int | None:
    """The first evaluated step whose avg@k is at or above the threshold; None: censored."""
    return next((s for s in sorted(curve) if curve[s].value >= threshold - _EPS), None)


def reach(
    engine: sa.Engine, sweep_id: int, table: pd.DataFrame, threshold: float | None = None
) -> Reach | None:
    """Each arm of `table` (db.ablation.ablation_table of the sweep) on its way to `threshold`
    (a fraction, on the table's evaluation), default_threshold when None. None when the table
    has no evaluation to measure by (or no default can be drawn)."""
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold {threshold!r}: a score between 0 and 1")
    dataset = next((d for d in table["eval_dataset"] if isinstance(d, str)), None)
    k = next((int(v) for v in table["eval_k"] if not pd.isna(v)), None)
    if dataset is None or k is None:
        return None
    if threshold is None:
        found = default_threshold(table)
        if found is None:
            return None
        threshold, rule = found
    else:
        rule = "given"
    curves = sweep_curves(engine, sweep_id, dataset, k)
    counters = _counters(engine, sweep_id)
    rows = table.to_dict("records")
    reached_by_arm: dict[str, dict[int, int]] = {}
    spent_by_arm: dict[str, dict[str, dict[int, float]]] = {}
    for row in rows:
        arm = str(row["arm"])
        reached: dict[int, int] = {}
        spent: dict[str, dict[int, float]] = {name: {} for name in COUNTERS}
        for seed in (int(s) for s in row["seeds"] or []):
            step = _first_reached(curves.get((arm, seed), {}), threshold)
            if step is None:
                continue
            reached[seed] = step
            for name, metric in COUNTERS.items():
                value = 0.0 if step == 0 else counters.get((arm, seed, step, metric))
                if value is not None:
                    spent[name][seed] = value
        reached_by_arm[arm], spent_by_arm[arm] = reached, spent
    arms = []
    for row in rows:
        arm = str(row["arm"])
        parent = None if _missing(row["parent"]) else str(row["parent"])
        spent, theirs = spent_by_arm[arm], spent_by_arm.get(parent or "")
        arms.append(
            ArmReach(
                arm=arm,
                parent=parent,
                seeds=tuple(int(s) for s in row["seeds"] or []),
                reached=reached_by_arm[arm],
                spent=spent,
                estimate={
                    n: stats.t_interval(list(v.values()), keys=list(v)) for n, v in spent.items()
                },
                # over the seeds where both reached it: stats.paired drops the others
                delta_parent={
                    name: stats.paired(spent[name], theirs[name])
                    if theirs is not None and parent != arm
                    else stats.EMPTY
                    for name in COUNTERS
                },
            )
        )
    return Reach(threshold=threshold, rule=rule, label=metric_label(table), arms=tuple(arms))


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# --- as text ----------------------------------------------------------------------------------


def _updates(value: float, signed: bool = False) -> str:
    return f"{value:{'+' if signed else ''},.1f}"


def _tokens(value: float, signed: bool = False) -> str:
    """Tokens with three significant digits and a unit: 950, 12.3k, 4.56M, 1.20G."""
    sign = "+" if signed and value >= 0 else ("-" if value < 0 else "")
    size = abs(value)
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if size >= scale:
            return f"{sign}{size / scale:.{max(0, 2 - int(math.log10(size / scale)))}f}{unit}"
    return f"{sign}{size:.0f}"


_FORMAT = {"updates": _updates, "tokens": _tokens}


def _delta_text(estimate: stats.Estimate, name: str) -> str:
    """A paired Δ with its n always said: only the seeds where both arms reached it count."""
    text = estimate_text(estimate, signed=True, number=lambda x: _FORMAT[name](x, True))
    return text if estimate.n < 2 else f"{text} (n={estimate.n})"


def reach_records(result: Reach) -> list[dict[str, str]]:
    """One dict of display strings per arm: k/n reached, updates and tokens to the threshold
    (mean [95% interval] over the seeds that reached it), each with its paired Δ parent."""
    at = f"{pct(result.threshold)}%"
    out = []
    for a in result.arms:
        record = {"arm": a.arm, "reached": a.reached_text}
        for name in COUNTERS:
            record[f"{name} to {at}"] = estimate_text(
                a.estimate[name], number=_FORMAT[name], n_expected=len(a.reached)
            )
            record[f"Δ parent ({name})"] = _delta_text(a.delta_parent[name], name)
        record["parent"] = a.parent or MISSING
        out.append(record)
    return out


def reach_caption(result: Reach) -> str:
    return (
        f"Time to threshold: per seed, the gradient updates (optimizer steps) and the generated "
        f"response tokens (every rollout, dynamic sampling's filtered ones included) until its "
        f"first held-out evaluation with {result.label} ≥ {pct(result.threshold)}% "
        f"({result.rule}); nothing interpolated. A seed that never gets there is censored: "
        "`reached` counts k of n seeds, the mean [95% t-interval] is over the k (optimistic "
        "when some are censored); Δ parent: paired by seed over the seeds where both arms "
        f"reached it (n), {SIGNIFICANT_RULE}"
    )


def csv_fields(result: Reach) -> dict[str, dict[str, Any]]:
    """arm -> the CSV columns of its way to the threshold: the threshold in percent, k and n
    reached, and per counter its mean, 95% interval and n, and the same of its Δ parent with
    its significance (raw numbers; '' where there is none)."""

    def num(value: float) -> Any:
        return "" if math.isnan(value) else round(float(value), 6)

    out: dict[str, dict[str, Any]] = {}
    for a in result.arms:
        row: dict[str, Any] = {
            "threshold_pct": round(100.0 * result.threshold, 6),
            "reached": len(a.reached),
            "reached_of": len(a.seeds),
        }
        for name in COUNTERS:
            for column, estimate in (
                (f"{name}_to_threshold", a.estimate[name]),
                (f"{name}_to_threshold_delta_parent", a.delta_parent[name]),
            ):
                row[column] = num(estimate.mean)
                row[f"{column}_low"], row[f"{column}_high"] = num(estimate.low), num(estimate.high)
                row[f"{column}_n"] = estimate.n
            row[f"{name}_to_threshold_delta_parent_significant"] = int(
                a.delta_parent[name].significant
            )
        out[a.arm] = row
    return out
