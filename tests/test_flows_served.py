"""The flows as a researcher uses them: a real Prefect server, `dapo serve`, a real Ray cluster.

The module starts `prefect server start` (temporary PREFECT_HOME, a free port), a local Ray
instance with 2 CPUs, and `dapo serve` joined to both, then drives the deployments through the
Prefect API exactly as the UI and the dashboard do (create_flow_run_from_deployment).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import prefect_server as prefect_server_module
import pytest
from dapo_cli import stored_sweep
from prefect_server import stop as _stop
from prefect_server import wait_for as _wait_for

from dapo_core.train.run_dir import latest_step
from flows import plan, ray_worker
from flows.params import SweepParams, validate

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Small batches keep each arm to seconds on 2 cores; the tiny model itself (and so its cached
# warm start) stays the preset's.
FAST = {
    "batch.train_batch_size": 4,
    "batch.gen_batch_size": 4,
    "batch.mini_batch_size": 2,
    "rollout.group_size": 4,
    "data.eval_problems": 8,
    "data.eval_k": 2,
    "run.checkpoint_every": 1,
    "run.samples_per_step": 2,
}
FLOW_TIMEOUT_S = 180.0


def _process_alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, dead but not yet reaped, does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class Served:
    api_url: str
    store_url: str
    runs_dir: Path
    log: Path


@contextmanager
def prefect_client(api_url: str) -> Iterator[Any]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings(updates={PREFECT_API_URL: api_url}),
        get_client(sync_client=True) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with prefect_server_module.running(tmp_path_factory.mktemp("prefect-home")) as api_url:
        yield api_url


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    import ray

    ray_worker.connect("local", num_cpus=2)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray_worker.shutdown()


@pytest.fixture(scope="module")
def served(
    prefect_server: str, ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("served")
    store_url = f"sqlite:///{work / 'dapo.db'}"
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_server,
        "PREFECT_HOME": str(work / "prefect-client"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "RAY_ADDRESS": ray_address,
        "DAPO_DB_URL": store_url,
        "DAPO_RUNS_DIR": str(work / "runs"),
    }
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
    names = ("ablation-sweep/dapo-sweep", "ablation-arm/dapo-arm", "evaluate-run/dapo-eval")

    def registered() -> bool:
        from prefect.exceptions import ObjectNotFound

        with prefect_client(prefect_server) as client:
            try:
                for name in names:
                    client.read_deployment_by_name(name)
            except ObjectNotFound:
                return False
        return True

    try:
        _wait_for(registered, "dapo serve to register its deployments", 90.0, proc, log)
        yield Served(prefect_server, store_url, work / "runs", log)
    finally:
        # The runner stops before the server it talks to (the other order hangs).
        _stop(proc, signal.SIGINT)


def trigger(served: Served, deployment: str, parameters: dict[str, Any]) -> UUID:
    """What the UI's "Run" button does: a flow run of the deployment with these parameters."""
    with prefect_client(served.api_url) as client:
        dep = client.read_deployment_by_name(deployment)
        return client.create_flow_run_from_deployment(dep.id, parameters=parameters).id


def wait_final(served: Served, flow_run_id: UUID, timeout_s: float = FLOW_TIMEOUT_S) -> Any:
    seen: list[str] = []

    def final() -> Any:
        with prefect_client(served.api_url) as client:
            run = client.read_flow_run(flow_run_id)
        seen[:] = [f"{run.state.name}: {run.state.message}" if run.state else "no state"]
        return run if run.state is not None and run.state.is_final() else None

    try:
        return _wait_for(final, f"flow run {flow_run_id}", timeout_s, log=served.log)
    except pytest.fail.Exception as exc:
        pytest.fail(f"flow run {flow_run_id} last seen as {seen}\n{exc}")


def store(served: Served) -> Any:
    from db.store import Store

    return Store(served.store_url)


