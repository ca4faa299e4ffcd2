"""The read side of the store: each function takes an engine and returns a DataFrame or a dict.

The dashboard, `dapo table` and the flows' table artifact all read through here. Scores are
fractions in [0, 1] as the evaluator wrote them (the dashboard shows percent).

Which attempt counts: an (arm, seed) may have several attempts (reruns). Scores come from its
latest *completed* attempt (or, when none completed, its latest attempt, which then has no
score); the status shown is that of its latest attempt, so a rerun in flight reads "running"
while the table still shows the scores it will replace. A run stored as "running" whose row has
not been touched for db.models.RUN_LEASE_S (its driver died without a word) reads "interrupted",
and so does its sweep once none of its rows has been touched for that long.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
import sqlalchemy as sa

from db import mechanisms, stats
from db.engine import safe_url
from db.errors import NotFound
from db.models import (
    EVALUATION_FIELDS,
    EVALUATIONS,
    INTERRUPTED,
    METRICS,
    RUN_LEASE_S,
    RUNS,
    SAMPLE_FIELDS,
    SAMPLES,
    SWEEPS,
    fold_status,
    utcnow,
)

EvalKey = tuple[int, int]  # (run_id, step) of one evaluation

RUN_COLUMNS = [
    "run_id",
    "sweep_id",
    "arm",
    "seed",
    "attempt",
    "status",
    "steps",
    "grad_updates",
    "tokens",
    "wall_s",
    "error",
    "config_hash",
    "host",
    "flow_run_id",
    "checkpoint_dir",
    "started_at",
    "finished_at",
    "updated_at",
]
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
]
EVALUATION_COLUMNS = ["step", *EVALUATION_FIELDS]
CURVE_COLUMNS = ["run_id", "arm", "seed", "step", "name", "value"]
EVAL_CURVE = "eval/avg_at_k"  # the name evaluation_curves gives avg@k (dapo_core's metric name)
SAMPLE_COLUMNS = ["run_id", "step", "idx", *SAMPLE_FIELDS]
ATTEMPT_COLUMNS = [
    "run_id",
    "seed",
    "attempt",
    "status",
    "started_at",
    "finished_at",
    "wall_s",
    "steps",
    "grad_updates",
    "tokens",
    "error",
    "config_hash",
    "host",
    "flow_run_id",
    "checkpoint_dir",
]
# How an arm's seeds fold into one status: the first that any seed has wins.
_TIME_COLUMNS = ("created_at", "finished_at", "started_at", "updated_at")

_sweeps, _runs, _metrics, _evaluations, _samples = SWEEPS, RUNS, METRICS, EVALUATIONS, SAMPLES


def _frame(rows: Iterable[Any], columns: Sequence[str]) -> pd.DataFrame:
    frame = pd.DataFrame([tuple(r) for r in rows], columns=list(columns))
    for column in _TIME_COLUMNS:
        if column in frame:
            frame[column] = pd.to_datetime(frame[column], utc=True)
    return frame


def _where(engine: sa.Engine) -> str:
    return safe_url(engine.url)


def _sweep_row(conn: sa.Connection, engine: sa.Engine, sweep_id: int) -> Any:
    row = conn.execute(sa.select(_sweeps).where(_sweeps.c.id == int(sweep_id))).first()
    if row is None:
        raise NotFound(f"no sweep with id {sweep_id} in {_where(engine)}")
    return row


def _lease_cutoff() -> datetime:
    """A row last touched before this belongs to a driver that is gone (RUN_LEASE_S)."""
    return utcnow() - timedelta(seconds=RUN_LEASE_S)


def _shown_status() -> sa.ColumnElement[str]:
    """runs.status as the reader should see it: "running" past its lease reads INTERRUPTED."""
    r = _runs.c
    stale = sa.and_(r.status == "running", r.updated_at < _lease_cutoff())
    return sa.case((stale, sa.literal(INTERRUPTED)), else_=r.status).label("status")


def _shown_sweep_status(sweep: Any, runs: pd.DataFrame) -> str:
    """A sweep stored as "running" whose row and runs nobody has touched for the lease (its
    driver was SIGKILLed and never resumed) reads INTERRUPTED, like its runs."""
    if sweep.status != "running":
        return str(sweep.status)
    touched = [sweep.updated_at, *(t for t in runs["updated_at"] if pd.notna(t))]
    newest = max(pd.Timestamp(t) for t in touched)
    return INTERRUPTED if newest < pd.Timestamp(_lease_cutoff()) else "running"


def _run_select() -> sa.Select[Any]:
    r = _runs.c
    return sa.select(
        r.id,
        r.sweep_id,
        r.arm,
        r.seed,
        r.attempt,
        _shown_status(),
        r.steps,
        r.grad_updates,
        r.tokens,
        r.wall_s,
        r.error,
        r.config_hash,
        r.host,
        r.flow_run_id,
        r.checkpoint_dir,
        r.started_at,
        r.finished_at,
        r.updated_at,
    )


# --- sweeps ------------------------------------------------------------------------------


def latest_sweep_id(engine: sa.Engine) -> int | None:
    """The newest sweep's id, or None for an empty store."""
    with engine.connect() as conn:
        found = conn.execute(sa.select(sa.func.max(_sweeps.c.id))).scalar()
    return None if found is None else int(found)


