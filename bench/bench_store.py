"""Rows per second into the store: SqlSink (one transaction per step) vs one commit per row.

    .venv/bin/python bench/bench_store.py [--steps 500] [--naive-rows 1500] [--repeat 3]
        [--metrics 32 20] [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

Both writers run the same idempotent upsert through the same engine (SQLite: WAL, synchronous
FULL; PostgreSQL: the server's defaults, synchronous_commit on), each on one held connection,
into a fresh SQLite file and a fresh PostgreSQL schema (dropped afterwards). The sink writes a
whole step (all its metrics) per transaction, as the trainer calls it; the naive writer commits
every row. The trainer logs 32 scalars per step (dapo_common.metric_names), so that is the
headline step size; 20 (the concurrency test's) is shown too.

"driver ceiling" is the same comparison with SQLAlchemy and the sink taken out (the bare
sqlite3 / psycopg connection, batch-per-step vs commit-per-row): the most that batching a step
into one transaction can give on this machine's disk, whatever the writer's own overhead.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from db import engine as db_engine
from db.models import METRICS
from db.sink import upsert
from db.store import Store
from db.transactions import WRITE_OPTION

GOAL = 20.0


@contextmanager
def sqlite_store() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'bench.db'}"
        try:
            yield url
        finally:
            db_engine.dispose(url)


@contextmanager
def postgres_store(server_url: str) -> Iterator[str]:
    schema = f"dapo_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(server_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = f"{server_url}?options=-csearch_path%3D{schema}"
    try:
        yield url
    finally:
        db_engine.dispose(url)
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def new_run(store: Store) -> int:
    sweep = store.create_sweep(
        name="bench", preset="bench", arms=["a"], seeds=[0], base_config={}, ladder=[]
    )
    return store.resume_attempt(
        sweep_id=sweep,
        arm="a",
        seed=0,
        config={},
        config_hash="bench",
        after=None,
        resume_step=None,
        checkpoint_dir=f"/bench/sweep{sweep}",
    ).run_id


def names(n_metrics: int) -> list[str]:
    return [f"bench/metric_{i:02d}" for i in range(n_metrics)]


def sink_rows_per_s(store: Store, steps: int, n_metrics: int) -> float:
    """SqlSink.log_metrics: one transaction per step of n_metrics rows."""
    sink = store.sink(new_run(store))
    keys = names(n_metrics)
    sink.log_metrics(0, dict.fromkeys(keys, 0.0))  # connection opened, statement compiled
    start = time.perf_counter()
    for step in range(1, steps + 1):
        sink.log_metrics(step, {k: step + i / 100 for i, k in enumerate(keys)})
    elapsed = time.perf_counter() - start
    sink.close()
    return steps * n_metrics / elapsed


def naive_rows_per_s(store: Store, rows: int, n_metrics: int) -> float:
    """The same upsert, one row per transaction (what a writer without batching does)."""
    run_id = new_run(store)
    table = METRICS
    stmt = upsert(store.engine, table)
    stmt = stmt.on_conflict_do_update(
        index_elements=[table.c.run_id, table.c.step, table.c.name],
        set_={"value": stmt.excluded.value},
    )
    keys = names(n_metrics)
    with store.engine.connect() as conn:
        conn.execution_options(**{WRITE_OPTION: True})
        with conn.begin():
            conn.execute(stmt, {"run_id": run_id, "name": keys[0], "step": 0, "value": 0.0})
        start = time.perf_counter()
        for i in range(rows):
            step, k = divmod(i, n_metrics)
            row = {"run_id": run_id, "name": keys[k], "step": step + 1, "value": step + k / 100}
            with conn.begin():
                conn.execute(stmt, row)
        elapsed = time.perf_counter() - start
    return rows / elapsed


def driver_ceiling(store: Store, steps: int, rows: int, n_metrics: int) -> float:
    """Rows/s batched per step over rows/s one per transaction, on the bare DB-API connection
    with the sink's own SQL."""
    run_id = new_run(store)
    sink = store.sink(run_id)
    postgres = store.engine.dialect.name == "postgresql"
    sql, keys = sink._metrics_sql, names(n_metrics)
    pooled = store.engine.raw_connection()
    try:
        raw: Any = pooled.driver_connection
        cursor = raw.cursor()

        def commit_one(step: int, batch: list[str]) -> None:
            values = [float(step)] * len(batch)
            if postgres:
                params = {"run_id": run_id, "step": step, "names": batch, "values": values}
                cursor.execute(sql, params)
                raw.commit()
            else:
                cursor.execute("BEGIN IMMEDIATE")
                cursor.executemany(
                    sql, [(run_id, step, k, v) for k, v in zip(batch, values, strict=True)]
                )
                cursor.execute("COMMIT")

        start = time.perf_counter()
        for step in range(1, steps + 1):
            commit_one(step, keys)
        batched = steps * n_metrics / (time.perf_counter() - start)
        start = time.perf_counter()
        for i in range(rows):
            step, k = divmod(i, n_metrics)
            commit_one(steps + 1 + step, [keys[k]])
        single = rows / (time.perf_counter() - start)
    finally:
        pooled.close()
        sink.close()
    return batched / single


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500, help="steps the sink writes (500)")
    parser.add_argument(
        "--naive-rows", type=int, default=1500, help="rows the naive writer commits (1500)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="alternating rounds of both; the median is shown"
    )
    parser.add_argument("--metrics", type=int, nargs="+", default=[32, 20], help="rows per step")
    parser.add_argument(
        "--pg-url",
        default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
        help="PostgreSQL server database (a scratch schema is made and dropped)",
    )
    args = parser.parse_args(argv)

    print(f"python {platform.python_version()}, sqlalchemy {sa.__version__}, {platform.platform()}")
    header = (
        f"{'backend':<11} {'rows/step':>9} {'sink rows/s':>12} {'naive rows/s':>13} {'ratio':>7}"
        f" {'driver ceiling':>15}"
    )
    print(header)
    print("-" * len(header))
    worst = float("inf")
    backends = [("sqlite", sqlite_store()), ("postgresql", postgres_store(args.pg_url))]
    for backend, context in backends:
        with context as url:
            store = Store(url)
            if backend == "postgresql":
                with store.engine.connect() as conn:
                    version = conn.execute(sa.text("SHOW server_version")).scalar()
                    sync = conn.execute(sa.text("SHOW synchronous_commit")).scalar()
                print(f"(postgresql {version}, synchronous_commit={sync})")
            for n_metrics in args.metrics:
                # Alternate the two writers so that a burst of load on the machine (fsync
                # latency varies) hits both alike; report medians.
                sinks, naives, ceilings = [], [], []
                for _ in range(args.repeat):
                    sinks.append(sink_rows_per_s(store, args.steps, n_metrics))
                    naives.append(naive_rows_per_s(store, args.naive_rows, n_metrics))
                    ceilings.append(driver_ceiling(store, args.steps, args.naive_rows, n_metrics))
                sink, naive = statistics.median(sinks), statistics.median(naives)
                ceiling = statistics.median(ceilings)
                ratio = sink / naive
                worst = min(worst, ratio) if n_metrics == args.metrics[0] else worst
                print(
                    f"{backend:<11} {n_metrics:>9} {sink:>12,.0f} {naive:>13,.0f} {ratio:>6.1f}x"
                    f" {ceiling:>14.1f}x"
                )
    verdict = "met" if worst >= GOAL else "NOT met"
    print(
        f"goal: sink >= {GOAL:.0f}x naive at {args.metrics[0]} rows/step on both backends: "
        f"{verdict} (worst {worst:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
