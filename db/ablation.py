"""The ablation table: one row per arm of a sweep, its score over seeds with a 95% interval,
its gain over the starting model and its paired differences to the parent arm and to the
baseline (db.stats); and the list of sweeps, whose leader comes from the same rows.

One function (`ablation_table`) builds it for `dapo table`, the dashboard and the Prefect
artifact; db.table_format turns it into text. Which attempt of an (arm, seed) counts is
db.reads' rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import sqlalchemy as sa

from db import decisions, stats
from db.errors import NotFound
from db.looks import is_adaptive
from db.models import EVALUATIONS, RUNS, SWEEPS, fold_status
from db.reads import (
    RUN_COLUMNS,
    arm_order,
    latest_attempts,
    parents,
    run_select,
    selected_attempts,
    shown_sweep_status,
    sweep_row,
    sweep_runs,
    to_frame,
)

EvalKey = tuple[int, int]  # (run_id, step) of one evaluation

SWEEP_COLUMNS = [
    "sweep_id",
    "name",
    "preset",
    "status",
    "created_at",
    "finished_at",
    "arms",
    "seeds",
    "arms_total",
    "runs_done",
    "runs_failed",
    "runs_running",
    "best_arm",
    "best_score",
    "leader",
    "flow_run_id",
    "error",
]
ABLATION_COLUMNS = [
    "arm",
    "adds",
    "parent",
    "paper_score",
    "seeds",
    "scores",
    "best_scores",
    "start_scores",
    "n_seeds",
    # stats.Estimate records (mean, 95% interval, n): see ablation_table
    "score",
    "gain",
    "gain_problems",
    "delta_parent",
    "delta_parent_problems",
    "delta_base",
    "delta_base_problems",
    "score_mean",
    "score_std",
    "best_mean",
    "best_std",
    "start_mean",
    "steps",
    "grad_updates",
    "tokens",
    "wall_s",
    "status",
    "runs_done",
    "runs_total",
    "run_ids",
    "eval_dataset",
    "eval_k",
    # sample efficiency (stats.Estimate): per seed, the mean avg@k over the held-out curve's
    # evaluations, step 0 included (the area under the curve over its length); over seeds
    "area",
    "area_delta_parent",  # the same minus the parent's, paired by seed
    # robustness (db.decisions): the interquartile mean of the finals from 5 seeds on (NaN
    # below), and the runs that ended at or below their start (a decisions.Share)
    "iqm",
    "collapsed",
]

_sweeps, _runs, _evaluations = SWEEPS, RUNS, EVALUATIONS


# --- the sweeps ---------------------------------------------------------------------------


# list_sweeps' rows of sweeps whose every run has ended, per store and sweep, with the
# fingerprint they were computed at: such a row changes only when a row under it is written,
# and every write there moves the fingerprint (a run's updated_at, an evaluation's created_at,
# the sweep's updated_at; a deleted run or evaluation changes a count). Without it the sweeps
# page (and, before sweep_choices, every page's picker) recomputed every sweep's ablation rows
# in pandas on each load: 0.5 s a sweep on a loaded 2-core machine (bench/bench_scale.py).
_ENDED_ROWS: dict[tuple[str, int], tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
_ENDED_ROWS_MAX = 10_000


def _fingerprints(conn: sa.Connection, sweep_id: int | None) -> dict[int, tuple[Any, ...]]:
    """sweep id -> (runs, newest run write, runs stored as running, evaluations, newest
    evaluation write): two grouped reads of the runs' and the evaluations' keys."""
    r, e = _runs.c, _evaluations.c
    runs = sa.select(
        r.sweep_id,
        sa.func.count(),
        sa.func.max(r.updated_at),
        sa.func.sum(sa.case((r.status == "running", 1), else_=0)),
    ).group_by(r.sweep_id)
    evals = (
        sa.select(r.sweep_id, sa.func.count(), sa.func.max(e.created_at))
        .join_from(_evaluations, _runs, e.run_id == r.id)
        .group_by(r.sweep_id)
    )
    if sweep_id is not None:
        runs = runs.where(r.sweep_id == int(sweep_id))
        evals = evals.where(r.sweep_id == int(sweep_id))
    out: dict[int, tuple[Any, ...]] = {}
    for sid, n, newest, running in conn.execute(runs):
        out[int(sid)] = (int(n), newest, int(running or 0), 0, None)
    for sid, n, newest in conn.execute(evals):
        n_runs, run_newest, running, _, _ = out.get(int(sid), (0, None, 0, 0, None))
        out[int(sid)] = (n_runs, run_newest, running, int(n), newest)
    return out


def list_sweeps(
    engine: sa.Engine, sweep_id: int | None = None, *, among: Sequence[int] | None = None
) -> pd.DataFrame:
    """Every sweep (or the one `sweep_id` names, or those `among` names: the Sweeps page's
    page of them), newest first, with progress: runs_done counts
    the (arm, seed) pairs with a completed attempt out of arms_total = arms × seeds. best_arm
    (and best_score, its mean) is set only when the arm with the highest mean leads the
    runner-up significantly (paired 95% interval over seeds above 0); `leader` is the
    stats.Leader behind it, for the headline.

    A sweep none of whose runs is stored as running is computed once per process and store
    while nothing under it changes (_ENDED_ROWS); its status is read afresh every time."""
    store = str(engine.url)
    with engine.connect() as conn:
        select_sweeps = sa.select(_sweeps)
        if sweep_id is not None:
            select_sweeps = select_sweeps.where(_sweeps.c.id == int(sweep_id))
        if among is not None:
            select_sweeps = select_sweeps.where(_sweeps.c.id.in_([int(i) for i in among]))
        sweeps = conn.execute(select_sweeps.order_by(_sweeps.c.id.desc())).all()
        if not sweeps:
            return to_frame([], SWEEP_COLUMNS)
        prints = _fingerprints(conn, sweep_id)
        keys = {
            sweep.id: (sweep.updated_at, *prints.get(sweep.id, (0, None, 0, 0, None)))
            for sweep in sweeps
        }
        stale = [
            sweep.id
            for sweep in sweeps
            if _ENDED_ROWS.get((store, sweep.id), (None,))[0] != keys[sweep.id]
        ]
        select_runs = run_select().where(_runs.c.sweep_id.in_(stale))
        runs = to_frame(conn.execute(select_runs).all(), RUN_COLUMNS)
        evals = _evaluation_frame(conn, sweep_id, stale)
    rows = []
    for sweep in sweeps:
        key = keys[sweep.id]
        # what a status needs of the runs: the newest heartbeat (shown_sweep_status)
        touched = to_frame([(key[2],)] if key[2] is not None else [], ["updated_at"])
        status = shown_sweep_status(sweep, touched)
        cached = _ENDED_ROWS.get((store, sweep.id))
        if cached is not None and cached[0] == key:
            rows.append((*cached[1][:3], status, *cached[1][3:]))
            continue
        mine = runs[runs["sweep_id"] == sweep.id]
        latest = latest_attempts(mine)
        done = selected_attempts(mine)
        done = done[done["status"] == "completed"]
        sweep_evals = evals[evals["run_id"].isin(mine["run_id"])]
        table = _ablation_rows(sweep, mine, sweep_evals, primary_evaluation(sweep_evals))
        lead = stats.leader_of_rows(table)
        row = (
            sweep.id,
            sweep.name,
            sweep.preset,
            sweep.created_at,
            sweep.finished_at,
            list(sweep.arms),
            list(sweep.seeds),
            len(latest) if is_adaptive(sweep.params) else len(sweep.arms) * len(sweep.seeds),
            len(done),
            int((latest["status"] == "failed").sum()),
            int((latest["status"] == "running").sum()),
            lead.best if lead.significant else None,
            lead.best_mean if lead.significant else math.nan,
            lead,
            sweep.flow_run_id,
            sweep.error,
        )
        rows.append((*row[:3], shown_sweep_status(sweep, mine), *row[3:]))
        if key[3] == 0:  # no run stored as running: nothing under it changes by itself
            if len(_ENDED_ROWS) >= _ENDED_ROWS_MAX:
                _ENDED_ROWS.clear()
            _ENDED_ROWS[(store, sweep.id)] = (key, row)
    return to_frame(rows, SWEEP_COLUMNS)


CHOICE_COLUMNS = ["sweep_id", "name", "preset", "status", "created_at"]


def sweep_choices(engine: sa.Engine) -> pd.DataFrame:
    """Every sweep, newest first, with only what a picker shows (CHOICE_COLUMNS; the status as
    list_sweeps gives it): two short queries, whatever the sweeps hold. list_sweeps computes
    each sweep's ablation rows for its progress and leader, which a sweep selectbox on every
    page does not need and which grows with every sweep in the store."""
    s, r = _sweeps.c, _runs.c
    with engine.connect() as conn:
        sweeps = conn.execute(
            sa.select(s.id, s.name, s.preset, s.status, s.created_at, s.updated_at).order_by(
                s.id.desc()
            )
        ).all()
        touched = dict(
            conn.execute(
                sa.select(r.sweep_id, sa.func.max(r.updated_at)).group_by(r.sweep_id)
            ).all()
        )
    rows = []
    for sweep in sweeps:
        # shown_sweep_status needs only the newest of its runs' heartbeats
        runs = pd.DataFrame({"updated_at": [touched.get(sweep.id)]})
        if runs["updated_at"].isna().all():
            runs = runs.iloc[0:0]
        rows.append(
            (sweep.id, sweep.name, sweep.preset, shown_sweep_status(sweep, runs), sweep.created_at)
        )
    return to_frame(rows, CHOICE_COLUMNS)


# --- the ablation table ------------------------------------------------------------------


_EVAL_FRAME = ["run_id", "dataset", "k", "step", "avg_at_k", "n_problems"]


def _evaluation_frame(
    conn: sa.Connection, sweep_id: int | None = None, among: list[int] | None = None
) -> pd.DataFrame:
    """Evaluations (run_id, dataset, k, step, avg@k, n_problems) of one sweep's runs, or of
    every sweep (`among`: only these sweeps). The per-problem counts (`extra`) are read only
    where needed: _correct_counts."""
    e, r = _evaluations.c, _runs.c
    query = sa.select(*(e[c] for c in _EVAL_FRAME)).join_from(_evaluations, _runs, e.run_id == r.id)
    if sweep_id is not None:
        query = query.where(r.sweep_id == int(sweep_id))
    if among is not None:
        query = query.where(r.sweep_id.in_([int(s) for s in among]))
    return to_frame(conn.execute(query).all(), _EVAL_FRAME)


def _correct_counts(
    conn: sa.Connection, dataset: str, k: int, keys: Iterable[EvalKey]
) -> dict[EvalKey, list[int]]:
    """(run_id, step) -> correct samples per eval problem, from the evaluations' `extra`
    (runs evaluated before it was recorded have none)."""
    wanted = set(keys)
    if not wanted:
        return {}
    e = _evaluations.c
    query = sa.select(e.run_id, e.step, e.extra).where(
        e.dataset == dataset,
        e.k == int(k),
        e.run_id.in_(sorted({run for run, _ in wanted})),
    )
    out: dict[EvalKey, list[int]] = {}
    for run_id, step, extra in conn.execute(query):
        counts = (extra or {}).get("correct_per_problem")
        if (int(run_id), int(step)) in wanted and isinstance(counts, list):
            out[(int(run_id), int(step))] = [int(c) for c in counts]
    return out


def evaluation_choices(evals: pd.DataFrame) -> list[tuple[str, int]]:
    """The (dataset, k) pairs that have a score, sorted."""
    scored = evals.dropna(subset=["avg_at_k"])
    pairs = {(str(d), int(k)) for d, k in zip(scored["dataset"], scored["k"], strict=True)}
    return sorted(pairs)


def primary_evaluation(evals: pd.DataFrame) -> tuple[str, int] | None:
    """The (dataset, k) that scores the table: the one most runs were evaluated on (ties: the
    dataset first by name, then the larger k)."""
    scored = evals.dropna(subset=["avg_at_k"])
    if scored.empty:
        return None
    counts = scored.groupby(["dataset", "k"])["run_id"].nunique().reset_index(name="n")
    counts = counts.sort_values(["n", "dataset", "k"], ascending=[False, True, False])
    best = counts.iloc[0]
    return str(best["dataset"]), int(best["k"])


def _resolve_evaluation(
    evals: pd.DataFrame, dataset: str | None, k: int | None, sweep_id: int
) -> tuple[str, int] | None:
    """The (dataset, k) to score by: the one asked for, else the primary one. Asking for one
    the sweep does not have is a mistake: NotFound names the ones it has (never a table of
    dashes)."""
    candidates = evals
    if dataset is not None:
        candidates = candidates[candidates["dataset"] == dataset]
    if k is not None:
        candidates = candidates[candidates["k"] == int(k)]
    found = primary_evaluation(candidates)
    if found is None and (dataset is not None or k is not None):
        asked = " ".join(
            part
            for part in (
                f"dataset {dataset!r}" if dataset is not None else "",
                f"k={k}" if k is not None else "",
            )
            if part
        )
        have = ", ".join(f"{d} avg@{n}" for d, n in evaluation_choices(evals))
        raise NotFound(
            f"sweep {sweep_id} has no evaluation with {asked}; "
            + (f"it has: {have}" if have else "it has no evaluations yet")
        )
    return found


@dataclass(frozen=True)
class _SeedScore:
    """What one (arm, seed) contributes: its selected run's final, best and start avg@k."""

    run_id: int
    final: float
    best: float
    final_step: int
    n_problems: int | None
    start: float = math.nan  # the step-0 evaluation (the starting model)
    start_run: int | None = None  # the attempt that holds it (a resumed attempt has none)


