"""The pieces of the store-outage tests that other modules use too: what a step logs, the check
that every step is there exactly once, a fresh run, and a process that locks a SQLite file. Used
by tests/db/test_db_outage.py, test_store_integrity.py, test_store_copies.py and
tests/flows/test_flows_arm_wall.py; PostgreSQL through the TCP proxy that a test takes down is
tests/conftest.py's fixtures `proxy` and `pg_urls`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from store_runs import new_attempt

from db import engine as db_engine
from db.sink import SqlSink
from db.store import Store

N_METRICS = 12


def metrics(step: int) -> dict[str, float]:
    return {f"m/{i:02d}": step * 100.0 + i for i in range(N_METRICS)}


def samples(step: int) -> list[dict[str, Any]]:
    return [{"prompt": f"p{step}", "response": f"r{step}-{i}", "reward": 1.0} for i in range(2)]


def log_step(sink: SqlSink, step: int) -> None:
    """What the trainer logs per step: metrics, samples, and every 5th step an evaluation."""
    sink.log_metrics(step, metrics(step))
    sink.log_samples(step, samples(step))
    if step % 5 == 0:
        sink.log_evaluation(step, {"dataset": "d", "k": 2, "avg_at_k": step / 100.0})


def assert_every_step_once(
    url: str, run_id: int, steps: range, logged: range | None = None
) -> None:
    """Every metric of every step exactly once with its value; samples and evaluations too
    (for the steps in `logged`, default all: a step whose metrics call raised logged no more)."""
    logged = steps if logged is None else logged
    engine = db_engine.create(url)  # a direct engine: the test's view, not the sink's
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT step, name, value FROM metrics WHERE run_id = :r ORDER BY step, name"),
            {"r": run_id},
        ).all()
        sample_rows = conn.execute(
            sa.text("SELECT step, idx, response FROM samples WHERE run_id = :r ORDER BY step, idx"),
            {"r": run_id},
        ).all()
        evals = conn.execute(
            sa.text("SELECT step, avg_at_k FROM evaluations WHERE run_id = :r ORDER BY step"),
            {"r": run_id},
        ).all()
    engine.dispose()
    expected = [
        (step, name, value) for step in steps for name, value in sorted(metrics(step).items())
    ]
    assert [(int(s), str(n), float(v)) for s, n, v in rows] == expected
    assert [(int(s), int(i), str(r)) for s, i, r in sample_rows] == [
        (step, i, f"r{step}-{i}") for step in logged for i in range(2)
    ]
    assert [(int(s), float(a)) for s, a in evals] == [
        (step, step / 100.0) for step in logged if step % 5 == 0
    ]


def new_run(url: str, **store_kw: Any) -> tuple[Store, int]:
    """The store at `url` (Store's keywords) and a new run in a sweep of its own."""
    store = Store(url, **store_kw)
    sweep = store.create_sweep(
        name="outage", preset="tiny", arms=["grpo"], seeds=[0], base_config={},
        ladder=[{"arm": "grpo"}],
    )  # fmt: skip
    run_id = new_attempt(store, sweep, "grpo", 0, config_hash="h")
    return store, run_id


# A process that holds a SQLite file's exclusive lock for argv[2] seconds (python -c LOCKER FILE S).
LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("LOCKED", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""
