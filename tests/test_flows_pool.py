"""The team setup: deployments on a Prefect work pool (`dapo deploy`) and process workers
(`dapo worker`) that run them, against a real Prefect server and real workers.

The module starts `prefect server start` (temporary PREFECT_HOME, a free port) and a local Ray
instance with 2 CPUs in this process (the workers join it through RAY_ADDRESS, so killing a
worker never takes Ray with it), deploys to pool POOL, and starts workers as `dapo worker`
subprocesses, each stopped by its pid. Tests run in file order: the first worker runs a sweep,
a sweep is submitted through the Prefect UI's own form in headless Chromium, then two workers
share two arms, then one of them is killed in the middle of an arm.
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
from dapo_cli import stored_sweep
from prefect_server import stop as _stop
from prefect_server import wait_for as _wait_for
from test_dashboard_browser import ARTIFACTS, find_chromium
from test_flows_served import FAST, prefect_client

from dapo_core.train.run_dir import latest_step
from dashboard import browser
from flows import deploy, ray_worker
from flows.params import SweepParams, validate

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
POOL = "dapo-test-pool"
NAMES = ("ablation-sweep/dapo-sweep", "ablation-arm/dapo-arm", "evaluate-run/dapo-eval")
FLOW_TIMEOUT_S = 300.0
# The default window: a shorter one risks crashing a live run on a loaded machine.
CRASH_AFTER_S = deploy.CRASH_AFTER_S


@dataclass
class Team:
    api_url: str
    store_url: str
    runs_dir: Path
    work: Path
    ray_address: str
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
            "RAY_ADDRESS": self.ray_address,
            "DAPO_RUNS_DIR": str(self.runs_dir),
            **extra,
        }
        env.pop("DAPO_DB_URL", None)  # the store travels as --store, as a user passes it
        return env

    def log(self, name: str) -> Path:
        return self.work / f"worker-{name}.log"

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
        _wait_for(
            lambda: f"Worker '{name}' started" in self.log(name).read_text(),
            f"worker {name} to start polling",
            120.0,
            proc,
            self.log(name),
        )
        return proc


def dapo(team: Team, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "dapo"), *args],
        env=env if env is not None else team.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    import ray

    work = tmp_path_factory.mktemp("pool")
    # The UI too, for the form test.
    with prefect_server.running(work / "prefect-server", ui=True) as api_url:
        team = None
        try:
            ray_worker.connect("local", num_cpus=2)
            team = Team(
                api_url=api_url,
                store_url=f"sqlite:///{work / 'dapo.db'}",
                runs_dir=work / "runs",
                work=work,
                ray_address=ray.get_runtime_context().gcs_address,
            )
            yield team
        finally:
            # Workers, then the flow-run processes a failed test may have left (each in a
            # session of its own), before the server they talk to.
            for proc in team.workers.values() if team else []:
                _stop(proc, signal.SIGINT)
            if team is not None:
                stop_unfinished_flow_runs(team.api_url)
            ray_worker.shutdown()


def stop_unfinished_flow_runs(api_url: str) -> None:
    """SIGKILL the process of each flow run that is not final, by the pid Prefect recorded
    for it, when that pid is still a flow-run process (`prefect.engine`) of ours."""
    with prefect_client(api_url) as client:
        runs = client.read_flow_runs()
    for run in runs:
        if run.state is None or run.state.is_final() or not run.infrastructure_pid:
            continue
        pid = int(str(run.infrastructure_pid).rsplit(":", 1)[-1])
        with contextlib.suppress(OSError):
            if b"prefect.engine" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def deployed(team: Team) -> str:
    """`dapo deploy --pool POOL --limit 2`; returns its output."""
    done = dapo(team, "deploy", "--pool", POOL, "--limit", "2", "--crash-after", str(CRASH_AFTER_S))
    assert done.returncode == 0, done.stderr
    return done.stdout


def wait_final(team: Team, flow_run_id: UUID, timeout_s: float = FLOW_TIMEOUT_S) -> Any:
    def final() -> Any:
        with prefect_client(team.api_url) as client:
            run = client.read_flow_run(flow_run_id)
        return run if run.state is not None and run.state.is_final() else None

    try:
        return _wait_for(final, f"flow run {flow_run_id}", timeout_s)
    except pytest.fail.Exception as exc:
        logs = "\n".join(p.read_text()[-1500:] for p in team.work.glob("worker-*.log"))
        pytest.fail(f"{exc}\n{logs}")


def trigger(team: Team, deployment: str, parameters: dict[str, Any]) -> UUID:
    with prefect_client(team.api_url) as client:
        dep = client.read_deployment_by_name(deployment)
        return client.create_flow_run_from_deployment(dep.id, parameters=parameters).id


def submitted_by(team: Team, flow_run_id: UUID) -> str | None:
    """The worker that picked the flow run up, from the run's own log on the server."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with prefect_client(team.api_url) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    for log in logs:
        found = re.match(r"Worker '([^']+)' submitting flow run", log.message)
        if found:
            return found.group(1)
    return None