def sweep_ids(served: Served) -> list[int]:
    from db import ablation

    return [int(s) for s in ablation.list_sweeps(store(served).engine)["sweep_id"]]


def flow_logs(served: Served, flow_run_id: UUID) -> list[str]:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with prefect_client(served.api_url) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [log.message for log in logs]


def table_artifacts(served: Served, sweep_id: int) -> list[Any]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    key = plan.artifact_key("ablation-table", sweep_id)
    with prefect_client(served.api_url) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )


# --- bad parameters ----------------------------------------------------------------------------
BAD = [
    ({"arms": ["grpo", "nope"]}, "arms: unknown arm 'nope'"),
    ({"seeds": []}, "seeds: no seeds given"),
    ({"ray_address": "127.0.0.1:9"}, "cannot reach the Ray cluster at 127.0.0.1:9"),
    ({"store_url": "postgresql+psycopg://nobody@127.0.0.1:9/nowhere"}, "cannot open the store"),
    # The form's JSON editor: a value that cannot be its field's type is one line, not the
    # TypeError a config built from it would raise.
    (
        {"overrides": {"algo.clip_high": "high"}},
        "overrides: algo.clip_high='high': expected a number",
    ),
]


def test_bad_parameters_fail_the_flow_run_with_one_line_and_write_nothing(served: Served) -> None:
    before = sweep_ids(served)
    runs = [
        (trigger(served, "ablation-sweep/dapo-sweep", {**params, "steps": 2}), want)
        for params, want in BAD
    ]
    for flow_run_id, want in runs:
        run = wait_final(served, flow_run_id)
        assert run.state.is_failed(), (want, run.state)
        reason = plan.state_line(run.state.message)
        assert want in reason, reason
        assert "\n" not in run.state.message.strip(), run.state.message
    assert sweep_ids(served) == before


def test_an_override_typed_as_text_in_the_form_is_its_fields_type(served: Served) -> None:
    """{"algo.clip_high": "0.28"} from the form trains with ε_high = 0.28, as --set would."""
    params = {
        "arms": ["grpo"],
        "seeds": [0],
        "steps": 1,
        "overrides": {**FAST, "algo.clip_high": "0.28", "run.samples_per_step": "1"},
        "name": "typed-overrides",
    }
    run = wait_final(served, trigger(served, "ablation-sweep/dapo-sweep", params))
    assert run.state.is_completed(), (run.state, served.log.read_text()[-3000:])
    st = store(served)
    sweep_id = max(sweep_ids(served))
    assert st.get_sweep(sweep_id)["name"] == "typed-overrides"
    attempt = st.latest_attempt(sweep_id, "grpo", 0)
    assert attempt is not None and attempt["status"] == "completed"
    config = st.get_run(int(attempt["run_id"]))["config"]
    assert config["algo"]["clip_high"] == 0.28 and isinstance(config["algo"]["clip_high"], float)
    assert config["run"]["samples_per_step"] == 1


# --- a sweep from the UI ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sweep(served: Served) -> dict[str, Any]:
    """A 2-arm × 1-seed tiny sweep of 2 steps, triggered like the UI's form."""
    params = {
        "preset": "tiny",
        "arms": ["grpo", "clip_higher"],
        "seeds": [0],
        "steps": 2,
        "overrides": FAST,
    }
    flow_run_id = trigger(served, "ablation-sweep/dapo-sweep", params)
    run = wait_final(served, flow_run_id)
    assert run.state.is_completed(), (run.state, served.log.read_text()[-3000:])
    ids = sweep_ids(served)
    return {"flow_run": run, "sweep_id": max(ids)}


