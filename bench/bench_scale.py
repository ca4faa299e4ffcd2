"""The store and the dashboard at 10M metric rows: does a page cost what it shows, not what is stored?

    .venv/bin/python bench/bench_scale.py [--backend postgresql|sqlite|both] [--metric-rows 10000000]
        [--sweeps 100] [--small-sweeps 10] [--repeat 20] [--keep] [--reuse]
        [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

Two synthetic stores per backend with the production schema (the Alembic migrations, opened
through db.engine): a big one of `--sweeps` sweeps and a small one of `--small-sweeps`, with
the same shape per sweep: 6 arms x 3 seeds = 18 runs, 43 metric names (dapo_common.metric_names)
x `--metric-rows / (sweeps * 18 * 43)` rollout steps (130 at the default 10M), 4 samples per
step (1M samples at the default), and an evaluation (held-out, k = 4, 32 problems with their
per-problem counts) at step 0 and every 10 steps.

How rows are written (honestly): sweeps and runs go through the real writer, db.store.Store
(create_sweep, resume_attempt, end_attempt: so the per-run summaries written at run end are written
by the code a real run takes, refresh_sweep_status). Metric, sample and evaluation rows are
bulk-loaded, of exactly the shape db.sink.SqlSink writes (its `_sample_row` is used to shape
samples): PostgreSQL through COPY, SQLite through one executemany per sweep of a plain INSERT
(the sink's upsert would do the same work on an empty table, 10M times slower through one
transaction per step). Values are seeded and deterministic.

What is timed, in one process, alternating big and small so that load on the shared machine hits
both alike: `dapo table` and `dapo table --mechanisms` (the command's own function, db.cli
cmd_table, with its engine opened afresh each time as a new process would; Python's start-up is
not in it), the curves read of an 18-run sweep (db.reads.metric_curves of the page's default
metrics, full and downsampled), and every dashboard page in the real Streamlit app driven by
headless Chromium (dashboard.browser), timed from navigation to the page's asserted content.
Each figure is the median and p95 of `--repeat` loads after a first one, which is reported on
its own ("1st": a fresh Streamlit process, db.ablation's memo of ended sweeps still empty); 20
loads by default: the p95 of n loads is the ceil(0.95 n)-th fastest, so below 20 it is simply
the slowest. The ratio big / small of the p95 is the figure that says whether cost grows with
what is stored. The dashboard's memory is the Streamlit process's peak RSS (VmHWM) after every
page was loaded `--repeat` times on the big store. Pages are timed on the browser's clock
(dashboard.browser.Page.time_to: from the document's navigation start to the first look, every
50 ms in the page, that finds the page's text).

Goals (issue 27): every page and table <= 1.5 s p95 on PostgreSQL at 10M rows and <= 1.3x the
10-sweep figure; dashboard RSS <= 1 GiB. Databases it creates are dropped unless --keep.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dapo_common import metric_names as M  # noqa: E402
from db import engine as db_engine  # noqa: E402
from db import reads  # noqa: E402
from db.models import EVALUATIONS, SAMPLES  # noqa: E402
from db.store import Store  # noqa: E402

ARMS = ("grpo", "overlong_filter", "clip_higher", "soft_punish", "token_loss", "dapo")
ADDS = (
    "naive GRPO",
    "truncated samples masked",
    "decoupled clip",
    "soft overlong punishment",
    "token-level loss",
    "dynamic sampling",
)
SEEDS = (0, 1, 2)
NAMES = sorted(
    v
    for k, v in vars(M).items()
    if k.isupper() and isinstance(v, str) and "/" in v and not v.endswith("/") and k != "X_AXES"
)[:43]
SAMPLES_PER_STEP = 4
EVAL_EVERY = 10
N_PROBLEMS = 32
PAGE_TIMEOUT_S = 120.0
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def arm_config(arm: str, seed: int) -> dict[str, Any]:
    """A run config that changes one flag per rung, as a ladder's arms do."""
    at = ARMS.index(arm)
    return {
        "algo": {
            "clip_low": 0.2,
            "clip_high": 0.28 if at >= 2 else 0.2,
            "loss_agg": "token-mean" if at >= 4 else "seq-mean-token-mean",
            "overlong_filter": at >= 1,
            "soft_punish": at >= 3,
            "dynamic_sampling": at >= 5,
        },
        "data": {"eval_every": EVAL_EVERY},
        "rollout": {"group_size": SAMPLES_PER_STEP},
        "run": {"seed": seed, "samples_per_step": SAMPLES_PER_STEP},
    }