def _scores(evals: pd.DataFrame, dataset: str, k: int) -> dict[int, _SeedScore]:
    """run_id -> final avg@k (at the run's last evaluated step), best avg@k over its steps, and
    its own step-0 score when it has one."""
    mine = evals[(evals["dataset"] == dataset) & (evals["k"] == k)].dropna(subset=["avg_at_k"])
    out: dict[int, _SeedScore] = {}
    for run_id, group in mine.groupby("run_id"):
        ordered = group.sort_values("step")
        last = ordered.iloc[-1]
        start = ordered[ordered["step"] == 0]["avg_at_k"]
        n_problems = last["n_problems"]
        out[int(run_id)] = _SeedScore(
            run_id=int(run_id),
            final=float(last["avg_at_k"]),
            best=float(ordered["avg_at_k"].max()),
            final_step=int(last["step"]),
            n_problems=None if pd.isna(n_problems) else int(n_problems),
            start=float(start.iloc[0]) if len(start) else math.nan,
            start_run=int(run_id) if len(start) else None,
        )
    return out


@dataclass(frozen=True)
class CurvePoint:
    """One evaluated step of an (arm, seed)'s held-out curve: its avg@k and the attempt (and
    run) that evaluated it."""

    attempt: int
    run_id: int
    value: float


