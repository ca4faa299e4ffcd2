"""Store: the write side of the experiment store (sweeps, run attempts, metric sinks).

flows/ creates a sweep, starts one run row per attempt of an (arm, seed), hands the trainer a
`sink(run_id)`, and marks the run done. Every method is one short transaction, retried on
lock or serialization errors, so many workers (processes, Ray actors on other machines) can
share one store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from db import engine as db_engine
from db.errors import NotFound
from db.models import (
    EVALUATIONS,
    METRICS,
    RUN_STATUSES,
    RUNS,
    SAMPLES,
    SWEEP_STATUSES,
    SWEEPS,
    TERMINAL_STATUSES,
    utcnow,
)
from db.sink import SqlSink, jsonable, text, upsert
from db.transactions import retrying, write_transaction

# Fields update_run accepts, with the type each is stored as.
RUN_FIELDS: dict[str, type] = {
    "status": str,
    "error": str,
    "steps": int,
    "grad_updates": int,
    "tokens": int,
    "wall_s": float,
    "checkpoint_dir": str,
    "flow_run_id": str,
    "host": str,
}


def row_dict(row: Any, table: sa.Table, id_name: str) -> dict[str, Any]:
    """A row as a plain dict, its primary key under both "id" and `id_name`."""
    out = {column.name: getattr(row, column.name) for column in table.columns}
    out[id_name] = out["id"]
    return out


def _unique_violation(error: sa.exc.IntegrityError) -> bool:
    orig = getattr(error, "orig", None)
    if getattr(orig, "sqlstate", None) == "23505":
        return True
    return "unique constraint failed" in str(orig).lower()


class Store:
    """The store at `url` (default: $DAPO_DB_URL, else the local SQLite file)."""

    def __init__(self, url: str | None = None) -> None:
        self.url = db_engine.resolve_url(url)
        self.engine = db_engine.get_engine(self.url)
        self.where = db_engine.safe_url(self.url)

    def __repr__(self) -> str:
        return f"Store({self.where!r})"

    # --- sweeps --------------------------------------------------------------------------

    def create_sweep(
        self,
        *,
        name: str,
        preset: str,
        arms: Sequence[str],
        seeds: Sequence[int],
        base_config: Mapping[str, Any],
        ladder: Sequence[Mapping[str, Any]],
        flow_run_id: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> int:
        """A new sweep (status "pending"); returns its id. `ladder` rows are
        {"arm", "adds", "paper_score"} in ladder order."""
        arms = [str(a) for a in arms]
        if not arms or len(set(arms)) != len(arms):
            raise ValueError(f"a sweep needs distinct arms, got {arms}")
        seeds = [int(s) for s in seeds]
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"a sweep needs distinct seeds, got {seeds}")
        rungs = []
        for rung in ladder:
            if not rung.get("arm"):
                raise ValueError(f"every ladder entry needs an 'arm', got {dict(rung)}")
            rungs.append(
                {
                    "arm": str(rung["arm"]),
                    "adds": rung.get("adds"),
                    "paper_score": rung.get("paper_score"),
                }
            )
        now = utcnow()
        values = {
            "name": str(name),
            "preset": str(preset),
            "status": "pending",
            "arms": arms,
            "seeds": seeds,
            "ladder": jsonable(rungs),
            "base_config": jsonable(dict(base_config)),
            "params": None if params is None else jsonable(dict(params)),
            "flow_run_id": flow_run_id,
            "created_at": now,
            "updated_at": now,
        }

        def work() -> int:
            with write_transaction(self.engine) as conn:
                result = conn.execute(sa.insert(SWEEPS).values(**values))
                return int(result.inserted_primary_key[0])  # type: ignore[index]

        return retrying(work)

    def set_sweep_status(self, sweep_id: int, status: str, *, error: str | None = None) -> None:
        """pending | running | completed | failed | cancelled; a terminal one stamps finished_at."""
        if status not in SWEEP_STATUSES:
            raise ValueError(
                f"sweep status must be one of {', '.join(SWEEP_STATUSES)}, got {status!r}"
            )
        now = utcnow()
        values: dict[str, Any] = {"status": status, "updated_at": now, "error": text(error)}
        values["finished_at"] = now if status in TERMINAL_STATUSES else None
        self._update(SWEEPS, sweep_id, values, "sweep")

    def set_sweep_flow_run(self, sweep_id: int, flow_run_id: str) -> None:
        values = {"flow_run_id": str(flow_run_id), "updated_at": utcnow()}
        self._update(SWEEPS, sweep_id, values, "sweep")

    def get_sweep(self, sweep_id: int) -> dict[str, Any]:
        """The sweep as a dict (id/sweep_id, name, preset, status, arms, seeds, ladder, ...)."""
        table = SWEEPS
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(table).where(table.c.id == int(sweep_id))).first()
        if row is None:
            raise NotFound(f"no sweep with id {sweep_id} in {self.where}")
        return row_dict(row, table, "sweep_id")

    # --- runs ----------------------------------------------------------------------------

    def start_run(
        self,
        *,
        sweep_id: int,
        arm: str,
        seed: int,
        config: Mapping[str, Any],
        config_hash: str,
        host: str,
        flow_run_id: str | None = None,
        checkpoint_dir: str | None = None,
    ) -> int:
        """A new attempt of (sweep, arm, seed), status "running"; returns the run id.

        attempt = the number of earlier attempts + 1; two workers starting the same arm at once
        get consecutive attempts (the unique key decides, the loser retries).
        """
        runs = RUNS
        now = utcnow()
        values = {
            "sweep_id": int(sweep_id),
            "arm": str(arm),
            "seed": int(seed),
            "status": "running",
            "config": jsonable(dict(config)),
            "config_hash": str(config_hash),
            "host": host,
            "flow_run_id": flow_run_id,
            "checkpoint_dir": checkpoint_dir,
            "started_at": now,
            "updated_at": now,
        }

        def work() -> int:
            with write_transaction(self.engine) as conn:
                sweeps = SWEEPS
                if (
                    conn.execute(sa.select(sweeps.c.id).where(sweeps.c.id == int(sweep_id))).first()
                    is None
                ):
                    raise NotFound(f"no sweep with id {sweep_id} in {self.where}")
                last = conn.execute(
                    sa.select(sa.func.max(runs.c.attempt)).where(
                        runs.c.sweep_id == int(sweep_id),
                        runs.c.arm == str(arm),
                        runs.c.seed == int(seed),
                    )
                ).scalar()
                result = conn.execute(sa.insert(runs).values(**values, attempt=int(last or 0) + 1))
                return int(result.inserted_primary_key[0])  # type: ignore[index]

        for _ in range(20):
            try:
                return retrying(work)
            except sa.exc.IntegrityError as error:
                if not _unique_violation(error):
                    raise
        raise RuntimeError(f"could not number a new attempt of {arm}/seed {seed} (contention)")

    def update_run(self, run_id: int, **fields: Any) -> None:
        """Set some of: status, error, steps, grad_updates, tokens, wall_s, checkpoint_dir,
        flow_run_id, host. A terminal status (completed, failed, cancelled) stamps finished_at;
        "running" clears it."""
        unknown = sorted(set(fields) - set(RUN_FIELDS))
        if unknown:
            raise ValueError(
                f"update_run: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(RUN_FIELDS)}"
            )
        values: dict[str, Any] = {}
        for name, value in fields.items():
            if value is None:
                values[name] = None
            elif RUN_FIELDS[name] is str:
                values[name] = text(value)
            else:
                values[name] = RUN_FIELDS[name](value)
        status = values.get("status", "unchanged")
        if "status" in fields:
            if status not in RUN_STATUSES:
                raise ValueError(
                    f"run status must be one of {', '.join(RUN_STATUSES)}, got {status!r}"
                )
            values["finished_at"] = utcnow() if status in TERMINAL_STATUSES else None
        values["updated_at"] = utcnow()
        self._update(RUNS, run_id, values, "run")

    def get_run(self, run_id: int) -> dict[str, Any]:
        """The run as a dict (id/run_id, sweep_id, arm, seed, attempt, status, config, ...)."""
        table = RUNS
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(table).where(table.c.id == int(run_id))).first()
        if row is None:
            raise NotFound(f"no run with id {run_id} in {self.where}")
        return row_dict(row, table, "run_id")

    def completed_run(self, sweep_id: int, arm: str, seed: int, config_hash: str) -> int | None:
        """The latest completed attempt of (sweep, arm, seed) with this config hash, if any
        (an arm already done is skipped unless the user forces a rerun)."""
        runs = RUNS
        query = (
            sa.select(runs.c.id)
            .where(
                runs.c.sweep_id == int(sweep_id),
                runs.c.arm == str(arm),
                runs.c.seed == int(seed),
                runs.c.config_hash == str(config_hash),
                runs.c.status == "completed",
            )
            .order_by(runs.c.attempt.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            found = conn.execute(query).scalar()
        return None if found is None else int(found)

    def latest_attempt(self, sweep_id: int, arm: str, seed: int) -> dict[str, Any] | None:
        """The newest attempt of (sweep, arm, seed) as a dict, whatever its status."""
        runs = RUNS
        query = (
            sa.select(runs)
            .where(
                runs.c.sweep_id == int(sweep_id), runs.c.arm == str(arm), runs.c.seed == int(seed)
            )
            .order_by(runs.c.attempt.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else row_dict(row, runs, "run_id")

    def copy_history(self, from_run: int, to_run: int, up_to_step: int) -> None:
        """Copy metrics, samples and evaluations with step <= up_to_step from one attempt to
        another (a rerun resuming an older attempt's checkpoint keeps the whole curve). Rows
        the target already has are kept: its own numbers win."""
        self.get_run(from_run)
        self.get_run(to_run)
        up_to, source, target = int(up_to_step), int(from_run), int(to_run)

        def copy(conn: sa.Connection, table: sa.Table, keys: list[str]) -> None:
            columns = [c.name for c in table.columns]
            picked = [
                sa.literal(target, sa.Integer).label("run_id") if c == "run_id" else table.c[c]
                for c in columns
            ]
            query = sa.select(*picked).where(table.c.run_id == source, table.c.step <= up_to)
            stmt = upsert(self.engine, table).from_select(columns, query)
            conn.execute(stmt.on_conflict_do_nothing(index_elements=keys))

        def work() -> None:
            with write_transaction(self.engine) as conn:
                copy(conn, METRICS, ["run_id", "name", "step"])
                copy(conn, EVALUATIONS, ["run_id", "dataset", "k", "step"])
                copy(conn, SAMPLES, ["run_id", "step", "idx"])

        retrying(work)

    def sink(self, run_id: int) -> SqlSink:
        """The metrics sink of one run (see db.sink.SqlSink)."""
        self.get_run(run_id)
        return SqlSink(self.engine, int(run_id))

    # --- helpers -------------------------------------------------------------------------

    def _update(self, table: sa.Table, row_id: int, values: dict[str, Any], what: str) -> None:
        def work() -> int:
            with write_transaction(self.engine) as conn:
                result = conn.execute(
                    sa.update(table).where(table.c.id == int(row_id)).values(**values)
                )
                return int(result.rowcount)

        if retrying(work) == 0:
            raise NotFound(f"no {what} with id {row_id} in {self.where}")
