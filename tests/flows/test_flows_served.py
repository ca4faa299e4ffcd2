"""The flows as a researcher uses them: a real Prefect server, `dapo serve`, a real Ray cluster.

`dapo serve` runs against the session's Prefect server (conftest.shared_prefect_server) and
joins the session's warm Ray (conftest.warm_ray), with a store and runs directory of this
module's own; the tests drive the deployments through the Prefect API exactly as the UI and the
dashboard do (create_flow_run_from_deployment). One sweep, typed as the form sends it (a ladder
of the form's own, overrides as text), is run once and asserted on by several tests; its arms
are then rerun and evaluated through the other two deployments.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import prefect_server
import pytest
from dapo_cli import FAST, FLOW_TEST_TIMEOUT_S, ROOT, alive, store_env, stored_sweep
from prefect_server import FLOW_POLL_S, client, flow_logs, stop, wait_for
from ray_cluster import RayCluster

from dapo_core.train.run_dir import latest_step
from flows import plan
from flows.params import SweepParams, validate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(FLOW_TEST_TIMEOUT_S)]

BIN = Path(sys.executable).parent


@dataclass
class Served:
    api_url: str
    store_url: str
    runs_dir: Path
    log: Path
    ray: RayCluster

    def trigger(self, deployment: str, parameters: dict[str, Any]) -> UUID:
        return prefect_server.trigger(self.api_url, deployment, parameters)

    def wait_final(self, flow_run_id: UUID) -> Any:
        return prefect_server.wait_final(self.api_url, flow_run_id, logs=[self.log])


@pytest.fixture(scope="module")
def served(
    shared_prefect_server: str, warm_ray: RayCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("served")
    api_url = shared_prefect_server
    env = store_env(
        work,
        ray=warm_ray,
        PREFECT_API_URL=api_url,
        PREFECT_HOME=str(work / "prefect-client"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    # Deployments of these names that an earlier module left would pass for this one's.
    prefect_server.delete_deployments(api_url)
    log = work / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "dapo"), "serve"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def registered() -> bool:
        from prefect.exceptions import ObjectNotFound

        with client(api_url) as prefect:
            try:
                for name in prefect_server.DEPLOYMENTS:
                    prefect.read_deployment_by_name(name)
            except ObjectNotFound:
                return False
        return True

    try:
        wait_for(
            registered, "dapo serve to register its deployments", 600.0, proc, log, FLOW_POLL_S
        )
        yield Served(api_url, env["DAPO_DB_URL"], work / "runs", log, warm_ray)
    finally:
        # The runner stops before the server it talks to (the other order hangs); the
        # server is the session's, and the next module registers deployments of its own.
        stop(proc, signal.SIGINT)
        prefect_server.delete_deployments(api_url)


def store(served: Served) -> Any:
    from db.store import Store

    return Store(served.store_url)


def sweep_ids(served: Served) -> list[int]:
    from db import ablation

    return [int(s) for s in ablation.list_sweeps(store(served).engine)["sweep_id"]]


def table_artifacts(served: Served, sweep_id: int, flow_run_ids: set[str]) -> list[Any]:
    """The sweep's table artifacts that these flow runs published (the session's server
    keeps other modules' too, and an artifact's key names the sweep id, not the store)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    key = plan.artifact_key("ablation-table", sweep_id)
    with client(served.api_url) as prefect:
        found = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    return [a for a in found if str(a.flow_run_id) in flow_run_ids]


# --- bad parameters ----------------------------------------------------------------------------
# Through a served flow run: a parameter the form's JSON editor typed wrong, and a place the
# flow cannot reach. The other mistakes fail in the same checks (flows.checks.prepare_sweep),
# tested below without a server and through `dapo sweep` in tests/flows/test_flows_cli.py.
SERVED_BAD = [
    (
        {"overrides": {"algo.clip_high": "high"}},
        "overrides: algo.clip_high='high': expected a number",
    ),
    ({"ray_address": "127.0.0.1:9"}, "cannot reach the Ray cluster at 127.0.0.1:9"),
]
CHECKED_BAD = [
    ({"arms": ["grpo", "nope"]}, "arms: unknown arm 'nope'"),
    ({"seeds": []}, "seeds: no seeds given"),
    ({"store_url": "postgresql+psycopg://nobody@127.0.0.1:9/nowhere"}, "cannot open the store"),
]