def sweep_details(engine: sa.Engine, sweep_id: int) -> dict[str, Any]:
    """One sweep as a dict (id/sweep_id, name, preset, status, arms, seeds, ladder, ...)."""
    with engine.connect() as conn:
        row = _sweep_row(conn, engine, sweep_id)
        touched = conn.execute(
            sa.select(_runs.c.updated_at).where(_runs.c.sweep_id == int(sweep_id))
        ).all()
    out = {column.name: getattr(row, column.name) for column in _sweeps.columns}
    out["sweep_id"] = out["id"]
    out["status"] = _shown_sweep_status(row, _frame(touched, ["updated_at"]))
    return out


def list_sweeps(engine: sa.Engine, sweep_id: int | None = None) -> pd.DataFrame:
    """Every sweep (or the one `sweep_id` names), newest first, with progress: runs_done counts
    the (arm, seed) pairs with a completed attempt out of arms_total = arms × seeds. best_arm
    (and best_score, its mean) is set only when the arm with the highest mean leads the
    runner-up significantly (paired 95% interval over seeds above 0); `leader` is the
    stats.Leader behind it, for the headline."""
    with engine.connect() as conn:
        select_sweeps, select_runs = sa.select(_sweeps), _run_select()
        if sweep_id is not None:
            select_sweeps = select_sweeps.where(_sweeps.c.id == int(sweep_id))
            select_runs = select_runs.where(_runs.c.sweep_id == int(sweep_id))
        sweeps = conn.execute(select_sweeps.order_by(_sweeps.c.id.desc())).all()
        if not sweeps:
            return _frame([], SWEEP_COLUMNS)
        runs = _frame(conn.execute(select_runs).all(), RUN_COLUMNS)
        evals = _evaluation_frame(conn, sweep_id)
    rows = []
    for sweep in sweeps:
        mine = runs[runs["sweep_id"] == sweep.id]
        latest = _latest(mine)
        done = _selected(mine)
        done = done[done["status"] == "completed"]
        sweep_evals = evals[evals["run_id"].isin(mine["run_id"])]
        table = _ablation_rows(sweep, mine, sweep_evals, primary_evaluation(sweep_evals))
        lead = stats.leader_of_rows(table)
        rows.append(
            (
                sweep.id,
                sweep.name,
                sweep.preset,
                _shown_sweep_status(sweep, mine),
                sweep.created_at,
                sweep.finished_at,
                list(sweep.arms),
                list(sweep.seeds),
                len(sweep.arms) * len(sweep.seeds),
                len(done),
                int((latest["status"] == "failed").sum()),
                int((latest["status"] == "running").sum()),
                lead.best if lead.significant else None,
                lead.best_mean if lead.significant else math.nan,
                lead,
                sweep.flow_run_id,
                sweep.error,
            )
        )
    return _frame(rows, SWEEP_COLUMNS)


# --- the ablation table ------------------------------------------------------------------


