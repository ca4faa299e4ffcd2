"""What a sweep of many short runs costs outside the trainer: `dapo sweep --grid` of N 2-step runs.

One `dapo sweep --preset tiny --arms grpo --grid algo.clip_high=...` (the base arm plus N - 1
grid points, 2 rollout steps each, 2 at a time on this machine's Ray) into a temporary store
and runs directory, with its own temporary Prefect server (the one `dapo sweep` starts; the
shared Prefect home, so its database is warm). While it runs, this script

- reads the sweep's progress lines as they arrive (each one's arrival time), and
- samples the resident memory of the Prefect server process the sweep started (the driver's
  child running `flows.local_server`) and of the driver itself, every SAMPLE_S.

Then, from the store's run rows (started_at: the attempt claimed; finished_at: marked
completed; wall_s: train()'s own time inside the actor), each run's cycle on its slot: from
the moment its slot was free (the previous run on that slot finished, or the sweep row was
created) to its finish. Orchestration of a run = cycle - wall_s, split into before the claim
(Prefect subflow, the arm's checks, Ray's placement check) and after it (the actor, the
store's writes, marking it completed). Progress latency = a run's "completed" line's arrival
minus the store's finished_at. Finally it checks that `dapo table`, the dashboard's sweeps
listing (db.ablation.list_sweeps) and the sweep's own lines all count N runs.

Usage: .venv/bin/python bench/bench_grid.py [--runs 16] [--steps 2] [--slots 2]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SAMPLE_S = 0.5
BASE_ARM = "grpo"
GRID_KEY = "algo.clip_high"
# The 150-step demo ladder (`make demo`: six arms, one seed, 2 at a time) took 6 min 52 s on
# 2026-11-25 (bench/RESULTS.md, "Orchestration"): the wall time the goal's 10% is of.
DEMO_WALL_S = 412.0
DEMO_RUNS = 6


def grid_values(runs: int) -> list[str]:
    """N - 1 values of clip_high next to grpo's 0.2 (the base arm is the N-th run)."""
    return [f"{0.2 + 0.001 * i:.3f}" for i in range(1, runs)]