@pytest.mark.e2e
def test_bad_parameters_fail_the_flow_run_with_one_line_and_write_nothing(served: Served) -> None:
    before = sweep_ids(served)
    runs = [
        (served.trigger("ablation-sweep/dapo-sweep", {**params, "steps": 2}), want)
        for params, want in SERVED_BAD
    ]
    for flow_run_id, want in runs:
        run = served.wait_final(flow_run_id)
        assert run.state.is_failed(), (want, run.state)
        reason = plan.state_line(run.state.message)
        assert want in reason, reason
        assert "\n" not in run.state.message.strip(), run.state.message
    assert sweep_ids(served) == before


def test_the_sweep_flows_checks_refuse_bad_parameters_in_one_line(tmp_path: Path) -> None:
    """What the served flow runs first (the sweep flow's own checks), without a server."""
    from dapo_common.cli_args import USER_ERRORS
    from flows import checks

    for params, want in CHECKED_BAD:
        raw = {"steps": 2, "store_url": f"sqlite:///{tmp_path / 'x.db'}", **params}
        with pytest.raises(USER_ERRORS) as info:
            checks.prepare_sweep(raw, None)
        assert want in str(info.value) and "\n" not in str(info.value), info.value
    assert not (tmp_path / "x.db").exists()


# --- one sweep typed into the form, asserted on by the tests below ------------------------------
# The form's ladder (TOML text): arm names holding `=` (as a grid's points are named), an arm
# whose parent is not the arm above it; overrides typed as text, as the JSON editor sends them.
FORM_LADDER = """\
name = "from the form"

[[arms]]
name = "base"
from = "grpo"

[[arms]]
name = "base-clip_high=0.28"
set = { "algo.clip_high" = 0.28 }

[[arms]]
name = "no_std"
from = "base"
set = { "algo.scale_adv_by_std" = false }
"""
ARMS = ["base", "base-clip_high=0.28", "no_std"]
STEPS = 2


@pytest.fixture(scope="module")
def sweep(served: Served) -> dict[str, Any]:
    """The form's ladder × 1 seed, 2 steps, with overrides typed as text, triggered as the
    UI's Run button does."""
    params = {
        "ladder": FORM_LADDER,
        "seeds": [0],
        "steps": STEPS,
        "overrides": {**FAST, "optim.lr": "2e-6", "run.samples_per_step": "1"},
        "name": "typed into the form",
    }
    flow_run_id = served.trigger("ablation-sweep/dapo-sweep", params)
    run = served.wait_final(flow_run_id)
    assert run.state.is_completed(), (run.state, served.log.read_text()[-3000:])
    from db import ablation

    sweeps = ablation.list_sweeps(store(served).engine)
    (sweep_id,) = sweeps[sweeps["flow_run_id"] == str(flow_run_id)]["sweep_id"]
    return {"flow_run": run, "sweep_id": int(sweep_id)}


