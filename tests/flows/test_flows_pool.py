"""The team setup: deployments on a Prefect work pool (`dapo deploy`) and process workers
(`dapo worker`) that run them, against a real Prefect server and real workers.

The server is the session's (conftest.shared_prefect_server, with its UI), the Ray the
session's warm one (conftest.warm_ray: workers join it through RAY_ADDRESS, so killing a worker
never takes Ray with it); the store and runs directory are this module's own. The module
deploys to pool POOL with an arm limit of 1 and starts workers as `dapo worker` subprocesses,
each stopped by its pid. Tests run in file order: a sweep submitted through the Prefect UI's
own form in headless Chromium runs on a worker, its arms one at a time under the limit; then a
second deploy raises the limit in place, two workers share two arms at once, and the worker of
one is killed in the middle of it. At the end the module leaves the server without its
deployments, pools and automation.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import prefect_server
import prefect_ui
import pytest
import yaml
from chromium import ARTIFACTS, find_chromium
from dapo_cli import FAST, FLOW_TEST_TIMEOUT_S, alive, dapo, stored_sweep
from prefect_server import FLOW_POLL_S, client, stop, wait_for
from ray_cluster import RayCluster

from dapo_core.train.run_dir import latest_step
from dashboard import browser
from flows import deploy
from flows.params import SweepParams, validate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(FLOW_TEST_TIMEOUT_S)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
POOL = "dapo-test-pool"
K8S_POOL = "dapo-test-k8s-pool"
NAMES = prefect_server.DEPLOYMENTS
# The default window: a shorter one risks crashing a live run on a loaded machine.
CRASH_AFTER_S = deploy.CRASH_AFTER_S


@dataclass
class Team:
    api_url: str
    store_url: str
    runs_dir: Path
    work: Path
    ray: RayCluster
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ui_url(self) -> str:
        return self.api_url.removesuffix("/api")

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            "PREFECT_API_URL": self.api_url,
            "PREFECT_HOME": str(self.work / "prefect-client"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            **self.ray.client_env(),
            "DAPO_RUNS_DIR": str(self.runs_dir),
            **extra,
        }
        env.pop("DAPO_DB_URL", None)  # the store travels as --store, as a user passes it
        return env

    def log(self, name: str) -> Path:
        return self.work / f"worker-{name}.log"

    def logs(self) -> list[Path]:
        return sorted(self.work.glob("worker-*.log"))

    def start_worker(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        with self.log(name).open("wb") as out:
            proc = subprocess.Popen(
                [
                    *(str(BIN / "dapo"), "worker", "--pool", POOL, "--name", name),
                    *("--store", self.store_url, *extra),
                ],
                env=self.env(),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.workers[name] = proc
        wait_for(
            lambda: f"Worker '{name}' started" in self.log(name).read_text(),
            f"worker {name} to start polling",
            600.0,
            proc,
            self.log(name),
        )
        return proc

    def stop_workers(self) -> None:
        for name, proc in list(self.workers.items()):
            stop(proc, signal.SIGINT)
            del self.workers[name]

    def wait_final(
        self, flow_run_id: UUID, timeout_s: float = prefect_server.FLOW_TIMEOUT_S
    ) -> Any:
        return prefect_server.wait_final(self.api_url, flow_run_id, timeout_s, logs=self.logs())

    def trigger(self, deployment: str, parameters: dict[str, Any]) -> UUID:
        return prefect_server.trigger(self.api_url, deployment, parameters)


@pytest.fixture(scope="module")
def team(
    shared_prefect_server: str, warm_ray: RayCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Team]:
    work = tmp_path_factory.mktemp("pool")
    team = Team(
        api_url=shared_prefect_server,
        store_url=f"sqlite:///{work / 'dapo.db'}",
        runs_dir=work / "runs",
        work=work,
        ray=warm_ray,
    )
    leave_the_server_as_found(team.api_url)
    try:
        yield team
    finally:
        # Workers, then the flow-run processes a failed test may have left (each in a
        # session of its own), then what the module made on the session's server.
        team.stop_workers()
        stop_unfinished_flow_runs(team.api_url)
        leave_the_server_as_found(team.api_url)


def leave_the_server_as_found(api_url: str) -> None:
    """Remove the deployments, the pools and the automation this module makes (before it
    starts, what an earlier one left; after it ends, its own)."""
    from prefect.exceptions import ObjectNotFound

    prefect_server.delete_deployments(api_url)
    with client(api_url) as prefect:
        for pool in (POOL, K8S_POOL):
            with contextlib.suppress(ObjectNotFound):
                prefect.delete_work_pool(pool)
        for automation in prefect.read_automations_by_name(deploy.AUTOMATION_NAME):
            prefect.delete_automation(automation.id)


def stop_unfinished_flow_runs(api_url: str) -> None:
    """SIGKILL the process of each flow run of the pool that is not final, by the pid Prefect
    recorded for it, when that pid is still a flow-run process (`prefect.engine`) of ours."""
    with client(api_url) as prefect:
        runs = prefect.read_flow_runs()
    for run in runs:
        if run.work_pool_name != POOL or not run.infrastructure_pid:
            continue
        if run.state is None or run.state.is_final():
            continue
        pid = int(str(run.infrastructure_pid).rsplit(":", 1)[-1])
        with contextlib.suppress(OSError):
            if b"prefect.engine" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def deployed(team: Team) -> str:
    """`dapo deploy --pool POOL --limit 1`: one arm at a time; returns its output."""
    done = dapo(
        *("deploy", "--pool", POOL, "--limit", "1", "--crash-after", str(CRASH_AFTER_S)),
        env=team.env(),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def submitted_by(team: Team, flow_run_id: UUID) -> str | None:
    """The worker that picked the flow run up, from the run's own log on the server."""
    for message in prefect_server.flow_logs(team.api_url, flow_run_id):
        found = re.match(r"Worker '([^']+)' submitting flow run", message)
        if found:
            return found.group(1)
    return None


