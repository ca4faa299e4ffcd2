"""Arms as Ray jobs (`--submit ray-jobs`): each (arm, seed) one job on the cluster's job server.

Opt-in beside the default, where the flow's own process drives Ray actors (flows/ray_worker.py).
A job lives on the cluster, not in the flow's process: a worker that dies (a machine rebooted,
a SIGKILLed `dapo arm`) leaves its arm training, and the next flow run of that arm finds the job
again and adopts it instead of starting a second one.

- Keyed by the run, not the attempt: the job's submission id is `submission_id(store id, sweep,
  arm, seed)`, so a resubmission of the same (arm, seed) meets the job Ray already holds. A live
  job, or one that succeeded while nobody watched it (its run never recorded as completed), is
  adopted; an older finished job is deleted from the job server first (Ray keeps a finished
  job's id), then the new one is submitted.
- What runs: `<python> -m flows.job_entry RUN_ID` with the installed package (the nodes run the
  same install as the worker; $DAPO_JOB_PYTHON names another interpreter). The store's URL
  travels in the job's runtime_env env_vars ($DAPO_DB_URL), never on the command line that Ray
  shows everyone: it may hold a password. One worker: the entrypoint holds the arm's CPUs and
  GPUs (entrypoint_num_cpus / entrypoint_num_gpus) and trains in its own process; N workers: the
  entrypoint holds nothing and places the N workers as a driver of its own (ray_worker).
- Watched: the flow polls the job's status and log; the log's protocol lines (progress,
  placement, result, error: `dapo-job-* {json}`, written by flows/job_entry.py) become the
  flow-run log's progress lines, the run's host and the arm's result. SUCCEEDED ends the arm
  completed, FAILED failed with one line naming the cause (the job's own error, else the last
  line its log printed, else Ray's message), STOPPED cancelled.
- Stopped: a stop of this process (Ctrl-C, a cancelled sweep) stops the job; so does cancelling
  the arm's flow run: its SIGTERM stops the job from the watcher, which re-raises it saying
  "the flow run was cancelled; Ray job ... stopped" (the run's error line), and its
  on_cancellation hook (`stop_on_cancel`, in the worker or runner) stops a job the signal
  missed. A lease lost to a newer attempt leaves the job alone: the newer attempt adopts it.
- An adopted job trains the attempt it was submitted for; the adopting attempt (it resumed that
  one, see flows/arm.py) copies that attempt's curve in as it grows, so that the attempt which
  speaks for the arm holds every step once (the store's copy keeps rows it has).

Where the job server is: $RAY_API_SERVER_ADDRESS (Ray's own variable, e.g.
http://head:8265), else the arm's Ray address (--ray-address, the sweep's, $RAY_ADDRESS), from
which Ray's client finds the cluster's dashboard. A local Ray started by the flow has none.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from dapo_common.util import first_line
from db.engine import ENV_VAR as STORE_URL_ENV
from db.store import Store
from flows import plan, progress, ray_worker
from flows.params import Resources, SubmitMode

SUBMIT_MODES: tuple[str, ...] = get_args(SubmitMode)  # actors, ray-jobs
RAY_JOBS = SUBMIT_MODES[1]

PYTHON_ENV = "DAPO_JOB_PYTHON"
# The job's own parameters, as JSON in its environment (beside the store URL): who owns the run
# directory, and the arm's resources.
JOB_ENV = "DAPO_JOB"
API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"
# The job's log lines that speak to the flow; anything else is the job's own output.
PROGRESS, PLACED, RESULT, ERROR = (
    "dapo-job-progress ",
    "dapo-job-placed ",
    "dapo-job-result ",
    "dapo-job-error ",
)
POLL_S = 1.0
# A job server that stops answering while a job trains (a head node restarting) is asked again
# for this long before the watcher gives up; the job goes on, and the next flow run adopts it.
SERVER_GRACE_S = 60.0
LOG_TAIL_LINES = 40
# copy_history's "every step": the adopted attempt's whole curve.
ALL_STEPS = 2**31 - 1


class JobServerDown(ConnectionError):
    """The Ray job server does not answer (or there is none to ask)."""


class JobFailed(RuntimeError):
    """The arm's Ray job ended FAILED; `remote_traceback` keeps the tail of its log."""

    def __init__(self, message: str, remote_traceback: str) -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


class JobStopped(ray_worker.Interrupted):
    """The arm's Ray job was stopped (from Ray's dashboard, `ray job stop`, a cancel): the arm
    ends cancelled (a subclass of Interrupted, which plan.is_stop counts as a stop)."""