@pytest.mark.e2e
def test_a_sweep_runs_each_arm_as_its_own_flow_run_and_publishes_the_table(
    served: Served, sweep: dict[str, Any]
) -> None:
    from db import ablation, reads

    st = store(served)
    sweep_id = sweep["sweep_id"]
    row = st.get_sweep(sweep_id)
    assert row["status"] == "completed" and row["name"] == "typed into the form"
    assert row["flow_run_id"] == str(sweep["flow_run"].id)
    assert row["arms"] == ARMS
    assert [(r["arm"], r["parent"]) for r in row["ladder"]] == [
        ("base", None),
        ("base-clip_high=0.28", "base"),
        ("no_std", "base"),
    ]

    runs = reads.runs_of_sweep(st.engine, sweep_id)
    assert sorted(runs["arm"]) == sorted(ARMS)
    assert set(runs["status"]) == {"completed"} and list(runs["steps"]) == [STEPS] * 3
    curves = reads.metric_curves(st.engine, [int(r) for r in runs["run_id"]])
    for run_id in runs["run_id"]:
        mine = curves[curves["run_id"] == run_id]
        assert sorted(set(mine["step"])) == [1, 2]
        assert "acc/mean" in set(mine["name"])
        assert not reads.evaluations(st.engine, int(run_id)).empty
        # The overrides typed as text trained as their fields' types, as --set gives them.
        config = st.get_run(int(run_id))["config"]
        assert config["optim"]["lr"] == 2e-6 and isinstance(config["optim"]["lr"], float)
        assert config["run"]["samples_per_step"] == 1

    # Each arm is a flow run of the dapo-arm deployment, a child of the sweep's flow run,
    # named after its arm (a name with `=` included).
    with client(served.api_url) as prefect:
        arm_dep = prefect.read_deployment_by_name("ablation-arm/dapo-arm")
        for arm, flow_run_id in zip(runs["arm"], runs["flow_run_id"], strict=True):
            child = prefect.read_flow_run(UUID(flow_run_id))
            assert child.deployment_id == arm_dep.id
            assert child.state.is_completed()
            assert child.name == f"{arm}-s0-sweep{sweep_id}"
            parent = prefect.read_task_run(child.parent_task_run_id)
            assert parent.flow_run_id == sweep["flow_run"].id

    artifacts = table_artifacts(served, sweep_id, {str(sweep["flow_run"].id)})
    assert len(artifacts) == 1 and artifacts[0].type == "table"
    assert [r["arm"] for r in _rows(artifacts[0])] == ARMS

    # Δ to each arm's own parent: no_std's is base (its `from`), not the arm above it.
    table = ablation.ablation_table(st.engine, sweep_id)
    assert list(table["arm"]) == ARMS
    assert list(table["parent"].fillna("")) == ["", "base", "base"]
    score = dict(zip(table["arm"], table["score_mean"], strict=True))
    for arm, parent, delta in zip(
        table["arm"], table["parent"], table["delta_parent"], strict=True
    ):
        if isinstance(parent, str):
            assert delta.mean == pytest.approx(score[arm] - score[parent]), arm


def _rows(artifact: Any) -> list[dict[str, Any]]:
    import json

    data = artifact.data
    return json.loads(data) if isinstance(data, str) else list(data)


@pytest.mark.e2e
def test_rerunning_an_arm_from_the_dashboard_makes_a_new_attempt_and_updates_the_table(
    served: Served, sweep: dict[str, Any]
) -> None:
    """The dashboard's rerun sends only (sweep, arm, seed): the arm deployment rebuilds the
    same config from the ladder stored with the sweep, and the table follows the new attempt."""
    from dashboard.rerun import request_rerun
    from db import ablation

    st = store(served)
    sweep_id, arm = sweep["sweep_id"], "base-clip_high=0.28"
    first = st.latest_attempt(sweep_id, arm, 0)
    result = request_rerun(sweep_id, arm, 0, environ={"PREFECT_API_URL": served.api_url})
    assert result.ok, result.message
    run = served.wait_final(UUID(result.flow_run_id))
    assert run.state.is_completed(), run.state

    second = st.latest_attempt(sweep_id, arm, 0)
    assert second["attempt"] == first["attempt"] + 1 == 2
    assert second["status"] == "completed" and second["flow_run_id"] == result.flow_run_id
    assert second["config_hash"] == first["config_hash"]
    # A forced rerun of a completed arm starts over in its own directory: the first attempt's
    # checkpoints are kept.
    assert second["checkpoint_dir"] != first["checkpoint_dir"]
    assert latest_step(first["checkpoint_dir"]) == STEPS
    table = ablation.ablation_table(st.engine, sweep_id)
    assert list(table["arm"]) == ARMS
    row = table[table["arm"] == arm].iloc[0]
    assert int(second["run_id"]) in list(row["run_ids"])
    assert int(first["run_id"]) not in list(row["run_ids"])
    # The arm flow published a new version of the sweep's table.
    published = {str(sweep["flow_run"].id), result.flow_run_id}
    assert len(table_artifacts(served, sweep_id, published)) == 2


