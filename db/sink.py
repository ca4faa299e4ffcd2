"""SqlSink: the trainer's MetricsSink, writing one run's numbers into the store.

It matches dapo_core.protocols.MetricsSink structurally (db/ never imports dapo_core):
log_metrics, log_samples, log_evaluation, close. Each call is one transaction, so a step is
either wholly in the store or not at all, and every write is an upsert on the row's meaning
((run, step, name) for metrics, (run, dataset, k, step) for evaluations; a step's samples are
replaced), so a step replayed after a resume overwrites its earlier values and never
duplicates them.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from db.models import EVALUATIONS, METRICS, SAMPLES, utcnow
from db.transactions import WRITE_OPTION, retrying

SAMPLE_FIELDS = (
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
)
EVALUATION_FIELDS = ("dataset", "k", "avg_at_k", "pass_at_k", "cons_at_k", "n_problems")
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
_RECONNECTS = 3  # a dropped connection is replaced this many times per write


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


class SqlSink:
    """Metrics, samples and evaluations of one run (see the module docstring)."""

    def __init__(self, engine: sa.Engine, run_id: int) -> None:
        self.engine = engine
        self.run_id = int(run_id)
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
        self.closed = False
        self._conn: sa.Connection | None = None

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """All scalars of one step in one transaction (upserted on (run, step, name))."""
        at = _step(step)
        items = []
        for name, value in metrics.items():
            if not isinstance(name, str) or not name or len(name) > MAX_NAME:
                raise ValueError(f"metric names are 1..{MAX_NAME} characters, got {name!r}")
            try:
                items.append((name, number(value)))
            except ValueError as error:
                raise ValueError(f"metric {name!r} at step {at}: {error}") from None
        if not items:
            return
        # A fixed row order: two writers upserting overlapping keys lock them in the same order.
        items.sort()
        params: Any
        if self._postgres:
            names, values = zip(*items, strict=True)
            params = {
                "run_id": self.run_id,
                "step": at,
                "names": list(names),
                "values": list(values),
            }
        else:
            params = [(self.run_id, at, name, value) for name, value in items]
        self._write(lambda conn: conn.exec_driver_sql(self._metrics_sql, params))

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """The step's rollouts, replacing whatever that step held before."""
        at = _step(step)
        rows = [self._sample_row(at, i, sample) for i, sample in enumerate(samples)]
        table = self._samples

        def work(conn: sa.Connection) -> None:
            conn.execute(sa.delete(table).where(table.c.run_id == self.run_id, table.c.step == at))
            if rows:
                conn.execute(sa.insert(table), rows)

        self._write(work)

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
            "created_at": utcnow(),
        }
        self._write(lambda conn: conn.execute(self._evaluations, row))

    def close(self) -> None:
        """Release the sink's connection (every call already committed; nothing is buffered)."""
        self.closed = True
        self._drop_connection()

    def __enter__(self) -> SqlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, work: Callable[[sa.Connection], Any]) -> None:
        """Run `work` in one write transaction on the sink's own connection.

        The sink keeps one connection for its life (no pool checkout, ping and reset per step:
        a step costs one transaction, nothing more). If the server drops it (a restart), the
        step is written again on a new connection: every write is idempotent.
        """
        if self.closed:
            raise ValueError(f"the sink of run {self.run_id} is closed")

        def transaction() -> None:
            conn = self._connection()
            try:
                with conn.begin():
                    work(conn)
            except sa.exc.DBAPIError as error:
                if error.connection_invalidated:
                    self._drop_connection()
                raise

        for reconnects in range(_RECONNECTS + 1):
            try:
                retrying(transaction)
                return
            except sa.exc.DBAPIError as error:
                if not error.connection_invalidated or reconnects == _RECONNECTS:
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
