"""Many writers, and writers that die: the store keeps every row exactly once.

- Concurrency: 4 processes each write 2,000 steps × 20 metrics through SqlSink into one store
  (a SQLite file; a PostgreSQL schema), started together behind a barrier, and every 100 steps
  start a new attempt of one shared (arm, seed) (a read-then-write transaction). Every row must
  be there exactly once with its value, the attempts numbered 1..80, and no writer may see
  "database is locked", not even as an error that was retried.
- Fault: a writer SIGKILLed in the middle of a step's transaction leaves the store consistent
  (the step is absent, every earlier step whole, SQLite's integrity check clean, no lock
  left behind); replaying its steps gives exactly the rows of a clean run.

The writers are tests/db_writer.py, run as separate interpreters.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import db_writer
import pytest
import sqlalchemy as sa
from store_runs import new_attempt

from db.store import Store

ROOT = Path(__file__).resolve().parents[2]
WRITER = ROOT / "tests" / "db_writer.py"
PROCESSES, STEPS, METRICS = 4, 2000, 20


def writer(url: str, run_id: int, first: int, last: int, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [
            sys.executable,
            str(WRITER),
            url,
            str(run_id),
            str(first),
            str(last),
            str(METRICS),
            *extra,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def new_runs(store: Store, n: int) -> list[int]:
    sweep = store.create_sweep(
        name="writers", preset="test", arms=["a"], seeds=list(range(n)), base_config={},
        ladder=[{"arm": "a"}],
    )  # fmt: skip
    return [new_attempt(store, sweep, "a", s, config_hash="h") for s in range(n)]


def rows_of(store: Store, run_id: int) -> list[tuple[int, str, float | None]]:
    with store.engine.connect() as conn:
        result = conn.execute(
            sa.text("SELECT step, name, value FROM metrics WHERE run_id = :r ORDER BY step, name"),
            {"r": run_id},
        )
        return [(int(s), str(n), v) for s, n, v in result]


def expected_rows(run_id: int, first: int, last: int) -> list[tuple[int, str, float | None]]:
    rows = []
    for step in range(first, last):
        for name, value in sorted(db_writer.step_metrics(run_id, step, METRICS).items()):
            rows.append((step, name, None if math.isnan(value) else value))
    return rows


@pytest.mark.slow
def test_four_processes_write_every_row_exactly_once(store_url: str) -> None:
    store = Store(store_url)
    run_ids = new_runs(store, PROCESSES)
    every = 100  # each writer also starts 20 attempts of one shared (arm, seed)
    procs = [
        writer(store_url, r, 0, STEPS, "--wait", "--start-runs-every", str(every)) for r in run_ids
    ]
    try:
        for p in procs:  # barrier: all connected and ready before anyone writes
            assert p.stdout is not None and p.stdout.readline().strip() == "READY"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outcomes = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outcomes, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "locked" not in (out + err).lower()
        # not even a retried lock error: BEGIN IMMEDIATE queues writers on the busy timeout
        assert out.split() == ["DONE", "0"]
    with store.engine.connect() as conn:
        total, distinct = conn.execute(
            sa.text(
                "SELECT count(*), count(DISTINCT run_id || ':' || step || ':' || name) FROM metrics"
            )
        ).one()
    assert total == distinct == PROCESSES * STEPS * METRICS
    for run_id in run_ids:  # and each value is the one its writer sent
        assert rows_of(store, run_id) == expected_rows(run_id, 0, STEPS)
    # The shared (arm, seed) got consecutive attempt numbers, none lost or repeated.
    with store.engine.connect() as conn:
        attempts = conn.execute(
            sa.text("SELECT attempt FROM runs WHERE arm = 'contended' ORDER BY attempt")
        ).scalars()
        assert list(attempts) == list(range(1, PROCESSES * STEPS // every + 1))


def _integrity(store: Store) -> None:
    with store.engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []


@pytest.mark.parametrize("hang_at", [0, 37])
def test_a_writer_killed_mid_transaction_leaves_the_store_consistent(
    store_url: str, hang_at: int
) -> None:
    store = Store(store_url)
    victim, reference = new_runs(store, 2)
    proc = writer(store_url, victim, 0, 60, "--hang-at", str(hang_at))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "IN_TRANSACTION", proc.stderr.read() if proc.stderr else line
        os.kill(proc.pid, signal.SIGKILL)  # the step's INSERT ran; its COMMIT never will
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    # Every step before the kill is whole; the one in flight left nothing behind.
    assert rows_of(store, victim) == expected_rows(victim, 0, hang_at)
    _integrity(store)
    # No lock outlives the writer: another writer gets through at once (the busy timeout is
    # 30 s; a leaked lock would show as a timeout here).
    with store.sink(reference) as sink:
        sink.log_metrics(0, db_writer.step_metrics(reference, 0, METRICS))

    # The resumed writer replays from step 0 (as a resume from an older checkpoint would):
    # the result is exactly the rows of a run that never died, each once.
    replay = writer(store_url, victim, 0, 60)
    _out, err = replay.communicate(timeout=120)
    assert replay.returncode == 0, err[-3000:]
    assert rows_of(store, victim) == expected_rows(victim, 0, 60)
    _integrity(store)


# The parent of the fork runs in a fresh interpreter: forked from a pytest-xdist worker that had
# run other modules first (Ray, gloo, Prefect clients in-process), the child exited with 1 for
# both backends in a CI rehearsal (2026-11-29), and passed alone; what the test asks is only the
# store's own behaviour across a fork.
FORK_PARENT = """
import multiprocessing, sys
import sqlalchemy as sa
import db_writer
from db.store import Store

store_url, run_id = sys.argv[1], int(sys.argv[2])
metrics = int(sys.argv[3])
store = Store(store_url)
with store.engine.connect() as conn:  # the parent's pool now holds a live connection
    conn.execute(sa.text("SELECT 1"))

def child():  # an exception here is printed to stderr by multiprocessing, exit code 1
    with Store(store_url).sink(run_id) as sink:
        for step in range(200):
            sink.log_metrics(step, db_writer.step_metrics(run_id, step, metrics))

proc = multiprocessing.get_context("fork").Process(target=child)
proc.start()
# The parent reads through its pool while the child writes: a shared connection would
# interleave two conversations on one socket and break both.
reads = 0
while proc.is_alive() or reads == 0:
    with store.engine.connect() as conn:
        conn.execute(sa.text("SELECT count(*) FROM metrics")).scalar()
    reads += 1
proc.join(timeout=120)
sys.exit(proc.exitcode)
"""


def test_a_forked_child_opens_its_own_connections(store_url: str) -> None:
    """A process forked after the parent opened the store (multiprocessing, Ray, Prefect
    workers) must not share the parent's pooled connections: both keep working."""
    store = Store(store_url)
    (run_id,) = new_runs(store, 1)
    done = subprocess.run(
        [sys.executable, "-c", FORK_PARENT, store_url, str(run_id), str(METRICS)],
        # tests/ for db_writer; ROOT on the path, so that `db` is the package, not tests/db/
        cwd=ROOT / "tests",
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert rows_of(store, run_id) == expected_rows(run_id, 0, 200)