@pytest.mark.e2e
def test_the_eval_deployment_scores_a_stored_checkpoint(
    served: Served, sweep: dict[str, Any]
) -> None:
    from db import reads

    st = store(served)
    run_id = int(st.latest_attempt(sweep["sweep_id"], "no_std", 0)["run_id"])
    flow_run_id = served.trigger(
        "evaluate-run/dapo-eval", {"run_id": run_id, "eval_k": 1, "eval_problems": 4}
    )
    run = served.wait_final(flow_run_id)
    assert run.state.is_completed(), run.state
    evals = reads.evaluations(st.engine, run_id)
    added = evals[evals["k"] == 1]
    assert len(added) == 1
    assert int(added["n_problems"].iloc[0]) == 4 and int(added["step"].iloc[0]) == STEPS
    assert 0.0 <= float(added["avg_at_k"].iloc[0]) <= 1.0


# --- a killed actor ----------------------------------------------------------------------------
# A driver of its own joins the Ray the arm trains on, finds the run's actor and kills it
# (ray.kill: no restart in place; the flow's retry starts a new actor); prints the actor's pid.
# Connected to Ray before the arm starts, it waits for the run's first checkpoint with metrics and
# kills the actor training it at once: a killer started only after the test saw the checkpoint
# needed seconds to import and connect, and on a quiet machine the run had finished by then
# ("no live actor trains run 5", 2026-11-29).
KILL_ACTOR = """
import os, sys, time
from flows import ray_worker
import ray
from dapo_core.train.run_dir import latest_step
from db import reads
from db.store import Store

store, sweep_id, arm = Store(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ray_worker.connect()
deadline = time.monotonic() + float(sys.argv[4])
while True:
    latest = store.latest_attempt(sweep_id, arm, 0)
    run_dir = latest.get("checkpoint_dir") if latest else None
    step = latest_step(run_dir) if run_dir else None
    if step and not reads.metric_curves(store.engine, [int(latest["run_id"])]).empty:
        break
    if time.monotonic() > deadline:
        sys.exit("no checkpoint with metrics in time")
    time.sleep(0.1)  # a poll of the store, not a wait for timing
run_id = int(latest["run_id"])
# a pooled actor answers which run it trains between its training's kernels: on a loaded
# machine that can take longer than the default probe's few seconds
actor = ray_worker.training_actor(run_id, probe_timeout_s=120.0)
if actor is None:
    sys.exit(f"no live actor trains run {run_id} (checkpoint at step {step})")
pid = ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=300)
ray.kill(actor)
print(run_id, pid, step, run_dir, flush=True)
ray_worker.shutdown()
"""