Curves = dict[tuple[str, int], dict[int, CurvePoint]]  # (arm, seed) -> step -> point


def held_out_curves(
    runs: pd.DataFrame, selected: pd.DataFrame, evals: pd.DataFrame, dataset: str, k: int
) -> Curves:
    """(arm, seed) -> step -> its avg@k on (dataset, k). The curve is that of the attempts up
    to the selected one, a step evaluated twice (a resume that replayed it) counting once with
    the newer attempt's value, so a resumed run's curve is whole."""
    scored = evals[(evals["dataset"] == dataset) & (evals["k"] == k)].dropna(subset=["avg_at_k"])
    attempt_of = {
        int(r.run_id): (str(r.arm), int(r.seed), int(r.attempt)) for r in runs.itertuples()
    }
    upto = {(str(r.arm), int(r.seed)): int(r.attempt) for r in selected.itertuples()}
    curves: Curves = {}
    for e in scored.itertuples():
        found = attempt_of.get(int(e.run_id))
        if found is None or found[2] > upto.get((found[0], found[1]), -1):
            continue
        curve = curves.setdefault((found[0], found[1]), {})
        step = int(e.step)
        if step not in curve or found[2] > curve[step].attempt:
            curve[step] = CurvePoint(found[2], int(e.run_id), float(e.avg_at_k))
    return curves


