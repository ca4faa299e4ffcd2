"""Arms as Ray jobs (`--submit ray-jobs`, flows/ray_jobs.py).

The first tests are plain functions (no Ray). The rest (marker `rayjobs`) start a real Ray head
on 127.0.0.1 with its job server (tests/ray_cluster.py: its own temp dir, ports and auth token,
stopped by its own pids at the end) and run `dapo sweep` / `dapo arm` as users do, with a store
and a runs directory under the test's tmp dir. In file order: two arms submitted as jobs; a
`dapo sweep` SIGKILLed mid-arm, whose job trains on and is adopted by `dapo arm` (trained once,
its curve whole and once); a job server that does not answer; a job that cannot start (the
interpreter lacks the package); a job stopped from outside; the hook of a cancelled flow run;
the team's path (a Prefect server, `dapo deploy --pool`, a `dapo worker`), where cancelling an
arm's flow run stops its job; the cluster stops leaving no process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import pytest
from dapo_cli import DAPO, ROOT, SMALL, SMALL_OVERRIDES, store_env, stored_sweep
from prefect_server import BIN
from prefect_server import client as prefect_client
from prefect_server import healthy as _healthy
from prefect_server import stop as _stop
from prefect_server import wait_for as _wait_for
from ray_cluster import RayCluster, ray_cluster

from dapo_common.util import free_port
from flows import ray_jobs

TIMEOUT_S = 300
JOBS = ("--submit", "ray-jobs")


# --- plain functions -------------------------------------------------------------------------
def test_submission_id_is_the_runs_key_not_the_attempts() -> None:
    sid = ray_jobs.submission_id("0f1e2d3c-aaaa", 3, "clip_high=0.28", 1)
    assert sid == "dapo-0f1e2d3c-aaaa-sweep3-clip_high=0.28-s1"
    assert sid == ray_jobs.submission_id("0f1e2d3c-aaaa", 3, "clip_high=0.28", 1)
    assert sid != ray_jobs.submission_id("0f1e2d3c-aaaa", 3, "clip_high=0.28", 2)


def test_the_log_reader_parses_protocol_lines_and_waits_for_whole_lines() -> None:
    seen: list[Any] = []
    reader = ray_jobs.LogReader("grpo s0")
    log = (
        "2026-11-25 INFO job_manager.py:581 -- Runtime env is setting up.\n"
        'dapo-job-progress {"step": 1, "steps": 2}\n'
        'dapo-job-progress {"step": 2'
    )
    reader.feed(log, final=False, on_progress=seen.append)
    assert seen == [{"step": 1, "steps": 2}]  # the half-written line waits
    log += ', "steps": 2}\nsome warning\ndapo-job-result {"steps": 2}\n'
    reader.feed(log, final=True, on_progress=seen.append)
    assert seen[-1] == {"step": 2, "steps": 2} and reader.result == {"steps": 2}
    assert reader.cause(None) == "some warning"  # Ray's own INFO line is not a cause
    reader._error("ValueError: bad data")
    assert reader.cause("Job failed") == "ValueError: bad data"


def test_a_job_server_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAY_ADDRESS", ray_jobs.API_SERVER_ENV):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ray_jobs.JobServerDown, match="needs a Ray cluster with its job server"):
        ray_jobs.connect(None)
    with pytest.raises(ray_jobs.JobServerDown, match="needs a Ray cluster"):
        ray_jobs.connect("local")


def test_which_jobs_are_adopted() -> None:
    from ray.job_submission import JobStatus

    class FakeStore:
        def get_run(self, run_id: int) -> dict[str, Any]:
            return {7: {"status": "completed"}, 8: {"status": "cancelled"}}[run_id]

    def job(status: JobStatus, run_id: int | None) -> Any:
        return SimpleNamespace(status=status, metadata={"run_id": str(run_id)} if run_id else {})

    store: Any = FakeStore()
    assert ray_jobs.adoptable(job(JobStatus.RUNNING, 7), store)  # live: always
    assert ray_jobs.adoptable(job(JobStatus.PENDING, None), store)
    assert not ray_jobs.adoptable(job(JobStatus.SUCCEEDED, 7), store)  # recorded: a new job
    assert ray_jobs.adoptable(job(JobStatus.SUCCEEDED, 8), store)  # nobody recorded it
    assert not ray_jobs.adoptable(job(JobStatus.FAILED, 8), store)
    assert not ray_jobs.adoptable(job(JobStatus.STOPPED, 8), store)


def test_the_store_url_is_not_on_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.params import Resources

    monkeypatch.delenv(ray_jobs.PYTHON_ENV, raising=False)
    url = "postgresql+psycopg://dapo:SECRET@db:5432/dapo"
    command = ray_jobs.entrypoint(12)
    assert command.endswith(" -m flows.job_entry 12") and "SECRET" not in command
    env = ray_jobs.job_env(url, {"arm": "grpo"}, Resources())
    assert env["DAPO_DB_URL"] == url


def test_a_cancelled_flow_runs_signal_says_so_and_stays_prefects_signal() -> None:
    """The SIGTERM of a cancelled flow run reaches the watcher as Prefect's TerminationSignal
    with no message; once the job is stopped it goes on as a TerminationSignal (Prefect's engine
    still handles it as its own) whose message is the run's error line."""
    from prefect.exceptions import TerminationSignal

    from dapo_common.util import first_line
    from flows import plan

    said = ray_jobs.cancelled_signal(TerminationSignal(15), "dapo-x-sweep1-grpo-s0")
    assert isinstance(said, TerminationSignal) and said.signal == 15 and plan.is_stop(said)
    assert first_line(said).endswith("; Ray job dapo-x-sweep1-grpo-s0 stopped"), first_line(said)
    ctrl_c = KeyboardInterrupt()
    assert ray_jobs.cancelled_signal(ctrl_c, "dapo-x") is ctrl_c  # other stops: as they are


