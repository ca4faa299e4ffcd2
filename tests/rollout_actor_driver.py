"""Runs for the rollout-engine actor's tests, in an interpreter of their own (ray.init is once
per process): `runner.train` of one config with the engine in this process and again with it
on an EngineActor of the Ray named by $RAY_ADDRESS (without it, a local Ray of 2 CPUs that this
process starts and stops: the vLLM venv's tests have no warm Ray), each run's metrics, samples
and evaluations written as JSON, with where the engine actor ran.

    python tests/rollout_actor_driver.py CONFIG_JSON OUT_DIR
"""

from __future__ import annotations

import json
import os
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


# A local Ray's CPUs: one for the engine's actor, one the trainer (this process) runs on.
LOCAL_RAY_CPUS = 2


def main() -> None:
    config, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    from flows import ray_worker

    ray_worker.connect(os.environ.get("RAY_ADDRESS") or "local", num_cpus=LOCAL_RAY_CPUS)
    try:
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


if __name__ == "__main__":
    main()
