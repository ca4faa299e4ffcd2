"""SqlSink: the trainer's MetricsSink, writing one run's numbers into the store.

It matches dapo_core.train.protocols.MetricsSink structurally (db/ never imports dapo_core):
log_metrics, log_samples, log_evaluation, close. Each call is one transaction, so a step is
either wholly in the store or not at all, and every write is an upsert on the row's meaning
((run, step, name) for metrics, (run, dataset, k, step) for evaluations; a step's samples are
replaced: upserted on (run, step, idx), any rows beyond them dropped), so a step replayed
after a resume, or written by two writers at once, overwrites its earlier values and never
duplicates them.

Store outages. The guarantee: a store that is unreachable for up to OUTAGE_S seconds (5
minutes; $DAPO_STORE_OUTAGE_S sets another budget) loses no step and duplicates none, and
training does not wait for it. While the store is down, each write is checked (a bad metric
name still fails at once) and queued in order: with a run directory, in a spill file there
(`store-spill-run<ID>.jsonl`, one write per line, fsynced) from the first queued write, so that
a process that dies during the outage loses nothing it had queued (memory_writes > 0 keeps that
many in memory first, for callers that accept losing them; without a run directory the queue
is memory only). The sink tries the store again with exponential back-off (0.25 s doubling to
5 s) whenever the trainer calls it, and writes the queue back in order, oldest first, once it
answers; every write being an upsert, a write whose COMMIT was lost in the outage is simply
written again. When the outage outlasts the budget, the next call (at the latest close())
raises StoreUnavailable with one line naming the store, and the spill file keeps every write
not yet in the store: a later sink of the same run (a retried actor, or the next attempt's
Store.replay_spill) writes it back first. The first failure and the recovery are each said in
one line (stderr, or the `say` given).

Hangs. A store can stop answering without refusing (a half-open TCP connection, a proxy that
accepts and never forwards, a SQLite lock held for minutes). Every write runs on the sink's own
writer thread and the trainer waits for it at most WRITE_WAIT_S: a write still running then is
left to finish on its own while the trainer goes on, and counts as an outage (its write stays
queued, and is not sent again while it runs). A write running for HANG_S is taken for a dead
connection: its socket is shut (PostgreSQL) so that the next try opens a fresh one; a SQLite
writer waits at most HANG_S for the lock. The budget runs through a hang as through a refusal.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import os
import queue
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from dapo_common.samples import SAMPLE_FIELDS
from dapo_common.util import first_line
from db.errors import StoreUnavailable
from db.models import EVALUATION_FIELDS, EVALUATIONS, METRICS, SAMPLES, utcnow
from db.transactions import (
    WRITE_OPTION,
    is_outage,
    is_transient,
    outage_budget,
    outage_wait,
    retrying,
)

MAX_NAME = 200  # metrics.name and evaluations.dataset are VARCHAR(200)
METRIC_COLUMNS = ("run_id", "step", "name", "value")
# PostgreSQL: the whole step as one statement over two arrays, so the server parses and plans
# one INSERT per step rather than one per metric.
_PG_METRICS = (
    "INSERT INTO metrics (run_id, step, name, value) "
    "SELECT %(run_id)s, %(step)s, u.name, u.value "
    "FROM unnest(%(names)s::varchar[], %(values)s::float8[]) AS u(name, value) "
    "ON CONFLICT (run_id, step, name) DO UPDATE SET value = EXCLUDED.value"
)
# Writes held in memory during an outage before they go to the spill file: none, so that what
# is queued outlives the process (an actor killed mid-outage used to take 256 writes with it).
MEMORY_WRITES = 0
# The longest a trainer's call waits for one write; past it the write finishes (or not) on the
# writer thread while training goes on.
WRITE_WAIT_S = 1.0
# A write running this long is on a dead connection (PostgreSQL's own statement_timeout is
# longer): its socket is shut so that the next try connects afresh.
HANG_S = 15.0
SPILL_PREFIX = "store-spill-run"

Write = dict[str, Any]
"""One queued write, JSON-able: {"kind": "metrics" | "samples" | "evaluation", "step", ...}."""


def upsert(engine: sa.Engine, table: sa.Table) -> Any:
    """The dialect's INSERT, for ON CONFLICT clauses (SQLite and PostgreSQL spell them alike)."""
    return (postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert)(table)


def number(value: Any) -> float | None:
    """A metric value as a float; NaN and ±inf (e.g. a mean over no tokens) become NULL."""
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"not a number: {value!r}") from error
    return x if math.isfinite(x) else None