def store(team: Team) -> Any:
    from db.store import Store

    return Store(team.store_url)


def arm_sweep(team: Team, arms: list[str], steps: int, name: str) -> int:
    params = validate(SweepParams, {"arms": arms, "seeds": [0], "steps": steps, "overrides": FAST})
    return stored_sweep(store(team), params, name)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of a live parent stays a zombie until reaped: dead all the same.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    return True


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
        assert mine["enforce_parameter_schema"] is dep.enforce_parameter_schema is False
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
def test_bad_pools_and_no_server_are_one_line_and_exit_2(team: Team) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate

    env = team.env()
    env.pop("PREFECT_API_URL")
    done = dapo(team, "deploy", "--pool", POOL, env=env)
    assert done.returncode == 2 and "no Prefect server" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr

    done = dapo(team, "worker", "--pool", "no-such-pool")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: no work pool named 'no-such-pool' on the Prefect server at {team.api_url}: "
        "create it and its deployments with `dapo deploy --pool no-such-pool`"
    ]
    with prefect_client(team.api_url) as client:
        # Prefect's own worker would have created it: ours must not.
        assert deploy.read_pool(client, "no-such-pool") is None
        client.create_work_pool(WorkPoolCreate(name="k8s-pool", type="kubernetes"))

    done = dapo(team, "worker", "--pool", "k8s-pool")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "'k8s-pool' is a 'kubernetes' pool" in done.stderr, done.stderr
    done = dapo(team, "deploy", "--pool", "k8s-pool")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "--image" in done.stderr and "'kubernetes' pool" in done.stderr, done.stderr


# --- deploy ------------------------------------------------------------------------------------------
def test_deploy_creates_the_pool_and_the_three_deployments_with_the_served_forms(
    team: Team, deployed: str
) -> None:
    from flows.serve import deployments

    assert f"created work pool '{POOL}' (type process)" in deployed
    forms = {f"{d.flow_name}/{d.name}": d._parameter_openapi_schema for d in deployments()}
    with prefect_client(team.api_url) as client:
        assert client.read_work_pool(POOL).type == "process"
        for name in NAMES:
            dep = client.read_deployment_by_name(name)
            assert dep.work_pool_name == POOL, name
            assert dep.parameter_openapi_schema == forms[name].model_dump(exclude_unset=True)
            assert "dapo" in dep.tags
            assert dep.job_variables["env"] == deploy.HEARTBEAT_ENV
        limits = {
            name: client.read_deployment_by_name(name).global_concurrency_limit for name in NAMES
        }
        automations = client.read_automations_by_name(deploy.AUTOMATION_NAME)
    # --limit bounds the arms only: a sweep waiting for its arms never holds their slot.
    assert limits["ablation-arm/dapo-arm"] is not None
    assert limits["ablation-arm/dapo-arm"].limit == 2
    assert limits["ablation-sweep/dapo-sweep"] is None
    assert len(automations) == 1
    assert automations[0].trigger.within.total_seconds() == CRASH_AFTER_S


