"""Async rollouts against sync: step time and trainer throughput of one arm, in one run.

    python bench/bench_async.py [--preset tiny] [--arm dapo] [--steps 8] [--rounds 2]
                                [--staleness 1] [--threads 2]
                                [--rollout-actor [--only-actor] [--two-nodes]]

Runs `dapo train` on the same arm, seed and steps with rollout.mode=sync and with
rollout.mode=async at max_staleness k, alternating for `rounds` rounds (sync, async, sync,
async, ...), each a fresh process with `threads` torch threads, and reads each run's own
metrics (metrics.jsonl): the mean step time after the first step (the first builds the
engines), the trainer's idle time waiting for rollouts, the trainer's throughput
(perf/train_tokens_per_s) and the realised staleness. Per mode the best round is kept: on a
shared machine other work only ever slows a round down. The ratio async/sync of the step time
is the figure: below 1 the overlap pays.

On a CPU both sides share the same cores (the worker is a thread of the trainer's process with
its own engine), so what overlaps is only what one side leaves idle; on a GPU node the rollout
engine has a device of its own and the overlap is the point. The held-out evaluations are off
(data.eval_every=0) so that both modes time only their steps.

Memory: each run's resident memory (its process and their descendants, from /proc, every half
second) gives the mode's peak and its growth over the run's last third (the last third's peak
less the middle third's): an arm that keeps what it no longer needs (old weight snapshots,
queued groups) grows there, a steady one stays near 0.

`--rollout-actor` adds two modes with the rollout engine on a Ray actor of its own
(flows/rollout_actor.py), in a local Ray of `threads` CPUs, the trainer on threads − 1 torch
threads and the engine's actor on 1 CPU (the same cores, split between two processes instead of
shared by two threads of one): `actor`, async at the same k, and `actor-sync`, sync. Their ratio
is the overlap where each side has a device of its own: in `actor-sync` the engine idles while
the trainer updates and the trainer while the engine samples, as in a sync run on a GPU node.

`--two-nodes` (with `--rollout-actor`, `threads` 2) runs the actor modes on a two-node Ray
cluster that the bench starts on this machine (tests/ray_cluster.py: two raylets of 1 CPU and
a 2 GiB object store, the second offering the `rollout` resource that the engine's actor asks
for), the trainer in
the driver's process: the engine on one node, the trainer beside the other. The nodes' own
processes are not under the driver, so the memory figures of those modes are the driver's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _dapo() -> str:
    here = Path(sys.executable).with_name("dapo")
    return str(here) if here.exists() else "dapo"


ACTOR_RUN = """
import json, os, sys
from pathlib import Path
from flows import ray_worker  # first: it binds the local Ray to loopback
from flows.rollout_actor import RolloutPlacement, host_for
from dapo_core.setup.ladders import paper_ladder
from dapo_core.train.runner import train
from dapo_core.train.sinks import JsonlSink

preset, arm, steps, k, threads, out, mode, resource = sys.argv[1:9]
ray_worker.connect(os.environ.get("RAY_ADDRESS") or "local", num_cpus=int(threads))
overrides = {"data.eval_every": 0, "run.num_threads": max(1, int(threads) - 1), "run.steps": int(steps),
             "rollout.mode": mode, "rollout.max_staleness": int(k)}
cfg = paper_ladder().config(arm, preset, overrides)
sink = JsonlSink(Path(out))
try:
    train(cfg, sink=sink, out_dir=Path(out), resume=False,
          engine_host=host_for(RolloutPlacement(1.0, resource=resource), cfg.to_dict(), wait_s=600))
finally:
    sink.close()
    ray_worker.shutdown()