def metric_value(rng: random.Random, name_at: int, arm_at: int, step: int, steps: int) -> float:
    """A curve: a per-name level, a trend with the arm and the step, and noise."""
    progress = step / steps
    return (name_at + 1) * 0.1 + 0.05 * arm_at * progress + rng.gauss(0.0, 0.02)


def _copy_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "")


def _copy_field(value: Any) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, (dict, list)):
        return _copy_escape(json.dumps(value))
    return _copy_escape(str(value))


class Rows:
    """The bulk rows of one run, shaped as db.sink.SqlSink writes them."""

    def __init__(self, run_id: int, arm: str, seed: int, steps: int, sink_shape: Any) -> None:
        rng = random.Random(run_id * 7919 + seed)
        arm_at = ARMS.index(arm)
        self.metrics = [
            (run_id, step, name, metric_value(rng, i, arm_at, step, steps))
            for step in range(1, steps + 1)
            for i, name in enumerate(NAMES)
        ]
        self.samples = []
        for step in range(1, steps + 1):
            for idx in range(SAMPLES_PER_STEP):
                correct = rng.random() < 0.3 + 0.05 * arm_at
                truncated = rng.random() < 0.05
                penalty = -0.5 if truncated else 0.0
                score = 1.0 if correct else -1.0
                a, b = rng.randint(2, 99), rng.randint(2, 99)
                sample = {
                    "prompt": f"What is {a} + {b}? Think step by step, then end with 'Answer: N'.",
                    "response": f"{a} plus {b}: first the tens, then the ones.\n"
                    + "Let me check that once more. " * rng.randint(1, 4)
                    + f"\nAnswer: {a + b if correct else a + b + 1}",
                    "ground_truth": str(a + b),
                    "pred": str(a + b if correct else a + b + 1),
                    "reward": score + penalty,
                    "score": score,
                    "overlong_penalty": penalty,
                    "correct": correct,
                    "length": rng.randint(20, 200),
                    "truncated": truncated,
                    "group": 0,
                    "member": idx,
                    "advantage": rng.gauss(0.0, 1.0),
                }
                self.samples.append(sink_shape(step, idx, sample))
        self.evaluations = []
        for step in range(0, steps + 1, EVAL_EVERY):
            per_problem = [rng.randint(0, 4) for _ in range(N_PROBLEMS)]
            avg = sum(per_problem) / (4 * N_PROBLEMS) + 0.01 * arm_at * step / steps
            self.evaluations.append(
                {
                    "run_id": run_id,
                    "dataset": "heldout",
                    "k": 4,
                    "step": step,
                    "avg_at_k": min(avg, 1.0),
                    "pass_at_k": sum(c > 0 for c in per_problem) / N_PROBLEMS,
                    "cons_at_k": None,
                    "n_problems": N_PROBLEMS,
                    "extra": {"correct_per_problem": per_problem},
                    "created_at": "2026-11-25 00:00:00+00",
                }
            )


def _sink_shape(store: Store, run_id: int) -> Callable[[int, int, dict[str, Any]], dict[str, Any]]:
    """SqlSink._sample_row of the run's sink: the exact row the sink writes for a sample."""
    sink = store.sink(run_id)
    sink.close()
    return sink._sample_row