def store(team: Team) -> Any:
    from db.store import Store

    return Store(team.store_url)


def arm_sweep(team: Team, arms: list[str], steps: int, name: str) -> int:
    params = validate(SweepParams, {"arms": arms, "seeds": [0], "steps": steps, "overrides": FAST})
    return stored_sweep(store(team), params, name)


# --- prefect.yaml and the deployments agree (no server) --------------------------------------
def test_prefect_yaml_describes_the_served_deployments() -> None:
    from flows.serve import deployments

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    described = {d["name"]: d for d in spec["deployments"]}
    for dep in deployments():
        mine = described[dep.name]
        assert mine["entrypoint"] == dep.entrypoint, dep.name
        assert mine["tags"] == dep.tags, dep.name
        assert mine["description"] == dep.description, dep.name
        assert mine["enforce_parameter_schema"] is dep.enforce_parameter_schema is True
        assert mine["work_pool"]["name"] == deploy.DEFAULT_POOL
        assert mine["work_pool"]["job_variables"]["env"] == deploy.HEARTBEAT_ENV
    assert len(described) == 3


def test_pool_checks_say_the_cause_in_one_line() -> None:
    from types import SimpleNamespace

    process, k8s = SimpleNamespace(type="process"), SimpleNamespace(type="kubernetes")
    deploy.check_worker_pool(process, "p", "URL")
    deploy.check_deploy_pool(None, "p", None)  # created as a process pool
    deploy.check_deploy_pool(process, "p", None)
    deploy.check_deploy_pool(k8s, "p", "registry/dapo-lab:1")
    cases = [
        (lambda: deploy.check_worker_pool(None, "p", "URL"), "no work pool named 'p'"),
        (lambda: deploy.check_worker_pool(k8s, "p", "URL"), "'p' is a 'kubernetes' pool"),
        (lambda: deploy.check_deploy_pool(k8s, "p", None), "name one with dapo-lab installed"),
        (lambda: deploy.check_deploy_pool(None, "p", "img"), "creates process pools only"),
        (lambda: deploy.check_deploy_pool(process, "p", "img"), "leave out --image"),
    ]
    for check, want in cases:
        with pytest.raises(ValueError, match=re.escape(want)) as info:
            check()
        assert "\n" not in str(info.value)