def sweep_curves(engine: sa.Engine, sweep_id: int, dataset: str, k: int) -> Curves:
    """held_out_curves of a sweep's (arm, seed)s, up to each one's selected attempt (the one
    that speaks for it in the table)."""
    with engine.connect() as conn:
        runs = sweep_runs(conn, sweep_id)
        evals = _evaluation_frame(conn, int(sweep_id))
    return held_out_curves(runs, selected_attempts(runs), evals, dataset, k)


def _areas(
    runs: pd.DataFrame, selected: pd.DataFrame, evals: pd.DataFrame, dataset: str, k: int
) -> dict[tuple[str, int], float]:
    """(arm, seed) -> the mean avg@k over the evaluated steps of its held-out curve
    (held_out_curves), step 0 included: the area under the curve divided by its length, a
    sample-efficiency score (an arm that gets there sooner scores higher at the same final
    score). Without a step-0 evaluation there is no area: the start weighs in every arm's mean
    alike."""
    return {
        key: math.fsum(p.value for p in curve.values()) / len(curve)
        for key, curve in held_out_curves(runs, selected, evals, dataset, k).items()
        if 0 in curve
    }


def _mean_of(frame: pd.DataFrame, column: str) -> float:
    values = pd.to_numeric(frame[column], errors="coerce").dropna()
    return float(values.mean()) if len(values) else math.nan