def _bulk_postgres(engine: sa.Engine, batch: list[Rows]) -> None:
    raw = engine.raw_connection()
    try:
        conn = raw.driver_connection
        assert conn is not None
        with conn.cursor() as cur:
            with cur.copy("COPY metrics (run_id, step, name, value) FROM STDIN") as copy:
                for rows in batch:
                    copy.write("".join(f"{r}\t{s}\t{n}\t{v!r}\n" for r, s, n, v in rows.metrics))
            columns = [c.name for c in SAMPLES.columns]
            with cur.copy(f"COPY samples ({', '.join(columns)}) FROM STDIN") as copy:
                for rows in batch:
                    copy.write(
                        "".join(
                            "\t".join(_copy_field(s[c]) for c in columns) + "\n"
                            for s in rows.samples
                        )
                    )
            columns = [c.name for c in EVALUATIONS.columns]
            with cur.copy(f"COPY evaluations ({', '.join(columns)}) FROM STDIN") as copy:
                for rows in batch:
                    copy.write(
                        "".join(
                            "\t".join(_copy_field(e[c]) for c in columns) + "\n"
                            for e in rows.evaluations
                        )
                    )
        conn.commit()
    finally:
        raw.close()


def _bulk_sqlite(engine: sa.Engine, batch: list[Rows]) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO metrics (run_id, step, name, value) VALUES (?, ?, ?, ?)",
            [m for rows in batch for m in rows.metrics],
        )
        conn.execute(sa.insert(SAMPLES), [s for rows in batch for s in rows.samples])
        evals = [{**e, "created_at": db_engine_utc()} for rows in batch for e in rows.evaluations]
        conn.execute(sa.insert(EVALUATIONS), evals)


def db_engine_utc() -> Any:
    from db.models import utcnow

    return utcnow()


def build(url: str, sweeps: int, steps: int) -> dict[str, Any]:
    """Fill the store at `url` (empty, migrated on open) with `sweeps` sweeps; returns counts."""
    store = Store(url, outage_s=0.0)
    engine = store.engine
    postgres = engine.dialect.name == "postgresql"
    ladder = [
        {"arm": a, "adds": d, "paper_score": None, "parent": ARMS[i - 1] if i else None}
        for i, (a, d) in enumerate(zip(ARMS, ADDS, strict=True))
    ]
    started = time.perf_counter()
    for s in range(sweeps):
        sweep_id = store.create_sweep(
            name=f"scale-{s}",
            preset="tiny",
            arms=ARMS,
            seeds=SEEDS,
            base_config=arm_config("grpo", 0),
            ladder=ladder,
        )
        store.set_sweep_status(sweep_id, "running")
        batch, run_ids = [], []
        for arm in ARMS:
            for seed in SEEDS:
                run_id = store.resume_attempt(
                    sweep_id=sweep_id,
                    arm=arm,
                    seed=seed,
                    config=arm_config(arm, seed),
                    config_hash=f"{arm}-{seed}",
                    after=None,  # a new sweep: the first attempt of each (arm, seed)
                    resume_step=None,
                    checkpoint_dir=f"/bench/sweep{sweep_id}/{arm}-s{seed}",
                ).run_id
                run_ids.append(run_id)
                batch.append(Rows(run_id, arm, seed, steps, _sink_shape(store, run_id)))
        (_bulk_postgres if postgres else _bulk_sqlite)(engine, batch)
        for run_id in run_ids:
            store.end_attempt(
                run_id,
                "completed",
                steps=steps,
                grad_updates=steps * 4,
                tokens=steps * 60_000,
                wall_s=steps * 2.5,
            )
        store.refresh_sweep_status(sweep_id)
        if (s + 1) % 10 == 0:
            print(f"  {s + 1}/{sweeps} sweeps, {time.perf_counter() - started:.0f} s", flush=True)
    if postgres:
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    return counts(engine) | {"build_s": time.perf_counter() - started}


