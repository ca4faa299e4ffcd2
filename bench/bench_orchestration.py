"""What Prefect + Ray + the SQL store cost on top of training: `dapo sweep` against plain train().

1. `dapo sweep --preset tiny` (all six arms, one seed: what `make demo` runs) as a subprocess
   into a temporary store and runs directory, timed end to end (Prefect's database already
   set up, as on every run after the first).
2. The same six configs, `dapo_core.train.runner.train` called directly with a JSONL sink, two at a
   time in two plain worker processes with one torch thread each: the same concurrency as the
   sweep on this machine, with no Prefect, no Ray, no SQL store.

orchestration share = 1 − (2) / (1). The tiny model's warm start is built (cached) before
either is timed. Usage: .venv/bin/python bench/bench_orchestration.py [--steps N] [--arms ...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dapo_core.setup.ladders import paper_ladder  # noqa: E402


def _direct_one(job: tuple[str, dict[str, Any], str]) -> tuple[str, float]:
    import torch

    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.train.runner import train
    from dapo_core.train.sinks import JsonlSink

    torch.set_num_threads(1)
    arm, config, out = job
    t0 = time.perf_counter()
    with JsonlSink(out) as sink:
        train(ExperimentConfig.from_dict(config), sink=sink, out_dir=Path(out))
    return arm, time.perf_counter() - t0


def direct(
    arms: list[str], overrides: dict[str, Any], work: Path, workers: int
) -> tuple[float, dict[str, float]]:
    jobs = [
        (arm, paper_ladder().config(arm, "tiny", overrides).to_dict(), str(work / arm))
        for arm in arms
    ]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        per_arm = dict(pool.map(_direct_one, jobs, chunksize=1))
    return time.perf_counter() - t0, per_arm


def swept(arms: list[str], steps: int | None, work: Path) -> tuple[float, dict[str, float], str]:
    env = {
        **os.environ,
        "DAPO_DB_URL": f"sqlite:///{work / 'dapo.db'}",
        "DAPO_RUNS_DIR": str(work / "runs"),
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [
        str(Path(sys.executable).parent / "dapo"),
        "sweep",
        "--preset",
        "tiny",
        "--arms",
        *arms,
        "--quiet",
    ]
    if steps:
        cmd += ["--steps", str(steps)]
    t0 = time.perf_counter()
    result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if result.returncode != 0:
        sys.exit(f"dapo sweep failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    from db import reads
    from db.engine import get_engine

    runs = reads.runs_of_sweep(get_engine(env["DAPO_DB_URL"]), 1)
    return wall, dict(zip(runs["arm"], runs["wall_s"].astype(float), strict=True)), result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arms", nargs="+", default=list(paper_ladder().names))
    parser.add_argument("--steps", type=int, help="rollout steps per arm (default: the preset's)")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="direct baseline's processes"
    )
    args = parser.parse_args()
    overrides = {"run.steps": args.steps} if args.steps else {}

    from dapo_core.models import tiny_model_dir

    t0 = time.perf_counter()
    # The warm start is built and cached here, untimed.
    tiny_model_dir(paper_ladder().config("grpo", "tiny").model)
    print(f"warm start ready in {time.perf_counter() - t0:.1f} s", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-orch-", dir=ROOT / ".cache") as tmp:
        work = Path(tmp)
        sweep_wall, sweep_train, stdout = swept(args.arms, args.steps, work / "sweep")
        print(stdout, flush=True)
        direct_wall, direct_train = direct(args.arms, overrides, work / "direct", args.workers)

    share = 1.0 - direct_wall / sweep_wall
    inside = sum(sweep_train.values()) / args.workers
    report = {
        "arms": args.arms,
        "steps": args.steps,
        "sweep_wall_s": round(sweep_wall, 1),
        "sweep_train_s_sum": round(sum(sweep_train.values()), 1),
        "direct_wall_s": round(direct_wall, 1),
        "direct_train_s_sum": round(sum(direct_train.values()), 1),
        "orchestration_share_vs_direct": round(share, 3),
        "orchestration_share_inside_sweep": round(1.0 - inside / sweep_wall, 3),
        "per_arm_train_s": {
            a: [round(sweep_train.get(a, float("nan")), 1), round(direct_train[a], 1)]
            for a in args.arms
        },
    }
    print(json.dumps(report, indent=2))
    print(
        f"\n`dapo sweep` {sweep_wall:.1f} s vs direct train() {direct_wall:.1f} s "
        f"({args.workers} processes): orchestration {100 * share:.0f}% of the sweep's wall time; "
        f"inside the sweep, train() took {sum(sweep_train.values()):.1f} s of arm time "
        f"({100 * (1 - inside / sweep_wall):.0f}% of the wall time outside train())."
    )


if __name__ == "__main__":
    main()
