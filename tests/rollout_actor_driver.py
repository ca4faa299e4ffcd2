"""Runs for the rollout-engine actor's tests, in an interpreter of their own (ray.init is once
per process): `runner.train` of one config with the engine in this process and again with it
on an EngineActor of the Ray named by $RAY_ADDRESS (without it, a local Ray of 2 CPUs that this
process starts and stops: the vLLM venv's tests have no warm Ray), each run's metrics, samples
and evaluations written as JSON, with where the engine actor ran.

    python tests/rollout_actor_driver.py CONFIG_JSON OUT_DIR [--workers]

With `--workers`, an arm of two workers instead, through flows.ray_worker.run_training (what
`dapo arm` calls) with a SQLite store in OUT_DIR, twice: `local` (each rank's engine in its own
process), then `actor` (each on an EngineActor of the arm's placement group); OUT_DIR/
workers.json holds each run's metrics by "step name", the engine actors made and the vLLM
skeletons left in the runs' directories.

The tests (the hf engine's in tests/flows, vLLM's in tests/vllm_engine) call `drive`, which runs
this script, and `check_actor_run_is_the_local_run` on what it wrote.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class JsonSink:
    """Metrics, samples and evaluations kept in memory, by step."""

    def __init__(self) -> None:
        self.record: dict[str, dict[str, Any]] = {"metrics": {}, "samples": {}, "evaluations": {}}

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.record["metrics"][str(step)] = dict(metrics)

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self.record["samples"][str(step)] = [dict(s) for s in samples]

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        self.record["evaluations"][str(step)] = dict(result)


def drive(
    config: Mapping[str, Any],
    out: Path,
    env: Mapping[str, str],
    timeout_s: float,
    workers: bool = False,
) -> None:
    """This script on `config` (with `workers`: an arm of two workers), its JSON in `out`; a
    test failure with its stderr if it fails. A session of its own: on a timeout it and a Ray
    it started are killed together."""
    import pytest

    (out / "config.json").write_text(json.dumps(config))
    more = ["--workers"] if workers else []
    driver = subprocess.Popen(
        [sys.executable, __file__, str(out / "config.json"), str(out), *more],
        env=dict(env),
        cwd=out,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = driver.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        _, stderr = driver.communicate()
        pytest.fail(f"the driver ran past {timeout_s:.0f} s: {stderr[-3000:]}")
    assert driver.returncode == 0, stderr[-3000:]


def computed(metrics: Mapping[str, float]) -> dict[str, float]:
    """What a run computes, not how long it took (time/..., perf/...)."""
    from dapo_common import metric_names as M

    return {k: v for k, v in metrics.items() if not k.startswith((M.TIME_PREFIX, "perf/"))}


def same(a: Any, b: Any) -> bool:
    return bool(a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


def check_actor_run_is_the_local_run(out: Path, steps: int) -> dict[str, Any]:
    """The run with its engine on an actor trained exactly what the run with it in the
    trainer's process trained (every computed metric, the samples and the evaluations), its
    engine in another process; returns the local run's record."""
    from dapo_common import metric_names as M

    local = json.loads((out / "local.json").read_text())
    actor = json.loads((out / "actor.json").read_text())
    (where,) = json.loads((out / "where.json").read_text())
    assert where["engine"]["pid"] != where["trainer_pid"]  # sampled in another process
    assert sorted(actor["metrics"]) == [str(s) for s in range(1, steps + 1)]
    for step, metrics in local["metrics"].items():
        a, b = computed(metrics), computed(actor["metrics"][step])
        assert M.POLICY_LOSS in a and M.STALENESS_MEAN in a
        assert set(a) == set(b), (step, set(a) ^ set(b))
        differ = {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}
        assert not differ, (step, differ)  # exactly equal: not approximately
    assert local["samples"] and actor["samples"] == local["samples"]
    assert actor["evaluations"] == local["evaluations"]
    return dict(local)