def counts(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {
            t: int(conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar() or 0)
            for t in ("sweeps", "runs", "metrics", "samples", "evaluations")
        }


# --- timing ---------------------------------------------------------------------------------


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return {"median": statistics.median(ordered), "p95": p95, "n": len(ordered)}


def cli_table(url: str, sweep_id: int, *extra: str) -> Callable[[], None]:
    """`dapo table` as the command runs it (db.cli.cmd_table), engine opened afresh each time."""
    from db import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["table", "--store", url, "--sweep", str(sweep_id), *extra])

    def run() -> None:
        db_engine.dispose(url)
        with contextlib.redirect_stdout(io.StringIO()):
            assert args.func(args) == 0

    return run


def curves_read(url: str, sweep_id: int, max_points: int | None) -> Callable[[], None]:
    """The curves page's training-metric read of one sweep's 18 runs (its default metrics)."""
    engine = db_engine.get_engine(url)
    run_ids = [int(r) for r in reads.runs_of_sweep(engine, sweep_id)["run_id"]]
    names = [*M.HEADLINE[:4], M.GRAD_UPDATES]

    def run() -> None:
        kwargs = {} if max_points is None else {"max_points": max_points}
        frame = reads.metric_curves(engine, run_ids, names=names, **kwargs)
        assert not frame.empty

    return run


def _downsampled(url: str, sweep_id: int) -> dict[str, Callable[[], None]]:
    """The downsampled curves read, where db.reads has one (max_points)."""
    import inspect

    if "max_points" not in inspect.signature(reads.metric_curves).parameters:
        return {}
    return {"curves read, 18 runs, max_points=500": curves_read(url, sweep_id, 500)}


def _store_reads(url: str, sweep_id: int) -> dict[str, Callable[[], None]]:
    """The reads behind every page's sweep picker and the sweeps page, and the metric names of
    a sweep (summaries for ended runs, where db has them)."""
    from db import ablation

    engine = db_engine.get_engine(url)
    run_ids = [int(r) for r in reads.runs_of_sweep(engine, sweep_id)["run_id"]]
    out = {
        "list_sweeps (sweeps page, every sweep's table)": lambda: ablation.list_sweeps(engine),
        "metric_names of 18 runs": lambda: reads.metric_names(engine, run_ids),
    }
    if hasattr(ablation, "sweep_choices"):
        out["sweep_choices (every page's sweep picker)"] = lambda: ablation.sweep_choices(engine)
    return out  # type: ignore[return-value]


def pages(sweep_id: int, run_id: int, other_run: int) -> list[tuple[str, str, list[str]]]:
    """(label, path, text that says the page's data is on the screen)."""
    return [
        ("ablation", f"/?sweep={sweep_id}&live=0", ["Ablation ladder", "token_loss", "leads"]),
        ("sweeps", "/sweeps?live=0", ["sweep(s)", "The best arm is named only"]),
        ("curves", f"/curves?sweep={sweep_id}", ["seed(s) per arm: line = mean"]),
        ("mechanisms", f"/mechanisms?sweep={sweep_id}", ["Each arm's signature", "Every metric"]),
        ("grid", f"/grid?sweep={sweep_id}", ["is not a grid"]),
        ("rollouts", f"/rollouts?run={run_id}", ["samples ·", "mean reward"]),
        ("run", f"/run?run={run_id}", ["Attempts of this arm"]),
        ("compare", f"/compare?a={run_id}&b={other_run}", ["Curves across sweeps"]),
    ]


def load_page(page: Any, url: str, needles: list[str]) -> float:
    """Seconds from navigation to `needles` on the screen (from a blank page, so that the last
    page's text cannot answer): the browser's own clock, from the document's navigation start
    to the first look that found them (the page looks every browser.WATCH_MS; until
    2026-11-26 this process fetched the whole page's HTML every 0.2 s instead, which rounded
    each figure up by as much)."""
    page.goto("about:blank")
    end = time.monotonic() + 10
    while "Ablation" in page.text() and time.monotonic() < end:
        time.sleep(0.05)
    page.goto(url)
    return float(page.time_to(needles, timeout_s=PAGE_TIMEOUT_S))