def _latest(runs: pd.DataFrame) -> pd.DataFrame:
    """The newest attempt of each (arm, seed)."""
    if runs.empty:
        return runs
    ordered = runs.sort_values(["arm", "seed", "attempt"])
    return ordered.groupby(["arm", "seed"], as_index=False, sort=False).tail(1)


def _selected(runs: pd.DataFrame) -> pd.DataFrame:
    """The attempt that speaks for each (arm, seed): its latest completed one, else its latest."""
    if runs.empty:
        return runs
    ranked = runs.assign(_done=(runs["status"] == "completed").astype(int))
    ranked = ranked.sort_values(["arm", "seed", "_done", "attempt"])
    return ranked.groupby(["arm", "seed"], as_index=False, sort=False).tail(1).drop(columns="_done")


_EVAL_FRAME = ["run_id", "dataset", "k", "step", "avg_at_k", "n_problems"]


def _evaluation_frame(conn: sa.Connection, sweep_id: int | None = None) -> pd.DataFrame:
    """Evaluations (run_id, dataset, k, step, avg@k, n_problems) of one sweep's runs, or of
    every sweep. The per-problem counts (`extra`) are read only where needed: _correct_counts."""
    e, r = _evaluations.c, _runs.c
    query = sa.select(*(e[c] for c in _EVAL_FRAME)).join_from(_evaluations, _runs, e.run_id == r.id)
    if sweep_id is not None:
        query = query.where(r.sweep_id == int(sweep_id))
    return _frame(conn.execute(query).all(), _EVAL_FRAME)


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


def arm_order(sweep: Any, runs: pd.DataFrame | None = None) -> list[str]:
    """The sweep's arms in ladder order; arms outside the ladder follow in the sweep's order,
    then any arm only the runs know of."""
    ladder = [str(rung["arm"]) for rung in (sweep.ladder or [])]
    arms = [str(a) for a in (sweep.arms or [])] or ladder
    rank = {arm: i for i, arm in enumerate(ladder)}
    ordered = sorted(arms, key=lambda a: (rank.get(a, len(rank)), arms.index(a)))
    if runs is not None and not runs.empty:
        ordered += sorted(set(runs["arm"]) - set(ordered))
    return ordered


def parents(sweep: Any, order: Sequence[str]) -> dict[str, str | None]:
    """Each arm's parent among the arms shown (`order`): the ladder rung's explicit `parent`,
    else the arm before it on the ladder; an ancestor that is not in the sweep is skipped for
    its own parent, and an arm with none left compares with the row above it. The first row
    (the baseline) has none."""
    rungs = [rung for rung in (sweep.ladder or []) if "arm" in rung]
    ladder = [str(rung["arm"]) for rung in rungs]
    explicit = {str(r["arm"]): str(r["parent"]) for r in rungs if r.get("parent")}

    def up(arm: str) -> str | None:
        if arm in explicit:
            return explicit[arm]
        at = ladder.index(arm) if arm in ladder else 0
        return ladder[at - 1] if at > 0 else None

    shown = set(order)
    out: dict[str, str | None] = {}
    for i, arm in enumerate(order):
        if i == 0:
            out[arm] = None
            continue
        parent, seen = up(arm), {arm}
        while parent is not None and parent not in shown and parent not in seen:
            seen.add(parent)
            parent = up(parent)
        out[arm] = parent if parent in shown and parent != arm else order[i - 1]
    return out


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
    selected, latest = _selected(runs), _latest(runs)
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
        all_seeds = sorted(set(seeds) | set(status_by_seed))
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
            }
        )
    base = order[0] if order else None
    for row in rows:
        arm = row["arm"]
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
        sweep = _sweep_row(conn, engine, sweep_id)
        runs = _frame(
            conn.execute(_run_select().where(_runs.c.sweep_id == int(sweep_id))).all(),
            RUN_COLUMNS,
        )
        evals = _evaluation_frame(conn, int(sweep_id))
        evaluation = _resolve_evaluation(evals, dataset, k, int(sweep_id))
        correct: dict[EvalKey, list[int]] = {}
        if evaluation is not None:
            chosen = _scores(evals, *evaluation)
            correct = _correct_counts(conn, *evaluation, _needed_counts(chosen))
    rows = _ablation_rows(sweep, runs, evals, evaluation, correct)
    return pd.DataFrame(rows, columns=ABLATION_COLUMNS)


