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
name still fails at once) and queued in order: in memory up to MEMORY_WRITES writes, then in a
spill file under the run directory (`store-spill-run<ID>.jsonl`, one write per line, fsynced).
The sink tries the store again with exponential back-off (0.25 s doubling to 5 s) whenever the
trainer calls it, and writes the queue back in order, oldest first, once it answers; every write
being an upsert, a write whose COMMIT was lost in the outage is simply written again. When the
outage outlasts the budget, the next call (at the latest close()) raises StoreUnavailable with
one line naming the store, and the spill file keeps every write not yet in the store: a later
sink of the same run (a retried actor, or the next attempt's Store.replay_spill) writes it back
first.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from db.errors import StoreUnavailable, first_line
from db.models import EVALUATION_FIELDS, EVALUATIONS, METRICS, SAMPLE_FIELDS, SAMPLES, utcnow
from db.transactions import (
    WRITE_OPTION,
    is_outage,
    is_transient,
    outage_budget,
    outage_wait,
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
# Writes held in memory during an outage before they go to the spill file (a tiny run's step
# is ~3 writes of a few kB; a real one with samples, tens of kB).
MEMORY_WRITES = 256
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
    budget (default $DAPO_STORE_OUTAGE_S, else OUTAGE_S).
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
    ) -> None:
        self.engine = engine
        self.run_id = int(run_id)
        self.where = where
        self.outage_s = outage_budget() if outage_s is None else float(outage_s)
        self.memory_writes = int(memory_writes)
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
        self._conn: sa.Connection | None = None
        # The queue of writes an outage holds back: the spill file (older) before memory.
        self._memory: deque[Write] = deque()
        self._spill: _SpillFile | None = None
        if spill_dir is not None:
            self._spill = _SpillFile(Path(spill_dir) / f"{SPILL_PREFIX}{self.run_id}.jsonl")
        self._outage_since: float | None = None
        self._failures = 0
        self._next_try = 0.0
        self._last_error = ""
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
            self._drop_connection()

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
        if not self.pending:
            try:
                self._apply(write)
                return
            except sa.exc.DBAPIError as error:
                if not self._down(error):
                    raise
                self._outage(error)
        self._enqueue(write)
        self._drain(block=False)

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
            now = time.monotonic()
            if now < self._next_try:
                if not block:
                    self._check_budget(now)
                    return
                time.sleep(self._next_try - now)
            write = self._head()
            if write is None:  # only torn lines were left in the spill file
                self._pop()
                continue
            try:
                self._apply(write)
            except sa.exc.DBAPIError as error:
                if not self._down(error):
                    raise
                self._outage(error)
                self._check_budget(time.monotonic())
                continue
            self._pop()
        self._outage_since, self._failures, self._next_try = None, 0, 0.0

    def _down(self, error: sa.exc.DBAPIError) -> bool:
        """An error that means "the store is not answering now" (and not "this write is
        wrong"): worth queueing and trying again."""
        return is_outage(error) or is_transient(error)

    def _outage(self, error: sa.exc.DBAPIError) -> None:
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
        self._failures += 1
        self._next_try = now + outage_wait(self._failures)
        self._last_error = first_line(getattr(error, "orig", None) or error)
        self._drop_connection()

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
            self._write(lambda conn: conn.exec_driver_sql(self._metrics_sql, params))
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

            self._write(work)
        elif kind == "evaluation":
            row = {**write["row"], "created_at": utcnow()}
            self._write(lambda conn: conn.execute(self._evaluations, row))
        else:  # pragma: no cover - only this module writes the queue
            raise ValueError(f"unknown queued write {kind!r}")

    def _write(self, work: Callable[[sa.Connection], Any]) -> None:
        """Run `work` in one write transaction on the sink's own connection.

        The sink keeps one connection for its life (no pool checkout, ping and reset per step:
        a step costs one transaction, nothing more). A connection the server dropped (a
        restart between two steps) is replaced and the write tried again at once; only a
        fresh connection failing too is an outage, whose writes go back to the queue. A lock
        held by another writer is not retried here: the engine's busy timeout is the wait, and
        past it the write is queued like any outage's, so that the trainer never waits on
        retries (the queue is the sink's retry).
        """

        for fresh in (False, True):
            conn = self._connection()
            try:
                with conn.begin():
                    work(conn)
                return
            except sa.exc.DBAPIError as error:
                if not error.connection_invalidated:
                    raise
                self._drop_connection()
                if fresh:
                    raise

    def _connection(self) -> sa.Connection:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._conn = self.engine.connect()
            self._conn.execution_options(**{WRITE_OPTION: True})
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                self._conn.close()
            self._conn = None

    def _sample_row(self, step: int, idx: int, sample: Mapping[str, Any]) -> dict[str, Any]:
        extra = {k: v for k, v in sample.items() if k not in SAMPLE_FIELDS}
        length = sample.get("length")
        return {
            "run_id": self.run_id,
            "step": step,
            "idx": idx,
            "prompt": text(sample.get("prompt")) or "",
            "response": text(sample.get("response")) or "",
            "ground_truth": text(sample.get("ground_truth")),
            "pred": text(sample.get("pred")),
            "reward": number(sample.get("reward")),
            "score": number(sample.get("score")),
            "overlong_penalty": number(sample.get("overlong_penalty")),
            "correct": bool(sample.get("correct", False)),
            "length": None if length is None else int(length),
            "truncated": bool(sample.get("truncated", False)),
            "extra": jsonable(extra) if extra else None,
        }