def _same_problems(a: _SeedScore, b: _SeedScore) -> bool:
    """Two evaluations of one seed compare problem by problem only on the same eval set (the
    dataset and k are fixed by the table; a different problem count means a different set)."""
    return a.n_problems is None or b.n_problems is None or a.n_problems == b.n_problems


def _paired_delta(mine: dict[int, _SeedScore], other: dict[int, _SeedScore]) -> stats.Estimate:
    """Final score of `mine` − `other`, paired by seed over the seeds both have."""
    common = [s for s in mine if s in other and _same_problems(mine[s], other[s])]
    return stats.paired({s: mine[s].final for s in common}, {s: other[s].final for s in common})


def _problems_delta(
    delta: stats.Estimate,
    correct: Mapping[EvalKey, list[int]],
    k: int,
    a: Mapping[int, EvalKey | None],
    b: Mapping[int, EvalKey | None],
) -> stats.Estimate:
    """A one-seed difference with its interval over eval problems (problem sampling only):
    a[seed] and b[seed] name the two evaluations it compares."""
    if delta.n != 1:
        return stats.EMPTY
    seed = delta.keys[0]
    key_a, key_b = a.get(seed), b.get(seed)
    ca = correct.get(key_a) if key_a is not None else None
    cb = correct.get(key_b) if key_b is not None else None
    if ca is None or cb is None or len(ca) != len(cb) or len(ca) < 2:
        return stats.EMPTY
    return stats.paired_problems(ca, cb, k)


def _final_key(score: _SeedScore) -> EvalKey:
    return (score.run_id, score.final_step)


def _start_key(score: _SeedScore) -> EvalKey | None:
    return None if score.start_run is None else (score.start_run, 0)