def test_a_sweep_runs_each_arm_as_its_own_flow_run_and_publishes_the_table(
    served: Served, sweep: dict[str, Any]
) -> None:
    from db import reads

    st = store(served)
    sweep_id = sweep["sweep_id"]
    row = st.get_sweep(sweep_id)
    assert row["status"] == "completed"
    assert row["flow_run_id"] == str(sweep["flow_run"].id)

    runs = reads.runs_of_sweep(st.engine, sweep_id)
    assert sorted(runs["arm"]) == ["clip_higher", "grpo"]
    assert set(runs["status"]) == {"completed"}
    assert list(runs["steps"]) == [2, 2]
    curves = reads.metric_curves(st.engine, [int(r) for r in runs["run_id"]])
    for run_id in runs["run_id"]:
        mine = curves[curves["run_id"] == run_id]
        assert sorted(set(mine["step"])) == [1, 2]
        assert "acc/mean" in set(mine["name"])
        assert not reads.evaluations(st.engine, int(run_id)).empty

    # Each arm is a flow run of the dapo-arm deployment, a child of the sweep's flow run.
    with prefect_client(served.api_url) as client:
        arm_dep = client.read_deployment_by_name("ablation-arm/dapo-arm")
        for flow_run_id in runs["flow_run_id"]:
            child = client.read_flow_run(UUID(flow_run_id))
            assert child.deployment_id == arm_dep.id
            assert child.state.is_completed()
            parent = client.read_task_run(child.parent_task_run_id)
            assert parent.flow_run_id == sweep["flow_run"].id

    artifacts = table_artifacts(served, sweep_id)
    assert len(artifacts) == 1 and artifacts[0].type == "table"
    assert [r["arm"] for r in _rows(artifacts[0])] == ["grpo", "clip_higher"]


def _rows(artifact: Any) -> list[dict[str, Any]]:
    import json

    data = artifact.data
    return json.loads(data) if isinstance(data, str) else list(data)


def test_rerunning_an_arm_from_the_dashboard_makes_a_new_attempt_and_updates_the_table(
    served: Served, sweep: dict[str, Any]
) -> None:
    from dashboard.rerun import request_rerun
    from db import ablation

    st = store(served)
    sweep_id = sweep["sweep_id"]
    first = st.latest_attempt(sweep_id, "grpo", 0)
    result = request_rerun(sweep_id, "grpo", 0, environ={"PREFECT_API_URL": served.api_url})
    assert result.ok, result.message
    run = wait_final(served, UUID(result.flow_run_id))
    assert run.state.is_completed(), run.state

    second = st.latest_attempt(sweep_id, "grpo", 0)
    assert second["attempt"] == first["attempt"] + 1
    assert second["status"] == "completed" and second["flow_run_id"] == result.flow_run_id
    # A forced rerun of a completed arm starts over in its own directory: the first attempt's
    # checkpoints are kept.
    assert second["checkpoint_dir"] != first["checkpoint_dir"]
    assert latest_step(first["checkpoint_dir"]) == 2
    table = ablation.ablation_table(st.engine, sweep_id)
    grpo = table[table["arm"] == "grpo"].iloc[0]
    assert int(second["run_id"]) in list(grpo["run_ids"])
    assert int(first["run_id"]) not in list(grpo["run_ids"])
    # The arm flow published a new version of the sweep's table.
    assert len(table_artifacts(served, sweep_id)) == 2


