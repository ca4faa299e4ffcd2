"""The plain reads of the store: sweeps, runs and their attempts, evaluations, metric curves and
samples, each a function of an engine that returns a DataFrame, a dict or a list; and the
pieces the table builders (db.ablation, db.mechanism_table, db.grids) share: which attempt
speaks for an (arm, seed), the arms' ladder order and parents, a sweep's runs as a frame.

Scores are fractions in [0, 1] as the evaluator wrote them (the dashboard shows percent).

Which attempt counts: an (arm, seed) may have several attempts (reruns). Scores come from its
latest *completed* attempt (or, when none completed, its latest attempt, which then has no
score); the status shown is that of its latest attempt, so a rerun in flight reads "running"
while the table still shows the scores it will replace. A run stored as "running" whose row has
not been touched for db.models.RUN_LEASE_S (its driver died without a word) reads "interrupted",
and so does its sweep once none of its rows has been touched for that long.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
import sqlalchemy as sa

from dapo_common import metric_names as M
from dapo_common.samples import ADVANTAGE, GROUP, MEMBER, SAMPLE_FIELDS, TOKENS
from db import summaries
from db.engine import safe_url
from db.errors import NotFound
from db.models import (
    EVALUATION_FIELDS,
    EVALUATIONS,
    INTERRUPTED,
    METRICS,
    RUN_LEASE_S,
    RUN_METRIC_SUMMARIES,
    RUNS,
    SAMPLES,
    SWEEPS,
    utcnow,
)

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
EVALUATION_COLUMNS = ["step", *EVALUATION_FIELDS]
CURVE_COLUMNS = ["run_id", "arm", "seed", "step", "name", "value"]
EVAL_CURVE = M.EVAL_AVG_AT_K  # the name evaluation_curves gives avg@k (the trainer logs it so)
SAMPLE_COLUMNS = ["run_id", "step", "idx", *SAMPLE_FIELDS]
# The sample columns a frame types: flags as bool, rewards as float (NULL read as NaN).
_SAMPLE_DTYPES = {name: kind for name, kind in SAMPLE_FIELDS.items() if kind in (bool, float)}
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
_TIME_COLUMNS = ("created_at", "finished_at", "started_at", "updated_at")

_sweeps, _runs, _metrics, _evaluations, _samples = SWEEPS, RUNS, METRICS, EVALUATIONS, SAMPLES


def to_frame(rows: Iterable[Any], columns: Sequence[str]) -> pd.DataFrame:
    """Rows as a frame with `columns`, the time columns as UTC timestamps."""
    frame = pd.DataFrame([tuple(r) for r in rows], columns=list(columns))
    for column in _TIME_COLUMNS:
        if column in frame:
            frame[column] = pd.to_datetime(frame[column], utc=True)
    return frame


def _where(engine: sa.Engine) -> str:
    return safe_url(engine.url)


def sweep_row(conn: sa.Connection, engine: sa.Engine, sweep_id: int) -> Any:
    """The sweep's row; NotFound (naming the store) when it has none such."""
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


def shown_sweep_status(sweep: Any, runs: pd.DataFrame) -> str:
    """A sweep stored as "running" whose row and runs nobody has touched for the lease (its
    driver was SIGKILLed and never resumed) reads INTERRUPTED, like its runs."""
    if sweep.status != "running":
        return str(sweep.status)
    touched = [sweep.updated_at, *(t for t in runs["updated_at"] if pd.notna(t))]
    newest = max(pd.Timestamp(t) for t in touched)
    return INTERRUPTED if newest < pd.Timestamp(_lease_cutoff()) else "running"


def run_select() -> sa.Select[Any]:
    """The RUN_COLUMNS of runs, the status as the reader should see it."""
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


def sweep_runs(conn: sa.Connection, sweep_id: int) -> pd.DataFrame:
    """Every attempt of the sweep's runs (RUN_COLUMNS), in no particular order."""
    query = run_select().where(_runs.c.sweep_id == int(sweep_id))
    return to_frame(conn.execute(query).all(), RUN_COLUMNS)