# --- bad input -----------------------------------------------------------------------------------
@pytest.mark.e2e
def test_bad_pools_and_no_server_are_one_line_and_exit_2(team: Team) -> None:
    """The commands read the pool from the server and refuse it through the checks above
    (each check's every case is tested there): one line, exit 2, nothing created."""
    from prefect.client.schemas.actions import WorkPoolCreate

    env = team.env()
    env.pop("PREFECT_API_URL")
    done = dapo("deploy", "--pool", POOL, env=env)
    assert done.returncode == 2 and "no Prefect server" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr

    done = dapo("worker", "--pool", "no-such-pool", env=team.env())
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: no work pool named 'no-such-pool' on the Prefect server at {team.api_url}: "
        "create it and its deployments with `dapo deploy --pool no-such-pool`"
    ]
    with client(team.api_url) as prefect:
        # Prefect's own worker would have created it: ours must not.
        assert deploy.read_pool(prefect, "no-such-pool") is None
        prefect.create_work_pool(WorkPoolCreate(name=K8S_POOL, type="kubernetes"))

    done = dapo("deploy", "--pool", K8S_POOL, env=team.env())
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "--image" in done.stderr and "'kubernetes' pool" in done.stderr, done.stderr


# --- deploy ------------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_deploy_creates_the_pool_and_the_three_deployments_with_the_served_forms(
    team: Team, deployed: str
) -> None:
    from flows.serve import deployments

    assert f"created work pool '{POOL}' (type process)" in deployed
    forms = {f"{d.flow_name}/{d.name}": d._parameter_openapi_schema for d in deployments()}
    with client(team.api_url) as prefect:
        assert prefect.read_work_pool(POOL).type == "process"
        for name in NAMES:
            dep = prefect.read_deployment_by_name(name)
            assert dep.work_pool_name == POOL, name
            assert dep.parameter_openapi_schema == forms[name].model_dump(exclude_unset=True)
            assert "dapo" in dep.tags
            assert dep.job_variables["env"] == deploy.HEARTBEAT_ENV
        limits = {
            name: prefect.read_deployment_by_name(name).global_concurrency_limit for name in NAMES
        }
        automations = prefect.read_automations_by_name(deploy.AUTOMATION_NAME)
    # --limit bounds the arms only: a sweep waiting for its arms never holds their slot.
    assert limits["ablation-arm/dapo-arm"] is not None
    assert limits["ablation-arm/dapo-arm"].limit == 1
    assert limits["ablation-sweep/dapo-sweep"] is None
    assert len(automations) == 1
    assert automations[0].trigger.within.total_seconds() == CRASH_AFTER_S


