"""The mechanism table: did each arm's change show in the training metric it is about, beyond
the seed spread? Per arm × metric, the metric's mean over the first and the last window of
rollout steps, over seeds with a 95% interval, and paired by seed against the parent arm.

What each config change is about, and the table as text, are db.mechanisms'; which attempt of
an (arm, seed) counts is db.reads' rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import sqlalchemy as sa

from db import mechanisms, stats, summaries
from db.models import METRICS, RUN_METRIC_SUMMARIES, RUNS, SUMMARY_WINDOW
from db.reads import arm_order, parents, selected_attempts, sweep_row, sweep_runs

MECHANISM_COLUMNS = [
    "arm",
    "parent",
    "adds",
    "changes",  # dotted config keys that differ from the parent's (a grid base: its swept keys)
    "focus",  # True when the arm's change is about this metric (mechanisms.FOCUS)
    "metric",
    "seeds",  # the seeds with a value in the last window, in order
    "first_values",  # per seed (aligned with seeds): mean over the first `window` steps
    "last_values",  # per seed: mean over the last `window` steps
    # stats.Estimate records (mean over seeds, 95% t-interval, n)
    "first",
    "last",
    "delta_parent",  # last-window mean − the parent's, paired by seed
    # first-window mean − the parent's, paired by seed: a mechanism that acts while there is
    # something to act on (truncations, early in a run) shows here and may fade by the end
    "delta_parent_first",
    "window",
]

_runs, _metrics = RUNS, METRICS


def _window_means(
    conn: sa.Connection, run_ids: Sequence[int], names: Sequence[str], window: int
) -> dict[tuple[int, str], tuple[float, float]]:
    """(run_id, metric) -> (mean over the run's first `window` rollout steps, mean over its
    last `window`), NaN where the metric has no finite value there. The window is the run's
    own: its last `window` steps end at the last step it logged anything; NULL (a NaN/inf
    value) is left out of the mean, as SQL's avg does."""
    ids = [int(r) for r in run_ids]
    if not ids or not names:
        return {}
    out: dict[tuple[int, str], tuple[float, float]] = {}
    if window == SUMMARY_WINDOW:
        # Ended runs: the same means, kept when they ended (db.summaries), read per (run,
        # name) instead of aggregated over every row of the run.
        done = summaries.summarized(conn, ids)
        s = RUN_METRIC_SUMMARIES.c
        if done:
            rows = conn.execute(
                sa.select(s.run_id, s.name, s.head_mean, s.tail_mean).where(
                    s.run_id.in_(sorted(done)), s.name.in_([str(n) for n in names])
                )
            )
            for run_id, name, a, b in rows:
                out[(int(run_id), str(name))] = (
                    math.nan if a is None else float(a),
                    math.nan if b is None else float(b),
                )
        ids = [r for r in ids if r not in done]
        if not ids:
            return out
    m = _metrics.c
    bounds = (
        sa.select(m.run_id, sa.func.min(m.step).label("lo"), sa.func.max(m.step).label("hi"))
        .where(m.run_id.in_(ids))
        .group_by(m.run_id)
        .subquery()
    )
    first = sa.func.avg(sa.case((m.step <= bounds.c.lo + (window - 1), m.value)))
    last = sa.func.avg(sa.case((m.step >= bounds.c.hi - (window - 1), m.value)))
    query = (
        sa.select(m.run_id, m.name, first, last)
        .join_from(_metrics, bounds, m.run_id == bounds.c.run_id)
        .where(m.run_id.in_(ids), m.name.in_([str(n) for n in names]))
        .group_by(m.run_id, m.name)
    )
    for run_id, name, a, b in conn.execute(query):
        out[(int(run_id), str(name))] = (
            math.nan if a is None else float(a),
            math.nan if b is None else float(b),
        )
    return out