def rss(pid: int) -> dict[str, float]:
    """The process's current and peak resident memory, MiB (Linux /proc)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def measure(urls: dict[str, str], repeat: int, browser_on: bool) -> dict[str, Any]:
    """Every figure on every store, loads alternating between the stores."""
    results: dict[str, Any] = {label: {} for label in urls}
    ids: dict[str, tuple[int, int, int]] = {}
    for label, url in urls.items():
        engine = db_engine.get_engine(url)
        sweep_id = int(reads.latest_sweep_id(engine) or 0)
        runs = reads.runs_of_sweep(engine, sweep_id)
        ids[label] = (sweep_id, int(runs["run_id"].iloc[0]), int(runs["run_id"].iloc[1]))
    probes: dict[str, dict[str, Callable[[], None]]] = {
        label: {
            "dapo table": cli_table(url, ids[label][0]),
            "dapo table --mechanisms": cli_table(url, ids[label][0], "--mechanisms"),
            "curves read, 18 runs, full": curves_read(url, ids[label][0], None),
            **_downsampled(url, ids[label][0]),
            **_store_reads(url, ids[label][0]),
        }
        for label, url in urls.items()
    }
    # This process holds far more than a `dapo table` process would (both stores' frames, the
    # libraries of every probe): a full garbage collection over that heap landed in whichever
    # probe triggered it (a call of 150-185 ms against 80-110) and made its p95. Frozen, the
    # collector walks only what the probes create, as it would in the command's own process.
    gc.collect()
    gc.freeze()
    for probe in next(iter(probes.values())):
        times: dict[str, list[float]] = {label: [] for label in urls}
        for _ in range(repeat + 1):  # the first of each is a warm-up, not counted
            for label in urls:
                started = time.perf_counter()
                probes[label][probe]()
                times[label].append(time.perf_counter() - started)
        for label in urls:
            results[label][probe] = summary(times[label][1:]) | {"first": times[label][0]}
    if browser_on:
        results = _measure_pages(urls, ids, repeat, results)
    return results


def _measure_pages(
    urls: dict[str, str], ids: dict[str, tuple[int, int, int]], repeat: int, results: Any
) -> Any:
    from dashboard import browser

    exe = browser.find_browser()
    if exe is None:
        print("no Chromium: dashboard pages not measured", file=sys.stderr)
        return results
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        servers, bases = {}, {}
        for label, url in urls.items():
            log = stack.enter_context(open(work / f"{label}.log", "wb"))
            bases[label] = stack.enter_context(browser.served(url, cwd=work, log=log))
        page = stack.enter_context(browser.open_page(exe))
        for label, base in bases.items():
            servers[label] = _server_pid(base)
        plan = {label: pages(*ids[label]) for label in urls}
        for i, (name, _, _) in enumerate(next(iter(plan.values()))):
            times: dict[str, list[float]] = {label: [] for label in urls}
            for _ in range(repeat + 1):
                for label, base in bases.items():
                    _, path, needles = plan[label][i]
                    times[label].append(load_page(page, base + path, needles))
            for label in urls:
                results[label][f"page {name}"] = summary(times[label][1:]) | {
                    "first": times[label][0]
                }
        for label in urls:
            results[label]["dashboard RSS MiB"] = rss(servers[label])
    return results


def _server_pid(base: str) -> int:
    """The pid of the Streamlit server listening on `base`'s port (a child of this process)."""
    port = int(base.rsplit(":", 1)[1])
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inode = fields[9]
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            if f"PPid:\t{me}" not in Path(f"/proc/{pid}/status").read_text():
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return int(pid)
    raise RuntimeError(f"no Streamlit process of ours listens on port {port}")


# --- stores -----------------------------------------------------------------------------------


@contextlib.contextmanager
def pg_database(server_url: str, name: str, keep: bool, reuse: bool) -> Iterator[tuple[str, bool]]:
    """A PostgreSQL database `name` on the server of `server_url`: (its URL, already filled)."""
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    url = server_url.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as conn:
        exists = conn.execute(
            sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
        ).first()
        if exists and not reuse:
            conn.exec_driver_sql(f'DROP DATABASE "{name}"')
        if not exists or not reuse:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield url, bool(exists and reuse)
    finally:
        db_engine.dispose(url)
        if not keep:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@contextlib.contextmanager