@functools.cache
def _cancelled_type() -> type[BaseException]:
    """FlowRunCancelled, made on first use: Prefect is imported only where its signal arrived
    (a job's own entrypoint never imports it)."""
    from prefect.exceptions import TerminationSignal

    class FlowRunCancelled(TerminationSignal):
        """Prefect's TerminationSignal (its engine still sees the signal it sent) with a
        message: the run's error line says the flow run was cancelled and its job stopped."""

        def __init__(self, signal: int, message: str) -> None:
            super().__init__(signal)
            self.message = message

        def __str__(self) -> str:
            return self.message

    return FlowRunCancelled


def cancelled_signal(exc: BaseException, sid: str) -> BaseException:
    """The SIGTERM of a cancelled flow run (Prefect's TerminationSignal, whose message is
    empty) as one that says what happened, after its job was stopped; any other stop as is."""
    if type(exc).__name__ != "TerminationSignal" or "prefect" not in sys.modules:
        return exc
    intent = None
    with contextlib.suppress(Exception):  # Prefect's own record of why it sent the signal
        from prefect._internal.control_listener import get_intent

        intent = get_intent()
    why = (
        "the flow run was cancelled"
        if intent == "cancel"
        else f"the flow run's process got signal {getattr(exc, 'signal', '?')}"
    )
    return _cancelled_type()(int(getattr(exc, "signal", 15)), f"{why}; Ray job {sid} stopped")


def submission_id(store_id: str, sweep_id: int, arm: str, seed: int) -> str:
    """The job's id on the job server: the run's key, the same for every attempt of an
    (arm, seed) of a sweep of one store, so that Ray itself refuses a second job of it."""
    return f"dapo-{store_id}-sweep{int(sweep_id)}-{arm}-s{int(seed)}"


def job_server(ray_address: str | None) -> str:
    """Where the job server is asked (see the module docstring); one line when nowhere."""
    address = os.environ.get(API_SERVER_ENV) or ray_address or os.environ.get("RAY_ADDRESS") or None
    if not address or address == "local":
        raise JobServerDown(
            "--submit ray-jobs needs a Ray cluster with its job server: give --ray-address "
            "(or $RAY_ADDRESS) of a cluster started with `ray start --head`, or "
            f"${API_SERVER_ENV}=http://HEAD:8265"
        )
    return address


def connect(ray_address: str | None) -> Any:
    """A JobSubmissionClient of the cluster's job server; JobServerDown in one line."""
    from ray.job_submission import JobSubmissionClient

    address = job_server(ray_address)
    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # ConnectionError, or Ray's own when it finds no dashboard
        raise JobServerDown(
            f"the Ray job server at {address} does not answer: {first_line(exc)}"
        ) from None


def job_of(client: Any, sid: str) -> Any | None:
    """The job server's JobDetails of `sid`, None when it holds no such job."""
    try:
        return client.get_job_info(sid)
    except RuntimeError as exc:  # Ray's client answers a 404 with a RuntimeError
        if "does not exist" in str(exc):
            return None
        raise


def adoptable(job: Any, store: Store) -> bool:
    """Whether a flow run should adopt this job rather than start another: it is still live,
    or it succeeded while nobody recorded it (its run is not completed in the store)."""
    from ray.job_submission import JobStatus

    if not job.status.is_terminal():
        return True
    if job.status != JobStatus.SUCCEEDED:
        return False
    run_id = (job.metadata or {}).get("run_id")
    if run_id is None:
        return False
    try:
        return bool(store.get_run(int(run_id))["status"] != "completed")
    except (LookupError, ValueError):
        return False


def entrypoint(run_id: int, python: str | None = None) -> str:
    """The job's shell command: the run id only (the rest is in its environment)."""
    exe = python or os.environ.get(PYTHON_ENV) or sys.executable
    return f"{shlex.quote(exe)} -m flows.job_entry {int(run_id)}"


def job_env(store_url: str, owner: Mapping[str, Any], resources: Resources) -> dict[str, str]:
    """The job's environment: the trainer's forwarded variables, the runs directory, the store
    URL (here, not on the command line) and the job's parameters."""
    return {
        **ray_worker.forwarded_env(),
        "DAPO_RUNS_DIR": str(plan.runs_dir()),
        STORE_URL_ENV: store_url,
        JOB_ENV: json.dumps({"owner": dict(owner), "resources": resources.model_dump()}),
    }


def submit(
    client: Any,
    sid: str,
    *,
    run_id: int,
    label: str,
    store_url: str,
    owner: Mapping[str, Any],
    resources: Resources,
) -> None:
    """Submit the job that trains store run `run_id` under the id `sid`."""
    one = resources.workers == 1  # N workers: the entrypoint is a driver that holds nothing
    client.submit_job(
        entrypoint=entrypoint(run_id),
        submission_id=sid,
        runtime_env={"env_vars": job_env(store_url, owner, resources)},
        metadata={"run_id": str(run_id), "label": label},
        entrypoint_num_cpus=resources.cpus if one else None,
        entrypoint_num_gpus=resources.gpus if one and resources.gpus > 0 else None,
    )


