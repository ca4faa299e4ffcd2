"""A writer process for the store's concurrency and crash tests (run as a script, not a test).

    python tests/db_writer.py URL RUN_ID FIRST LAST N_METRICS [--wait] [--hang-at STEP]
        [--start-runs-every K]

Writes steps FIRST..LAST-1 of run RUN_ID through the real SqlSink, N_METRICS metrics per step,
with values that depend only on (run, step, metric), so a replay writes exactly the same rows.
--wait: print READY and wait for a line on stdin before writing (a start barrier).
--start-runs-every K: every K steps also claim a new attempt of arm "contended", seed 0 of the
run's sweep and end it (Store.resume_attempt: a read-then-write transaction, it reads the newest
attempt, then inserts the next; a claim that another writer's beat is planned again).
--hang-at STEP: at that step, once the INSERT has run inside the still-open transaction, print
IN_TRANSACTION and block, so that the test can SIGKILL the process mid-transaction.
Prints DONE <retries> at the end (retries: transient lock errors that were retried).
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from db import transactions
from db.store import AttemptChanged, RunHeld, Store


def metric_name(i: int) -> str:
    return f"m/{i:02d}"


def value(run_id: int, step: int, i: int) -> float:
    """Deterministic, distinct per row; every 7th is NaN (stored as NULL) to exercise that too."""
    if (step + i) % 7 == 0:
        return float("nan")
    return run_id * 1e6 + step + i / 100.0


def step_metrics(run_id: int, step: int, n_metrics: int) -> dict[str, float]:
    return {metric_name(i): value(run_id, step, i) for i in range(n_metrics)}


def claim_and_end(store: Store, sweep_id: int) -> None:
    """One attempt of the shared (arm, seed), claimed as a driver claims it and ended at once.
    Another writer may claim between this one's read and its claim (AttemptChanged), or hold
    its own attempt for the moment it takes to end it (RunHeld): read again and claim again."""
    while True:
        newest = store.latest_attempt(sweep_id, "contended", 0)
        try:
            attempt = store.resume_attempt(
                sweep_id=sweep_id,
                arm="contended",
                seed=0,
                config={},
                config_hash="c",
                after=None if newest is None else int(newest["run_id"]),
                resume_step=None,
                checkpoint_dir="",
            )
        except (AttemptChanged, RunHeld):
            continue
        store.end_attempt(attempt.run_id, "completed")
        return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("run_id", type=int)
    parser.add_argument("first", type=int)
    parser.add_argument("last", type=int)
    parser.add_argument("n_metrics", type=int)
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--hang-at", type=int, default=None)
    parser.add_argument("--start-runs-every", type=int, default=None)
    args = parser.parse_args(argv)

    retries = 0
    original = transactions.is_transient

    def counting(error: BaseException) -> bool:
        nonlocal retries
        transient = original(error)
        retries += int(transient)
        return transient

    transactions.is_transient = counting  # type: ignore[assignment]

    store = Store(args.url)
    sink = store.sink(args.run_id)
    current = {"step": -1}
    if args.hang_at is not None:
        from sqlalchemy import event

        @event.listens_for(store.engine, "after_cursor_execute")
        def _hang(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            if current["step"] == args.hang_at and statement.lstrip().upper().startswith("INSERT"):
                print("IN_TRANSACTION", flush=True)
                threading.Event().wait()  # until SIGKILL

    if args.wait:
        print("READY", flush=True)
        sys.stdin.readline()
    sweep_id = store.get_run(args.run_id)["sweep_id"]
    for step in range(args.first, args.last):
        current["step"] = step
        sink.log_metrics(step, step_metrics(args.run_id, step, args.n_metrics))
        if args.start_runs_every and step % args.start_runs_every == 0:
            claim_and_end(store, sweep_id)
    sink.close()
    print(f"DONE {retries}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