def _ablation_rows(
    sweep: Any,
    runs: pd.DataFrame,
    evals: pd.DataFrame,
    evaluation: tuple[str, int] | None,
    correct: Mapping[EvalKey, list[int]] | None = None,
) -> list[dict[str, Any]]:
    dataset, k = evaluation if evaluation is not None else (None, None)
    mine = evals[evals["run_id"].isin(runs["run_id"])] if not runs.empty else evals.iloc[0:0]
    scores = _scores(mine, dataset, k) if dataset is not None and k is not None else {}
    correct = correct or {}
    ladder = {str(rung["arm"]): rung for rung in (sweep.ladder or [])}
    seeds = [int(s) for s in sweep.seeds or []]
    adaptive = is_adaptive(getattr(sweep, "params", None))
    selected, latest = selected_attempts(runs), latest_attempts(runs)
    order = arm_order(sweep, runs)
    parent_of = parents(sweep, order)
    # The starting model's score of each (arm, seed), from any attempt that evaluated it: a
    # resumed attempt starts from a checkpoint and does not evaluate step 0 again.
    starts: dict[tuple[str, int], tuple[float, int]] = {}
    for run in runs.sort_values("attempt").itertuples():
        found = scores.get(int(run.run_id))
        if found is not None and found.start_run is not None:
            starts.setdefault((str(run.arm), int(run.seed)), (found.start, found.start_run))
    by_arm: dict[str, dict[int, _SeedScore]] = {}
    area_of = _areas(runs, selected, mine, dataset, k) if dataset is not None and k else {}
    area_by_arm: dict[str, dict[int, float]] = {}
    rows: list[dict[str, Any]] = []
    for arm in order:
        chosen = selected[selected["arm"] == arm].sort_values("seed")
        newest = latest[latest["arm"] == arm]
        per_seed: dict[int, _SeedScore] = {}
        for run in chosen.itertuples():
            found = scores.get(int(run.run_id))
            if run.status == "completed" and found is not None:
                if found.start_run is None:
                    start, start_run = starts.get((arm, int(run.seed)), (math.nan, None))
                    found = replace(found, start=start, start_run=start_run)
                per_seed[int(run.seed)] = found
        by_arm[arm] = per_seed
        # the seeds that score the row (completed, evaluated) and have a whole curve
        area = {seed: area_of[(arm, seed)] for seed in per_seed if (arm, seed) in area_of}
        area_by_arm[arm] = area
        # Counters describe the runs behind the scores (the completed ones); an arm with none
        # completed yet shows how far its runs have got.
        done = chosen[chosen["status"] == "completed"]
        counted = done if len(done) else chosen
        finals = [s.final for s in per_seed.values()]
        mean, std = stats.mean_sd(finals)
        best_mean, best_std = stats.mean_sd([s.best for s in per_seed.values()])
        started = {seed: s for seed, s in per_seed.items() if not math.isnan(s.start)}
        gain = stats.paired(
            {seed: s.final for seed, s in started.items()},
            {seed: s.start for seed, s in started.items()},
        )
        status_by_seed = dict(zip(newest["seed"].astype(int), newest["status"], strict=True))
        # An adaptive sweep's arm stops at its own seed count: only its attempts are its own.
        all_seeds = sorted(set(status_by_seed) if adaptive else set(seeds) | set(status_by_seed))
        rung = ladder.get(arm, {})
        paper = rung.get("paper_score")
        rows.append(
            {
                "arm": arm,
                "adds": rung.get("adds"),
                "parent": parent_of[arm],
                "paper_score": math.nan if paper is None else float(paper),
                "seeds": list(per_seed),
                "scores": finals,
                "best_scores": [s.best for s in per_seed.values()],
                "start_scores": [s.start for s in per_seed.values()],
                "n_seeds": len(finals),
                "score": stats.t_interval(finals, keys=list(per_seed)),
                "score_mean": mean,
                "score_std": std,
                "best_mean": best_mean,
                "best_std": best_std,
                "start_mean": stats.mean_sd([s.start for s in started.values()])[0],
                "gain": gain,
                "gain_problems": _problems_delta(
                    gain,
                    correct,
                    k or 1,
                    {seed: _final_key(s) for seed, s in started.items()},
                    {seed: _start_key(s) for seed, s in started.items()},
                ),
                "steps": _mean_of(counted, "steps"),
                "grad_updates": _mean_of(counted, "grad_updates"),
                "tokens": _mean_of(counted, "tokens"),
                "wall_s": _mean_of(counted, "wall_s"),
                "status": fold_status([status_by_seed.get(s) for s in all_seeds]),
                "runs_done": int((chosen["status"] == "completed").sum()),
                "runs_total": len(all_seeds),
                "run_ids": [int(r) for r in chosen["run_id"]],
                "eval_dataset": dataset,
                "eval_k": k,
                "area": stats.t_interval(list(area.values()), keys=list(area)),
                "iqm": decisions.iqm(finals),
                "collapsed": decisions.collapsed(
                    [s.final for s in started.values()], [s.start for s in started.values()]
                ),
            }
        )
    base = order[0] if order else None
    for row in rows:
        arm = row["arm"]
        parent = parent_of[arm]
        row["area_delta_parent"] = (
            stats.paired(area_by_arm[arm], area_by_arm[parent])
            if parent is not None and parent in area_by_arm and parent != arm
            else stats.EMPTY
        )
        for name, other in (("delta_parent", parent_of[arm]), ("delta_base", base)):
            if other is None or other == arm:
                row[name] = row[f"{name}_problems"] = stats.EMPTY
                continue
            mine_, theirs = by_arm[arm], by_arm[other]
            delta = _paired_delta(mine_, theirs)
            row[name] = delta
            row[f"{name}_problems"] = _problems_delta(
                delta,
                correct,
                k or 1,
                {seed: _final_key(s) for seed, s in mine_.items()},
                {seed: _final_key(s) for seed, s in theirs.items()},
            )
    return rows


