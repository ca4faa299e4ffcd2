"""Progress of the runs in flight, from what the trainer stores as it goes: the step it has
reached, how many it will take, and when it should end at its recent pace.

The trainer's sink writes each rollout step's metrics as one transaction while the run trains
(db.sink), so the store knows a running run's step without asking anyone: its last stored step
(one index seek on the metrics key, whatever the run's length) and, at that step, the
cumulative `progress/rollout_step` counter (the step count itself, also right for a store that
numbers steps from 0). The ETA is the steps left times the mean `time/step_s` of the last
ETA_WINDOW stored steps: the pace now, not the average since a slower first step (a cold
start, a compile). Evaluations take time the steps do not count, and are not in it.

Every read here is bounded by the runs asked about (the running ones: a handful), never by
the store's size: a page that shows progress costs what it shows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import sqlalchemy as sa

from dapo_common import metric_names as M
from db.models import METRICS, RUNS
from db.reads import RUN_COLUMNS, run_select, to_frame

ETA_WINDOW = 10  # stored steps whose mean step time makes the pace of the ETA
PROGRESS_COLUMNS = [
    "run_id",
    "sweep_id",
    "arm",
    "seed",
    "attempt",
    "status",
    "step",  # rollout steps done: the counter at the last stored step (0 before the first)
    "steps",  # the run's run.steps (NaN when its config does not say)
    "fraction",  # step / steps, in [0, 1] (NaN without steps)
    "step_s",  # mean seconds a step over the last ETA_WINDOW stored steps (NaN before one)
    "eta_s",  # (steps − step) × step_s
    "replaces_done",  # a rerun of an (arm, seed) that already has a completed attempt
    "started_at",
    "updated_at",
]


def _total_steps(config: Any) -> float:
    """run.steps of a stored config, NaN when it has none."""
    run = (config or {}).get("run") if isinstance(config, dict) else None
    steps = run.get("steps") if isinstance(run, dict) else None
    return float(steps) if isinstance(steps, int) and steps > 0 else math.nan


def run_progress(engine: sa.Engine, run_ids: Sequence[int]) -> pd.DataFrame:
    """PROGRESS_COLUMNS for the given runs (any status; meant for the running ones), in the
    order asked. Three reads, each bounded by len(run_ids): the runs' rows and configs, their
    last stored step with the counter there (an index seek each), and the step times of their
    last ETA_WINDOW steps."""
    ids = [int(r) for r in dict.fromkeys(run_ids)]
    if not ids:
        return pd.DataFrame(columns=PROGRESS_COLUMNS)
    m, r = METRICS.c, RUNS.c
    last = sa.select(sa.func.max(m.step)).where(m.run_id == r.id).scalar_subquery().label("last")
    other = RUNS.alias("other")
    done = (
        sa.exists()
        .where(
            other.c.sweep_id == r.sweep_id,
            other.c.arm == r.arm,
            other.c.seed == r.seed,
            other.c.status == "completed",
            other.c.id != r.id,
        )
        .label("replaces_done")
    )
    base = run_select().add_columns(r.config, last, done).where(r.id.in_(ids))
    with engine.connect() as conn:
        runs = to_frame(conn.execute(base).all(), [*RUN_COLUMNS, "config", "last", "replaces_done"])
        lasts = {int(i): int(s) for i, s in zip(runs["run_id"], runs["last"], strict=True)
                 if s is not None and s == s}  # fmt: skip
        counters = _values_at(conn, lasts, M.ROLLOUT_STEP)
        paces = _recent_pace(conn, lasts)
    out = []
    for row in runs.to_dict("records"):
        run_id = int(row["run_id"])
        steps = _total_steps(row["config"])
        # before its first step a run has done 0; the counter, else the step's own number
        step = counters.get(run_id, float(lasts[run_id])) if run_id in lasts else 0.0
        pace = paces.get(run_id, math.nan)
        left = max(steps - step, 0.0) if not math.isnan(steps) else math.nan
        out.append(
            {
                "run_id": run_id,
                "sweep_id": int(row["sweep_id"]),
                "arm": row["arm"],
                "seed": int(row["seed"]),
                "attempt": int(row["attempt"]),
                "status": row["status"],
                "step": int(step),
                "steps": steps,
                "fraction": min(step / steps, 1.0) if steps == steps else math.nan,
                "step_s": pace,
                "eta_s": left * pace if left == left and pace == pace else math.nan,
                "replaces_done": bool(row["replaces_done"]),
                "started_at": row["started_at"],
                "updated_at": row["updated_at"],
            }
        )
    frame = pd.DataFrame(out, columns=PROGRESS_COLUMNS)
    order = {run_id: i for i, run_id in enumerate(ids)}
    return frame.sort_values("run_id", key=lambda s: s.map(order)).reset_index(drop=True)


def _values_at(conn: sa.Connection, at: dict[int, int], name: str) -> dict[int, float]:
    """run -> the value of `name` at the given step (one key lookup each)."""
    if not at:
        return {}
    m = METRICS.c
    keys = sa.or_(*(sa.and_(m.run_id == run, m.step == step) for run, step in at.items()))
    query = sa.select(m.run_id, m.value).where(keys, m.name == name)
    return {int(run): float(v) for run, v in conn.execute(query) if v is not None}


def _recent_pace(conn: sa.Connection, lasts: dict[int, int]) -> dict[int, float]:
    """run -> mean `time/step_s` over its last ETA_WINDOW stored steps (a key range each)."""
    if not lasts:
        return {}
    m = METRICS.c
    recent = sa.or_(
        *(sa.and_(m.run_id == run, m.step > last - ETA_WINDOW) for run, last in lasts.items())
    )
    query = (
        sa.select(m.run_id, sa.func.avg(m.value))
        .where(recent, m.name == M.STEP_S, m.value.isnot(None))
        .group_by(m.run_id)
    )
    return {int(run): float(v) for run, v in conn.execute(query) if v is not None}


def running_runs(engine: sa.Engine, sweep_ids: Sequence[int] | None = None) -> list[int]:
    """The ids of the runs stored as running (of the given sweeps, or of all), oldest first;
    a run past its lease reads interrupted (db.reads) and is left out."""
    r = RUNS.c
    query = run_select().where(r.status == "running")
    if sweep_ids is not None:
        query = query.where(r.sweep_id.in_([int(s) for s in sweep_ids]))
    with engine.connect() as conn:
        runs = to_frame(conn.execute(query.order_by(r.id)).all(), RUN_COLUMNS)
    return [int(i) for i, s in zip(runs["run_id"], runs["status"], strict=True) if s == "running"]


def sweep_fraction(runs_done: int, arms_total: int, progress: pd.DataFrame, sweep_id: int) -> float:
    """A sweep's progress in steps, not only in finished runs: (the (arm, seed) pairs done +
    the fractions its running runs have trained) / arms × seeds. A rerun of a pair already
    done adds nothing (the pair is counted once). NaN for a sweep of no runs."""
    if arms_total <= 0:
        return math.nan
    mine = progress[
        (progress["sweep_id"] == sweep_id)
        & (progress["status"] == "running")
        & ~progress["replaces_done"].astype(bool)
    ]
    partial = float(mine["fraction"].fillna(0.0).sum()) if len(mine) else 0.0
    return min((runs_done + partial) / arms_total, 1.0)