# --- a killed actor ----------------------------------------------------------------------------
def test_a_killed_actor_is_replaced_and_resumes_from_its_checkpoint(
    served: Served, ray_address: str
) -> None:
    import ray

    from db import reads

    steps = 8
    params = validate(
        SweepParams, {"arms": ["token_loss"], "seeds": [0], "steps": steps, "overrides": FAST}
    )
    st = store(served)
    sweep_id = stored_sweep(st, params, "kill test")
    flow_run_id = trigger(
        served, "ablation-arm/dapo-arm", {"sweep_id": sweep_id, "arm": "token_loss", "seed": 0}
    )

    def checkpointed() -> tuple[int, str, int] | None:
        latest = st.latest_attempt(sweep_id, "token_loss", 0)
        if latest is None or not latest.get("checkpoint_dir"):
            return None
        step = latest_step(latest["checkpoint_dir"])
        has_metrics = not reads.metric_curves(st.engine, [int(latest["run_id"])]).empty
        return (
            (int(latest["run_id"]), latest["checkpoint_dir"], step)
            if step and has_metrics
            else None
        )

    run_id, run_dir, step = _wait_for(
        checkpointed, "the first checkpoint", FLOW_TIMEOUT_S, log=served.log
    )
    assert step < steps, "the run finished before it could be killed: give it more steps"
    actor = ray_worker.training_actor(run_id)
    assert actor is not None, f"no live actor trains run {run_id}"
    pid = ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=60)
    ray.kill(actor)
    # ray.kill returns before the actor's process is gone: it went on to write a later step's
    # checkpoint after the look below (seen under load: the retry resumed step 3, which the
    # look had missed). Look once the process has exited, so that the look holds every
    # checkpoint the killed try wrote; the replacement resumes the newest of them, whichever
    # it is, and leaves it as it was (inodes).
    _wait_for(lambda: not _process_alive(pid), "the killed actor's process to exit", 60.0)
    inodes = {
        int(path.parent.name.removeprefix("step_")): path.stat().st_ino
        for path in (Path(run_dir) / "checkpoints").glob("step_*/trainer_state.pt")
    }

    run = wait_final(served, flow_run_id)
    assert run.state.is_completed(), run.state
    # The same attempt finished the job: no new attempt row; its time is both tries' (issue
    # 14.6: it was the last try's alone).
    latest = st.latest_attempt(sweep_id, "token_loss", 0)
    assert int(latest["run_id"]) == run_id and latest["attempt"] == 1
    assert latest["status"] == "completed" and latest["steps"] == steps
    assert latest["tries"] == 2
    _wait_for(  # the flow run's last log lines may reach the server after its final state
        lambda: any(
            f"{steps} steps in" in m and "over 2 tries" in m for m in flow_logs(served, flow_run_id)
        ),
        "the completion line counting both tries",
        30.0,
        log=served.log,
    )
    # It resumed from a checkpoint (which it did not rewrite) rather than starting over.
    resumed = [
        int(found.group(1))
        for m in flow_logs(served, flow_run_id)
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


def test_the_deployments_carry_typed_forms(served: Served) -> None:
    from dapo_core.setup.presets import PRESETS

    with prefect_client(served.api_url) as client:
        sweep_form = client.read_deployment_by_name(
            "ablation-sweep/dapo-sweep"
        ).parameter_openapi_schema
        arm_form = client.read_deployment_by_name("ablation-arm/dapo-arm").parameter_openapi_schema
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


FORM_LADDER = """\
name = "from the form"

[[arms]]
name = "base"
from = "token_loss"

[[arms]]
name = "base-clip_high=0.3"
set = { "algo.clip_high" = 0.3 }
"""


def test_a_ladder_typed_into_the_form_runs_and_an_arm_reruns_from_the_dashboard(
    served: Served,
) -> None:
    """The sweep form's ladder (TOML text) runs through the deployments; the dashboard's
    rerun sends only (sweep, arm, seed) and the arm deployment rebuilds the same config from
    the ladder stored with the sweep."""
    from dashboard.rerun import request_rerun
    from db import ablation

    params = {"ladder": FORM_LADDER, "seeds": [0], "steps": 2, "overrides": FAST}
    run = wait_final(served, trigger(served, "ablation-sweep/dapo-sweep", params))
    assert run.state.is_completed(), (run.state, served.log.read_text()[-3000:])
    st = store(served)
    sweep_id = max(sweep_ids(served))
    row = st.get_sweep(sweep_id)
    assert row["arms"] == ["base", "base-clip_high=0.3"]
    assert [(r["arm"], r["parent"]) for r in row["ladder"]] == [
        ("base", None),
        ("base-clip_high=0.3", "base"),
    ]
    first = st.latest_attempt(sweep_id, "base-clip_high=0.3", 0)
    with prefect_client(served.api_url) as client:
        child = client.read_flow_run(UUID(first["flow_run_id"]))
    assert child.name == f"base-clip_high=0.3-s0-sweep{sweep_id}"

    result = request_rerun(
        sweep_id, "base-clip_high=0.3", 0, environ={"PREFECT_API_URL": served.api_url}
    )
    assert result.ok, result.message
    rerun = wait_final(served, UUID(result.flow_run_id))
    assert rerun.state.is_completed(), rerun.state
    second = st.latest_attempt(sweep_id, "base-clip_high=0.3", 0)
    assert second["attempt"] == 2 and second["status"] == "completed"
    assert second["config_hash"] == first["config_hash"]
    table = ablation.ablation_table(st.engine, sweep_id)
    assert list(table["arm"]) == ["base", "base-clip_high=0.3"]
    assert list(table["parent"].fillna("")) == ["", "base"]


def test_the_eval_deployment_scores_a_stored_checkpoint(
    served: Served, sweep: dict[str, Any]
) -> None:
    from db import reads

    st = store(served)
    run_id = int(st.latest_attempt(sweep["sweep_id"], "clip_higher", 0)["run_id"])
    flow_run_id = trigger(
        served, "evaluate-run/dapo-eval", {"run_id": run_id, "eval_k": 1, "eval_problems": 4}
    )
    run = wait_final(served, flow_run_id)
    assert run.state.is_completed(), run.state
    evals = reads.evaluations(st.engine, run_id)
    added = evals[evals["k"] == 1]
    assert (
        len(added) == 1
        and int(added["n_problems"].iloc[0]) == 4
        and int(added["step"].iloc[0]) == 2
    )
    assert 0.0 <= float(added["avg_at_k"].iloc[0]) <= 1.0


def test_cancelling_an_arm_never_reopens_one_its_runner_already_cancelled(served: Served) -> None:
    """The sweep cancels its arms while their runner cancels them too: whichever comes last
    must leave an arm that is already Cancelled as it is (a forced Cancelling reopened it, and
    no process was left to end it)."""
    from prefect.states import Cancelled, Cancelling

    from flows.sweep import cancel_flow_run

    with prefect_client(served.api_url) as client:
        dep = client.read_deployment_by_name("ablation-arm/dapo-arm")
        run_id = client.create_flow_run_from_deployment(
            dep.id, parameters={"sweep_id": 1, "arm": "grpo"}, state=Cancelled()
        ).id
        cancel_flow_run(client, run_id)
        assert client.read_flow_run(run_id).state.is_cancelled()
        # What the sweep did before: forced, it takes the run out of its final state.
        client.set_flow_run_state(run_id, Cancelling(), force=True)
        assert not client.read_flow_run(run_id).state.is_final()
        client.set_flow_run_state(run_id, Cancelled(), force=True)


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
    sweep_run_id = trigger(served, "ablation-sweep/dapo-sweep", params)
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

    latest = _wait_for(training, "the arm to start training", FLOW_TIMEOUT_S, log=served.log)
    with prefect_client(served.api_url) as client:  # what the UI's Cancel button does
        client.set_flow_run_state(sweep_run_id, Cancelling())
    assert wait_final(served, sweep_run_id).state.is_cancelled()
    child = wait_final(served, UUID(latest["flow_run_id"]))
    assert child.state.is_cancelled(), child.state

    def marked() -> bool:
        run = st.get_run(int(latest["run_id"]))
        return (
            run["status"] == "cancelled"
            and st.get_sweep(int(run["sweep_id"]))["status"] == "cancelled"
        )

    _wait_for(marked, "the store to mark the run and the sweep cancelled", 30.0, log=served.log)
    assert (
        st.get_run(int(latest["run_id"]))["steps"] is None
        or st.get_run(int(latest["run_id"]))["steps"] < 200
    )