# --- runs --------------------------------------------------------------------------------


def runs_of_sweep(engine: sa.Engine, sweep_id: int) -> pd.DataFrame:
    """Every attempt of every (arm, seed) of the sweep, oldest first (see RUN_COLUMNS)."""
    with engine.connect() as conn:
        _sweep_row(conn, engine, sweep_id)
        query = _run_select().where(_runs.c.sweep_id == int(sweep_id)).order_by(_runs.c.id)
        return _frame(conn.execute(query).all(), RUN_COLUMNS)


def run_details(engine: sa.Engine, run_id: int) -> dict[str, Any]:
    """One run as a dict: the RUN_COLUMNS fields plus its config (a dict)."""
    with engine.connect() as conn:
        query = sa.select(_runs, _shown_status().label("shown_status"))
        row = conn.execute(query.where(_runs.c.id == int(run_id))).first()
    if row is None:
        raise NotFound(f"no run with id {run_id} in {_where(engine)}")
    out = {column.name: getattr(row, column.name) for column in _runs.columns}
    out["run_id"] = out["id"]
    out["status"] = row.shown_status
    return out


def previous_arm_run(engine: sa.Engine, run_id: int) -> int | None:
    """The latest completed attempt, with the same seed in the same sweep, of this run's parent
    arm (the ablation table's `parent`: what the run page diffs its config against)."""
    run = run_details(engine, run_id)
    with engine.connect() as conn:
        sweep = _sweep_row(conn, engine, run["sweep_id"])
        before = parents(sweep, arm_order(sweep)).get(run["arm"])
        if before is None:
            return None
        r = _runs.c
        found = conn.execute(
            sa.select(r.id)
            .where(
                r.sweep_id == run["sweep_id"],
                r.arm == before,
                r.seed == run["seed"],
                r.status == "completed",
            )
            .order_by(r.attempt.desc())
            .limit(1)
        ).scalar()
    return None if found is None else int(found)


def arm_attempts(engine: sa.Engine, sweep_id: int, arm: str) -> pd.DataFrame:
    """The history of attempts of one arm of a sweep, by seed then attempt (ATTEMPT_COLUMNS)."""
    r = _runs.c
    query = (
        sa.select(
            *(
                r.id if c == "run_id" else _shown_status() if c == "status" else r[c]
                for c in ATTEMPT_COLUMNS
            )
        )
        .where(r.sweep_id == int(sweep_id), r.arm == str(arm))
        .order_by(r.seed, r.attempt)
    )
    with engine.connect() as conn:
        _sweep_row(conn, engine, sweep_id)
        return _frame(conn.execute(query).all(), ATTEMPT_COLUMNS)


def evaluations(engine: sa.Engine, run_id: int) -> pd.DataFrame:
    """A run's evaluations by step (EVALUATION_COLUMNS); scores are fractions."""
    e = _evaluations.c
    query = (
        sa.select(*(e[c] for c in EVALUATION_COLUMNS))
        .where(e.run_id == int(run_id))
        .order_by(e.step, e.dataset, e.k)
    )
    with engine.connect() as conn:
        frame = _frame(conn.execute(query).all(), EVALUATION_COLUMNS)
    for column in ("avg_at_k", "pass_at_k", "cons_at_k"):
        frame[column] = frame[column].astype(float)
    return frame


# --- curves ------------------------------------------------------------------------------


def metric_curves(
    engine: sa.Engine, run_ids: Sequence[int], names: Sequence[str] | None = None
) -> pd.DataFrame:
    """Long frame (run_id, arm, seed, step, name, value) of the runs' metrics, optionally only
    `names`; ordered by run, name, step. NaN stands for a value logged as NaN/inf."""
    ids = [int(r) for r in run_ids]
    if not ids or (names is not None and not list(names)):
        return _frame([], CURVE_COLUMNS).astype({"value": float})
    m, r = _metrics.c, _runs.c
    query = (
        sa.select(m.run_id, r.arm, r.seed, m.step, m.name, m.value)
        .join_from(_metrics, _runs, m.run_id == r.id)
        .where(m.run_id.in_(ids))
        .order_by(m.run_id, m.name, m.step)
    )
    if names is not None:
        query = query.where(m.name.in_([str(n) for n in names]))
    with engine.connect() as conn:
        frame = _frame(conn.execute(query).all(), CURVE_COLUMNS)
    return frame.astype({"value": float})