def _needed_counts(scores: Mapping[int, _SeedScore]) -> list[EvalKey]:
    """The evaluations whose per-problem counts the table may use: every run's final and
    step-0 ones."""
    keys = [_final_key(s) for s in scores.values()]
    return keys + [key for s in scores.values() if (key := _start_key(s)) is not None]


def ablation_table(
    engine: sa.Engine, sweep_id: int, *, dataset: str | None = None, k: int | None = None
) -> pd.DataFrame:
    """One row per arm of the sweep, in ladder order (see ABLATION_COLUMNS).

    Per arm: what it adds, its parent arm and the paper's score; per seed the final avg@k (the
    evaluation at the run's last evaluated step), the best avg@k over its evaluations and the
    starting model's (step 0), of the latest completed attempt. Statistics (db.stats, typed
    `Estimate`s with a 95% t-interval over seeds): `score` (mean final), `gain` (final − start,
    paired by seed), `delta_parent` and `delta_base` (final − the parent's / the first arm's,
    paired by seed over the seeds both have); with one seed, `*_problems` is the same
    difference with an interval over eval problems (problem sampling only). Also the mean and
    sample std of final and best, steps, gradient updates, tokens and wall time (mean over the
    seeds' completed runs, else over their latest attempts), and the status folded over seeds
    (running > failed > cancelled > pending > completed). The evaluation is (dataset, k) when
    given (NotFound, naming those that exist, when the sweep has none such), else the one most
    runs have. Scores are fractions; Δs are differences of fractions.
    """
    with engine.connect() as conn:
        sweep = sweep_row(conn, engine, sweep_id)
        runs = sweep_runs(conn, sweep_id)
        evals = _evaluation_frame(conn, int(sweep_id))
        evaluation = _resolve_evaluation(evals, dataset, k, int(sweep_id))
        correct: dict[EvalKey, list[int]] = {}
        if evaluation is not None:
            chosen = _scores(evals, *evaluation)
            correct = _correct_counts(conn, *evaluation, _needed_counts(chosen))
    rows = _ablation_rows(sweep, runs, evals, evaluation, correct)
    return pd.DataFrame(rows, columns=ABLATION_COLUMNS)


# --- many Δs at once: Holm ------------------------------------------------------------------