def sqlite_file(directory: Path, name: str, keep: bool, reuse: bool) -> Iterator[tuple[str, bool]]:
    path = directory / f"{name}.db"
    there = path.exists() and reuse
    if path.exists() and not reuse:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    url = f"sqlite:///{path}"
    try:
        yield url, there
    finally:
        db_engine.dispose(url)
        if not keep:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)


def report(backend: str, built: dict[str, Any], results: dict[str, Any]) -> None:
    big, small = results["big"], results["small"]
    print(f"\n## {backend}")
    for label in ("big", "small"):
        print(f"{label}: {built[label]}")
    print(
        f"{'figure':46s} {'big med':>8s} {'big p95':>8s} {'small p95':>9s} {'p95 ratio':>9s} "
        f"{'big 1st':>8s}"
    )
    for key in big:
        if key == "dashboard RSS MiB":
            continue
        ratio = big[key]["p95"] / small[key]["p95"]
        print(
            f"{key:46s} {big[key]['median']:8.3f} {big[key]['p95']:8.3f} "
            f"{small[key]['p95']:9.3f} {ratio:9.2f} {big[key].get('first', math.nan):8.3f}"
        )
    if "dashboard RSS MiB" in big:
        print(f"dashboard RSS MiB, big: {big['dashboard RSS MiB']}")
        print(f"dashboard RSS MiB, small: {small['dashboard RSS MiB']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    parser.add_argument("--metric-rows", type=int, default=10_000_000)
    parser.add_argument("--samples", type=int, default=1_000_000, help="at least this many")
    parser.add_argument("--sweeps", type=int, default=100)
    parser.add_argument("--small-sweeps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-browser", action="store_true", help="skip the dashboard pages")
    parser.add_argument("--keep", action="store_true", help="keep the stores (for --reuse)")
    parser.add_argument("--reuse", action="store_true", help="measure stores a --keep run left")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--sqlite-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    runs_per_sweep = len(ARMS) * len(SEEDS)
    # at least --metric-rows: the steps are rounded up
    steps = max(1, math.ceil(args.metric_rows / (args.sweeps * runs_per_sweep * len(NAMES))))
    global SAMPLES_PER_STEP
    SAMPLES_PER_STEP = max(1, math.ceil(args.samples / (args.sweeps * runs_per_sweep * steps)))
    print(
        f"{args.sweeps} sweeps x {runs_per_sweep} runs x {steps} steps x {len(NAMES)} metrics "
        f"= {args.sweeps * runs_per_sweep * steps * len(NAMES):,} metric rows, "
        f"{SAMPLES_PER_STEP} samples a step (small store: "
        f"{args.small_sweeps} sweeps); repeat {args.repeat}",
        flush=True,
    )
    backends = ("postgresql", "sqlite") if args.backend == "both" else (args.backend,)
    everything: dict[str, Any] = {}
    for backend in backends:
        with contextlib.ExitStack() as stack:
            urls, built = {}, {}
            for label, n in (("big", args.sweeps), ("small", args.small_sweeps)):
                name = f"dapo_bench_scale_{label}_{n}x{steps}"
                if backend == "postgresql":
                    url, there = stack.enter_context(
                        pg_database(args.pg_url, name, args.keep, args.reuse)
                    )
                else:
                    url, there = stack.enter_context(
                        sqlite_file(args.sqlite_dir, name, args.keep, args.reuse)
                    )
                if there:
                    started = time.perf_counter()
                    engine = db_engine.get_engine(url)  # an older store is migrated here
                    built[label] = counts(engine) | {"open_s": time.perf_counter() - started}
                else:
                    print(f"building {backend} {label} ({n} sweeps)", flush=True)
                    built[label] = build(url, n, steps)
                urls[label] = url
            results = measure(urls, args.repeat, not args.no_browser)
            report(backend, built, results)
            everything[backend] = {"stores": built, "figures": results}
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