def stop(client: Any, sid: str) -> None:
    """Stop the job (best effort: it may have ended, or the server may be gone)."""
    with contextlib.suppress(Exception):
        client.stop_job(sid)


def start_or_adopt(
    client: Any,
    store: Store,
    sid: str,
    *,
    run_id: int,
    label: str,
    owner: Mapping[str, Any],
    resources: Resources,
) -> int:
    """The job of this (arm, seed) running for store run `run_id`, started now or adopted;
    returns the run the job trains (an adopted job's is the attempt it was submitted for)."""
    job = job_of(client, sid)
    if job is not None and adoptable(job, store):
        trains = int((job.metadata or {}).get("run_id", run_id))
        progress.say(
            f"{label}  run {run_id}: adopting Ray job {sid} ({job.status}), which trains run "
            f"{trains}: it is not started again"
        )
        return trains
    if job is not None:  # finished and recorded: Ray keeps its id until it is deleted
        client.delete_job(sid)
    try:
        submit(
            client,
            sid,
            run_id=run_id,
            label=label,
            store_url=store.url,
            owner=owner,
            resources=resources,
        )
    except RuntimeError:
        # Two flow runs of one arm submitting at once: the second meets the first's job.
        raced = job_of(client, sid)
        if raced is None or not adoptable(raced, store):
            raise
        progress.say(f"{label}  run {run_id}: adopting Ray job {sid}, submitted meanwhile")
        return int((raced.metadata or {}).get("run_id", run_id))
    progress.say(
        f"{label}  run {run_id}: submitted Ray job {sid} ({ray_worker.resources_text(resources)})"
    )
    return run_id