def text(value: Any) -> str | None:
    """Text for a TEXT column; PostgreSQL refuses NUL characters, which model output may hold."""
    if value is None:
        return None
    return str(value).replace("\x00", "\ufffd")


def jsonable(value: Any) -> Any:
    """A JSON document both backends accept: non-finite floats spelled as strings ("inf"),
    anything else that JSON lacks (paths, enums, numpy scalars) as its str()."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if hasattr(value, "item"):  # numpy / torch scalars
        return jsonable(value.item())
    return json.loads(json.dumps(value, default=str))


def _to_stderr(line: str) -> None:
    # stderr: in a Ray actor, what its driver shows.
    print(line, file=sys.stderr, flush=True)


class _StillWriting(Exception):
    """The writer thread has not finished a write within the wait: the store is not answering."""


class _Writer:
    """The one thread that talks to the store for a sink, so that a call that hangs holds that
    thread and never the trainer. One job at a time, in order: a job still running when its
    caller stopped waiting keeps the thread until it ends (then late() says how it ended)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None
        ] = queue.SimpleQueue()
        self.job: concurrent.futures.Future[Any] | None = None
        self.started = 0.0
        self.token: Any = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (item := self._jobs.get()) is not None:
            work, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as error:  # handed to the caller, who decides
                    future.set_exception(error)

    def busy(self) -> bool:
        return self.job is not None and not self.job.done()

    def run(self, work: Callable[[], Any], *, wait: float, token: Any = None) -> Any:
        """work()'s result, or its exception; _StillWriting when the thread is still on an
        earlier job, or this one did not end within `wait` seconds (it goes on)."""
        if self.busy():
            raise _StillWriting
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.job, self.started, self.token = future, time.monotonic(), token
        self._jobs.put((work, future))
        try:
            return future.result(timeout=wait)
        except concurrent.futures.TimeoutError:
            raise _StillWriting from None
        finally:
            if future.done():
                self.job = self.token = None

    def late(self) -> tuple[Any, BaseException | None] | None:
        """(token, error or None) of a job that ended after its caller stopped waiting."""
        if self.job is None or not self.job.done():
            return None
        job, token = self.job, self.token
        self.job = self.token = None
        return token, job.exception()

    def stop(self) -> None:
        self._jobs.put(None)


def _step(step: Any) -> int:
    value = int(step)
    if value < 0 or value != step:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return value