"""


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` and its descendants (Linux /proc); 0 once it is gone."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        here = todo.pop()
        try:
            status = Path(f"/proc/{here}/status").read_text()
        except OSError:
            continue
        total += next(
            (
                int(line.split()[1]) * 1024
                for line in status.splitlines()
                if line.startswith("VmRSS:")
            ),
            0,
        )
        todo += children.get(here, [])
    return total


def memory_summary(samples: list[tuple[float, int]]) -> dict[str, float]:
    """Peak resident bytes, and the growth of the peak from the middle third of the run's time
    to its last third."""
    if not samples:
        return {"peak_rss": 0.0, "late_growth": 0.0}
    end = samples[-1][0]
    middle = [rss for t, rss in samples if end / 3 <= t < 2 * end / 3] or [0]
    last = [rss for t, rss in samples if t >= 2 * end / 3] or [0]
    return {
        "peak_rss": float(max(rss for _, rss in samples)),
        "late_growth": float(max(last) - max(middle)),
    }


ACTOR_MODES = {"actor": "async", "actor-sync": "sync"}
# The custom resource the second node of `--two-nodes` offers and the engine's actor asks for.
ROLLOUT_RESOURCE = "rollout"
OBJECT_STORE_BYTES = 2 * 2**30


def run_once(
    args: argparse.Namespace, mode: str, out: Path, cluster_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """One `dapo train` run (or, for `actor`, runner.train with the engine on a Ray actor);
    its metrics summarised."""
    sets = ["data.eval_every=0", f"run.num_threads={args.threads}"]
    if mode == "async":
        sets += ["rollout.mode=async", f"rollout.max_staleness={args.staleness}"]
    cmd = [_dapo(), "train", "--preset", args.preset, "--arm", args.arm, "--steps", str(args.steps)]
    cmd += ["--seed", "0", "--out", str(out), "--no-resume", "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    if mode in ACTOR_MODES:
        cmd = [sys.executable, "-c", ACTOR_RUN, args.preset, args.arm, str(args.steps)]
        cmd += [str(args.staleness), str(args.threads), str(out), ACTOR_MODES[mode]]
        cmd += [ROLLOUT_RESOURCE if cluster_env else ""]
        env = {**{k: v for k, v in env.items() if k != "RAY_ADDRESS"}, **(cluster_env or {})}
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    samples: list[tuple[float, int]] = []
    while True:
        samples.append((time.perf_counter() - started, tree_rss_bytes(proc.pid)))
        try:
            proc.wait(timeout=0.5)  # the next sample comes when this wait ends
            break
        except subprocess.TimeoutExpired:
            pass
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    rows = [json.loads(line)["metrics"] for line in (out / "metrics.jsonl").open()]
    later = rows[1:] or rows
    return {
        "wall_s": wall,
        "step_s": statistics.fmean(r["time/step_s"] for r in later),
        "trainer_idle_s": statistics.fmean(r.get("time/trainer_idle_s", 0.0) for r in later),
        "train_tokens_per_s": statistics.fmean(r["perf/train_tokens_per_s"] for r in later),
        "staleness_mean": statistics.fmean(r.get("staleness/mean", 0.0) for r in later),
        **memory_summary(samples),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--arm", default="dapo")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rollout-actor", action="store_true")
    parser.add_argument("--two-nodes", action="store_true")
    parser.add_argument("--only-actor", action="store_true", help="the actor modes alone")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.rounds < 1 or args.staleness < 0 or args.threads < 1:
        print(
            "error: --steps >= 2, --rounds >= 1, --staleness >= 0, --threads >= 1", file=sys.stderr
        )
        return 2
    if (args.two_nodes or args.only_actor) and not args.rollout_actor:
        print("error: --two-nodes and --only-actor go with --rollout-actor", file=sys.stderr)
        return 2
    if args.two_nodes and args.threads != 2:
        print("error: --two-nodes runs on 2 threads (a node of 1 CPU each side)", file=sys.stderr)
        return 2
    print(
        f"{args.preset}/{args.arm}, {args.steps} steps, async k={args.staleness} against sync, "
        f"{args.rounds} round(s), {args.threads} thread(s); {platform.processor() or platform.machine()}, "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    modes: tuple[str, ...] = () if args.only_actor else ("sync", "async")
    if args.rollout_actor:
        modes += ("actor-sync", "actor")
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    with (
        tempfile.TemporaryDirectory(prefix="bench-async-") as tmp,
        two_nodes(Path(tmp), args.two_nodes) as cluster_env,
    ):
        for r in range(args.rounds):
            for mode in modes:
                got = run_once(args, mode, Path(tmp) / f"{mode}-{r}", cluster_env)
                results[mode].append(got)
                print(
                    f"round {r + 1} {mode:10s}: step {got['step_s']:.2f} s, trainer idle "
                    f"{got['trainer_idle_s']:.2f} s/step, trainer {got['train_tokens_per_s']:.0f} "
                    f"tokens/s, staleness {got['staleness_mean']:.2f}, wall {got['wall_s']:.0f} s, "
                    f"peak RSS {got['peak_rss'] / 2**30:.2f} GiB, late growth "
                    f"{got['late_growth'] / 2**20:+.0f} MiB",
                    flush=True,
                )
    best = {mode: min(rows, key=lambda x: x["step_s"]) for mode, rows in results.items()}
    peak = {mode: max(r["peak_rss"] for r in rows) for mode, rows in results.items()}
    if "sync" in best:
        ratio = best["async"]["step_s"] / best["sync"]["step_s"]
        print(
            f"best step time: sync {best['sync']['step_s']:.2f} s, async "
            f"{best['async']['step_s']:.2f} s; async/sync {ratio:.2f} (below 1: the overlap "
            f"pays); load after {os.getloadavg()[0]:.1f}"
        )
        print(
            f"peak RSS: sync {peak['sync'] / 2**30:.2f} GiB, async {peak['async'] / 2**30:.2f} "
            f"GiB; async/sync {peak['async'] / max(peak['sync'], 1.0):.2f}"
        )
    if "actor" in best:
        where = "on the second node" if args.two_nodes else "on its own actor"
        apart = best["actor"]["step_s"] / best["actor-sync"]["step_s"]
        print(
            f"engine {where}: sync {best['actor-sync']['step_s']:.2f} s, async "
            f"{best['actor']['step_s']:.2f} s; async/sync {apart:.2f} (the overlap with the "
            f"engine apart)"
            + (
                f"; actor/sync {best['actor']['step_s'] / best['sync']['step_s']:.2f}"
                if "sync" in best
                else ""
            )
        )
    return 0


@contextlib.contextmanager
def two_nodes(root: Path, wanted: bool) -> Iterator[dict[str, str] | None]:
    """A two-node Ray cluster of 1 CPU a node on this machine (the second offering
    ROLLOUT_RESOURCE), stopped at the end; the environment a driver joins it with. None
    without `wanted`."""
    if not wanted:
        yield None
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from ray_cluster import RayCluster  # the test suite's cluster of raylets

    # With the tests' 96 MiB object store the real model's 540 MB of weights spilled to disk
    # at every push to the engine's actor.
    cluster = RayCluster(root / "cluster", cpus_per_node=1, object_store_bytes=OBJECT_STORE_BYTES)
    (root / "cluster").mkdir()
    # A bench stopped by SIGTERM stops its nodes too (they run in sessions of their own).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        cluster.add_node()
        cluster.add_node({ROLLOUT_RESOURCE: 1})
        yield cluster.client_env()
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