@dataclass
class LogReader:
    """What the job's log said so far: protocol lines parsed, the rest kept as a tail."""

    label: str
    seen: int = 0  # characters of the log already read
    result: dict[str, Any] | None = None
    error: str | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))

    def feed(
        self,
        log: str,
        *,
        final: bool,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        on_placed: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """Read what the log holds beyond `seen`; a last line without its newline waits for
        it unless the job is over (`final`)."""
        new = log[self.seen :]
        if not final:
            new = new[: new.rfind("\n") + 1]
        self.seen += len(new)
        for line in new.splitlines():
            self.line(line, on_progress, on_placed)

    def line(
        self,
        line: str,
        on_progress: Callable[[dict[str, Any]], None] | None,
        on_placed: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        for prefix, handle in (
            (PROGRESS, on_progress),
            (PLACED, on_placed),
            (RESULT, self._result),
            (ERROR, self._error),
        ):
            if line.startswith(prefix):
                with contextlib.suppress(ValueError):
                    data = json.loads(line[len(prefix) :])
                    if handle is not None:
                        handle(data)
                return
        if line.strip():
            self.tail.append(line)

    def _result(self, data: Any) -> None:
        self.result = dict(data)

    def _error(self, data: Any) -> None:
        self.error = str(data)

    def cause(self, message: str | None) -> str:
        """Why a FAILED job failed, in one line: its own error line, else the last line of its
        output (Ray's set-up lines left out), else Ray's message."""
        if self.error:
            return self.error
        for line in reversed(self.tail):
            if " INFO " not in line and not line.startswith("Running entrypoint for job"):
                return line.strip()
        return plan.state_line(message) or "no cause given"


def watch(
    client: Any,
    sid: str,
    *,
    label: str,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    on_placed: Callable[[dict[str, Any]], None] | None = None,
    cancel: Any | None = None,
    poll_s: float = POLL_S,
) -> dict[str, Any]:
    """Follow the job to its end and return its result (the trainer's: steps, tokens, host,
    final_eval, ...). FAILED is JobFailed, STOPPED JobStopped; a stop of this process stops
    the job; `cancel` set (the lease lost) leaves it to the attempt that took it over."""
    from ray.job_submission import JobStatus

    reader = LogReader(label)
    down_since: float | None = None
    try:
        while True:
            if ray_worker.STOP.is_set():
                stop(client, sid)
                raise ray_worker.Interrupted(f"stopped: this process is shutting down ({sid})")
            if cancel is not None and cancel.is_set():
                raise ray_worker.LeaseLost(
                    f"{label}: another attempt took this run over; it adopts Ray job {sid}"
                )
            try:
                status = client.get_job_status(sid)
                log = client.get_job_logs(sid)
                down_since = None
            except Exception as exc:
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > SERVER_GRACE_S:
                    raise JobServerDown(
                        f"the Ray job server stopped answering about job {sid} for "
                        f"{SERVER_GRACE_S:g} s: {first_line(exc)} (the job may go on: run the "
                        "arm again to adopt it)"
                    ) from None
                time.sleep(poll_s)
                continue
            final = status.is_terminal()
            reader.feed(log, final=final, on_progress=on_progress, on_placed=on_placed)
            if final:
                break
            time.sleep(poll_s)
    except BaseException as exc:
        # Ctrl-C, or the SIGTERM of a cancelled flow run, lands here: the job stops with us.
        if plan.is_stop(exc) and not isinstance(exc, JobStopped):
            stop(client, sid)
            said = cancelled_signal(exc, sid)
            if said is not exc:
                raise said from exc
        raise
    tail = "\n".join(reader.tail)
    if status == JobStatus.SUCCEEDED:
        if reader.result is None:
            raise JobFailed(f"Ray job {sid} succeeded but reported no result", tail)
        return reader.result
    if status == JobStatus.STOPPED:
        raise JobStopped(f"Ray job {sid} was stopped")
    message = None
    with contextlib.suppress(Exception):
        message = client.get_job_info(sid).message
    raise JobFailed(f"Ray job {sid} failed: {reader.cause(message)}", tail or (message or ""))


def train_in_job(
    store: Store,
    *,
    run_id: int,
    label: str,
    owner: Mapping[str, Any],
    resources: Resources,
    ray_address: str | None,
) -> dict[str, Any]:
    """flows/arm.py's train_in_ray for `--submit ray-jobs`: the arm's job started or adopted,
    watched to its end with the run's heartbeat (TryClock), its result returned."""
    from flows.heartbeat import TryClock

    client = connect(ray_address)
    sid = submission_id(store.store_id, int(owner["sweep"]), str(owner["arm"]), int(owner["seed"]))
    trains = start_or_adopt(
        client, store, sid, run_id=run_id, label=label, owner=owner, resources=resources
    )
    adopted = trains != run_id
    if adopted:  # the job trains in its own attempt's directory: this attempt's, from now on
        where = store.get_run(trains).get("checkpoint_dir")
        if where:
            store.update_run(run_id, checkpoint_dir=where)

    with TryClock(store, run_id, label) as clock:

        def on_progress(update: dict[str, Any]) -> None:
            clock.waited(update.get("store_wait_s"))
            progress.say(progress.step_line(label, update))
            if adopted:  # the adopted attempt's curve, into the attempt that speaks for it
                _copy(store, trains, run_id)

        def on_placed(place: dict[str, Any]) -> None:
            where = str(place.get("host") or "")
            progress.say(f"{label}  run {run_id} placed: {where} (Ray job {sid})")
            with contextlib.suppress(Exception):
                store.update_run(run_id, host=where, outage_s=0.0)

        result = watch(
            client,
            sid,
            label=label,
            on_progress=on_progress,
            on_placed=on_placed,
            cancel=clock.lost,
        )
        clock.waited(result.get("store_wait_s"))
    if adopted:
        store.copy_history(trains, run_id, ALL_STEPS)
    return result


def _copy(store: Store, source: int, target: int) -> None:
    try:
        store.copy_history(source, target, ALL_STEPS)
    except Exception as exc:  # bookkeeping: the end of the job copies it again
        progress.say(f"could not copy run {source}'s curve: {first_line(exc)}", level="warning")


def stop_on_cancel(flow: Any, flow_run: Any, state: Any) -> None:
    """The arm flow's on_cancellation hook: stop the arm's Ray job when this flow run is the
    one whose attempt it trains for (a newer flow run that adopted it keeps it)."""
    params = dict(getattr(flow_run, "parameters", None) or {})
    try:
        store = Store(params.get("store_url"))
        sweep_id, arm, seed = (
            int(params["sweep_id"]),
            str(params["arm"]),
            int(params.get("seed", 0)),
        )
        latest = store.latest_attempt(sweep_id, arm, seed)
        if not latest or latest.get("flow_run_id") != str(flow_run.id):
            return
        stored = store.get_sweep(sweep_id).get("params") or {}
        if (params.get("submit") or stored.get("submit")) != RAY_JOBS:
            return  # its arm trained in actors, which its process took with it
        client = connect(params.get("ray_address") or stored.get("ray_address"))
        sid = submission_id(store.store_id, sweep_id, arm, seed)
        job = job_of(client, sid)
        if job is not None and not job.status.is_terminal():
            stop(client, sid)
    except Exception:  # best effort: the job server or the store may be gone too
        return
