"""Deleting a sweep from the store: what it holds, then its rows, in one transaction.

`dapo sweep rm` (flows.sweep_rm) says what a deletion would take before it takes it, from the
same place as the deletion: `sweep_footprint` reads what the sweep holds, `delete_sweep`
deletes the sweep and everything under it and returns that footprint. The run directories on disk are the
command's to remove (they hold checkpoints, which the store only names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from db.models import EVALUATIONS, METRICS, RUN_METRIC_SUMMARIES, RUNS, SAMPLES, SWEEPS
from db.reads import runs_of_sweep, sweep_row

# A sweep with a run in one of these may still be writing: deleting under it would leave a
# driver writing into rows (and a directory) that are gone.
LIVE_STATUSES = frozenset({"running", "pending"})


@dataclass(frozen=True)
class SweepFootprint:
    """What the store holds of one sweep (and the run directories its runs name)."""

    sweep_id: int
    name: str
    status: str
    runs: int
    metrics: int
    evaluations: int
    samples: int
    run_dirs: tuple[str, ...]  # the runs' checkpoint directories, as stored, in run order
    live_runs: tuple[int, ...]  # runs that may still be writing (LIVE_STATUSES, as shown)

    def summary(self) -> str:
        """'sweep 3 'ladder' (completed): 12 runs, 3,450 metric rows, ...' in one line."""
        return (
            f"sweep {self.sweep_id} '{self.name}' ({self.status}): {self.runs} runs, "
            f"{self.metrics:,} metric rows, {self.evaluations:,} evaluations, "
            f"{self.samples:,} samples, {len(self.run_dirs)} run directories"
        )


def _count(conn: sa.Connection, table: sa.Table, run_ids: Sequence[int]) -> int:
    if not run_ids:
        return 0
    query = sa.select(sa.func.count()).select_from(table).where(table.c.run_id.in_(run_ids))
    return int(conn.execute(query).scalar_one())


def sweep_footprint(engine: sa.Engine, sweep_id: int) -> SweepFootprint:
    """What deleting the sweep would delete; NotFound (one line) for an unknown sweep."""
    runs = runs_of_sweep(engine, sweep_id)  # statuses as shown: a dead driver's "interrupted"
    run_ids = [int(r) for r in runs["run_id"]]
    with engine.connect() as conn:
        sweep = sweep_row(conn, engine, sweep_id)
        counts = [_count(conn, table, run_ids) for table in (METRICS, EVALUATIONS, SAMPLES)]
    dirs = [str(d) for d in runs["checkpoint_dir"] if isinstance(d, str) and d]
    live = [int(r.run_id) for r in runs.itertuples() if str(r.status) in LIVE_STATUSES]
    return SweepFootprint(
        sweep_id=int(sweep_id),
        name=str(sweep.name),
        status=str(sweep.status),
        runs=len(run_ids),
        metrics=counts[0],
        evaluations=counts[1],
        samples=counts[2],
        run_dirs=tuple(dict.fromkeys(dirs)),  # attempts that resumed share a directory
        live_runs=tuple(live),
    )


def delete_sweep(engine: sa.Engine, sweep_id: int) -> SweepFootprint:
    """Delete the sweep, its runs and everything they logged, in one transaction, and return
    what was deleted. Children first, explicitly: the schema cascades, but SQLite enforces it
    only on connections that turned foreign keys on, and a count must not depend on that."""
    footprint = sweep_footprint(engine, sweep_id)
    with engine.begin() as conn:
        run_ids = sa.select(RUNS.c.id).where(RUNS.c.sweep_id == int(sweep_id))
        for table in (METRICS, EVALUATIONS, SAMPLES, RUN_METRIC_SUMMARIES):
            conn.execute(sa.delete(table).where(table.c.run_id.in_(run_ids)))
        conn.execute(sa.delete(RUNS).where(RUNS.c.sweep_id == int(sweep_id)))
        conn.execute(sa.delete(SWEEPS).where(SWEEPS.c.id == int(sweep_id)))
    return footprint