# --- a sweep through a worker -------------------------------------------------------------------
def test_a_sweep_created_through_the_api_runs_on_the_worker_and_fills_the_store(
    team: Team, deployed: str, request: pytest.FixtureRequest
) -> None:
    from db import ablation, reads

    worker = team.start_worker("w1")
    request.addfinalizer(lambda: _stop(worker, signal.SIGINT))
    params = {
        "preset": "tiny",
        "arms": ["grpo", "clip_higher"],
        "seeds": [0],
        "steps": 2,
        "overrides": FAST,
    }
    flow_run_id = trigger(team, "ablation-sweep/dapo-sweep", params)
    run = wait_final(team, flow_run_id)
    assert run.state.is_completed(), (run.state, team.log("w1").read_text()[-3000:])
    assert run.work_pool_name == POOL and submitted_by(team, flow_run_id) == "w1"

    st = store(team)
    sweeps = ablation.list_sweeps(st.engine)
    sweep_id = int(sweeps[sweeps["flow_run_id"] == str(flow_run_id)]["sweep_id"].iloc[0])
    assert st.get_sweep(sweep_id)["status"] == "completed"
    runs = reads.runs_of_sweep(st.engine, sweep_id)
    assert sorted(runs["arm"]) == ["clip_higher", "grpo"]
    assert set(runs["status"]) == {"completed"} and list(runs["steps"]) == [2, 2]
    curves = reads.metric_curves(st.engine, [int(r) for r in runs["run_id"]])
    assert set(curves["run_id"]) == {int(r) for r in runs["run_id"]}
    with prefect_client(team.api_url) as client:
        arm_dep = client.read_deployment_by_name("ablation-arm/dapo-arm")
        for arm_run_id in runs["flow_run_id"]:
            child = client.read_flow_run(UUID(arm_run_id))
            # Each arm is a run of the pool's dapo-arm deployment, started by the worker
            # in a process of its own.
            assert child.deployment_id == arm_dep.id and child.work_pool_name == POOL
            assert child.state.is_completed()
            assert submitted_by(team, child.id) == "w1"
            assert child.infrastructure_pid and int(child.infrastructure_pid) != worker.pid