def check_two_workers_actor_run_is_the_local_run(out: Path, steps: int) -> dict[str, Any]:
    """The two-worker `actor` run in OUT_DIR/workers.json computed exactly the `local` run's
    metrics (less time/ and perf/) at steps 1..`steps`; returns the report."""
    from dapo_common import metric_names as M

    report = json.loads((out / "workers.json").read_text())

    def kept(name: str) -> dict[str, float]:
        return {k: v for k, v in report[name].items() if computed({k.split(" ", 1)[1]: v})}

    local, actor = kept("local"), kept("actor")
    assert {k.split(" ")[0] for k in local} == {str(s) for s in range(1, steps + 1)}
    assert any(M.POLICY_LOSS in k for k in local)
    assert set(actor) == set(local), set(actor) ^ set(local)
    differ = {k: (local[k], actor[k]) for k in local if not same(local[k], actor[k])}
    assert not differ, differ  # exactly equal: not approximately
    return dict(report)


# A local Ray's CPUs: one for the engine's actor, one the trainer (this process) runs on.
LOCAL_RAY_CPUS = 2


def main() -> None:
    config, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    from flows import ray_worker

    ray_worker.connect(os.environ.get("RAY_ADDRESS") or "local", num_cpus=LOCAL_RAY_CPUS)
    try:
        if sys.argv[3:4] == ["--workers"]:
            run_two_workers(config, out)
        else:
            run_both(config, out)
    finally:
        ray_worker.shutdown()  # a local Ray's processes end with it; a joined one is left


def run_both(config: dict[str, Any], out: Path) -> None:
    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.train.runner import train
    from flows.rollout_actor import RolloutPlacement, host_for

    cfg = ExperimentConfig.from_dict(config)
    hosts: dict[str, Any] = {
        "local": None,
        "actor": host_for(RolloutPlacement(1.0), config, wait_s=600),
    }
    where: list[dict[str, Any]] = []
    for name, host in hosts.items():
        if host is not None:
            inner = host

            def host(recipe: Any, inner: Any = inner) -> Any:  # note where the engine went
                engine = inner(recipe)
                where.append({"engine": engine.where(), "trainer_pid": os.getpid()})
                return engine

        sink = JsonSink()
        train(cfg, sink=sink, out_dir=out / name, resume=False, engine_host=host)
        (out / f"{name}.json").write_text(json.dumps(sink.record, default=str))
    (out / "where.json").write_text(json.dumps(where))


# The two runs' resources: two workers of half a CPU, with `actor` two engines' actors of half a
# CPU more, so that the arm fits a local Ray of LOCAL_RAY_CPUS.
VARIANTS: dict[str, dict[str, Any]] = {
    "local": {},
    "actor": {"rollout_actor": True, "rollout_cpus": 0.5},
}


def run_two_workers(config: dict[str, Any], out: Path) -> None:
    from ray._private import state  # the GCS's table (ray.util.state needs Ray's dashboard)
    from store_runs import new_attempt

    from dapo_core.setup.ladders import paper_ladder
    from db import reads
    from db.store import Store
    from flows import ray_worker
    from flows.params import Resources

    url = f"sqlite:///{out / 'store.db'}"
    store = Store(url)

    def engines() -> set[str]:
        return {i for i, a in state.actors().items() if a["ActorClassName"] == "EngineActor"}

    before, report = engines(), {}
    for name, extra in VARIANTS.items():
        sweep = store.create_sweep(
            name=name,
            preset="tiny",
            arms=["dapo"],
            seeds=[0],
            base_config=config,
            ladder=paper_ladder().rows(),
        )
        run = new_attempt(store, sweep, "dapo", 0, config=config, checkpoint_dir=str(out / name))
        owner = {"store": store.store_id, "sweep": sweep, "arm": "dapo", "seed": 0}
        ray_worker.run_training(
            run_id=run,
            config=config,
            store_url=url,
            out_dir=str(out / name),
            owner={**owner, "config_hash": "h"},
            resources=Resources(cpus=0.5, workers=2, **extra),
        )
        curves = reads.metric_curves(store.engine, [run])
        report[name] = {f"{r.step} {r.name}": r.value for r in curves.itertuples()}
    report["engine_actors"] = len(engines() - before)
    report["skeletons"] = sorted(str(p.parent.relative_to(out)) for p in out.glob("*/*vllm-init"))
    (out / "workers.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