@pytest.mark.e2e
def test_a_killed_actor_is_replaced_and_resumes_from_its_checkpoint(served: Served) -> None:
    from db import reads

    steps = 12
    params = validate(
        SweepParams, {"arms": ["token_loss"], "seeds": [0], "steps": steps, "overrides": FAST}
    )
    st = store(served)
    sweep_id = stored_sweep(st, params, "kill test")
    killer = subprocess.Popen(
        [sys.executable, "-c", KILL_ACTOR, served.store_url, str(sweep_id), "token_loss", "1200"],
        env={**os.environ, **served.ray.client_env()},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    flow_run_id = served.trigger(
        "ablation-arm/dapo-arm", {"sweep_id": sweep_id, "arm": "token_loss", "seed": 0}
    )
    out, err = killer.communicate(timeout=1500)
    assert killer.returncode == 0, err[-3000:]
    run_id_text, pid_text, step_text, run_dir = out.split()[-4:]
    run_id, pid, step = int(run_id_text), int(pid_text), int(step_text)
    assert step < steps, "the run finished before it could be killed: give it more steps"
    # ray.kill returns before the actor's process is gone: it went on to write a later step's
    # checkpoint after the look below (seen under load: the retry resumed step 3, which the
    # look had missed). Look once the process has exited, so that the look holds every
    # checkpoint the killed try wrote; the replacement resumes the newest of them, whichever
    # it is, and leaves it as it was (inodes).
    wait_for(lambda: not alive(pid), "the killed actor's process to exit", 600.0)
    inodes = {
        int(path.parent.name.removeprefix("step_")): path.stat().st_ino
        for path in (Path(run_dir) / "checkpoints").glob("step_*/trainer_state.pt")
    }

    run = served.wait_final(flow_run_id)
    assert run.state.is_completed(), run.state
    # The same attempt finished the job: no new attempt row; its time is both tries' (issue
    # 14.6: it was the last try's alone).
    latest = st.latest_attempt(sweep_id, "token_loss", 0)
    assert int(latest["run_id"]) == run_id and latest["attempt"] == 1
    assert latest["status"] == "completed" and latest["steps"] == steps
    assert latest["tries"] == 2
    wait_for(  # the flow run's last log lines may reach the server after its final state
        lambda: any(
            f"{steps} steps in" in m and "over 2 tries" in m
            for m in flow_logs(served.api_url, flow_run_id)
        ),
        "the completion line counting both tries",
        600.0,
        log=served.log,
        poll_s=FLOW_POLL_S,
    )
    # It resumed from a checkpoint (which it did not rewrite) rather than starting over.
    resumed = [
        int(found.group(1))
        for m in flow_logs(served.api_url, flow_run_id)
        if (found := re.search(r"resuming from the checkpoint at step (\d+)", m))
    ]
    assert resumed and step <= resumed[0] < steps, resumed
    state_file = Path(run_dir) / "checkpoints" / f"step_{resumed[0]}" / "trainer_state.pt"
    assert resumed[0] in inodes and state_file.stat().st_ino == inodes[resumed[0]]
    # Every step once, each with the same metrics, and the counters continue across the kill.
    curves = reads.metric_curves(st.engine, [run_id])
    training = curves[~curves["name"].str.startswith("eval/")]  # the last step adds its eval
    per_step = training.groupby("step")["name"].apply(lambda names: tuple(sorted(names)))
    assert list(per_step.index) == list(range(1, steps + 1))
    assert len(set(per_step.values)) == 1
    assert not curves.duplicated(["step", "name"]).any()
    rollout = curves[curves["name"] == "progress/rollout_step"].set_index("step")["value"]
    assert list(rollout) == [float(s) for s in range(1, steps + 1)]


def test_the_deployments_carry_typed_forms() -> None:
    """The forms `dapo serve` and `dapo deploy` register (flows.serve.deployments(); that the
    server keeps them as they are is tests/flows/test_flows_pool.py's deploy test)."""
    from dapo_core.setup.presets import PRESETS
    from flows.serve import deployments

    forms = {
        f"{d.flow_name}/{d.name}": d._parameter_openapi_schema.model_dump(exclude_unset=True)
        for d in deployments()
    }
    sweep_form, arm_form = forms["ablation-sweep/dapo-sweep"], forms["ablation-arm/dapo-arm"]
    props = sweep_form["properties"]
    # The ladder: a text box (a built-in's name, or a ladder file's TOML pasted in); the arms:
    # free text checked against it (no drop-down: they are the ladder's, not the paper's).
    assert props["ladder"]["type"] == "string" and props["ladder"]["default"] == "paper"
    assert "beyond-dapo" in props["ladder"]["description"]
    assert "TOML" in props["ladder"]["description"]
    assert list(props).index("ladder") < list(props).index("arms")
    assert props["arms"]["items"] == {"type": "string"} and props["arms"]["default"] == []
    assert props["preset"]["enum"] == list(PRESETS)
    assert props["seeds"]["items"]["type"] == "integer"
    assert set(sweep_form["definitions"]["Resources"]["properties"]) == {
        "cpus",
        "gpus",
        "workers",
        "placement",
        "rollout_actor",
        "rollout_cpus",
        "rollout_gpus",
        "rollout_resource",
    }
    for name in (
        "steps",
        "model",
        "train_data",
        "eval_data",
        "eval_k",
        "store_url",
        "ray_address",
        "force",
    ):
        assert props[name]["description"], name
    # What the dashboard's rerun button sends must fit the arm's form.
    assert {"sweep_id", "arm", "seed", "force"} <= set(arm_form["properties"])
    assert arm_form["required"] == ["sweep_id", "arm"]
    assert arm_form["properties"]["arm"]["type"] == "string"


def test_the_sweep_flow_takes_a_ladder_and_names_any_arms_runs_validly() -> None:
    """No server needed: the flow's own parameter schema (what to_deployment sends) and the
    arm flow run's name for an arm named by grid values."""
    from prefect.types.names import BANNED_CHARACTERS

    from flows.arm import ablation_arm
    from flows.sweep import ablation_sweep

    props = ablation_sweep.parameters.model_dump()["properties"]
    assert props["ladder"]["type"] == "string" and props["ladder"]["default"] == "paper"
    name = plan.arm_flow_run_name("dapo-clip_high=0.24", 1, 3)
    assert name == ablation_arm.flow_run_name.format(arm="dapo-clip_high=0.24", seed=1, sweep_id=3)
    assert not set(name) & set(BANNED_CHARACTERS)


@pytest.mark.e2e
def test_cancelling_an_arm_never_reopens_one_its_runner_already_cancelled(served: Served) -> None:
    """The sweep cancels its arms while their runner cancels them too: whichever comes last
    must leave an arm that is already Cancelled as it is (a forced Cancelling reopened it, and
    no process was left to end it)."""
    from prefect.states import Cancelled, Cancelling

    from flows.sweep import cancel_flow_run

    with client(served.api_url) as prefect:
        dep = prefect.read_deployment_by_name("ablation-arm/dapo-arm")
        run_id = prefect.create_flow_run_from_deployment(
            dep.id, parameters={"sweep_id": 1, "arm": "grpo"}, state=Cancelled()
        ).id
        cancel_flow_run(prefect, run_id)
        assert prefect.read_flow_run(run_id).state.is_cancelled()
        # What the sweep did before: forced, it takes the run out of its final state.
        prefect.set_flow_run_state(run_id, Cancelling(), force=True)
        assert not prefect.read_flow_run(run_id).state.is_final()
        prefect.set_flow_run_state(run_id, Cancelled(), force=True)


@pytest.mark.e2e
def test_cancelling_a_served_sweep_cancels_its_arms_and_marks_the_store(served: Served) -> None:
    from prefect.states import Cancelling

    from db import ablation, reads

    params = {
        "arms": ["overlong_filter"],
        "seeds": [0],
        "steps": 200,
        "overrides": FAST,
        "name": "to cancel",
    }
    sweep_run_id = served.trigger("ablation-sweep/dapo-sweep", params)
    st = store(served)

    def training() -> dict[str, Any] | None:
        sweeps = ablation.list_sweeps(st.engine)
        mine = sweeps[sweeps["flow_run_id"] == str(sweep_run_id)]
        if mine.empty:
            return None
        latest = st.latest_attempt(int(mine["sweep_id"].iloc[0]), "overlong_filter", 0)
        if latest is None or reads.metric_curves(st.engine, [int(latest["run_id"])]).empty:
            return None
        return latest

    latest = wait_for(training, "the arm to start training", log=served.log)
    with client(served.api_url) as prefect:  # what the UI's Cancel button does
        prefect.set_flow_run_state(sweep_run_id, Cancelling())
    assert served.wait_final(sweep_run_id).state.is_cancelled()
    child = served.wait_final(UUID(latest["flow_run_id"]))
    assert child.state.is_cancelled(), child.state

    def marked() -> bool:
        run = st.get_run(int(latest["run_id"]))
        return (
            run["status"] == "cancelled"
            and st.get_sweep(int(run["sweep_id"]))["status"] == "cancelled"
        )

    wait_for(marked, "the store to mark the run and the sweep cancelled", 600.0, log=served.log)
    steps = st.get_run(int(latest["run_id"]))["steps"]
    assert steps is None or steps < 200