# --- a sweep through the Prefect UI's form ------------------------------------------------------
@pytest.mark.browser
def test_a_sweep_submitted_through_the_prefect_ui_form_runs_on_the_worker_and_fills_the_store(
    team: Team, deployed: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """What the deploy message tells a user: Deployments → dapo-sweep → Run → Custom run, the
    parameters typed as JSON, Submit; the flow run the form made is the pool's worker's."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from db import ablation, reads

    exe = find_chromium()
    worker = team.start_worker("form")
    # Stopped whatever happens: a worker left polling takes the next tests' runs.
    request.addfinalizer(lambda: _stop(worker, signal.SIGINT))
    run_name = "sweep-from-the-form"
    params = {
        "preset": "tiny",
        "arms": ["grpo"],
        "seeds": [0],
        "steps": 2,
        "overrides": FAST,
        "name": "submitted through the Prefect UI",
    }

    def runs_of_sweep_deployment() -> list[Any]:
        with prefect_client(team.api_url) as client:
            dep = client.read_deployment_by_name("ablation-sweep/dapo-sweep")
            by_dep = DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))
            return client.read_flow_runs(deployment_filter=by_dep)

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
    run = wait_final(team, shown_id)
    assert run.state.is_completed(), (run.state, team.log("form").read_text()[-3000:])
    assert run.work_pool_name == POOL and submitted_by(team, shown_id) == "form"
    assert run.infrastructure_pid and int(run.infrastructure_pid) != worker.pid

    st = store(team)
    sweeps = ablation.list_sweeps(st.engine)
    sweep_id = int(sweeps[sweeps["flow_run_id"] == str(shown_id)]["sweep_id"].iloc[0])
    sweep = st.get_sweep(sweep_id)
    assert sweep["status"] == "completed" and sweep["name"] == params["name"]
    runs = reads.runs_of_sweep(st.engine, sweep_id)
    assert list(runs["arm"]) == ["grpo"] and list(runs["seed"]) == [0]
    assert list(runs["status"]) == ["completed"] and list(runs["steps"]) == [2]
    curves = reads.metric_curves(st.engine, [int(runs["run_id"].iloc[0])])
    assert not curves.empty and set(curves["step"]) >= {1, 2}


# --- two workers share the work -----------------------------------------------------------------
def test_two_workers_on_the_pool_share_the_runs(team: Team, deployed: str) -> None:
    from db import reads

    # One run at a time each: two runs at once must go one to each.
    for name in ("a", "b"):
        team.start_worker(name, "--limit", "1")
    sweep_id = arm_sweep(team, ["overlong_filter", "soft_punish"], 2, "shared")
    ids = [
        trigger(team, "ablation-arm/dapo-arm", {"sweep_id": sweep_id, "arm": arm, "seed": 0})
        for arm in ("overlong_filter", "soft_punish")
    ]
    runs = [wait_final(team, flow_run_id) for flow_run_id in ids]
    assert all(run.state.is_completed() for run in runs), [run.state for run in runs]
    assert sorted(submitted_by(team, flow_run_id) or "" for flow_run_id in ids) == ["a", "b"]
    assert len({run.infrastructure_pid for run in runs}) == 2
    table = reads.runs_of_sweep(store(team).engine, sweep_id)
    assert set(table["status"]) == {"completed"} and list(table["steps"]) == [2, 2]


# --- a worker killed in the middle of an arm -------------------------------------------------------
def test_a_killed_worker_leaves_a_crashed_run_that_a_rerun_on_the_other_worker_resumes(
    team: Team, deployed: str
) -> None:
    """The machine of a worker dies: the worker and the flow run it started are SIGKILLed.

    What Prefect does: nothing reports the run any more, so it stays Running until the
    automation `dapo deploy` created sees its heartbeats stop and marks it Crashed. The arm
    is then rerun (what the dashboard's button does) and the other worker picks the rerun
    up; it resumes from the last checkpoint and completes every step once."""
    from dashboard.rerun import request_rerun
    from db import reads

    for name in ("a", "b"):  # those of the test before, or new ones when run alone
        if name not in team.workers or team.workers[name].poll() is not None:
            team.start_worker(name, "--limit", "1")
    steps = 8
    sweep_id = arm_sweep(team, ["token_loss"], steps, "kill a worker")
    flow_run_id = trigger(
        team, "ablation-arm/dapo-arm", {"sweep_id": sweep_id, "arm": "token_loss", "seed": 0}
    )
    st = store(team)

    def checkpointed() -> tuple[int, str, int] | None:
        latest = st.latest_attempt(sweep_id, "token_loss", 0)
        if latest is None or not latest.get("checkpoint_dir"):
            return None
        step = latest_step(latest["checkpoint_dir"])
        metrics = not reads.metric_curves(st.engine, [int(latest["run_id"])]).empty
        return (int(latest["run_id"]), latest["checkpoint_dir"], step) if step and metrics else None

    run_id, run_dir, step = _wait_for(checkpointed, "the first checkpoint", FLOW_TIMEOUT_S)
    assert step < steps, "the arm finished before its worker could be killed: more steps"
    name = submitted_by(team, flow_run_id)
    assert name in ("a", "b"), name
    other = "b" if name == "a" else "a"
    with prefect_client(team.api_url) as client:
        pid = int(client.read_flow_run(flow_run_id).infrastructure_pid)

    team.workers[name].send_signal(signal.SIGKILL)
    team.workers[name].wait()
    # The flow run's process is in a session of its own: it outlives its worker.
    assert alive(pid), "the flow run's process died with its worker"
    os.kill(pid, signal.SIGKILL)  # and now the rest of the machine
    _wait_for(lambda: not alive(pid), "the flow run's process to die", 30.0)

    crashed = wait_final(team, flow_run_id, timeout_s=CRASH_AFTER_S + 2 * deploy.HEARTBEAT_S + 60)
    assert crashed.state.is_crashed(), crashed.state
    assert "no heartbeat" in (crashed.state.message or ""), crashed.state.message
    first = st.get_run(run_id)
    assert first["status"] == "running", first  # no process was left to say otherwise

    result = request_rerun(sweep_id, "token_loss", 0, environ={"PREFECT_API_URL": team.api_url})
    assert result.ok, result.message
    rerun = wait_final(team, UUID(result.flow_run_id))
    assert rerun.state.is_completed(), (rerun.state, team.log(other).read_text()[-3000:])
    assert submitted_by(team, rerun.id) == other

    latest = st.latest_attempt(sweep_id, "token_loss", 0)
    assert latest["attempt"] == 2 and latest["status"] == "completed"
    assert latest["steps"] == steps and latest["checkpoint_dir"] == run_dir
    superseded = st.get_run(run_id)
    assert superseded["status"] == "cancelled" and superseded["superseded_by"] == latest["run_id"]
    curves = reads.metric_curves(st.engine, [int(latest["run_id"])])
    training = curves[~curves["name"].str.startswith("eval/")]
    assert sorted(set(training["step"])) == list(range(1, steps + 1))
    assert not curves.duplicated(["step", "name"]).any()


# --- the arm limit -------------------------------------------------------------------------------
def test_deploying_again_updates_in_place_and_the_arm_limit_holds_arms_back(
    team: Team, deployed: str
) -> None:
    """`dapo deploy --limit 1` again: the same deployments and one automation, now with a limit
    of one arm at a time; a worker with no limit of its own then trains two arms one after the
    other, the second held in Prefect's AwaitingConcurrencySlot until the first ends."""
    with prefect_client(team.api_url) as client:
        before = {name: client.read_deployment_by_name(name).id for name in NAMES}
    done = dapo(team, "deploy", "--pool", POOL, "--limit", "1")
    assert done.returncode == 0, done.stderr
    assert f"using work pool '{POOL}' (type process)" in done.stdout
    with prefect_client(team.api_url) as client:
        assert {name: client.read_deployment_by_name(name).id for name in NAMES} == before
        limit = client.read_deployment_by_name("ablation-arm/dapo-arm").global_concurrency_limit
        assert limit is not None and limit.limit == 1
        assert len(client.read_automations_by_name(deploy.AUTOMATION_NAME)) == 1

    for name, proc in list(team.workers.items()):  # only the new worker takes runs
        _stop(proc, signal.SIGINT)
        del team.workers[name]
    team.start_worker("c")
    sweep_id = arm_sweep(team, ["clip_higher", "token_loss"], 2, "limited")
    ids = [
        trigger(team, "ablation-arm/dapo-arm", {"sweep_id": sweep_id, "arm": arm, "seed": 0})
        for arm in ("clip_higher", "token_loss")
    ]
    runs = sorted(
        (wait_final(team, flow_run_id) for flow_run_id in ids), key=lambda r: r.start_time
    )
    assert all(run.state.is_completed() for run in runs), [run.state for run in runs]
    assert runs[0].end_time <= runs[1].start_time, [(r.start_time, r.end_time) for r in runs]
    with prefect_client(team.api_url) as client:
        held = [{state.name for state in client.read_flow_run_states(run.id)} for run in runs]
    assert "AwaitingConcurrencySlot" in held[1], held