def test_the_forms_offer_the_choice() -> None:
    """The dapo-sweep form: a drop-down, actors by default; the arm's: the sweep's by default."""
    from prefect.utilities.callables import parameter_schema

    from flows.arm import ablation_arm
    from flows.sweep import ablation_sweep

    sweep = parameter_schema(ablation_sweep.fn).model_dump_for_openapi()["properties"]["submit"]
    assert sweep["enum"] == list(ray_jobs.SUBMIT_MODES) == ["actors", "ray-jobs"]
    assert sweep["default"] == "actors"
    arm = parameter_schema(ablation_arm.fn).model_dump_for_openapi()["properties"]["submit"]
    assert arm["default"] is None and "the sweep's" in arm["description"]


# --- a real Ray head with its job server ------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    with ray_cluster(
        tmp_path_factory.mktemp("ray-jobs"), nodes=1, cpus_per_node=2, job_server=True
    ) as c:
        yield c


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, cluster: RayCluster) -> dict[str, Any]:
    """One store and runs directory for the module; drivers join through RAY_ADDRESS."""
    tmp = tmp_path_factory.mktemp("ray-jobs-work")
    env = store_env(tmp, cluster.env, OMP_NUM_THREADS="1", RAY_ADDRESS=cluster.address)
    return {"env": env, "url": env["DAPO_DB_URL"], "runs": tmp / "runs"}


@pytest.fixture(scope="module")
def sweep_id(work: dict[str, Any]) -> int:
    """A sweep of one 2-step arm, stored as `dapo sweep --submit ray-jobs` stores one, for the
    tests that run one arm of it."""
    from db.store import Store
    from flows.params import SweepParams

    params = SweepParams(arms=["grpo"], steps=2, overrides=SMALL_OVERRIDES, submit="ray-jobs")
    return stored_sweep(Store(work["url"]), params, "one arm")


def dapo_bg(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """`dapo ARGS` in a session of its own: a SIGKILL of the session reaches the temporary
    Prefect server it starts as well (killed by the pid of the session it leads)."""
    return subprocess.Popen(
        [DAPO, *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], *, ok: bool = True) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            _kill_session(proc)
            proc.communicate()
    if ok:
        assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-3000:]}\n{err[-5000:]}"
    return out, err