# --- a sweep through the Prefect UI's form, on a worker, under the arm limit -----------------
@pytest.mark.e2e
@pytest.mark.browser
def test_a_sweep_submitted_through_the_prefect_ui_form_runs_on_the_worker_one_arm_at_a_time(
    team: Team, deployed: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """What the deploy message tells a user: Deployments → dapo-sweep → Run → Custom run, the
    parameters typed as JSON, Submit; the flow run the form made is the pool's worker's, and
    so is each arm, a run of the dapo-arm deployment in a process of its own. The arm limit
    of 1 holds the second arm in Prefect's AwaitingConcurrencySlot until the first ends, while
    the sweep that waits for both holds no slot."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from db import ablation, reads

    exe = find_chromium()
    worker = team.start_worker("form")
    # Stopped whatever happens: a worker left polling takes the next tests' runs.
    request.addfinalizer(team.stop_workers)
    run_name = "sweep-from-the-form"
    params = {
        "preset": "tiny",
        "arms": ["grpo", "clip_higher"],
        "seeds": [0],
        "steps": 2,
        "overrides": FAST,
        "name": "submitted through the Prefect UI",
    }

    def runs_of_sweep_deployment() -> list[Any]:
        with client(team.api_url) as prefect:
            dep = prefect.read_deployment_by_name("ablation-sweep/dapo-sweep")
            by_dep = DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))
            return prefect.read_flow_runs(deployment_filter=by_dep)

    before = {run.id for run in runs_of_sweep_deployment()}
    with browser.open_page(exe) as page:
        page.set_viewport(1400, 1400)  # the whole form, Submit included
        prefect_ui.fill_custom_run(page, team.ui_url, "dapo-sweep", params, run_name)
        shot = page.screenshot(tmp_path / "pool-form.png")
        shown_id = prefect_ui.submit(page, run_name)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000  # a drawn form, not blank
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "pool-form.png", ARTIFACTS / "pool-form.png")

    # The form made exactly one run of the deployment: the one its page links to, named and
    # parameterized as typed.
    made = [run for run in runs_of_sweep_deployment() if run.id not in before]
    assert [run.id for run in made] == [shown_id]
    assert made[0].name == run_name and made[0].parameters == params
    run = team.wait_final(shown_id)
    assert run.state.is_completed(), (run.state, team.log("form").read_text()[-3000:])
    assert run.work_pool_name == POOL and submitted_by(team, shown_id) == "form"
    assert run.infrastructure_pid and int(run.infrastructure_pid) != worker.pid

    st = store(team)
    sweeps = ablation.list_sweeps(st.engine)
    sweep_id = int(sweeps[sweeps["flow_run_id"] == str(shown_id)]["sweep_id"].iloc[0])
    sweep = st.get_sweep(sweep_id)
    assert sweep["status"] == "completed" and sweep["name"] == params["name"]
    runs = reads.runs_of_sweep(st.engine, sweep_id)
    assert sorted(runs["arm"]) == ["clip_higher", "grpo"] and set(runs["seed"]) == {0}
    assert set(runs["status"]) == {"completed"} and list(runs["steps"]) == [2, 2]
    curves = reads.metric_curves(st.engine, [int(r) for r in runs["run_id"]])
    for run_id in runs["run_id"]:
        assert set(curves[curves["run_id"] == run_id]["step"]) >= {1, 2}

    with client(team.api_url) as prefect:
        arm_dep = prefect.read_deployment_by_name("ablation-arm/dapo-arm")
        arms = [prefect.read_flow_run(UUID(i)) for i in runs["flow_run_id"]]
        held = [{state.name for state in prefect.read_flow_run_states(a.id)} for a in arms]
    for child in arms:
        # Each arm is a run of the pool's dapo-arm deployment, started by the worker in a
        # process of its own.
        assert child.deployment_id == arm_dep.id and child.work_pool_name == POOL
        assert child.state.is_completed()
        assert submitted_by(team, child.id) == "form"
        assert child.infrastructure_pid and int(child.infrastructure_pid) != worker.pid
    first, second = sorted(arms, key=lambda a: a.start_time)
    assert first.end_time <= second.start_time, [(a.start_time, a.end_time) for a in arms]
    assert any("AwaitingConcurrencySlot" in names for names in held), held


# --- deploying again; two workers share the work; one of them is killed mid-arm ----------------
@pytest.mark.e2e
def test_deploying_again_updates_in_place_and_two_workers_share_two_arms_at_once(
    team: Team, deployed: str
) -> None:
    """`dapo deploy --limit 2` again: the same deployments and one automation, now with a limit
    of two arms at once, which two workers of one run at a time each then take, one each.

    Then the machine of one worker dies in the middle of its arm: the worker and the flow run
    it started are SIGKILLed. Nothing reports the run any more, so it stays Running until the
    automation `dapo deploy` created sees its heartbeats stop and marks it Crashed. The arm is
    then rerun (what the dashboard's button does) and the other worker picks the rerun up; it
    resumes from the last checkpoint and completes every step once."""
    from dashboard.rerun import request_rerun
    from db import reads

    with client(team.api_url) as prefect:
        before = {name: prefect.read_deployment_by_name(name).id for name in NAMES}
    done = dapo("deploy", "--pool", POOL, "--limit", "2", env=team.env())
    assert done.returncode == 0, done.stderr
    assert f"using work pool '{POOL}' (type process)" in done.stdout
    with client(team.api_url) as prefect:
        assert {name: prefect.read_deployment_by_name(name).id for name in NAMES} == before
        limit = prefect.read_deployment_by_name("ablation-arm/dapo-arm").global_concurrency_limit
        assert limit is not None and limit.limit == 2
        assert len(prefect.read_automations_by_name(deploy.AUTOMATION_NAME)) == 1

    # One run at a time each: two runs at once must go one to each.
    team.stop_workers()
    for name in ("a", "b"):
        team.start_worker(name, "--limit", "1")
    steps = 8
    killed_sweep = arm_sweep(team, ["token_loss"], steps, "kill a worker")
    shared_sweep = arm_sweep(team, ["overlong_filter"], 2, "shared")
    killed_run = team.trigger(
        "ablation-arm/dapo-arm", {"sweep_id": killed_sweep, "arm": "token_loss", "seed": 0}
    )
    shared_run = team.trigger(
        "ablation-arm/dapo-arm", {"sweep_id": shared_sweep, "arm": "overlong_filter", "seed": 0}
    )
    st = store(team)

    def checkpointed() -> tuple[int, str, int] | None:
        latest = st.latest_attempt(killed_sweep, "token_loss", 0)
        if latest is None or not latest.get("checkpoint_dir"):
            return None
        step = latest_step(latest["checkpoint_dir"])
        metrics = not reads.metric_curves(st.engine, [int(latest["run_id"])]).empty
        return (int(latest["run_id"]), latest["checkpoint_dir"], step) if step and metrics else None

    run_id, run_dir, step = wait_for(checkpointed, "the first checkpoint")
    assert step < steps, "the arm finished before its worker could be killed: more steps"
    name = wait_for(
        lambda: submitted_by(team, killed_run), "the killed run's worker", poll_s=FLOW_POLL_S
    )
    assert name in ("a", "b"), name
    other = "b" if name == "a" else "a"
    with client(team.api_url) as prefect:
        pid = int(prefect.read_flow_run(killed_run).infrastructure_pid)

    team.workers[name].send_signal(signal.SIGKILL)
    team.workers[name].wait()
    # The flow run's process is in a session of its own: it outlives its worker.
    assert alive(pid), "the flow run's process died with its worker"
    os.kill(pid, signal.SIGKILL)  # and now the rest of the machine
    wait_for(lambda: not alive(pid), "the flow run's process to die", 600.0)

    shared = team.wait_final(shared_run)  # the other arm, on the other worker, goes on
    assert shared.state.is_completed(), (shared.state, team.log(other).read_text()[-3000:])
    assert submitted_by(team, shared_run) == other
    assert shared.infrastructure_pid and int(shared.infrastructure_pid) != pid
    table = reads.runs_of_sweep(st.engine, shared_sweep)
    assert list(table["status"]) == ["completed"] and list(table["steps"]) == [2]

    crashed = team.wait_final(killed_run)
    assert crashed.state.is_crashed(), crashed.state
    assert "no heartbeat" in (crashed.state.message or ""), crashed.state.message
    first = st.get_run(run_id)
    assert first["status"] == "running", first  # no process was left to say otherwise

    result = request_rerun(killed_sweep, "token_loss", 0, environ={"PREFECT_API_URL": team.api_url})
    assert result.ok, result.message
    rerun = team.wait_final(UUID(result.flow_run_id))
    assert rerun.state.is_completed(), (rerun.state, team.log(other).read_text()[-3000:])
    assert submitted_by(team, rerun.id) == other

    latest = st.latest_attempt(killed_sweep, "token_loss", 0)
    assert latest["attempt"] == 2 and latest["status"] == "completed"
    assert latest["steps"] == steps and latest["checkpoint_dir"] == run_dir
    superseded = st.get_run(run_id)
    assert superseded["status"] == "cancelled" and superseded["superseded_by"] == latest["run_id"]
    curves = reads.metric_curves(st.engine, [int(latest["run_id"])])
    training = curves[~curves["name"].str.startswith("eval/")]
    assert sorted(set(training["step"])) == list(range(1, steps + 1))
    assert not curves.duplicated(["step", "name"]).any()