class _SpillFile:
    """Writes queued on disk, oldest first: appended as JSON lines (fsynced), read back in
    order. A line torn by a crash (the last one) is dropped: that write never returned."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self._read_at = 0  # byte offset of the next unread line
        self._next: tuple[Write, int] | None = None  # the head, parsed, and the offset after it
        if path.exists():
            offsets = [offset for _, offset in self._lines(0)]
            self.count = len(offsets)
            end = offsets[-1] if offsets else 0
            if path.stat().st_size > end:
                # A torn last line: cut it, or the next append would be glued to it.
                with path.open("r+b") as handle:
                    handle.truncate(end)

    def _lines(self, offset: int) -> Iterator[tuple[Write, int]]:
        with self.path.open("rb") as handle:
            handle.seek(offset)
            for raw in handle:
                if not raw.endswith(b"\n"):
                    return  # torn by a crash mid-append
                offset += len(raw)
                yield json.loads(raw), offset

    def append(self, writes: Sequence[Write]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as handle:
            for write in writes:
                handle.write(json.dumps(write, allow_nan=True).encode() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.count += len(writes)

    def head(self) -> Write | None:
        """The oldest unwritten write, read from the file once however often it is asked."""
        if self._next is None:
            self._next = next(iter(self._lines(self._read_at)), None)
        return None if self._next is None else self._next[0]

    def pop(self) -> None:
        self.head()
        if self._next is not None:
            self._read_at, self._next = self._next[1], None
            self.count -= 1
        else:  # nothing left to read, whatever the count said
            self.count = 0
        if self.count <= 0:
            self.path.unlink(missing_ok=True)
            self.count, self._read_at = 0, 0


class SqlSink:
    """Metrics, samples and evaluations of one run (see the module docstring).

    `where` names the store in messages; `spill_dir` is the run directory (no spill file
    without one: the queue then stays in memory for the whole budget); `outage_s` is the
    budget (default $DAPO_STORE_OUTAGE_S, else OUTAGE_S); `write_wait_s` and `hang_s`: see
    WRITE_WAIT_S and HANG_S; `say` takes the lines that report an outage (default: stderr).
    """

    def __init__(
        self,
        engine: sa.Engine,
        run_id: int,
        *,
        where: str = "the store",
        spill_dir: str | Path | None = None,
        outage_s: float | None = None,
        memory_writes: int = MEMORY_WRITES,
        write_wait_s: float = WRITE_WAIT_S,
        hang_s: float = HANG_S,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.run_id = int(run_id)
        self.where = where
        self.outage_s = outage_budget() if outage_s is None else float(outage_s)
        self.memory_writes = int(memory_writes)
        self.write_wait_s, self.hang_s = float(write_wait_s), float(hang_s)
        self._say = say or _to_stderr
        metrics = METRICS
        stmt = upsert(engine, metrics)
        stmt = stmt.on_conflict_do_update(
            index_elements=[metrics.c.run_id, metrics.c.step, metrics.c.name],
            set_={"value": stmt.excluded.value},
        )
        # The step's upsert as driver SQL, compiled once: per step the sink then pays one
        # statement (PostgreSQL) or one C-level executemany (SQLite), not per-row Python.
        self._postgres = engine.dialect.name == "postgresql"
        compiled = stmt.compile(dialect=engine.dialect)
        if not self._postgres and tuple(compiled.positiontup or ()) != METRIC_COLUMNS:
            raise RuntimeError(f"unexpected parameter order {compiled.positiontup}")
        self._metrics_sql = _PG_METRICS if self._postgres else compiled.string
        evaluations = EVALUATIONS
        stmt = upsert(engine, evaluations)
        keys = [evaluations.c.run_id, evaluations.c.dataset, evaluations.c.k, evaluations.c.step]
        self._evaluations = stmt.on_conflict_do_update(
            index_elements=keys,
            set_={c: stmt.excluded[c] for c in (*EVALUATION_FIELDS[2:], "extra", "created_at")},
        )
        self._samples = SAMPLES
        stmt = upsert(engine, SAMPLES)
        self._samples_upsert = stmt.on_conflict_do_update(
            index_elements=[SAMPLES.c.run_id, SAMPLES.c.step, SAMPLES.c.idx],
            set_={c: stmt.excluded[c] for c in (*SAMPLE_FIELDS, "extra")},
        )
        self.closed = False
        # Only the writer thread touches the connection; _raw (its driver connection) is read
        # by the caller's thread too, to shut a hung socket.
        self._conn: sa.Connection | None = None
        self._raw: Any = None
        self._writer = _Writer(f"store-sink-run{self.run_id}")
        self._said_down = False
        # The queue of writes an outage holds back: the spill file (older) before memory.
        self._memory: deque[Write] = deque()
        self._spill: _SpillFile | None = None
        if spill_dir is not None:
            self._spill = _SpillFile(Path(spill_dir) / f"{SPILL_PREFIX}{self.run_id}.jsonl")
        self._outage_since: float | None = None
        self._failures = 0
        self._next_try = 0.0
        self._last_error = ""
        # Seconds the caller spent waiting on a store that was down (writes that failed as an
        # outage, close()'s back-off sleeps): not training time, so a run's wall time leaves
        # them out (flows/arm.py reads it through the actor).
        self.waited_s = 0.0
        # Writes an earlier sink of this run left in the spill file (it died or gave up
        # during an outage): they go to the store first.
        self.left_behind = self.pending
        if self.left_behind:
            self._drain(block=False)

    # --- the MetricsSink protocol ---------------------------------------------------------

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """All scalars of one step in one transaction (upserted on (run, step, name))."""
        at = _step(step)
        items = []
        for name, value in metrics.items():
            if not isinstance(name, str) or not name or len(name) > MAX_NAME:
                raise ValueError(f"metric names are 1..{MAX_NAME} characters, got {name!r}")
            try:
                items.append([name, number(value)])
            except ValueError as error:
                raise ValueError(f"metric {name!r} at step {at}: {error}") from None
        if not items:
            return
        # A fixed row order: two writers upserting overlapping keys lock them in the same order.
        items.sort()
        self._submit({"kind": "metrics", "step": at, "items": items})

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """The step's rollouts, replacing whatever that step held before."""
        at = _step(step)
        rows = [self._sample_row(at, i, sample) for i, sample in enumerate(samples)]
        self._submit({"kind": "samples", "step": at, "rows": rows})

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        """One evaluation (dataset, k, avg@k, pass@k, cons@k, n_problems), upserted on
        (run, dataset, k, step); further keys are kept in `extra`."""
        at = _step(step)
        dataset, k = result.get("dataset"), result.get("k")
        if not isinstance(dataset, str) or not dataset or len(dataset) > MAX_NAME:
            raise ValueError(f"evaluation needs a dataset name, got {dataset!r}")
        if k is None or int(k) < 1:
            raise ValueError(f"evaluation of {dataset!r} needs k >= 1, got {k!r}")
        extra = {key: v for key, v in result.items() if key not in EVALUATION_FIELDS}
        n_problems = result.get("n_problems")
        row = {
            "run_id": self.run_id,
            "dataset": dataset,
            "k": int(k),
            "step": at,
            "avg_at_k": number(result.get("avg_at_k")),
            "pass_at_k": number(result.get("pass_at_k")),
            "cons_at_k": number(result.get("cons_at_k")),
            "n_problems": None if n_problems is None else int(n_problems),
            "extra": jsonable(extra) if extra else None,
        }
        self._submit({"kind": "evaluation", "step": at, "row": row})

    def close(self) -> None:
        """Write back whatever an outage still holds (waiting for the store up to the rest of
        the budget), then release the connection. Raises StoreUnavailable when the store did
        not come back in time; the spill file then keeps the writes."""
        if self.closed:
            return
        try:
            if self.pending:
                self._drain(block=True)
        finally:
            self.closed = True
            if self._writer.busy():
                self._abort()  # a hung write: its socket goes, the thread ends with it
            else:
                with contextlib.suppress(_StillWriting, sa.exc.SQLAlchemyError):
                    self._writer.run(self._drop_connection, wait=self.write_wait_s)
            self._writer.stop()

    def __enter__(self) -> SqlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pending(self) -> int:
        """Writes an outage holds back, not yet in the store."""
        return len(self._memory) + (self._spill.count if self._spill is not None else 0)

    # --- the queue ------------------------------------------------------------------------

    def _submit(self, write: Write) -> None:
        if self.closed:
            raise ValueError(f"the sink of run {self.run_id} is closed")
        self._settle_late()
        if not self.pending and self._attempt(write):
            return
        self._enqueue(write)
        self._drain(block=False)

    def _attempt(self, write: Write) -> bool:
        """Write now: True once it is in the store, False when the store is not answering
        (refused, dropped, locked, or no answer within write_wait_s); other errors raise."""
        started = time.monotonic()
        try:
            self._apply(write)
            return True
        except _StillWriting:
            self.waited_s += time.monotonic() - started
            self._outage(f"no answer within {self.write_wait_s:g} s")
            return False
        except sa.exc.DBAPIError as error:
            if not self._down(error):
                raise
            self.waited_s += time.monotonic() - started
            self._outage(first_line(getattr(error, "orig", None) or error))
            return False

    def _settle_late(self) -> None:
        """A write that ended on the writer thread after the trainer stopped waiting for it:
        when it went in and is still the queue's head, it is done (not sent again)."""
        late = self._writer.late()
        if late is None:
            return
        token, error = late
        if error is None and token is not None and self.pending and token == self._head():
            self._pop()

    def _enqueue(self, write: Write) -> None:
        if self._spill is not None and (
            self._spill.count or len(self._memory) >= self.memory_writes
        ):
            # Memory is full (or the file already holds older writes): the file takes the
            # queue, so that its order stays oldest first.
            self._spill.append([*self._memory, write])
            self._memory.clear()
        else:
            self._memory.append(write)

    def _head(self) -> Write | None:
        if self._spill is not None and self._spill.count:
            return self._spill.head()
        return self._memory[0] if self._memory else None

    def _pop(self) -> None:
        if self._spill is not None and self._spill.count:
            self._spill.pop()
        else:
            self._memory.popleft()

    def _drain(self, *, block: bool) -> None:
        """Write the queue back, oldest first. Without `block`, only when the back-off allows
        and only until the store fails again; with it, wait (within the budget) until all is
        written. Raises StoreUnavailable once the outage outlasts the budget."""
        while self.pending:
            self._settle_late()
            if not self.pending:
                break
            now = time.monotonic()
            if now < self._next_try:
                if not block:
                    self._check_budget(now)
                    return
                self.waited_s += self._next_try - now
                time.sleep(self._next_try - now)
            write = self._head()
            if write is None:  # only torn lines were left in the spill file
                self._pop()
                continue
            if not self._attempt(write):
                self._check_budget(time.monotonic())
                continue
            self._pop()
        if self._said_down:
            self._say(f"the store {self.where} answers again: run {self.run_id}'s queue is in it")
        self._outage_since, self._failures, self._next_try = None, 0, 0.0
        self._said_down = False

    def _down(self, error: sa.exc.DBAPIError) -> bool:
        """An error that means "the store is not answering now" (and not "this write is
        wrong"): worth queueing and trying again."""
        return is_outage(error) or is_transient(error)

    def _outage(self, why: str) -> None:
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
        self._failures += 1
        self._next_try = now + outage_wait(self._failures)
        self._last_error = why
        if self._writer.busy() and now - self._writer.started > self.hang_s:
            self._abort()
        if not self._said_down:
            self._said_down = True
            where = self._spill.path if self._spill is not None else "memory"
            self._say(
                f"the store {self.where} does not answer ({why}): run {self.run_id} trains on, "
                f"its writes queued in {where} for up to {self.outage_s:g} s"
            )

    def _abort(self) -> None:
        """Shut the socket of a write that hangs, so that it fails on the writer thread (and
        the next try connects afresh) instead of waiting for an answer that never comes."""
        raw = self._raw
        if raw is None:
            return  # still connecting: the engine's connect timeout ends it
        with contextlib.suppress(Exception):
            if self._postgres:
                with socket.socket(fileno=os.dup(raw.pgconn.socket)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            else:
                raw.interrupt()

    def _check_budget(self, now: float) -> None:
        if self._outage_since is None or now - self._outage_since <= self.outage_s:
            return
        if self._spill is not None and self._memory:
            self._spill.append(list(self._memory))  # keep what memory holds too
            self._memory.clear()
        kept = (
            f"; {self.pending} write(s) not yet in it are kept in {self._spill.path}"
            if self._spill is not None and self._spill.count
            else f"; {self.pending} write(s) not yet in it are lost"
        )
        raise StoreUnavailable(
            f"the store {self.where} has been unreachable for more than {self.outage_s:g} s "
            f"({self._last_error}): run {self.run_id} stops{kept}"
        )

    # --- writing --------------------------------------------------------------------------

    def _apply(self, write: Write) -> None:
        kind, at = write["kind"], int(write["step"])
        if kind == "metrics":
            params: Any
            items = write["items"]
            if self._postgres:
                params = {
                    "run_id": self.run_id,
                    "step": at,
                    "names": [name for name, _ in items],
                    "values": [value for _, value in items],
                }
            else:
                params = [(self.run_id, at, name, value) for name, value in items]
            self._write(lambda conn: conn.exec_driver_sql(self._metrics_sql, params), write)
        elif kind == "samples":
            rows, table = write["rows"], self._samples

            def work(conn: sa.Connection) -> None:
                # Upsert, then drop what an earlier write of the step had beyond these rows:
                # DELETE then INSERT let two writers of one step (a retried actor beside its
                # predecessor) both find the step empty, and the second INSERT then hit the
                # key (UniqueViolation on PostgreSQL); an upsert waits on the row lock instead.
                if rows:
                    # One multi-row statement: a driver executemany pipelines one statement per
                    # row, and stalls ~0.1 s a step on a proxied connection.
                    conn.execute(self._samples_upsert.values(rows))
                conn.execute(
                    sa.delete(table).where(
                        table.c.run_id == self.run_id, table.c.step == at, table.c.idx >= len(rows)
                    )
                )

            self._write(work, write)
        elif kind == "evaluation":
            row = {**write["row"], "created_at": utcnow()}
            self._write(lambda conn: conn.execute(self._evaluations, row), write)
        else:  # pragma: no cover - only this module writes the queue
            raise ValueError(f"unknown queued write {kind!r}")

    def _write(self, work: Callable[[sa.Connection], Any], token: Write) -> None:
        """Run `work` (the write `token`) in one write transaction on the sink's own
        connection, on the writer thread; the caller waits at most write_wait_s for it.

        The sink keeps one connection for its life (no pool checkout, ping and reset per step:
        a step costs one transaction, nothing more). A connection the server dropped (a
        restart between two steps) is replaced and the write tried again at once; only a
        fresh connection failing too is an outage, whose writes go back to the queue. A lock
        held by another writer is not retried here: the engine's busy timeout is the wait, and
        past it the write is queued like any outage's, so that the trainer never waits on
        retries (the queue is the sink's retry).
        """

        self._writer.run(lambda: self._write_here(work), wait=self.write_wait_s, token=token)

    def _write_here(self, work: Callable[[sa.Connection], Any]) -> None:
        """_write's work, on the writer thread."""
        for fresh in (False, True):
            conn = self._connection()
            try:
                with conn.begin():
                    work(conn)
                return
            except sa.exc.DBAPIError as error:
                if not error.connection_invalidated:
                    if is_outage(error):
                        self._drop_connection()  # the next try starts from a fresh one
                    raise
                self._drop_connection()
                if fresh:
                    raise

    def _connection(self) -> sa.Connection:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._raw = None
            conn = self.engine.connect()
            conn.execution_options(**{WRITE_OPTION: True})
            raw = conn.connection.dbapi_connection
            if not self._postgres and raw is not None:
                # A lock held longer than hang_s is an outage to the sink, not a stall. On the
                # driver's cursor: through SQLAlchemy the PRAGMA would open a transaction.
                cursor = raw.cursor()
                waits = int(cursor.execute("PRAGMA busy_timeout").fetchone()[0] or 0)
                cursor.execute(f"PRAGMA busy_timeout = {min(waits, int(self.hang_s * 1000))}")
                cursor.close()
            self._conn, self._raw = conn, raw
        return self._conn

    def _drop_connection(self) -> None:
        self._raw = None
        if self._conn is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                self._conn.close()
            self._conn = None

    def _sample_row(self, step: int, idx: int, sample: Mapping[str, Any]) -> dict[str, Any]:
        """A sample record as a `samples` row: each field typed as SAMPLE_FIELDS says (a
        missing one is NULL, or "" / False where its column allows no NULL), any other key in
        `extra`."""
        extra = {k: v for k, v in sample.items() if k not in SAMPLE_FIELDS}
        row: dict[str, Any] = {"run_id": self.run_id, "step": step, "idx": idx}
        for name, kind in SAMPLE_FIELDS.items():
            value = sample.get(name)
            if value is None:
                row[name] = None if SAMPLES.c[name].nullable else kind()
            elif kind is str:
                row[name] = text(value)
            elif kind is float:
                row[name] = number(value)
            else:  # bool, int
                row[name] = kind(value)
        row["extra"] = jsonable(extra) if extra else None
        return row


class IncompleteRun(RuntimeError):
    """A run trained its steps but the store lacks the metrics of some of them."""


def missing_steps(engine: sa.Engine, run_id: int, steps: int) -> list[int]:
    """The steps 1..steps whose metrics the store does not hold for `run_id` (the trainer logs
    metrics at every rollout step, so a step without any was lost on the way)."""
    query = (
        sa.select(METRICS.c.step)
        .where(METRICS.c.run_id == int(run_id), METRICS.c.step.between(1, int(steps)))
        .distinct()
    )

    def read() -> set[int]:
        with engine.connect() as conn:
            return {int(step) for step in conn.execute(query).scalars()}

    held = retrying(read, outage_s=outage_budget())
    return [step for step in range(1, int(steps) + 1) if step not in held]


def check_every_step(engine: sa.Engine, run_id: int, steps: int, *, where: str) -> None:
    """Raise IncompleteRun (one line) unless the store holds metrics for every step 1..steps:
    a run is marked completed only when its curve is whole in the store."""
    missing = missing_steps(engine, run_id, steps)
    if not missing:
        return
    shown = ", ".join(str(step) for step in missing[:5]) + (" …" if len(missing) > 5 else "")
    raise IncompleteRun(
        f"run {run_id} trained {steps} steps but the store {where} holds the metrics of "
        f"{steps - len(missing)}: {len(missing)} missing (steps {shown}); it is not marked "
        "completed"
    )


def resumable_step(engine: sa.Engine, run_id: int, step: int | None) -> int | None:
    """`step` when the store holds the metrics of every step of run `run_id` up to it, else
    None: a checkpoint is resumed only by a store that holds its curve (a store restored from
    an older backup, or one whose queued steps were lost, does not; resuming would leave a
    hole the new attempt never fills). Says so on stderr when it refuses."""
    if step is None or step <= 0:
        return step
    missing = missing_steps(engine, run_id, step)
    if not missing:
        return step
    print(
        f"run {run_id}'s checkpoint at step {step} is not resumed: the store holds the metrics "
        f"of {step - len(missing)} of its {step} steps (a copy or an older backup of the "
        "store, or steps lost); the arm starts over",
        file=sys.stderr,
        flush=True,
    )
    return None