def evaluation_curves(
    engine: sa.Engine, run_ids: Sequence[int], dataset: str, k: int
) -> pd.DataFrame:
    """Long frame (run_id, arm, seed, step, name, value) of the runs' avg@k on (dataset, k) at
    every evaluated step, step 0 (the starting model) included; name is "eval/avg_at_k" (the
    metric the trainer logs beside it), so the curve pipeline takes it like any metric."""
    ids = [int(r) for r in run_ids]
    if not ids:
        return _frame([], CURVE_COLUMNS).astype({"value": float})
    e, r = _evaluations.c, _runs.c
    query = (
        sa.select(e.run_id, r.arm, r.seed, e.step, e.avg_at_k)
        .join_from(_evaluations, _runs, e.run_id == r.id)
        .where(e.run_id.in_(ids), e.dataset == str(dataset), e.k == int(k))
        .order_by(e.run_id, e.step)
    )
    with engine.connect() as conn:
        frame = _frame(conn.execute(query).all(), ["run_id", "arm", "seed", "step", "value"])
    frame.insert(4, "name", EVAL_CURVE)
    return frame.astype({"value": float})


def metric_names(engine: sa.Engine, run_ids: Sequence[int]) -> list[str]:
    """The metric names the runs logged, sorted (read from the key alone: no value is read)."""
    ids = [int(r) for r in run_ids]
    if not ids:
        return []
    m = _metrics.c
    query = sa.select(m.name).where(m.run_id.in_(ids)).distinct().order_by(m.name)
    with engine.connect() as conn:
        return [str(name) for name in conn.execute(query).scalars()]


# --- samples -----------------------------------------------------------------------------


def samples(
    engine: sa.Engine,
    run_id: int,
    step: int | None = None,
    *,
    correct: bool | None = None,
    truncated: bool | None = None,
    limit: int | None = 200,
) -> pd.DataFrame:
    """A run's stored rollouts (SAMPLE_COLUMNS) by step then index, optionally only one step,
    only correct / wrong, only truncated / complete ones; at most `limit` rows."""
    s = _samples.c
    query = sa.select(*(s[c] for c in SAMPLE_COLUMNS)).where(s.run_id == int(run_id))
    if step is not None:
        query = query.where(s.step == int(step))
    if correct is not None:
        query = query.where(s.correct == bool(correct))
    if truncated is not None:
        query = query.where(s.truncated == bool(truncated))
    query = query.order_by(s.step, s.idx)
    if limit is not None:
        query = query.limit(int(limit))
    with engine.connect() as conn:
        frame = _frame(conn.execute(query).all(), SAMPLE_COLUMNS)
    return frame.astype(
        {
            "correct": bool,
            "truncated": bool,
            "reward": float,
            "score": float,
            "overlong_penalty": float,
        }
    )


def sample_steps(engine: sa.Engine, run_id: int) -> list[int]:
    """The steps at which a run stored rollouts."""
    s = _samples.c
    query = sa.select(s.step).where(s.run_id == int(run_id)).distinct().order_by(s.step)
    with engine.connect() as conn:
        return [int(v) for v in conn.execute(query).scalars()]


# --- mechanisms and grids ----------------------------------------------------------------

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
GRID_COLUMNS = [
    "arm",
    "parent",
    "base",  # the arm the grid's points branch from
    "point",  # {dotted key: value} of the swept keys
    "n_seeds",
    "score",  # stats.Estimate of the final avg@k (the ablation table's)
    "metric",  # stats.Estimate of the chosen metric's last-window mean, or EMPTY
    "metric_name",
    "eval_dataset",
    "eval_k",
]


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
    out: dict[tuple[int, str], tuple[float, float]] = {}
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


