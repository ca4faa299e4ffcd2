"""The rollout engine on a Ray actor of its own (flows/rollout_actor.py, `--rollout-actor`).

An async run at max_staleness 0 with its engine on an EngineActor of the session's warm Ray
trains exactly what the same run with the engine in its own process trains (metrics, samples
and evaluations bit for bit), while the engine ran in another process; so does an arm of two
workers, each rank's engine on an actor of the arm's placement group (`make test-e2e`). The
resources an arm asks for count the engines' actors, and a plan that cannot hold them is one
line.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from dapo_cli import FAST, FLOW_TEST_TIMEOUT_S, ROOT
from ray_cluster import RayCluster
from rollout_actor_driver import (
    check_actor_run_is_the_local_run,
    check_two_workers_actor_run_is_the_local_run,
    drive,
)

from dapo_core.setup.ladders import paper_ladder
from flows import plan
from flows.params import Resources
from flows.ray_worker import resources_text
from flows.rollout_actor import RolloutPlacement

# An async run at k = 0 of the dapo arm (dynamic sampling over-samples and carries groups
# over), every response kept as a sample, one torch thread.
ASYNC_K0 = {
    **FAST,
    "run.steps": 2,
    "run.samples_per_step": 16,
    "run.num_threads": 1,
    "rollout.mode": "async",
    "rollout.max_staleness": 0,
}


def test_an_engine_on_its_own_actor_trains_what_the_local_engine_does(
    tmp_path: Path, warm_ray: RayCluster
) -> None:
    cfg = paper_ladder().config("dapo", "tiny", ASYNC_K0)
    env = {
        **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
        **warm_ray.client_env(),
        "PYTHONPATH": str(ROOT),
    }
    # Under pytest's 600 s a test: a hang ends the driver's session, Ray workers included.
    drive(cfg.to_dict(), tmp_path, env, timeout_s=500)
    check_actor_run_is_the_local_run(tmp_path, steps=2)


@pytest.mark.e2e
@pytest.mark.timeout(FLOW_TEST_TIMEOUT_S)
def test_two_workers_engines_on_their_own_actors_train_what_local_engines_do(
    tmp_path: Path, warm_ray: RayCluster
) -> None:
    """An arm of two workers through flows.ray_worker.run_training (what `dapo arm` calls) on
    the warm Ray: each rank's engine recipe carries a CPU copy of the rank's weights to its
    actor (in the arm's placement group, bundles 2-3), which builds the engine on its own
    device: the two ranks' engines sample exactly what engines in the ranks' own processes
    sample."""
    cfg = paper_ladder().config("dapo", "tiny", ASYNC_K0).to_dict()
    env = {
        **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
        **warm_ray.client_env(),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    drive(cfg, tmp_path, env, FLOW_TEST_TIMEOUT_S - 100, workers=True)
    report = check_two_workers_actor_run_is_the_local_run(tmp_path, steps=2)
    assert report["engine_actors"] == 2  # one per rank, not in the ranks' processes


def test_an_arm_asks_for_its_engines_actors_too() -> None:
    plain = Resources(cpus=2, workers=2)
    hosted = Resources(cpus=2, workers=2, rollout_actor=True, rollout_cpus=1, rollout_gpus=0.5)
    assert plan.per_worker(plain) == {"CPU": 2.0, "GPU": 0.0}
    assert plan.per_worker(hosted) == {"CPU": 3.0, "GPU": 0.5}
    # 12 CPUs hold two arms of 2 × 2 CPUs, one arm of 2 × 3 (and the engines' GPUs).
    assert plan.concurrency({"CPU": 12, "GPU": 4}, plain, 5) == 3
    assert plan.concurrency({"CPU": 12, "GPU": 4}, hosted, 5) == 2
    assert plan.concurrency({"CPU": 12, "GPU": 1}, hosted, 5) == 1
    plan.check_fits({"CPU": 6, "GPU": 1}, hosted)
    with pytest.raises(ValueError) as refused:
        plan.check_fits({"CPU": 5, "GPU": 1}, hosted)
    line = str(refused.value)
    assert "\n" not in line and "2 workers × 3 CPU(s)" in line
    assert "rollout engines'" in line and "resources.rollout_cpus" in line
    assert resources_text(hosted) == (
        "2 workers × (2 CPU), PACK; rollout engine each: an actor of 1 CPU, 0.5 GPU"
    )
    # Without rollout_actor the engine's fields ask for nothing.
    assert plan.per_worker(Resources(rollout_cpus=8)) == {"CPU": 1.0, "GPU": 0.0}


def test_a_rollout_resource_no_node_offers_is_refused_in_one_line() -> None:
    hosted = Resources(rollout_actor=True, rollout_resource="rollout")
    plan.check_fits({"CPU": 4, "GPU": 0, "rollout": 1.0}, hosted)
    with pytest.raises(ValueError) as refused:
        plan.check_fits({"CPU": 4, "GPU": 0}, hosted)
    assert str(refused.value).startswith("resources.rollout_resource='rollout': no node ")
    assert RolloutPlacement(1, 0, "rollout").bundle() == {"CPU": 1, "rollout": 0.001}
    with pytest.raises(ValueError):
        Resources(rollout_resource="no spaces here")


def test_a_lost_engine_actor_ends_the_try_as_a_lost_actor_that_the_flow_retries() -> None:
    import ray.exceptions

    from flows import arm, ray_worker

    # What ArmTrainer.train's task raises when its engine's actor (or that node) died.
    failed = SimpleNamespace(cause=ray.exceptions.ActorDiedError())
    lost = ray_worker._task_error(failed)
    assert isinstance(lost, ray_worker.ActorLost)
    assert str(lost).startswith("the rollout engine's Ray actor died: ")
    # The flow's task retries it (a training error would be final).
    state = SimpleNamespace(result=lambda raise_on_failure: lost)
    assert arm._actor_died(None, None, state)


def test_engines_on_gpus_of_their_own_are_planned_apart_from_the_trainers() -> None:
    """A 7B arm on two 80 GB trainers does not fit with vLLM beside them (118 GiB a worker)
    and fits with each engine on a GPU of its own (75 GiB); an engine whose own GPU cannot
    hold it is one line before anything starts."""
    from dapo_core.setup.plan import PlanError
    from dapo_core.setup.presets import preset_config
    from flows.cluster import check_arm_plan, uses_gpus

    qwen7b = preset_config("qwen2.5-7b").to_dict()
    together = Resources(gpus=1, workers=2)
    apart = Resources(gpus=1, workers=2, rollout_actor=True, rollout_gpus=1)
    with pytest.raises(PlanError, match=r"^qwen2.5-7b/\w+ on 2 worker\(s\): does not fit"):
        check_arm_plan([qwen7b], together, 79.0)
    check_arm_plan([qwen7b], apart, 79.0)
    small = {**qwen7b, "rollout": {**qwen7b["rollout"], "gpu_memory_utilization": 0.15}}
    with pytest.raises(PlanError) as refused:
        check_arm_plan([small], apart, 79.0)
    line = str(refused.value)
    assert "\n" not in line and "rollout engine does not fit its own 79 GiB GPU" in line
    # Engines on GPUs beside trainers on CPUs: only the engines' GPUs are planned.
    assert uses_gpus(Resources(rollout_actor=True, rollout_gpus=1))
    assert not uses_gpus(Resources(rollout_gpus=1))  # without the actor: no engine apart
    with pytest.raises(PlanError):
        check_arm_plan([small], Resources(rollout_actor=True, rollout_gpus=1), 79.0)
