"""The read side of the store: each function takes an engine and returns a DataFrame or a dict.

The dashboard, `dapo table` and the flows' table artifact all read through here. Scores are
fractions in [0, 1] as the evaluator wrote them (the dashboard shows percent).

Which attempt counts: an (arm, seed) may have several attempts (reruns). Scores come from its
latest *completed* attempt (or, when none completed, its latest attempt, which then has no
score); the status shown is that of its latest attempt, so a rerun in flight reads "running"
while the table still shows the scores it will replace.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import sqlalchemy as sa

from db.engine import safe_url
from db.errors import NotFound
from db.models import EVALUATIONS, METRICS, RUNS, SAMPLES, SWEEPS

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
    "flow_run_id",
    "error",
]
ABLATION_COLUMNS = [
    "arm",
    "adds",
    "paper_score",
    "seeds",
    "scores",
    "best_scores",
    "n_seeds",
    "score_mean",
    "score_std",
    "best_mean",
    "best_std",
    "delta_prev",
    "delta_base",
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
EVALUATION_COLUMNS = ["step", "dataset", "k", "avg_at_k", "pass_at_k", "cons_at_k", "n_problems"]
CURVE_COLUMNS = ["run_id", "arm", "seed", "step", "name", "value"]
SAMPLE_COLUMNS = [
    "run_id",
    "step",
    "idx",
    "prompt",
    "response",
    "ground_truth",
    "pred",
    "reward",
    "score",
    "overlong_penalty",
    "correct",
    "length",
    "truncated",
]
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
STATUS_PRIORITY = ("running", "failed", "cancelled", "pending", "completed")
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


def _run_select() -> sa.Select[Any]:
    r = _runs.c
    return sa.select(
        r.id,
        r.sweep_id,
        r.arm,
        r.seed,
        r.attempt,
        r.status,
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
    out = {column.name: getattr(row, column.name) for column in _sweeps.columns}
    out["sweep_id"] = out["id"]
    return out


def list_sweeps(engine: sa.Engine) -> pd.DataFrame:
    """Every sweep, newest first, with progress: runs_done counts the (arm, seed) pairs with a
    completed attempt out of arms_total = arms × seeds; best_arm has the highest mean score."""
    with engine.connect() as conn:
        sweeps = conn.execute(sa.select(_sweeps).order_by(_sweeps.c.id.desc())).all()
        if not sweeps:
            return _frame([], SWEEP_COLUMNS)
        runs = _frame(conn.execute(_run_select()).all(), RUN_COLUMNS)
        evals = _evaluation_frame(conn)
    rows = []
    for sweep in sweeps:
        mine = runs[runs["sweep_id"] == sweep.id]
        latest = _latest(mine)
        done = _selected(mine)
        done = done[done["status"] == "completed"]
        best_arm, best_score = None, math.nan
        table = _ablation_rows(sweep, mine, evals, None, None)
        for row in table:
            if not math.isnan(row["score_mean"]) and (
                math.isnan(best_score) or row["score_mean"] > best_score
            ):
                best_arm, best_score = row["arm"], row["score_mean"]
        rows.append(
            (
                sweep.id,
                sweep.name,
                sweep.preset,
                sweep.status,
                sweep.created_at,
                sweep.finished_at,
                list(sweep.arms),
                list(sweep.seeds),
                len(sweep.arms) * len(sweep.seeds),
                len(done),
                int((latest["status"] == "failed").sum()),
                int((latest["status"] == "running").sum()),
                best_arm,
                best_score,
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


def _evaluation_frame(conn: sa.Connection, sweep_id: int | None = None) -> pd.DataFrame:
    """Evaluations (run_id, dataset, k, step, avg@k) of one sweep's runs, or of every sweep."""
    e, r = _evaluations.c, _runs.c
    query = sa.select(e.run_id, e.dataset, e.k, e.step, e.avg_at_k).join_from(
        _evaluations, _runs, e.run_id == r.id
    )
    if sweep_id is not None:
        query = query.where(r.sweep_id == int(sweep_id))
    return _frame(conn.execute(query).all(), ["run_id", "dataset", "k", "step", "avg_at_k"])


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


def _scores(evals: pd.DataFrame, dataset: str, k: int) -> dict[int, tuple[float, float]]:
    """run_id -> (final avg@k: at the run's last evaluated step, best avg@k over its steps)."""
    mine = evals[(evals["dataset"] == dataset) & (evals["k"] == k)].dropna(subset=["avg_at_k"])
    out: dict[int, tuple[float, float]] = {}
    for run_id, group in mine.groupby("run_id"):
        final = float(group.sort_values("step")["avg_at_k"].iloc[-1])
        out[int(run_id)] = (final, float(group["avg_at_k"].max()))
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


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    # sample standard deviation (n - 1), the usual spread over seeds
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance)


def _mean_of(frame: pd.DataFrame, column: str) -> float:
    values = pd.to_numeric(frame[column], errors="coerce").dropna()
    return float(values.mean()) if len(values) else math.nan


def _fold_status(statuses: Sequence[str]) -> str:
    for status in STATUS_PRIORITY:
        if status in statuses:
            return status
    return "pending"