def mechanism_table(
    engine: sa.Engine,
    sweep_id: int,
    metrics: Sequence[str] = mechanisms.DEFAULT_METRICS,
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
    """
    if window < 1:
        raise ValueError(f"window must be at least 1 rollout step, got {window}")
    names = [str(n) for n in metrics]
    with engine.connect() as conn:
        sweep = _sweep_row(conn, engine, sweep_id)
        runs = _frame(
            conn.execute(_run_select().where(_runs.c.sweep_id == int(sweep_id))).all(),
            RUN_COLUMNS,
        )
        selected = _selected(runs)
        done = selected[selected["status"] == "completed"] if not runs.empty else selected
        means = _window_means(conn, [int(r) for r in done["run_id"]], names, window)
        configs = _configs(conn, [int(r) for r in selected["run_id"]])
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
                    "first": stats.t_interval(list(firsts.values()), keys=list(firsts)),
                    "last": stats.t_interval(list(lasts.values()), keys=list(lasts)),
                    "delta_parent": (
                        stats.paired(lasts, {s: v for s, (_, v) in theirs.items()})
                        if parent is not None
                        else stats.EMPTY
                    ),
                    "delta_parent_first": (
                        stats.paired(
                            firsts, {s: f for s, (f, _) in theirs.items() if not math.isnan(f)}
                        )
                        if parent is not None
                        else stats.EMPTY
                    ),
                    "window": int(window),
                }
            )
    return pd.DataFrame(rows, columns=MECHANISM_COLUMNS)


def grid_keys(engine: sa.Engine, sweep_id: int) -> list[str]:
    """The dotted config keys the sweep's ladder sweeps (rungs with a `grid`), sorted (a JSONB
    column does not keep the order the keys were given in); [] for a sweep that is not a grid."""
    ladder = sweep_details(engine, sweep_id)["ladder"] or []
    return sorted({str(key) for rung in ladder for key in rung.get("grid") or {}})


def grid_table(
    engine: sa.Engine,
    sweep_id: int,
    *,
    metric: str | None = None,
    window: int = 10,
    dataset: str | None = None,
    k: int | None = None,
) -> pd.DataFrame:
    """One row per grid arm of the sweep (rungs with a `grid`), in ladder order (GRID_COLUMNS):
    its point (swept key -> value), whether it is the base the other points branch from, its
    final score with the 95% interval over seeds (ablation_table's `score`, on (dataset, k) as
    there), and, when `metric` is given, that metric's last-window mean over seeds
    (mechanism_table's `last`). A key a rung does not carry is read from its runs' config.
    Empty for a sweep without a grid."""
    keys = grid_keys(engine, sweep_id)
    if not keys:
        return pd.DataFrame(columns=GRID_COLUMNS)
    sweep = sweep_details(engine, sweep_id)
    rungs = {str(r["arm"]): r for r in sweep["ladder"] or [] if "arm" in r and r.get("grid")}
    table = ablation_table(engine, sweep_id, dataset=dataset, k=k)
    table = table[table["arm"].isin(list(rungs))]
    bases = {str(p) for p in table["parent"] if not pd.isna(p) and p in rungs}
    metric_of: dict[str, stats.Estimate] = {}
    if metric is not None:
        mech = mechanism_table(engine, sweep_id, [metric], window)
        metric_of = dict(zip(mech["arm"], mech["last"], strict=True))
    rows: list[dict[str, Any]] = []
    for row in table.to_dict("records"):
        arm = str(row["arm"])
        point = {key: rungs[arm]["grid"].get(key) for key in keys}
        if any(v is None for v in point.values()) and row["run_ids"]:
            flat = mechanisms.flatten(run_details(engine, int(row["run_ids"][0]))["config"] or {})
            point = {key: flat.get(key) if v is None else v for key, v in point.items()}
        parent = None if pd.isna(row["parent"]) else str(row["parent"])
        rows.append(
            {
                "arm": arm,
                "parent": parent,
                # the grid's base; a grid without parents (rungs written before they carried
                # one) has its first arm as the base
                "base": arm in bases or (not bases and not rows),
                "point": point,
                "n_seeds": row["n_seeds"],
                "score": row["score"],
                "metric": metric_of.get(arm, stats.EMPTY),
                "metric_name": metric,
                "eval_dataset": row["eval_dataset"],
                "eval_k": row["eval_k"],
            }
        )
    return pd.DataFrame(rows, columns=GRID_COLUMNS)