def _kill_session(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the session this test started, by its id


@pytest.fixture(scope="module")
def ray_env(cluster: RayCluster) -> Iterator[None]:
    """This process as a client of the cluster (its token, its job server) while the module
    runs; the environment is restored after."""
    with pytest.MonkeyPatch.context() as patch:
        for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
            patch.setenv(key, cluster.env[key])
        patch.setenv(ray_jobs.API_SERVER_ENV, cluster.job_server)
        yield


def client(cluster: RayCluster) -> Any:
    from ray.job_submission import JobSubmissionClient

    assert os.environ.get(ray_jobs.API_SERVER_ENV) == cluster.job_server, "use the ray_env fixture"
    return JobSubmissionClient(cluster.job_server)


def sweep_runs(url: str, sweep_id: int) -> list[dict[str, Any]]:
    from db import reads
    from db.engine import get_engine

    engine = get_engine(url)
    frame = reads.runs_of_sweep(engine, sweep_id)
    return [reads.run_details(engine, int(r)) for r in frame["run_id"]]


def latest_sweep(url: str) -> int:
    from db import reads
    from db.engine import get_engine

    found = reads.latest_sweep_id(get_engine(url))
    assert found is not None
    return int(found)


def check_curve(url: str, run_id: int, steps: int) -> None:
    """Every step 1..steps has the same metric names, each once; evaluated at 0 and the end."""
    from db import reads
    from db.engine import get_engine

    engine = get_engine(url)
    curves = reads.metric_curves(engine, [run_id])
    assert (curves.groupby(["step", "name"]).size() == 1).all()
    names = {
        step: {n for n in frame["name"] if not n.startswith("eval/")}
        for step, frame in curves.groupby("step")
    }
    assert sorted(names) == list(range(1, steps + 1)), sorted(names)
    assert all(names[s] == names[1] for s in names), "a step misses metrics"
    assert sorted(reads.evaluations(engine, run_id)["step"]) == [0, steps]


# The tests below speak to the head as its client (its token, its job server).
on_the_head = pytest.mark.usefixtures("ray_env")


@pytest.mark.rayjobs
@pytest.mark.slow
@on_the_head
def test_two_arms_run_as_ray_jobs(cluster: RayCluster, work: dict[str, Any]) -> None:
    """Each arm × seed is one job keyed by its run, holding the arm's CPU; the flow streams
    the job's progress and records the outcome."""
    out, _ = finish(
        dapo_bg(
            work["env"],
            "sweep",
            "--arms",
            "grpo",
            "clip_higher",
            "--steps",
            "2",
            *JOBS,
            "--name",
            "two-jobs",
            *SMALL,
        )
    )
    sweep = latest_sweep(work["url"])
    done = sorted(sweep_runs(work["url"], sweep), key=lambda r: str(r["arm"]))
    assert [(r["arm"], r["status"]) for r in done] == [
        ("clip_higher", "completed"),
        ("grpo", "completed"),
    ]
    from db.store import Store

    store_id = Store(work["url"]).store_id
    jobs = {j.submission_id: j for j in client(cluster).list_jobs()}
    for run in done:
        sid = ray_jobs.submission_id(store_id, sweep, str(run["arm"]), 0)
        assert str(jobs[sid].status) == "SUCCEEDED" and jobs[sid].metadata["run_id"] == str(
            run["id"]
        )
        assert jobs[sid].entrypoint.endswith(f"-m flows.job_entry {run['id']}")
        assert "DAPO_DB_URL" not in jobs[sid].entrypoint
        assert "(Ray job)" in str(run["host"])
        check_curve(work["url"], int(run["id"]), 2)
        assert f"submitted Ray job {sid}" in out
        assert f"{run['arm']} s0  step 2/2" in out  # the job's progress, in the flow's log


@pytest.mark.rayjobs
@pytest.mark.slow
@on_the_head
def test_a_killed_submitter_leaves_its_job_to_be_adopted(
    cluster: RayCluster, work: dict[str, Any]
) -> None:
    """`dapo sweep` is SIGKILLed while its arm's job trains; the job trains on; `dapo arm`
    finds it by its submission id and adopts it: trained once, the curve whole and once."""
    steps = 6
    proc = dapo_bg(
        work["env"],
        "sweep",
        "--arms",
        "grpo",
        "--steps",
        str(steps),
        *JOBS,
        "--name",
        "adopt",
        *SMALL,
    )
    jobs = client(cluster)
    try:
        # Wait for the job's first steps in the store, then kill the submitter mid-arm.
        deadline = time.monotonic() + TIMEOUT_S
        run: dict[str, Any] | None = None
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(Exception):
                (run,) = sweep_runs(work["url"], latest_sweep(work["url"]))
                if run["status"] == "running" and int(run.get("steps") or 0) >= 0:
                    from db import reads
                    from db.engine import get_engine

                    curve = reads.metric_curves(get_engine(work["url"]), [int(run["id"])])
                    if not curve.empty and curve["step"].max() >= 1:
                        break
            time.sleep(0.3)
        assert proc.poll() is None, finish(proc, ok=False)
        assert run is not None
        _kill_session(proc)
        proc.communicate()
    finally:
        if proc.poll() is None:
            _kill_session(proc)
            proc.communicate()
    from db.store import Store

    sweep = latest_sweep(work["url"])
    sid = ray_jobs.submission_id(Store(work["url"]).store_id, sweep, "grpo", 0)
    assert not jobs.get_job_status(sid).is_terminal(), "the job should outlive its submitter"

    out, _ = finish(dapo_bg(work["env"], "arm", "--sweep", str(sweep), "--arm", "grpo"))
    assert f"adopting Ray job {sid}" in out, out[-3000:]
    assert "submitted Ray job" not in out
    first, second = sorted(sweep_runs(work["url"], sweep), key=lambda r: int(r["attempt"]))
    assert first["id"] == run["id"] and first["status"] == "cancelled"  # superseded
    assert second["status"] == "completed" and second["steps"] == steps, second
    check_curve(work["url"], int(second["id"]), steps)
    # One job, one entrypoint, every step trained once (no step started twice).
    (job,) = [j for j in jobs.list_jobs() if j.submission_id == sid]
    assert str(job.status) == "SUCCEEDED" and job.metadata["run_id"] == str(first["id"])
    log = jobs.get_job_logs(sid)
    assert log.count("Running entrypoint for job") == 1
    trained = [line for line in log.splitlines() if line.startswith(ray_jobs.PROGRESS)]
    assert len(trained) == steps, trained


@pytest.mark.rayjobs
@pytest.mark.slow
@on_the_head
def test_a_job_server_that_does_not_answer(
    cluster: RayCluster, work: dict[str, Any], sweep_id: int
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    env = {**work["env"], ray_jobs.API_SERVER_ENV: down}
    sweep = sweep_id
    out, err = finish(
        dapo_bg(env, "arm", "--sweep", str(sweep), "--arm", "grpo", "--force", *JOBS), ok=False
    )
    assert "does not answer" in out, (out[-3000:], err[-3000:])
    line = f"the Ray job server at {down} does not answer"
    (error,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert line in error, err[-3000:]
    newest = max(sweep_runs(work["url"], sweep), key=lambda r: int(r["attempt"]))
    assert newest["status"] == "failed" and line in str(newest["error"]).splitlines()[0]


@pytest.mark.rayjobs
@pytest.mark.slow
@on_the_head
def test_a_job_that_cannot_start(cluster: RayCluster, work: dict[str, Any], sweep_id: int) -> None:
    """The job's interpreter lacks the package: one line naming it, the run failed with that
    line, the job over (nothing left running)."""
    env = {**work["env"], ray_jobs.PYTHON_ENV: "/usr/bin/python3"}
    sweep = sweep_id
    _, err = finish(
        dapo_bg(env, "arm", "--sweep", str(sweep), "--arm", "grpo", "--force", *JOBS), ok=False
    )
    newest = max(sweep_runs(work["url"], sweep), key=lambda r: int(r["attempt"]))
    first_line = str(newest["error"]).splitlines()[0]
    assert newest["status"] == "failed", newest
    assert "No module named 'flows'" in first_line and "failed" in first_line, first_line
    assert "No module named 'flows'" in err
    from db.store import Store

    sid = ray_jobs.submission_id(Store(work["url"]).store_id, sweep, "grpo", 0)
    assert str(client(cluster).get_job_status(sid)) == "FAILED"


@pytest.mark.rayjobs
@pytest.mark.slow
@on_the_head
def test_a_stopped_job_and_a_cancelled_flow_run(
    cluster: RayCluster, work: dict[str, Any], sweep_id: int
) -> None:
    """watch() maps STOPPED onto JobStopped (a stop: the run ends cancelled); the arm flow's
    on_cancellation hook stops the job of the attempt its flow run holds, and only that."""
    from db.store import Store

    jobs = client(cluster)
    store = Store(work["url"])
    sweep = sweep_id
    sid = ray_jobs.submission_id(store.store_id, sweep, "grpo", 0)
    with contextlib.suppress(Exception):
        jobs.delete_job(sid)
    jobs.submit_job(entrypoint="sleep 120", submission_id=sid, metadata={"run_id": "0"})
    # The cancellation below is of a running job, as an arm's is: stopped while Ray was still
    # starting its supervisor, a job can end FAILED ("Job supervisor actor died", seen once in
    # a CI rehearsal on a loaded machine) rather than STOPPED.
    deadline = time.monotonic() + 60
    while str(jobs.get_job_status(sid)) != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert str(jobs.get_job_status(sid)) == "RUNNING", jobs.get_job_status(sid)
    newest = max(sweep_runs(work["url"], sweep), key=lambda r: int(r["attempt"]))
    attempt = store.resume_attempt(
        sweep_id=sweep,
        arm="grpo",
        seed=0,
        config=newest["config"],
        config_hash=str(newest["config_hash"]),
        after=int(newest["id"]),
        resume_step=None,
        checkpoint_dir=str(newest["checkpoint_dir"]),
        flow_run_id="flow-run-a",
    )
    params = {"store_url": work["url"], "sweep_id": sweep, "arm": "grpo", "seed": 0}
    other = SimpleNamespace(id="flow-run-b", parameters=params)
    ray_jobs.stop_on_cancel(None, other, None)  # not the holder's flow run: left alone
    assert not jobs.get_job_status(sid).is_terminal()
    ray_jobs.stop_on_cancel(None, SimpleNamespace(id="flow-run-a", parameters=params), None)
    with pytest.raises(ray_jobs.JobStopped, match="was stopped"):
        ray_jobs.watch(jobs, sid, label="grpo s0", poll_s=0.2)
    from flows import plan

    assert plan.is_stop(ray_jobs.JobStopped("x"))
    store.end_attempt(attempt.run_id, "cancelled", error="test over")


# --- the team's path: a Prefect server, `dapo deploy --pool`, a `dapo worker` on the head ------
POOL = "dapo-jobs-pool"


@dataclass
class Team:
    """A Prefect server, the pool's deployments and one `dapo worker` joined to the cluster."""

    api_url: str
    work: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in self.work.glob("*.log"))

    def trigger(self, deployment: str, parameters: dict[str, Any]) -> UUID:
        with prefect_client(self.api_url) as c:
            dep = c.read_deployment_by_name(deployment)
            return UUID(str(c.create_flow_run_from_deployment(dep.id, parameters=parameters).id))

    def flow_run(self, flow_run_id: UUID) -> Any:
        with prefect_client(self.api_url) as c:
            return c.read_flow_run(flow_run_id)


@contextlib.contextmanager
def prefect_team(root: Path, cluster: RayCluster, work: dict[str, Any]) -> Iterator[Team]:
    """The README's team setup on this machine: `prefect server start` (its own home, a free
    port), `dapo deploy --pool`, then `dapo worker --pool --store --ray-address` as on the
    head node. The worker finds the job server from the Ray address, as the README says; each
    process is stopped by the session it leads."""
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    base = {**cluster.env, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "OMP_NUM_THREADS": "1"}
    for name in ("PREFECT_API_URL", "DAPO_DB_URL", ray_jobs.API_SERVER_ENV):
        base.pop(name, None)
    team = Team(api_url, root)

    def start(name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (root / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(
                args,
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        team.procs.append(proc)
        return proc

    server_env = {**base, "PREFECT_HOME": str(root / "server-home"), "PREFECT_UI_ENABLED": "false"}
    client_env = {
        **base,
        "PREFECT_API_URL": api_url,
        "PREFECT_HOME": str(root / "client-home"),
        "DAPO_RUNS_DIR": str(work["runs"]),
    }
    try:
        server = start(
            "server",
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            server_env,
        )
        _wait_for(
            lambda: _healthy(api_url), "the Prefect server", 120.0, server, root / "server.log"
        )
        done = subprocess.run(
            [DAPO, "deploy", "--pool", POOL],
            env=client_env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        worker = start(
            "worker",
            [
                DAPO,
                "worker",
                "--pool",
                POOL,
                "--name",
                "head",
                "--store",
                work["url"],
                "--ray-address",
                cluster.address,
            ],
            client_env,
        )
        _wait_for(
            lambda: "Worker 'head' started" in (root / "worker.log").read_text(),
            "the worker to poll",
            120.0,
            worker,
            root / "worker.log",
        )
        yield team
    finally:
        for proc in reversed(team.procs):  # the worker before the server
            _stop(proc)


@pytest.mark.rayjobs
@pytest.mark.slow
@on_the_head
def test_cancelling_the_arms_flow_run_stops_its_ray_job(
    cluster: RayCluster, work: dict[str, Any], tmp_path: Path
) -> None:
    """An arm triggered on the pool (a `dapo-arm` flow run that the worker runs) trains as a
    Ray job; cancelling that flow run through the Prefect API, as the UI's Cancel does, ends
    the job STOPPED, the run cancelled with a line that says so, and leaves no job or job
    process behind."""
    from prefect.states import Cancelling

    from db import reads
    from db.store import Store
    from flows.params import SweepParams

    store = Store(work["url"])
    params = SweepParams(arms=["grpo"], steps=500, overrides=SMALL_OVERRIDES, submit="ray-jobs")
    sweep = stored_sweep(store, params, "to cancel")
    sid = ray_jobs.submission_id(store.store_id, sweep, "grpo", 0)
    jobs = client(cluster)
    with prefect_team(tmp_path, cluster, work) as team:
        flow_run_id = team.trigger("ablation-arm/dapo-arm", {"sweep_id": sweep, "arm": "grpo"})

        def training() -> dict[str, Any] | None:
            job = ray_jobs.job_of(jobs, sid)
            latest = store.latest_attempt(sweep, "grpo", 0)
            if job is None or str(job.status) != "RUNNING" or latest is None:
                return None
            curve = reads.metric_curves(store.engine, [int(latest["run_id"])])
            return latest if not curve.empty else None

        try:
            latest = _wait_for(training, "the arm's Ray job to train a step", TIMEOUT_S)
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}\n{team.logs()}")
        assert latest["flow_run_id"] == str(flow_run_id)
        started = time.monotonic()
        with prefect_client(team.api_url) as c:
            c.set_flow_run_state(flow_run_id, Cancelling())

        def cancelled() -> Any:
            run = team.flow_run(flow_run_id)
            return run if run.state is not None and run.state.is_final() else None

        run = _wait_for(cancelled, "the flow run to end", 120.0)
        assert run.state.is_cancelled(), (run.state, team.logs())
        _wait_for(lambda: str(jobs.get_job_status(sid)) == "STOPPED", "the job to be STOPPED", 60.0)
        row = _wait_for(
            lambda: (r := store.get_run(int(latest["run_id"])))["status"] != "running" and r,
            "the run to be marked",
            60.0,
        )
        line = str(row["error"]).splitlines()[0]
        assert row["status"] == "cancelled", (row["status"], line, team.logs())
        assert "cancel" in line.lower(), line
        assert int(row["steps"] or 0) < 500
        print(f"cancelled to STOPPED in {time.monotonic() - started:.1f} s: {line}")
    # Nothing of the store's left on the job server, nor any job process on the cluster.
    live = [
        j.submission_id
        for j in jobs.list_jobs()
        if str(j.submission_id).startswith(f"dapo-{store.store_id}-") and not j.status.is_terminal()
    ]
    assert live == [], live
    _wait_for(
        lambda: not [c for c in cluster.processes().values() if "flows.job_entry" in c],
        "the job's processes to end",
        30.0,
    )


@pytest.mark.rayjobs
@pytest.mark.slow
def test_the_cluster_stops_leaving_no_process(cluster: RayCluster) -> None:
    cluster.stop()
    assert cluster.processes() == {}