def _ablation_rows(
    sweep: Any,
    runs: pd.DataFrame,
    evals: pd.DataFrame,
    dataset: str | None,
    k: int | None,
) -> list[dict[str, Any]]:
    mine = evals[evals["run_id"].isin(runs["run_id"])] if not runs.empty else evals.iloc[0:0]
    if dataset is None or k is None:
        candidates = mine
        if dataset is not None:
            candidates = candidates[candidates["dataset"] == dataset]
        if k is not None:
            candidates = candidates[candidates["k"] == k]
        primary = primary_evaluation(candidates)
        if primary is not None:
            dataset, k = primary
    scores = _scores(mine, dataset, k) if dataset is not None and k is not None else {}
    ladder = {str(rung["arm"]): rung for rung in (sweep.ladder or [])}
    seeds = [int(s) for s in sweep.seeds or []]
    selected, latest = _selected(runs), _latest(runs)
    rows: list[dict[str, Any]] = []
    for arm in arm_order(sweep, runs):
        chosen = selected[selected["arm"] == arm].sort_values("seed")
        newest = latest[latest["arm"] == arm]
        seed_scores = [
            (int(run.seed), *scores[int(run.run_id)])
            for run in chosen.itertuples()
            if run.status == "completed" and int(run.run_id) in scores
        ]
        # Counters describe the runs behind the scores (the completed ones); an arm with none
        # completed yet shows how far its runs have got.
        done = chosen[chosen["status"] == "completed"]
        counted = done if len(done) else chosen
        finals = [s[1] for s in seed_scores]
        bests = [s[2] for s in seed_scores]
        mean, std = _mean_std(finals)
        best_mean, best_std = _mean_std(bests)
        status_by_seed = dict(zip(newest["seed"].astype(int), newest["status"], strict=True))
        all_seeds = sorted(set(seeds) | set(status_by_seed))
        rung = ladder.get(arm, {})
        paper = rung.get("paper_score")
        rows.append(
            {
                "arm": arm,
                "adds": rung.get("adds"),
                "paper_score": math.nan if paper is None else float(paper),
                "seeds": [s[0] for s in seed_scores],
                "scores": finals,
                "best_scores": bests,
                "n_seeds": len(finals),
                "score_mean": mean,
                "score_std": std,
                "best_mean": best_mean,
                "best_std": best_std,
                "steps": _mean_of(counted, "steps"),
                "grad_updates": _mean_of(counted, "grad_updates"),
                "tokens": _mean_of(counted, "tokens"),
                "wall_s": _mean_of(counted, "wall_s"),
                "status": _fold_status([status_by_seed.get(s, "pending") for s in all_seeds]),
                "runs_done": int((chosen["status"] == "completed").sum()),
                "runs_total": len(all_seeds),
                "run_ids": [int(r) for r in chosen["run_id"]],
                "eval_dataset": dataset,
                "eval_k": k,
            }
        )
    base = rows[0]["score_mean"] if rows else math.nan
    previous = math.nan
    for i, row in enumerate(rows):
        row["delta_prev"] = row["score_mean"] - previous if i else math.nan
        row["delta_base"] = row["score_mean"] - base
        previous = row["score_mean"]
    return rows


def ablation_table(
    engine: sa.Engine, sweep_id: int, *, dataset: str | None = None, k: int | None = None
) -> pd.DataFrame:
    """One row per arm of the sweep, in ladder order (see ABLATION_COLUMNS).

    Per arm: what it adds and the paper's score; per seed the final avg@k (the evaluation at
    the run's last evaluated step) and the best avg@k over its evaluations, of the latest
    completed attempt; their mean and sample std over seeds; Δ of the mean final score to the
    previous arm and to the first arm (the baseline); steps, gradient updates, tokens and wall
    time (mean over the seeds' completed runs, else over their latest attempts); and the status
    folded over seeds (running > failed > cancelled >
    pending > completed). The evaluation is (dataset, k) when given, else the one most runs
    have. Scores are fractions; Δs are differences of fractions.
    """
    with engine.connect() as conn:
        sweep = _sweep_row(conn, engine, sweep_id)
        runs = _frame(
            conn.execute(_run_select().where(_runs.c.sweep_id == int(sweep_id))).all(),
            RUN_COLUMNS,
        )
        evals = _evaluation_frame(conn, int(sweep_id))
    rows = _ablation_rows(sweep, runs, evals, dataset, k)
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
        row = conn.execute(sa.select(_runs).where(_runs.c.id == int(run_id))).first()
    if row is None:
        raise NotFound(f"no run with id {run_id} in {_where(engine)}")
    out = {column.name: getattr(row, column.name) for column in _runs.columns}
    out["run_id"] = out["id"]
    return out


def previous_arm_run(engine: sa.Engine, run_id: int) -> int | None:
    """The latest completed attempt, with the same seed in the same sweep, of the arm before
    this run's arm on the ladder (what the run page diffs its config against)."""
    run = run_details(engine, run_id)
    with engine.connect() as conn:
        sweep = _sweep_row(conn, engine, run["sweep_id"])
        order = arm_order(sweep)
        if run["arm"] not in order or order.index(run["arm"]) == 0:
            return None
        before = order[order.index(run["arm"]) - 1]
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
        sa.select(*(r.id if c == "run_id" else r[c] for c in ATTEMPT_COLUMNS))
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