@dataclass(frozen=True)
class HolmStars:
    """The table's Δ-parent stars with and without Holm's correction over all of them.

    p: arm -> the exact paired sign-flip p of its Δ parent (arms whose Δ is a test: at least
    one shared seed); adjusted: arm -> its Holm-adjusted p; starred: the arms the exact test
    alone calls significant (the table's star); holm: the arms Holm rejects at the same
    family-wise 5%; lost: starred but not by Holm (Holm only ever removes stars).
    """

    p: dict[str, float]
    adjusted: dict[str, float]
    starred: tuple[str, ...]
    holm: tuple[str, ...]
    alpha: float = 1.0 - stats.LEVEL

    @property
    def lost(self) -> tuple[str, ...]:
        return tuple(arm for arm in self.starred if arm not in self.holm)


def holm_stars(table: pd.DataFrame) -> HolmStars:
    """Holm over the table's Δ-parent tests. A ladder of six arms draws five Δs; at 5% each,
    the chance that some star is noise is up to 1 − 0.95⁵ ≈ 23% when no arm does anything, and
    Holm brings the family back to 5% (uniformly more powerful than Bonferroni, and it assumes
    nothing about how the Δs depend on each other: neighbouring Δs share an arm). Only Δs over
    two or more seeds are tests here (one seed always gives p = 1)."""
    estimates = {str(r["arm"]): r["delta_parent"] for r in table.to_dict("records")}
    p = {
        arm: e.p
        for arm, e in estimates.items()
        if isinstance(e, stats.Estimate) and e.tested and e.n >= 2
    }
    adjusted = stats.holm_adjusted(p)
    alpha = 1.0 - stats.LEVEL
    starred = tuple(arm for arm in p if estimates[arm].significant)
    kept = tuple(arm for arm in p if adjusted[arm] < alpha)
    return HolmStars(p=p, adjusted=adjusted, starred=starred, holm=kept, alpha=alpha)


def holm_note(result: HolmStars) -> str:
    """One line under the table: how many Δs it starred, how many Holm keeps, and which lose
    their star (each with its p and Holm-adjusted p)."""
    head = (
        f"Holm over the {len(result.p)} Δ parent test(s) (family-wise "
        f"{100 * result.alpha:.0f}%): {len(result.starred)} starred, {len(result.holm)} after Holm"
    )
    if not result.lost:
        return head + ("; every star stands" if result.starred else "") + "."
    lost = ", ".join(
        f"{arm} (p = {result.p[arm]:.3g}, Holm p = {result.adjusted[arm]:.3g})"
        for arm in result.lost
    )
    return f"{head}; star lost under Holm: {lost}."


# --- sample efficiency ----------------------------------------------------------------------


def efficiency_records(table: pd.DataFrame) -> list[dict[str, str]]:
    """`dapo table --efficiency`: per arm, its area (the mean held-out avg@k over the curve's
    evaluations, step 0 included) in % with its 95% interval over seeds, and the paired Δ to
    the parent in percentage points (* when the exact paired test calls it real); the final score beside
    it, so that "as good, sooner" reads at a glance."""
    from db.table_format import MISSING, estimate_text

    out = []
    for row in table.to_dict("records"):
        area: stats.Estimate = row["area"]
        out.append(
            {
                "arm": str(row["arm"]),
                "n": str(area.n),
                "area": estimate_text(area),
                "Δ parent (area)": estimate_text(
                    row["area_delta_parent"], signed=True, n_expected=area.n
                ),
                "final": estimate_text(row["score"]),
                "parent": MISSING if pd.isna(row["parent"]) else str(row["parent"]),
            }
        )
    return out


def efficiency_caption(table: pd.DataFrame) -> str:
    from db.table_format import SIGNIFICANT_RULE, metric_label

    return (
        f"Sample efficiency: per seed, the mean held-out {metric_label(table)} over the run's "
        "evaluations, step 0 included (the area under the curve over its length), in %; mean "
        "over seeds [95% t-interval over seeds]; Δ parent (area): paired by seed, in "
        f"percentage points, {SIGNIFICANT_RULE}; n=1: no interval"
    )
