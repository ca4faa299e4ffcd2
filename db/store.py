"""Store: the write side of the experiment store (sweeps, run attempts, metric sinks).

flows/ creates a sweep, starts one run row per attempt of an (arm, seed), hands the trainer a
`sink(run_id)`, and marks the run done. Every method is one short transaction, retried on
lock or serialization errors, so many workers (processes, Ray actors on other machines) can
share one store; an outage of the store (a server restart, a dropped network) is waited out
for up to `outage_s` seconds (db.transactions.OUTAGE_S, or $DAPO_STORE_OUTAGE_S), after which
the call fails with one line naming the store (db.errors.StoreUnavailable).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa

from dapo_common.util import first_line
from db import engine as db_engine
from db import summaries
from db.errors import NotFound, StoreUnavailable
from db.looks import is_adaptive
from db.models import (
    EVALUATIONS,
    METRICS,
    RUN_LEASE_S,
    RUN_STATUSES,
    RUNS,
    SAMPLES,
    STORE_IDENTITY,
    SUPERSEDED,
    SWEEP_STATUSES,
    SWEEPS,
    TERMINAL_STATUSES,
    fold_status,
    utcnow,
)
from db.sink import SqlSink, jsonable, text, upsert
from db.transactions import is_outage, outage_budget, retrying, write_transaction

T = TypeVar("T")

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
    "tries": int,
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


def sweep_status_of(
    cells: Mapping[tuple[str, int], str | None],
) -> tuple[str, str | None]:
    """A sweep's status from the status of the newest attempt of each of its (arm, seed)
    (None: never attempted), and a one-line error for a failed or cancelled sweep.

    Anything running → running; all completed → completed; else failed, cancelled, or (some
    never attempted, nothing running, nothing failed) pending.
    """
    status = fold_status(list(cells.values()))
    if status not in ("failed", "cancelled"):
        return status, None
    bad = sorted(f"{arm} s{seed}" for (arm, seed), s in cells.items() if s == status)
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return status, f"{len(bad)} of {len(cells)} arm runs {status}: {', '.join(bad[:3])}{more}"


def _run_values(caller: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """update_run's fields as column values (typed; a terminal status stamps finished_at and
    releases the lease), with updated_at (the heartbeat) set to now."""
    unknown = sorted(set(fields) - set(RUN_FIELDS))
    if unknown:
        raise ValueError(
            f"{caller}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(RUN_FIELDS)}"
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
            raise ValueError(f"run status must be one of {', '.join(RUN_STATUSES)}, got {status!r}")
        values["finished_at"] = utcnow() if status in TERMINAL_STATUSES else None
        if status in TERMINAL_STATUSES:
            values.update(_RELEASED)  # an attempt that ended holds no lease
        if status == "completed" and "error" not in fields:
            # A try lost on the way (ActorLost, then a retry that finished) left its line
            # in `error`; a completed run shows none.
            values["error"] = None
    values["updated_at"] = utcnow()
    return values


def _missing(conn: sa.Connection, run_id: int) -> bool:
    """Whether runs has no row `run_id` (an UPDATE that matched nothing: gone, or fenced off)."""
    return conn.execute(sa.select(RUNS.c.id).where(RUNS.c.id == int(run_id))).first() is None


# --- the lease on an attempt ----------------------------------------------------------------
# One process trains an attempt of (sweep, arm, seed) at a time: the one that claimed it
# (Store.resume_attempt), recorded on the attempt's row as its lease (host, pid, since). Its
# heartbeat is the row's updated_at, written every flows.arm.WALL_EVERY_S while it trains (the
# same clock the read side uses to show a dead driver as "interrupted"). A lease is free once
# the attempt ends (any terminal status clears it), once its heartbeat is older than
# RUN_LEASE_S, or once its process is gone from this very machine (a SIGKILLed `dapo arm` or
# served flow run: no need to wait ten minutes when the pid says so).


@dataclass(frozen=True)
class Holder:
    """A process that may hold a lease: the host it runs on and its pid."""

    host: str
    pid: int

    @classmethod
    def here(cls) -> Holder:
        return cls(socket.gethostname(), os.getpid())


@dataclass(frozen=True)
class Lease:
    """A live lease on the newest attempt of an (arm, seed): who holds it and since when."""

    run_id: int
    attempt: int
    host: str
    pid: int | None
    since: datetime
    beat: datetime  # the holder's last heartbeat (the row's updated_at)

    def line(self, label: str) -> str:
        """One line saying who holds it (a second command's answer)."""
        age = max(0.0, (utcnow() - self.beat).total_seconds())
        pid = f" pid {self.pid}" if self.pid is not None else ""
        return (
            f"{label} is held by run {self.run_id} (attempt {self.attempt}): {self.host}{pid} "
            f"since {self.since:%Y-%m-%d %H:%M:%S} UTC, heartbeat {age:.0f} s ago; wait for it "
            f"or cancel it (a lease without a heartbeat for {RUN_LEASE_S:g} s is taken over)"
        )


class RunHeld(ValueError):
    """Another live process holds the arm's newest attempt (a user's mistake: one line, exit
    2). `lease` says who."""

    def __init__(self, message: str, lease: Lease) -> None:
        super().__init__(message)
        self.lease = lease


class AttemptChanged(ValueError):
    """The newest attempt is no longer the one a plan was made on (another command started or
    ended one meanwhile): plan again."""


@dataclass(frozen=True)
class Attempt:
    """What Store.resume_attempt claimed: a new attempt, held by the caller, and what it
    continues (the older attempt it resumed or took over, its wall time and tries)."""

    run_id: int
    attempt: int
    checkpoint_dir: str
    superseded: int | None
    wall_s: float | None
    tries: int | None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def live_lease(row: Any, now: datetime, holder: Holder | None = None) -> Lease | None:
    """The lease on a runs row when it is live (held, beating, its process not known to be
    gone), else None: the row may be taken over. `holder` is this process (default: here)."""
    if row is None or row.status != "running" or row.lease_at is None:
        return None
    if row.updated_at < now - timedelta(seconds=RUN_LEASE_S):
        return None  # stale: its driver stopped beating
    here = holder or Holder.here()
    same_host = row.lease_host == here.host and row.lease_pid not in (None, here.pid)
    if same_host and not _pid_alive(int(row.lease_pid)):
        return None  # its process is gone from this machine
    return Lease(
        run_id=int(row.id),
        attempt=int(row.attempt),
        host=str(row.lease_host),
        pid=None if row.lease_pid is None else int(row.lease_pid),
        since=row.lease_at,
        beat=row.updated_at,
    )


class _Raced(Exception):
    """The older attempt changed between the claim's read and its takeover (retried)."""


# The values that release a lease (an attempt that ends holds nothing).
_RELEASED = {"lease_host": None, "lease_pid": None, "lease_at": None}


class Store:
    """The store at `url` (default: $DAPO_DB_URL, else the local SQLite file).

    `outage_s`: how long a call waits out an unreachable store before it fails (default
    $DAPO_STORE_OUTAGE_S, else db.transactions.OUTAGE_S). `open_wait_s`: how long opening it
    waits (default: `outage_s`; 0 for commands a user is watching).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        outage_s: float | None = None,
        open_wait_s: float | None = None,
    ) -> None:
        self.url = db_engine.resolve_url(url)
        self.outage_s = outage_budget() if outage_s is None else float(outage_s)
        # Opening waits out an outage like every write does (default: the outage budget), so a
        # restarted actor opens its store; a command a user is watching passes open_wait_s=0,
        # because before its first row exists a mistyped or stopped store is a user's mistake.
        wait = self.outage_s if open_wait_s is None else float(open_wait_s)
        self.engine = db_engine.get_engine(self.url, outage_s=wait)
        self.where = db_engine.safe_url(self.url)
        self._store_id: str | None = None

    def __repr__(self) -> str:
        return f"Store({self.where!r})"

    def _retry(self, work: Callable[[], T], *, outage_s: float | None = None) -> T:
        """retrying() with this store's outage budget; an outage that outlasts it is one line."""
        budget = self.outage_s if outage_s is None else outage_s
        try:
            return retrying(work, outage_s=budget)
        except sa.exc.DBAPIError as error:
            if not is_outage(error):
                raise
            orig = getattr(error, "orig", None) or error
            raise StoreUnavailable(
                f"the store {self.where} is unreachable (waited {budget:g} s): {first_line(orig)}"
            ) from error

    def _read(self, query: Callable[[sa.Connection], T]) -> T:
        def work() -> T:
            with self.engine.connect() as conn:
                return query(conn)

        return self._retry(work)

    @property
    def store_id(self) -> str:
        """The store's own id, a UUID drawn when it was created (it names run directories)."""
        if self._store_id is None:
            found = self._read(
                lambda conn: conn.execute(
                    sa.select(STORE_IDENTITY.c.store_id).where(STORE_IDENTITY.c.id == 1)
                ).scalar()
            )
            if not found:
                raise RuntimeError(f"the store {self.where} has no store id: run `dapo db upgrade`")
            self._store_id = str(found)
        return self._store_id

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
            # parent: what the table's delta compares against; grid: the swept values of a
            # grid arm (the dashboard plots a metric against them).
            rungs.append(
                {
                    "arm": str(rung["arm"]),
                    "adds": rung.get("adds"),
                    "paper_score": rung.get("paper_score"),
                    "parent": rung.get("parent"),
                    "grid": rung.get("grid") or None,
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

        # Not retried through an outage: an INSERT whose COMMIT was lost would be a second
        # sweep, and the user who asked for one is there to try again.
        return self._retry(work, outage_s=0.0)

    def extend_sweep(
        self,
        sweep_id: int,
        *,
        arms: Sequence[str],
        seeds: Sequence[int],
        params: Mapping[str, Any] | None,
    ) -> None:
        """Widen a sweep's definition (an explicit `--extend`): its arms, seeds and stored
        parameters become these; arms and seeds may only be added, never dropped."""
        sweep = self.get_sweep(sweep_id)
        arms, seeds = [str(a) for a in arms], [int(s) for s in seeds]
        dropped = [a for a in sweep["arms"] if a not in arms] + [
            str(s) for s in sweep["seeds"] if s not in seeds
        ]
        if dropped:
            raise ValueError(f"extending sweep {sweep_id} cannot drop {', '.join(dropped)}")
        values = {
            "arms": arms,
            "seeds": seeds,
            "params": None if params is None else jsonable(dict(params)),
            "updated_at": utcnow(),
        }
        self._update(SWEEPS, sweep_id, values, "sweep")

    def refresh_sweep_status(self, sweep_id: int) -> str:
        """Recompute a sweep's status from the newest attempt of each of its (arm, seed) (see
        sweep_status_of), store it and return it. An arm that finishes outside its sweep's
        own flow run (`dapo arm`, a rerun) calls this, so a sweep whose driver died does not
        stay "running" once its arms are done."""
        runs = RUNS

        def work() -> str:
            with write_transaction(self.engine) as conn:
                sweep = conn.execute(
                    sa.select(
                        SWEEPS.c.arms, SWEEPS.c.seeds, SWEEPS.c.status, SWEEPS.c.params
                    ).where(SWEEPS.c.id == int(sweep_id))
                ).first()
                if sweep is None:
                    raise NotFound(f"no sweep with id {sweep_id} in {self.where}")
                rows = conn.execute(
                    sa.select(runs.c.arm, runs.c.seed, runs.c.status)
                    .where(runs.c.sweep_id == int(sweep_id))
                    .order_by(runs.c.attempt)
                ).all()
                newest = {(str(arm), int(seed)): str(status) for arm, seed, status in rows}
                cells = {
                    (str(arm), int(seed)): newest.get((str(arm), int(seed)))
                    for arm in sweep.arms
                    for seed in sweep.seeds
                }
                if is_adaptive(sweep.params):  # its arms stop at their own seed counts
                    cells = {cell: status for cell, status in cells.items() if status}
                status, error = sweep_status_of(cells)
                if status != sweep.status:
                    now = utcnow()
                    conn.execute(
                        sa.update(SWEEPS)
                        .where(SWEEPS.c.id == int(sweep_id))
                        .values(
                            status=status,
                            error=error,
                            updated_at=now,
                            finished_at=now if status in TERMINAL_STATUSES else None,
                        )
                    )
                return status

        return self._retry(work)

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
        return self._get(SWEEPS, sweep_id, "sweep")

    # --- runs ----------------------------------------------------------------------------

    def update_run(self, run_id: int, *, outage_s: float | None = None, **fields: Any) -> None:
        """Set some of: status, error, steps, grad_updates, tokens, wall_s, tries,
        checkpoint_dir, flow_run_id, host. A terminal status (completed, failed, cancelled)
        stamps finished_at and releases the attempt's lease; "running" clears finished_at;
        "completed" clears the error unless one is given. `outage_s`: this call's outage
        budget."""
        self._update(RUNS, run_id, _run_values("update_run", fields), "run", outage_s=outage_s)
        if "status" in fields:
            self._summarize(run_id, str(fields["status"]))

    def end_attempt(
        self, run_id: int, status: str, *, outage_s: float | None = None, **fields: Any
    ) -> bool:
        """End the attempt this process holds: a terminal `status` with some of update_run's
        fields, its lease released. Returns False, writing nothing, when a newer attempt took
        it over meanwhile (the row then keeps the record of that takeover)."""
        if status not in TERMINAL_STATUSES:
            raise ValueError(
                f"end_attempt: {status!r} is not one of {', '.join(TERMINAL_STATUSES)}"
            )
        values = _run_values("end_attempt", {**fields, "status": status})

        ended = self._update_current(run_id, values, outage_s=outage_s)
        if ended:
            self._summarize(run_id, status)
        return ended

    def _summarize(self, run_id: int, status: str) -> None:
        """After a status write: an ended run's metric summaries (db.summaries) are written
        from its rows, a running one's dropped (its rows may change again). A summary is a
        cache the readers fall back from, so an outage here is not the caller's failure and is
        not waited out (the status write before it already was): the run has ended either
        way, and its rows are read until a later status write."""

        def work() -> None:
            with write_transaction(self.engine) as conn:
                if status in TERMINAL_STATUSES:
                    summaries.write_summaries(conn, [int(run_id)])
                else:
                    summaries.drop_summaries(conn, [int(run_id)])

        with contextlib.suppress(StoreUnavailable):
            self._retry(work, outage_s=0.0)

    def begin_try(self, run_id: int) -> float:
        """Count one more try of an attempt (an actor that trains it); returns the wall time
        of its earlier tries, which this try's time is added to (see set_wall)."""

        def work() -> float:
            with write_transaction(self.engine) as conn:
                row = conn.execute(
                    sa.select(RUNS.c.wall_s, RUNS.c.tries).where(RUNS.c.id == int(run_id))
                ).first()
                if row is None:
                    raise NotFound(f"no run with id {run_id} in {self.where}")
                conn.execute(
                    sa.update(RUNS)
                    .where(RUNS.c.id == int(run_id))
                    .values(tries=int(row.tries or 0) + 1, updated_at=utcnow())
                )
                return float(row.wall_s or 0.0)

        return self._retry(work)

    def set_wall(self, run_id: int, seconds: float, *, outage_s: float | None = None) -> bool:
        """The attempt's wall time so far (its earlier tries plus the current one), written
        with its heartbeat (updated_at). Returns False, writing nothing, when a newer attempt
        has taken the run over (its lease went stale and another process claimed the arm):
        the caller no longer holds it and must stop training."""
        values = {"wall_s": float(seconds), "updated_at": utcnow()}

        return self._update_current(run_id, values, outage_s=outage_s)

    def _update_current(
        self, run_id: int, values: dict[str, Any], *, outage_s: float | None = None
    ) -> bool:
        """Write `values` on the attempt unless a newer attempt has taken it over (fenced by
        superseded_by); False when it has. A run id the store does not hold is NotFound."""

        def work() -> int:
            with write_transaction(self.engine) as conn:
                result = conn.execute(
                    sa.update(RUNS)
                    .where(RUNS.c.id == int(run_id), RUNS.c.superseded_by.is_(None))
                    .values(**values)
                )
                if result.rowcount == 0 and _missing(conn, run_id):
                    raise NotFound(f"no run with id {run_id} in {self.where}")
                return int(result.rowcount)

        return self._retry(work, outage_s=outage_s) > 0

    def get_run(self, run_id: int) -> dict[str, Any]:
        """The run as a dict (id/run_id, sweep_id, arm, seed, attempt, status, config, ...)."""
        return self._get(RUNS, run_id, "run")

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
        found = self._read(lambda conn: conn.execute(query).scalar())
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
        row = self._read(lambda conn: conn.execute(query).first())
        return None if row is None else row_dict(row, runs, "run_id")

    def lease_of(self, sweep_id: int, arm: str, seed: int) -> Lease | None:
        """The live lease on the newest attempt of (sweep, arm, seed), or None when it is free
        (see live_lease): what a second command asks before anything is written."""
        row = self._read(lambda conn: conn.execute(self._newest(sweep_id, arm, seed)).first())
        return live_lease(row, utcnow())

    def resume_attempt(
        self,
        *,
        sweep_id: int,
        arm: str,
        seed: int,
        config: Mapping[str, Any],
        config_hash: str,
        after: int | None,
        resume_step: int | None,
        checkpoint_dir: str | Callable[[int], str],
        flow_run_id: str | None = None,
        label: str | None = None,
        holder: Holder | None = None,
    ) -> Attempt:
        """Claim (sweep, arm, seed) for this process and open its new attempt, in one
        transaction: the lease check, the new attempt (status running, its lease held by
        `holder`, default this process), the older attempt taken over, and what the new one
        carries on from it.

        `after` is the run id of the newest attempt the caller planned on (None: none yet).
        With `resume_step`, the new attempt resumes that attempt from its checkpoint at this
        step: its curve up to the step is copied in, its wall time and tries carried on, and
        it is marked superseded. Without, the new attempt starts over (an older one still
        "running" is superseded). `checkpoint_dir` is the new attempt's run directory, or a
        function of its run id.

        Raises RunHeld (one line naming the holder) when a live process holds the newest
        attempt, AttemptChanged when the newest attempt is no longer `after`. Atomic on both
        backends: the new attempt's number is unique per (sweep, arm, seed), so of two claims
        at once one fails on the key and, read again, finds the other's lease; the older
        attempt is taken over by a conditional UPDATE on its heartbeat, so a holder that beat
        since it was read (alive after all) keeps it.
        """
        me = holder or Holder.here()
        what = f"{label or f'{arm} s{seed}'} of sweep {sweep_id}"
        runs = RUNS

        def work() -> Attempt:
            now = utcnow()
            with write_transaction(self.engine) as conn:
                if (
                    conn.execute(sa.select(SWEEPS.c.id).where(SWEEPS.c.id == int(sweep_id))).first()
                    is None
                ):
                    raise NotFound(f"no sweep with id {sweep_id} in {self.where}")
                latest = conn.execute(self._newest(sweep_id, arm, seed)).first()
                lease = live_lease(latest, now, me)
                if lease is not None:
                    raise RunHeld(lease.line(what), lease)
                latest_id = None if latest is None else int(latest.id)
                if latest_id != after:
                    raise AttemptChanged(
                        f"{what}: its newest attempt is run {latest_id}, not run {after} (another "
                        "command started or ended one meanwhile): run it again"
                    )
                carried = latest if resume_step is not None else None
                if resume_step is not None and carried is None:
                    raise ValueError(f"{what}: no attempt to resume")
                values = {
                    "sweep_id": int(sweep_id),
                    "arm": str(arm),
                    "seed": int(seed),
                    "attempt": (0 if latest is None else int(latest.attempt)) + 1,
                    "status": "running",
                    "config": jsonable(dict(config)),
                    "config_hash": str(config_hash),
                    "host": me.host,
                    "flow_run_id": flow_run_id,
                    "checkpoint_dir": checkpoint_dir if isinstance(checkpoint_dir, str) else None,
                    # The resumed curve's time so far belongs to this attempt too.
                    "wall_s": None if carried is None else carried.wall_s,
                    "tries": None if carried is None else carried.tries,
                    "lease_host": me.host,
                    "lease_pid": me.pid,
                    "lease_at": now,
                    "started_at": now,
                    "updated_at": now,
                }
                inserted = conn.execute(sa.insert(runs).values(**values))
                run_id = int(inserted.inserted_primary_key[0])  # type: ignore[index]
                out_dir = (
                    checkpoint_dir if isinstance(checkpoint_dir, str) else checkpoint_dir(run_id)
                )
                if not isinstance(checkpoint_dir, str):
                    conn.execute(
                        sa.update(runs).where(runs.c.id == run_id).values(checkpoint_dir=out_dir)
                    )
                taken_over = latest is not None and (
                    carried is not None or latest.status == "running"
                )
                if taken_over:
                    assert latest is not None
                    why = "it resumed this attempt's checkpoint" if carried else "it started over"
                    taken: dict[str, Any] = {"superseded_by": run_id, "updated_at": now}
                    if latest.status == "running":  # its driver died, or stopped beating
                        taken.update(
                            status=SUPERSEDED,
                            error=text(f"superseded by run {run_id}: {why}"),
                            finished_at=now,
                            **_RELEASED,
                        )
                    took = conn.execute(
                        sa.update(runs)
                        .where(runs.c.id == latest_id, runs.c.updated_at == latest.updated_at)
                        .values(**taken)
                    )
                    if took.rowcount != 1:
                        raise _Raced()  # it beat (or ended) since it was read: read it again
                if carried is not None:
                    assert resume_step is not None and latest_id is not None
                    self._copy_history(conn, latest_id, run_id, int(resume_step))
                return Attempt(
                    run_id=run_id,
                    attempt=int(values["attempt"]),
                    checkpoint_dir=out_dir,
                    superseded=latest_id if taken_over else None,
                    wall_s=values["wall_s"],
                    tries=values["tries"],
                )

        for _ in range(20):
            try:
                # Not retried through an outage (see create_sweep): a COMMIT lost on the way
                # would make the retry find its own lease.
                return self._retry(work, outage_s=0.0)
            except sa.exc.IntegrityError as error:
                if not _unique_violation(error):
                    raise
            except _Raced:
                continue
        raise RuntimeError(f"could not claim {what} (contention)")

    def _newest(self, sweep_id: int, arm: str, seed: int) -> sa.Select[Any]:
        """The newest attempt of (sweep, arm, seed), the whole row."""
        return (
            sa.select(RUNS)
            .where(
                RUNS.c.sweep_id == int(sweep_id), RUNS.c.arm == str(arm), RUNS.c.seed == int(seed)
            )
            .order_by(RUNS.c.attempt.desc())
            .limit(1)
        )

    def copy_history(self, from_run: int, to_run: int, up_to_step: int) -> None:
        """Copy metrics, samples and evaluations with step <= up_to_step from one attempt to
        another (a rerun resuming an older attempt's checkpoint keeps the whole curve). Rows
        the target already has are kept: its own numbers win."""
        self.get_run(from_run)
        self.get_run(to_run)

        def work() -> None:
            with write_transaction(self.engine) as conn:
                self._copy_history(conn, int(from_run), int(to_run), int(up_to_step))

        self._retry(work)

    def _copy_history(self, conn: sa.Connection, source: int, target: int, up_to: int) -> None:
        """copy_history inside the caller's transaction."""

        def copy(table: sa.Table, keys: list[str]) -> None:
            columns = [c.name for c in table.columns]
            picked = [
                sa.literal(target, sa.Integer).label("run_id") if c == "run_id" else table.c[c]
                for c in columns
            ]
            query = sa.select(*picked).where(table.c.run_id == source, table.c.step <= up_to)
            stmt = upsert(self.engine, table).from_select(columns, query)
            conn.execute(stmt.on_conflict_do_nothing(index_elements=keys))

        copy(METRICS, ["run_id", "name", "step"])
        copy(EVALUATIONS, ["run_id", "dataset", "k", "step"])
        copy(SAMPLES, ["run_id", "step", "idx"])

    def sink(self, run_id: int, *, spill_dir: str | Path | None = None) -> SqlSink:
        """The metrics sink of one run (see db.sink.SqlSink); `spill_dir` (the run directory)
        is where it keeps the steps an outage holds back once they outgrow its memory."""
        self.get_run(run_id)
        return SqlSink(
            self.engine, int(run_id), where=self.where, spill_dir=spill_dir, outage_s=self.outage_s
        )

    def replay_spill(self, run_id: int, run_dir: str | Path) -> int:
        """Write into the store what an earlier sink of `run_id` left in its spill file under
        `run_dir` (a process that died during an outage); returns the number of writes."""
        with self.sink(run_id, spill_dir=run_dir) as sink:
            return sink.left_behind

    # --- helpers -------------------------------------------------------------------------

    def _get(self, table: sa.Table, row_id: int, what: str) -> dict[str, Any]:
        """Row `row_id` of `table` as row_dict gives it, the key also under `{what}_id`."""
        row = self._read(
            lambda conn: conn.execute(sa.select(table).where(table.c.id == int(row_id))).first()
        )
        if row is None:
            raise NotFound(f"no {what} with id {row_id} in {self.where}")
        return row_dict(row, table, f"{what}_id")

    def _update(
        self,
        table: sa.Table,
        row_id: int,
        values: dict[str, Any],
        what: str,
        *,
        outage_s: float | None = None,
    ) -> None:
        def work() -> int:
            with write_transaction(self.engine) as conn:
                result = conn.execute(
                    sa.update(table).where(table.c.id == int(row_id)).values(**values)
                )
                return int(result.rowcount)

        if self._retry(work, outage_s=outage_s) == 0:
            raise NotFound(f"no {what} with id {row_id} in {self.where}")