# --- which attempt speaks for an (arm, seed), the arms' order -----------------------------


def latest_attempts(runs: pd.DataFrame) -> pd.DataFrame:
    """The newest attempt of each (arm, seed)."""
    if runs.empty:
        return runs
    ordered = runs.sort_values(["arm", "seed", "attempt"])
    return ordered.groupby(["arm", "seed"], as_index=False, sort=False).tail(1)


def selected_attempts(runs: pd.DataFrame) -> pd.DataFrame:
    """The attempt that speaks for each (arm, seed): its latest completed one, else its latest."""
    if runs.empty:
        return runs
    ranked = runs.assign(_done=(runs["status"] == "completed").astype(int))
    ranked = ranked.sort_values(["arm", "seed", "_done", "attempt"])
    return ranked.groupby(["arm", "seed"], as_index=False, sort=False).tail(1).drop(columns="_done")


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


# --- sweeps ------------------------------------------------------------------------------


def sweep_ladders(
    engine: sa.Engine, sweep_ids: Sequence[int] | None = None
) -> dict[int, list[dict[str, Any]]]:
    """sweep id -> its stored ladder (the rungs, with a grid's `grid` points), of the given
    sweeps or of every one: what names a grid's arms by what varies on pages that list runs
    of several sweeps."""
    query = sa.select(_sweeps.c.id, _sweeps.c.ladder)
    if sweep_ids is not None:
        query = query.where(_sweeps.c.id.in_([int(s) for s in sweep_ids]))
    with engine.connect() as conn:
        return {int(i): list(ladder or []) for i, ladder in conn.execute(query)}


def latest_sweep_id(engine: sa.Engine) -> int | None:
    """The newest sweep's id, or None for an empty store."""
    with engine.connect() as conn:
        found = conn.execute(sa.select(sa.func.max(_sweeps.c.id))).scalar()
    return None if found is None else int(found)


def sweep_details(engine: sa.Engine, sweep_id: int) -> dict[str, Any]:
    """One sweep as a dict (id/sweep_id, name, preset, status, arms, seeds, ladder, ...)."""
    with engine.connect() as conn:
        row = sweep_row(conn, engine, sweep_id)
        touched = conn.execute(
            sa.select(_runs.c.updated_at).where(_runs.c.sweep_id == int(sweep_id))
        ).all()
    out = {column.name: getattr(row, column.name) for column in _sweeps.columns}
    out["sweep_id"] = out["id"]
    out["status"] = shown_sweep_status(row, to_frame(touched, ["updated_at"]))
    return out


# --- runs --------------------------------------------------------------------------------


def runs_of_sweep(engine: sa.Engine, sweep_id: int) -> pd.DataFrame:
    """Every attempt of every (arm, seed) of the sweep, oldest first (see RUN_COLUMNS)."""
    with engine.connect() as conn:
        sweep_row(conn, engine, sweep_id)
        query = run_select().where(_runs.c.sweep_id == int(sweep_id)).order_by(_runs.c.id)
        return to_frame(conn.execute(query).all(), RUN_COLUMNS)


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
        sweep = sweep_row(conn, engine, run["sweep_id"])
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
        sweep_row(conn, engine, sweep_id)
        return to_frame(conn.execute(query).all(), ATTEMPT_COLUMNS)


def evaluations(engine: sa.Engine, run_id: int) -> pd.DataFrame:
    """A run's evaluations by step (EVALUATION_COLUMNS); scores are fractions."""
    e = _evaluations.c
    query = (
        sa.select(*(e[c] for c in EVALUATION_COLUMNS))
        .where(e.run_id == int(run_id))
        .order_by(e.step, e.dataset, e.k)
    )
    with engine.connect() as conn:
        frame = to_frame(conn.execute(query).all(), EVALUATION_COLUMNS)
    for column in ("avg_at_k", "pass_at_k", "cons_at_k"):
        frame[column] = frame[column].astype(float)
    return frame


# --- curves ------------------------------------------------------------------------------