def _configs(conn: sa.Connection, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    ids = [int(r) for r in run_ids]
    if not ids:
        return {}
    r = _runs.c
    rows = conn.execute(sa.select(r.id, r.config).where(r.id.in_(ids)))
    return {int(run_id): dict(config or {}) for run_id, config in rows}


def _arm_changes(
    arm: str,
    parent: str | None,
    rung: Mapping[str, Any],
    config_of: Mapping[tuple[str, int], dict[str, Any]],
) -> tuple[str, ...]:
    """What an arm changes: its config diff to its parent on a seed both ran (the lowest);
    without a parent, the keys a grid sweeps from it; without configs, the rung's grid keys."""
    grid = tuple(sorted(str(k) for k in (rung.get("grid") or {})))
    if parent is None:
        return grid
    seeds = sorted(s for a, s in config_of if a == arm and (parent, s) in config_of)
    for seed in seeds:
        mine, theirs = config_of[(arm, seed)], config_of[(parent, seed)]
        if mine and theirs:
            return mechanisms.config_changes(mine, theirs, arm, parent)
    return grid


def bound(metric: str, estimate: stats.Estimate, *, delta: bool = False) -> stats.Estimate:
    """A share's interval (mechanisms.PERCENT: a fraction of tokens, responses or groups) cut
    at what a share can be, [0, 1], or [−1, 1] for a difference of two (stats.within); any
    other metric's as it is."""
    if metric not in mechanisms.PERCENT:
        return estimate
    return stats.within(estimate, -1.0 if delta else 0.0, 1.0)


def mechanism_table(
    engine: sa.Engine,
    sweep_id: int,
    metrics: Sequence[str] | None = None,
    window: int = 10,
) -> pd.DataFrame:
    """One row per arm × metric, arms in ladder order (see MECHANISM_COLUMNS): did each arm's
    mechanism show in its own metric, beyond the seed spread?

    Per seed, the metric's mean over the first and the last `window` rollout steps of the run
    that scores it in the ablation table (the latest completed attempt; arms with none have no
    values yet). Over seeds: the mean with its 95% t-interval (db.stats), and `delta_parent`,
    the last-window mean minus the parent arm's (the ablation table's parent), paired by seed
    (`delta_parent_first`: the same over the first window).
    `changes` is what the arm sets relative to its parent (the runs' stored configs), `focus`
    whether the metric is one that change is about (db.mechanisms.FOCUS). A metric a run did
    not log (e.g. loss/long_share in runs older than it) is left out for that seed; with no
    seed left its estimates are empty (n = 0). Runs shorter than 2 × window steps have
    overlapping windows.

    `metrics` None: mechanisms.default_metrics of what the runs logged (the defaults, the
    eligible share and the decision entropy beside their partners where logged, and the focus
    metrics logged); `dapo table --mechanisms`, the dashboard and the Prefect artifact all take
    it. A metric of mechanisms.WHEN_LOGGED that no completed run logged has no rows, asked for
    or not: absent, not a row of dashes.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1 rollout step, got {window}")
    asked = None if metrics is None else [str(n) for n in metrics]
    # Without a list, every metric the default could show is read once, and the default is
    # then cut to what the runs logged.
    names = list(
        asked
        if asked is not None
        else dict.fromkeys(
            [
                *mechanisms.with_companions(mechanisms.DEFAULT_METRICS),
                *(m for ms in mechanisms.FOCUS.values() for m in ms),
            ]
        )
    )
    with engine.connect() as conn:
        sweep = sweep_row(conn, engine, sweep_id)
        runs = sweep_runs(conn, sweep_id)
        selected = selected_attempts(runs)
        done = selected[selected["status"] == "completed"] if not runs.empty else selected
        means = _window_means(conn, [int(r) for r in done["run_id"]], names, window)
        configs = _configs(conn, [int(r) for r in selected["run_id"]])
    logged = {name for (_, name), (_, last) in means.items() if not math.isnan(last)}
    if asked is None:
        names = list(mechanisms.default_metrics(logged))
    names = [n for n in names if n not in mechanisms.WHEN_LOGGED or n in logged]
    order = arm_order(sweep, runs)
    parent_of = parents(sweep, order)
    ladder = {str(rung["arm"]): rung for rung in (sweep.ladder or []) if "arm" in rung}
    config_of = {
        (str(run.arm), int(run.seed)): configs.get(int(run.run_id), {})
        for run in selected.itertuples()
    }
    # (arm, metric) -> {seed: (first, last)} over the arm's completed runs with a value
    values: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
    for run in done.sort_values("seed").itertuples():
        for name in names:
            first, last = means.get((int(run.run_id), name), (math.nan, math.nan))
            if not math.isnan(last):
                values.setdefault((str(run.arm), name), {})[int(run.seed)] = (first, last)
    rows: list[dict[str, Any]] = []
    for arm in order:
        parent = parent_of[arm]
        rung = ladder.get(arm, {})
        changes = _arm_changes(arm, parent, rung, config_of)
        focus = set(mechanisms.focus_metrics(changes))
        # a companion is about what its partner is about (the bound of the share it sits by)
        focus |= {c for m in focus for c in mechanisms.COMPANIONS.get(m, ())}
        for name in names:
            mine = values.get((arm, name), {})
            firsts = {s: f for s, (f, _) in mine.items() if not math.isnan(f)}
            lasts = {s: v for s, (_, v) in mine.items()}
            theirs = values.get((parent, name), {}) if parent is not None else {}
            rows.append(
                {
                    "arm": arm,
                    "parent": parent,
                    "adds": rung.get("adds"),
                    "changes": changes,
                    "focus": name in focus,
                    "metric": name,
                    "seeds": list(lasts),
                    "first_values": [firsts.get(s, math.nan) for s in lasts],
                    "last_values": list(lasts.values()),
                    "first": bound(
                        name, stats.t_interval(list(firsts.values()), keys=list(firsts))
                    ),
                    "last": bound(name, stats.t_interval(list(lasts.values()), keys=list(lasts))),
                    "delta_parent": (
                        bound(
                            name,
                            stats.paired(lasts, {s: v for s, (_, v) in theirs.items()}),
                            delta=True,
                        )
                        if parent is not None
                        else stats.EMPTY
                    ),
                    "delta_parent_first": (
                        bound(
                            name,
                            stats.paired(
                                firsts,
                                {s: f for s, (f, _) in theirs.items() if not math.isnan(f)},
                            ),
                            delta=True,
                        )
                        if parent is not None
                        else stats.EMPTY
                    ),
                    "window": int(window),
                }
            )
    return pd.DataFrame(rows, columns=MECHANISM_COLUMNS)
