"""Per-run metric summaries: what a full scan of a run's metric rows gives, kept once it ends.

A run's metric rows never change once it has ended, yet the read side used to scan them on
every page load: the names a sweep's runs logged (a DISTINCT over every row of 18 runs) and the
mechanism table's first- and last-window means (an aggregate over the same rows). At 10M rows
that is what grows with the store. `run_metric_summaries` (db.models.RunMetricSummary) keeps,
per (run, metric), exactly those aggregates, computed by the same SQL the readers ran:

    bounds  = the run's first and last step over every name (the windows' ends)
    head    = avg(value) over steps <= first + W - 1;  tail = avg(value) over steps >= last - W + 1
    (W = SUMMARY_WINDOW; NULL, a NaN/inf value, is left out of the mean, as SQL's avg does)

Written by db.store.Store when an attempt takes a terminal status (end_attempt, update_run),
deleted when it goes back to running; backfilled for older stores by migration 0005. Readers
use a summary only for a run whose stored status is terminal and fall back to the rows for
the others (a run still training, one whose summary write was lost to an outage): a summary is
a cache, never the only copy of a number.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from db.models import METRICS, RUN_METRIC_SUMMARIES, RUNS, SUMMARY_WINDOW, TERMINAL_STATUSES

SUMMARY_COLUMNS = (
    "run_id",
    "name",
    "n_rows",
    "n_values",
    "min_step",
    "max_step",
    "min_value",
    "max_value",
    "run_first_step",
    "run_last_step",
    "window",
    "head_mean",
    "tail_mean",
)


def summary_select(
    metrics: sa.TableClause | sa.Table,
    run_ids: Sequence[int] | None,
    window: int = SUMMARY_WINDOW,
) -> sa.Select[tuple[object, ...]]:
    """The summaries of `run_ids` (None: every run) as a SELECT of SUMMARY_COLUMNS over
    `metrics` (a table argument, so that migration 0005 runs it on its own table object)."""
    m = metrics.c
    bounds = sa.select(
        m.run_id, sa.func.min(m.step).label("lo"), sa.func.max(m.step).label("hi")
    ).group_by(m.run_id)
    if run_ids is not None:
        bounds = bounds.where(m.run_id.in_([int(r) for r in run_ids]))
    b = bounds.subquery()
    query = (
        sa.select(
            m.run_id,
            m.name,
            sa.func.count().label("n_rows"),
            sa.func.count(m.value).label("n_values"),
            sa.func.min(m.step).label("min_step"),
            sa.func.max(m.step).label("max_step"),
            sa.func.min(m.value).label("min_value"),
            sa.func.max(m.value).label("max_value"),
            b.c.lo.label("run_first_step"),
            b.c.hi.label("run_last_step"),
            sa.literal(int(window), sa.Integer).label("window"),
            sa.func.avg(sa.case((m.step <= b.c.lo + (window - 1), m.value))).label("head_mean"),
            sa.func.avg(sa.case((m.step >= b.c.hi - (window - 1), m.value))).label("tail_mean"),
        )
        .join_from(metrics, b, m.run_id == b.c.run_id)
        .group_by(m.run_id, m.name, b.c.lo, b.c.hi)
    )
    if run_ids is not None:
        query = query.where(m.run_id.in_([int(r) for r in run_ids]))
    return query


def write_summaries(conn: sa.Connection, run_ids: Sequence[int]) -> None:
    """(Re)write the summaries of `run_ids` from their metric rows, in the caller's
    transaction."""
    ids = [int(r) for r in run_ids]
    if not ids:
        return
    s = RUN_METRIC_SUMMARIES
    conn.execute(sa.delete(s).where(s.c.run_id.in_(ids)))
    conn.execute(sa.insert(s).from_select(list(SUMMARY_COLUMNS), summary_select(METRICS, ids)))


def drop_summaries(conn: sa.Connection, run_ids: Sequence[int]) -> None:
    """Forget the summaries of runs whose rows may change again (back to running)."""
    ids = [int(r) for r in run_ids]
    if ids:
        s = RUN_METRIC_SUMMARIES
        conn.execute(sa.delete(s).where(s.c.run_id.in_(ids)))


def summarized(conn: sa.Connection, run_ids: Sequence[int]) -> set[int]:
    """Those of `run_ids` whose summary may stand for their rows: they have one and their stored
    status is terminal (a summary row exists for every name such a run logged, or none)."""
    ids = [int(r) for r in run_ids]
    if not ids:
        return set()
    s, r = RUN_METRIC_SUMMARIES.c, RUNS.c
    query = (
        sa.select(s.run_id)
        .distinct()
        .join_from(RUN_METRIC_SUMMARIES, RUNS, s.run_id == r.id)
        .where(s.run_id.in_(ids), r.status.in_(TERMINAL_STATUSES))
    )
    return {int(v) for v in conn.execute(query).scalars()}