def metric_curves(
    engine: sa.Engine,
    run_ids: Sequence[int],
    names: Sequence[str] | None = None,
    *,
    max_points: int | None = None,
) -> pd.DataFrame:
    """Long frame (run_id, arm, seed, step, name, value) of the runs' metrics, optionally only
    `names`; ordered by run, name, step. NaN stands for a value logged as NaN/inf.

    `max_points`: at most about that many points per (run, metric), chosen by the database
    (what is sent and drawn then grows with the chart, not with the run's length). The steps
    kept are a grid common to every series read: lo, lo + s, lo + 2s, ... with lo the first
    step of all of them and s = (hi - lo) // max_points + 1, plus each series' own first and
    last step. Kept rows are the stored rows, never averaged; a common grid keeps the seeds of
    an arm and the x-axis metric on the same steps, which the seed band and the x join need
    (dashboard.curves). What it can miss: a spike between two grid steps (the dashboard's
    full-series switch reads everything). None: every row."""
    ids = [int(r) for r in run_ids]
    if not ids or (names is not None and not list(names)):
        return to_frame([], CURVE_COLUMNS).astype({"value": float})
    if max_points is not None and max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    m, r = _metrics.c, _runs.c
    wanted = [m.run_id.in_(ids)]
    if names is not None:
        wanted.append(m.name.in_([str(n) for n in names]))
    query = (
        sa.select(m.run_id, r.arm, r.seed, m.step, m.name, m.value)
        .join_from(_metrics, _runs, m.run_id == r.id)
        .where(*wanted)
        .order_by(m.run_id, m.name, m.step)
    )
    if max_points is not None:
        with engine.connect() as conn:
            lo, hi = _step_bounds(conn, ids, names)
        # Only a read longer than max_points pays for the window functions below.
        if lo is not None and hi is not None and hi - lo + 1 > max_points:
            query = _grid_query(ids, names, lo, (hi - lo) // int(max_points) + 1)
    with engine.connect() as conn:
        frame = to_frame(conn.execute(query).all(), CURVE_COLUMNS)
    return frame.astype({"value": float})


def _step_bounds(
    conn: sa.Connection, ids: list[int], names: Sequence[str] | None
) -> tuple[int | None, int | None]:
    """The first and last step of the series metric_curves reads: from the runs' summaries
    when every one has ended (db.summaries), else from their rows' keys."""
    if set(ids) <= summaries.summarized(conn, ids):
        s = RUN_METRIC_SUMMARIES.c
        query = sa.select(sa.func.min(s.min_step), sa.func.max(s.max_step)).where(s.run_id.in_(ids))
        if names is not None:
            query = query.where(s.name.in_([str(n) for n in names]))
    else:
        m = _metrics.c
        query = sa.select(sa.func.min(m.step), sa.func.max(m.step)).where(m.run_id.in_(ids))
        if names is not None:
            query = query.where(m.name.in_([str(n) for n in names]))
    row = conn.execute(query).first()
    if row is None or row[0] is None:
        return None, None
    return int(row[0]), int(row[1])


def _grid_query(
    ids: list[int], names: Sequence[str] | None, lo: int, stride: int
) -> sa.Select[Any]:
    """metric_curves' rows on the grid lo + k * stride, plus each series' first and last."""
    m, r = _metrics.c, _runs.c
    series = (m.run_id, m.name)
    inner = sa.select(
        m.run_id,
        m.step,
        m.name,
        m.value,
        sa.func.min(m.step).over(partition_by=series).label("first"),
        sa.func.max(m.step).over(partition_by=series).label("last"),
    ).where(m.run_id.in_(ids))
    if names is not None:
        inner = inner.where(m.name.in_([str(n) for n in names]))
    sub = inner.subquery()
    c = sub.c
    on_grid = (c.step - int(lo)) % int(stride) == 0
    return (
        sa.select(c.run_id, r.arm, r.seed, c.step, c.name, c.value)
        .join_from(sub, _runs, c.run_id == r.id)
        .where(sa.or_(on_grid, c.step == c.first, c.step == c.last))
        .order_by(c.run_id, c.name, c.step)
    )


def evaluation_curves(
    engine: sa.Engine, run_ids: Sequence[int], dataset: str, k: int
) -> pd.DataFrame:
    """Long frame (run_id, arm, seed, step, name, value) of the runs' avg@k on (dataset, k) at
    every evaluated step, step 0 (the starting model) included; name is "eval/avg_at_k" (the
    metric the trainer logs beside it), so the curve pipeline takes it like any metric."""
    ids = [int(r) for r in run_ids]
    if not ids:
        return to_frame([], CURVE_COLUMNS).astype({"value": float})
    e, r = _evaluations.c, _runs.c
    query = (
        sa.select(e.run_id, r.arm, r.seed, e.step, e.avg_at_k)
        .join_from(_evaluations, _runs, e.run_id == r.id)
        .where(e.run_id.in_(ids), e.dataset == str(dataset), e.k == int(k))
        .order_by(e.run_id, e.step)
    )
    with engine.connect() as conn:
        frame = to_frame(conn.execute(query).all(), ["run_id", "arm", "seed", "step", "value"])
    frame.insert(4, "name", EVAL_CURVE)
    return frame.astype({"value": float})


def final_metrics(
    engine: sa.Engine, run_ids: Sequence[int], names: Sequence[str] | None = None
) -> pd.DataFrame:
    """Frame (run_id, name, step, value): each metric's row at its own last logged step, per
    run (NaN where that row's value was logged as NaN/inf); `names`: only those metrics. One
    row per (run, metric), however long the runs: the last step comes from the run's summaries
    when it has ended (db.summaries), else from its rows' keys, and the value is then one key
    lookup."""
    columns = ["run_id", "name", "step", "value"]
    ids = [int(r) for r in run_ids]
    if not ids or (names is not None and not list(names)):
        return to_frame([], columns).astype({"value": float})
    m, s = _metrics.c, RUN_METRIC_SUMMARIES.c
    with engine.connect() as conn:
        ended = summaries.summarized(conn, ids)
        done, rest = sorted(ended), [r for r in ids if r not in ended]
        lasts = []
        if done:
            from_summaries = sa.select(s.run_id, s.name, s.max_step.label("step")).where(
                s.run_id.in_(done)
            )
            if names is not None:
                from_summaries = from_summaries.where(s.name.in_([str(n) for n in names]))
            lasts.append(from_summaries)
        if rest:
            from_rows = sa.select(m.run_id, m.name, sa.func.max(m.step).label("step")).where(
                m.run_id.in_(rest)
            )
            if names is not None:
                from_rows = from_rows.where(m.name.in_([str(n) for n in names]))
            lasts.append(from_rows.group_by(m.run_id, m.name))
        last = (lasts[0] if len(lasts) == 1 else sa.union_all(*lasts)).subquery()
        query = (
            sa.select(m.run_id, m.name, m.step, m.value)
            .join_from(
                _metrics,
                last,
                sa.and_(m.run_id == last.c.run_id, m.step == last.c.step, m.name == last.c.name),
            )
            .order_by(m.run_id, m.name)
        )
        frame = to_frame(conn.execute(query).all(), columns)
    return frame.astype({"value": float})


def metric_names(engine: sa.Engine, run_ids: Sequence[int]) -> list[str]:
    """The metric names the runs logged, sorted (read from the key alone: no value is read)."""
    ids = [int(r) for r in run_ids]
    if not ids:
        return []
    m, s = _metrics.c, RUN_METRIC_SUMMARIES.c
    with engine.connect() as conn:
        # Ended runs from their summaries (a row per name), the others from their rows.
        done = summaries.summarized(conn, ids)
        names: set[str] = set()
        if done:
            query = sa.select(s.name).where(s.run_id.in_(sorted(done))).distinct()
            names.update(str(n) for n in conn.execute(query).scalars())
        rest = [r for r in ids if r not in done]
        if rest:
            query = sa.select(m.name).where(m.run_id.in_(rest)).distinct()
            names.update(str(n) for n in conn.execute(query).scalars())
    return sorted(names)


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
        frame = to_frame(conn.execute(query).all(), SAMPLE_COLUMNS)
    return frame.astype(_SAMPLE_DTYPES)


def sample_steps(engine: sa.Engine, run_id: int) -> list[int]:
    """The steps at which a run stored rollouts."""
    s = _samples.c
    query = sa.select(s.step).where(s.run_id == int(run_id)).distinct().order_by(s.step)
    with engine.connect() as conn:
        return [int(v) for v in conn.execute(query).scalars()]


SAMPLE_GROUP_COLUMNS = [*SAMPLE_COLUMNS, GROUP, MEMBER, ADVANTAGE]


def sample_groups(engine: sa.Engine, run_id: int, step: int) -> pd.DataFrame:
    """A run's stored rollouts of one step (SAMPLE_GROUP_COLUMNS), with what the trainer keeps
    in `extra` for the group view: `group` (the response's group among the step's generated
    ones), `member` (its place in the group) and `advantage` (NaN when the group was not
    trained that step). Rows written before the trainer recorded these have group and member
    <NA> (nullable integers), and advantage NaN; readers group those by prompt."""
    s = _samples.c
    query = (
        sa.select(*(s[c] for c in SAMPLE_COLUMNS), s.extra)
        .where(s.run_id == int(run_id), s.step == int(step))
        .order_by(s.idx)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    records = []
    for row in rows:
        extra = row.extra if isinstance(row.extra, dict) else {}
        group, member, advantage = extra.get(GROUP), extra.get(MEMBER), extra.get(ADVANTAGE)
        records.append(
            (
                *row[: len(SAMPLE_COLUMNS)],
                None if group is None else int(group),
                None if member is None else int(member),
                float("nan") if advantage is None else float(advantage),
            )
        )
    frame = to_frame(records, SAMPLE_GROUP_COLUMNS)
    return frame.astype(
        {
            **_SAMPLE_DTYPES,
            ADVANTAGE: float,
            GROUP: "Int64",  # nullable: <NA> on rows written before they were recorded
            MEMBER: "Int64",
        }
    )


SWEEP_RUN_COLUMNS = [*RUN_COLUMNS, "sweep_name", "config"]


def sample_tokens(engine: sa.Engine, run_id: int, step: int) -> dict[int, dict[str, Any]]:
    """The per-token records (`tokens` in `extra`: text, p_old, ratio, clip, entropy,
    eligible lists) of a run's stored rollouts at one step, by sample index; rows written
    before the trainer recorded them, and rollouts of groups it did not train, have none."""
    s = _samples.c
    query = sa.select(s.idx, s.extra).where(s.run_id == int(run_id), s.step == int(step))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    out: dict[int, dict[str, Any]] = {}
    for idx, extra in rows:
        tokens = extra.get(TOKENS) if isinstance(extra, dict) else None
        if isinstance(tokens, dict):
            out[int(idx)] = tokens
    return out


def runs_of_sweeps(engine: sa.Engine, sweep_ids: Sequence[int]) -> pd.DataFrame:
    """Every attempt of the runs of several sweeps, by sweep then run id (SWEEP_RUN_COLUMNS:
    RUN_COLUMNS, the sweep's name and the run's config as a dict), for views that put arms
    of several sweeps side by side. A sweep id the store does not hold contributes nothing."""
    ids = [int(s) for s in sweep_ids]
    if not ids:
        return to_frame([], SWEEP_RUN_COLUMNS)
    query = (
        run_select()
        .add_columns(_sweeps.c.name, _runs.c.config)
        .join_from(_runs, _sweeps, _runs.c.sweep_id == _sweeps.c.id)
        .where(_runs.c.sweep_id.in_(ids))
        .order_by(_runs.c.sweep_id, _runs.c.id)
    )
    with engine.connect() as conn:
        return to_frame(conn.execute(query).all(), SWEEP_RUN_COLUMNS)