@dataclass
class Watch:
    """What the sampler and the line reader saw while the sweep ran."""

    lines: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), line)
    server_rss: list[tuple[float, int]] = field(default_factory=list)  # (t, bytes)
    driver_rss: list[tuple[float, int]] = field(default_factory=list)
    server_pid: int | None = None


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def server_child(parent: int) -> int | None:
    """The temporary Prefect server the driver `parent` started (flows/local_server.py passes
    `--parent PID`): found by its command line, never guessed by name alone."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"flows.local_server" in argv and str(parent).encode() in argv:
            return int(entry.name)
    return None


def sample(proc: subprocess.Popen[str], watch: Watch) -> None:
    while proc.poll() is None:
        now = time.time()
        if watch.server_pid is None:
            watch.server_pid = server_child(proc.pid)
        if watch.server_pid is not None and (rss := rss_bytes(watch.server_pid)) is not None:
            watch.server_rss.append((now, rss))
        if (rss := rss_bytes(proc.pid)) is not None:
            watch.driver_rss.append((now, rss))
        time.sleep(SAMPLE_S)


def run_sweep(
    runs: int,
    steps: int,
    work: Path,
    extra: list[str],
    *,
    echo: bool,
    phases: Path | None,
    heartbeats: bool = False,
) -> tuple[Watch, float, float]:
    env = {
        **os.environ,
        "DAPO_DB_URL": f"sqlite:///{work / 'dapo.db'}",
        "DAPO_RUNS_DIR": str(work / "runs"),
    }
    for private in ("RAY_ADDRESS", "PREFECT_API_URL"):  # the sweep's own Ray and Prefect server
        env.pop(private, None)
    if heartbeats:  # Prefect's default heartbeats, which `dapo sweep` turns off (the baseline)
        env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] = "180"
    if phases is not None:  # the same command, in a process that times the phases
        env[PHASE_FILE_ENV] = str(phases)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--traced-child"]
    else:
        cmd = [str(Path(sys.executable).parent / "dapo")]
    cmd += ["sweep", "--preset", "tiny"]
    cmd += ["--arms", BASE_ARM, "--grid", f"{GRID_KEY}={','.join(grid_values(runs))}"]
    cmd += ["--steps", str(steps), "--name", f"bench grid {runs}", *extra]
    watch = Watch()
    t0 = time.time()
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    sampler = threading.Thread(target=sample, args=(proc, watch), daemon=True)
    sampler.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        watch.lines.append((time.time(), line.rstrip("\n")))
        if echo:  # the sweep's own lines as they come (its [h:mm:ss] stamps included)
            print(line, end="", flush=True)
    proc.wait()
    end = time.time()
    sampler.join()
    if proc.returncode != 0:
        tail = "\n".join(line for _, line in watch.lines[-40:])
        sys.exit(f"dapo sweep failed ({proc.returncode}):\n{tail}")
    return watch, t0, end


def cycles(runs: Any, start: float, slots: int) -> list[dict[str, float]]:
    """Each run's cycle on its slot: runs in claim order, each on the slot that became free
    last before its claim (the one its thread took it on), from that moment to its finish."""
    free = [start] * slots
    out = []
    for _, run in runs.sort_values("started_at").iterrows():
        began, done = run["started_at"].timestamp(), run["finished_at"].timestamp()
        ready = [i for i in range(slots) if free[i] <= began] or [
            min(range(slots), key=free.__getitem__)
        ]
        slot = max(ready, key=free.__getitem__)
        wall = float(run["wall_s"])
        out.append(
            {
                "run_id": int(run["run_id"]),
                "cycle_s": done - free[slot],
                "train_s": wall,
                "orch_s": done - free[slot] - wall,
                "before_claim_s": began - free[slot],
                "after_claim_s": done - began - wall,
                "finished_at": done,
            }
        )
        free[slot] = done
    return out


def stats_of(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 3),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "max": round(ordered[-1], 3),
        "mean": round(statistics.fmean(ordered), 3),
    }


def listing_counts(url: str, sweep_id: int) -> dict[str, int]:
    """Runs that `dapo table` (CSV), the dashboard's sweeps listing and the store show."""
    import csv

    from db import ablation
    from db.engine import get_engine

    table = subprocess.run(
        [
            *(str(Path(sys.executable).parent / "dapo"), "table", "--sweep", str(sweep_id)),
            *("--store", url, "--format", "csv"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = list(csv.DictReader(io.StringIO(table)))
    listed = ablation.list_sweeps(get_engine(url), sweep_id).iloc[0]
    return {
        "dapo_table_rows": len(rows),
        "sweeps_listing_runs_done": int(listed["runs_done"]),
        "sweeps_listing_arms_total": int(listed["arms_total"]),
    }


# --- where a run's orchestration goes (--phases) --------------------------------------------
# Functions the sweep's driver calls for every run, timed in place (module attributes the
# callers look up at call time). A run's seconds outside train() split as:
#   run_child - run_arm            Prefect: the arm's subflow (create, states, logs, result)
#   plan_arm                       the arm's checks (store reads, its config, Ray's placement)
#   claim_arm + start_arm          the claim transaction, the "about to train" line
#   train_in_ray - run_training    Prefect: the training task (create, states)
#   run_training - wall_s          Ray: the pooled actor's call, its placement, the result
#   finish_arm                     the store's completion writes, the "completed" line
PHASES = {
    "flows.sweep": ["run_child", "publish_sweep"],
    "flows.arm": ["run_arm", "plan_arm", "claim_arm", "start_arm", "finish_arm", "train_in_ray"],
    "flows.ray_worker": ["run_training", "place_arm"],
    "flows.checks": ["arm_in_sweep", "check_inputs"],
}
PHASE_FILE_ENV = "BENCH_GRID_PHASES"


def _traced_child(argv: list[str]) -> int:
    """`dapo sweep` in this process with PHASES timed; the times go to $BENCH_GRID_PHASES."""
    import functools
    import importlib

    from dapo_lab.cli import main as dapo_main
    from flows.commands import prepare_terminal

    prepare_terminal()  # before Prefect is imported, as `dapo sweep` does
    times: list[tuple[str, str, float]] = []  # (thread, phase, seconds)
    lock = threading.Lock()

    def timed(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    times.append((threading.current_thread().name, name, time.perf_counter() - t0))

        return wrapper

    for module_name, names in PHASES.items():
        module = importlib.import_module(module_name)
        for name in names:
            setattr(module, name, timed(name, getattr(module, name)))
    try:
        return dapo_main(argv)
    finally:
        Path(os.environ[PHASE_FILE_ENV]).write_text(json.dumps(times))


def phase_report(path: Path, train_s: list[float]) -> dict[str, Any]:
    """Per-run medians of the phases (and of the differences that are Prefect's and Ray's)."""
    times = json.loads(path.read_text())
    by: dict[str, list[float]] = {}
    for _, name, seconds in times:
        by.setdefault(name, []).append(seconds)
    out: dict[str, Any] = {
        name: {"n": len(v), "median_s": round(statistics.median(v), 3), "sum_s": round(sum(v), 1)}
        for name, v in sorted(by.items())
    }
    pairs = {
        "prefect_subflow (run_child - run_arm)": ("run_child", "run_arm"),
        "prefect_task (train_in_ray - run_training)": ("train_in_ray", "run_training"),
    }
    by["wall_s"] = train_s
    # A difference's per-run mean is exact from the sums (the calls are not paired by run here).
    for label, (outer, inner) in {
        **pairs,
        "ray_call (run_training - wall_s)": ("run_training", "wall_s"),
    }.items():
        if outer in by and inner in by and len(by[outer]) == len(by[inner]):
            out[label] = {"mean_s": round((sum(by[outer]) - sum(by[inner])) / len(by[outer]), 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=16, help="runs in the grid (base + points)")
    parser.add_argument("--steps", type=int, default=2, help="rollout steps per run")
    parser.add_argument("--slots", type=int, default=2, help="runs at once (Ray's CPUs here)")
    parser.add_argument("--keep", action="store_true", help="keep the store and runs (printed)")
    parser.add_argument("--echo", action="store_true", help="print the sweep's lines as they come")
    parser.add_argument(
        "--heartbeats",
        action="store_true",
        help="Prefect's flow run heartbeats on (180 s), as before `dapo sweep` turned them off",
    )
    parser.add_argument(
        "--phases", action="store_true", help="also time each run's phases (see PHASES)"
    )
    parser.add_argument("extra", nargs="*", help="more `dapo sweep` arguments (after --)")
    args = parser.parse_args()

    from dapo_core.models import tiny_model_dir
    from dapo_core.setup.ladders import paper_ladder
    from db import reads
    from db.engine import get_engine

    tiny_model_dir(paper_ladder().config(BASE_ARM, "tiny").model)  # warm start cached, untimed
    (ROOT / ".cache").mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-grid-", dir=ROOT / ".cache")
    work = Path(tmp)
    load0 = os.getloadavg()
    phases = work / "phases.json" if args.phases else None
    watch, t0, t_end = run_sweep(
        args.runs,
        args.steps,
        work,
        args.extra,
        echo=args.echo,
        phases=phases,
        heartbeats=args.heartbeats,
    )
    url = f"sqlite:///{work / 'dapo.db'}"
    engine = get_engine(url)
    sweep_id = int(reads.latest_sweep_id(engine) or 0)
    sweep = reads.sweep_details(engine, sweep_id)
    runs = reads.runs_of_sweep(engine, sweep_id)
    done = runs[runs["status"] == "completed"]
    created = sweep["created_at"].timestamp() if hasattr(sweep["created_at"], "timestamp") else t0
    per_run = cycles(done, created, args.slots)

    # A run's "completed" line against the store's finished_at: how late the screen is.
    by_id = {r["run_id"]: r for r in per_run}
    latency = []
    for at, line in watch.lines:
        words = line.split()
        if "completed:" in words and "run" in words:
            run_id = int(words[words.index("run") + 1])
            if run_id in by_id:
                latency.append(at - by_id[run_id]["finished_at"])
    gaps = [b[0] - a[0] for a, b in zip(watch.lines, watch.lines[1:], strict=False)]
    first_line_at = watch.lines[0][0] if watch.lines else t0
    last_finish = max((r["finished_at"] for r in per_run), default=created)
    wall = t_end - t0
    train_sum = float(done["wall_s"].sum())
    orch = [r["orch_s"] for r in per_run]
    counts = listing_counts(url, sweep_id)
    completed_lines = sum(1 for _, line in watch.lines if " completed: " in line)
    server_peak = max((b for _, b in watch.server_rss), default=0)
    report = {
        "runs": args.runs,
        "steps": args.steps,
        "completed": len(done),
        "load_avg_before": [round(x, 2) for x in load0],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(wall, 1),
        "start_s (process start -> sweep row)": round(created - t0, 1),
        "runs_s (sweep row -> last run finished)": round(last_finish - created, 1),
        "end_s (last run finished -> process exit)": round(t_end - last_finish, 1),
        "train_s_sum": round(train_sum, 1),
        "train_s_per_run": stats_of([r["train_s"] for r in per_run]),
        "orchestration_s_per_run": stats_of(orch),
        "orchestration_before_claim_s": stats_of([r["before_claim_s"] for r in per_run]),
        "orchestration_after_claim_s": stats_of([r["after_claim_s"] for r in per_run]),
        "orchestration_s_per_run_aggregate": round(
            ((last_finish - created) * args.slots - train_sum) / max(1, len(per_run)), 3
        ),
        "demo_ladder_share_at_median": round(
            statistics.median(orch) * DEMO_RUNS / args.slots / DEMO_WALL_S, 4
        ),
        "orch_first_quarter_vs_last_quarter_median": [
            round(statistics.median(orch[: max(1, len(orch) // 4)]), 3),
            round(statistics.median(orch[-max(1, len(orch) // 4) :]), 3),
        ],
        "prefect_server_pid": watch.server_pid,
        "prefect_server_rss_mib": {
            "first": round(watch.server_rss[0][1] / 2**20) if watch.server_rss else None,
            "peak": round(server_peak / 2**20),
            "last": round(watch.server_rss[-1][1] / 2**20) if watch.server_rss else None,
            "samples": len(watch.server_rss),
        },
        "driver_rss_mib_peak": round(max((b for _, b in watch.driver_rss), default=0) / 2**20),
        "progress_lines": len(watch.lines),
        "progress_completed_lines": completed_lines,
        "progress_latency_s": stats_of(latency) if latency else None,
        "progress_max_gap_s (first line -> end)": round(max(gaps, default=0.0), 1),
        "first_line_after_s": round(first_line_at - t0, 1),
        **counts,
    }
    if phases is not None:
        report["phases"] = phase_report(phases, [float(w) for w in done["wall_s"]])
    print("\n".join(line for _, line in watch.lines[-6:]))
    print(json.dumps(report, indent=2))
    ok = counts["dapo_table_rows"] == counts["sweeps_listing_runs_done"] == len(done) == args.runs
    print(
        f"\n{args.runs} runs of {args.steps} steps, {args.slots} at a time: wall {wall:.0f} s; "
        f"orchestration per run median {statistics.median(orch):.2f} s (goal <= 1.0), "
        f"{100 * report['demo_ladder_share_at_median']:.1f}% of the demo ladder's wall "
        f"(goal <= 10%); Prefect server RSS peak {server_peak / 2**20:.0f} MiB (goal < 1024); "
        f"all runs listed: {ok}"
    )
    if args.keep:
        print(f"kept: {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--traced-child"]:
        sys.exit(_traced_child(sys.argv[2:]))
    main()
