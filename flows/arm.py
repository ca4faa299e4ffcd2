"""`ablation_arm`: train one (arm, seed) of a sweep in a Ray actor and record it in the store.

Each flow run is a new attempt row in the store, unless the arm already completed with the same
config (skipped, unless forced). An (arm, seed) outside the sweep is refused unless `extend`,
which adds it to the sweep's definition. An attempt resumes the previous attempt's checkpoint
when that one did not complete and had the same config; the new attempt then gets the old curve
copied in, so it holds the whole history, and the old one is marked superseded (so is an
unfinished one that a new attempt starts over from scratch). An actor that dies mid-run
(killed, node lost) is replaced by the task's retry, which resumes from the run's last
checkpoint inside the same attempt; the store's upsert keeps every (step, metric) once.

One process at a time: the new attempt is claimed in one store transaction
(db.store.Store.resume_attempt) that takes a lease on it for this process (host, pid, since
when). A second flow run or `dapo arm` of the same (arm, seed) while the lease is live fails
with one line naming its holder, before it writes anything; a lease whose heartbeat is older
than db.models.RUN_LEASE_S, or whose process is gone from this machine, is taken over. The
lease is released when the attempt ends; a driver whose lease was taken over meanwhile (it
stopped beating for ten minutes) stops its actors at its next heartbeat.

Where it ran: as soon as a try's actors are placed, the run's `host` says where, by host, Ray
node (id and address) and rank, e.g. `gpu-7 (node 1a2b3c4d@10.0.0.5: rank 0; node
5e6f7a8b@10.0.0.6: rank 1)` (cluster.describe): on one machine every node has the same host
name, so the node is what tells them apart. `checkpoint_dir` is the run directory, absolute.
A try lost with its actor (a node died) leaves its one line in the run's `error` while the
task retries; the final outcome replaces it (a completed run keeps no error).

Wall time: an attempt's `wall_s` is the sum over its tries (each actor that trained it, and the
tries of the attempt it resumed) of their training time, less the time their store sink spent
waiting on a store that was down (db.sink.SqlSink.waited_s); `tries` counts them. It is
written every WALL_EVERY_S on a clock of its own, and is the run row's heartbeat: the lease's,
and a run nobody has touched for RUN_LEASE_S reads "interrupted". When an arm finishes, its
sweep's status is recomputed from its runs, so a sweep whose driver died does not stay
"running".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext

from dapo_common.util import first_line
from dapo_core.train.run_dir import check_resumable_dir, latest_step
from db.sink import check_every_step, resumable_step
from db.store import Attempt, RunHeld, Store
from flows import checks, cluster, plan, progress, ray_jobs, ray_worker
from flows.heartbeat import BOOKKEEPING_OUTAGE_S, TryClock, unwritten_wall
from flows.params import ArmParams, Resources, SweepParams, takes, validate
from flows.publish import publish_sweep

FLOW_NAME = "ablation-arm"
DEPLOYMENT_NAME = "dapo-arm"
TRAIN_RETRIES = 2


def _actor_died(task: Any, task_run: Any, state: Any) -> bool:
    """Retry the training task only when its actor died; a training error is final."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:
        return False
    return isinstance(exc, ray_worker.ActorLost)


@task(
    name="train-in-ray",
    retries=TRAIN_RETRIES,
    retry_delay_seconds=1,
    retry_condition_fn=_actor_died,
    cache_policy=NO_CACHE,
    persist_result=False,
)
def train_in_ray(
    run_id: int,
    label: str,
    config: dict[str, Any],
    store_url: str,
    out_dir: str,
    owner: dict[str, Any],
    resources: dict[str, float],
) -> dict[str, Any]:
    """One try at training store run `run_id`: a fresh actor that resumes from out_dir. Its
    wall time is added to the attempt's (see the module docstring)."""
    step = latest_step(out_dir)
    if step is not None:
        progress.say(f"{label}  resuming from the checkpoint at step {step} in {out_dir}")
    store = Store(store_url)

    def on_progress(update: dict[str, Any]) -> None:
        clock.waited(update.get("store_wait_s"))
        progress.say(progress.step_line(label, update))

    def on_placed(places: list[dict[str, Any]]) -> None:
        where = cluster.describe(places)
        progress.say(f"{label}  run {run_id} placed: {where}")
        _bookkeeping(lambda: store.update_run(run_id, host=where, outage_s=0.0))

    with TryClock(store, run_id, label) as clock:
        try:
            result = ray_worker.run_training(
                run_id=run_id,
                config=config,
                store_url=store_url,
                out_dir=out_dir,
                owner=owner,
                resources=Resources.model_validate(resources),
                on_progress=on_progress,
                on_placed=on_placed,
                cancel=clock.lost,
            )
        except ray_worker.ActorLost as exc:
            # The try is lost, not the attempt: say why in the run's error while the task
            # retries (a last failure's own error replaces it, see run_arm).
            line = first_line(exc, with_type=True)
            progress.say(f"{label}  run {run_id}: {line}", level="warning")
            _bookkeeping(lambda: store.update_run(run_id, error=line, outage_s=0.0))
            raise
        clock.waited(result.get("store_wait_s"))
    return result


def current_flow_run_id() -> str | None:
    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx and ctx.flow_run else None


@dataclass(frozen=True)
class ArmPlan:
    """What a flow run of one (arm, seed) is to do, decided before anything is written."""

    label: str
    job: plan.ArmJob
    sweep: SweepParams  # the sweep's parameters, widened by `extend`
    extended: bool
    resources: Resources
    nodes: list[dict[str, Any]]  # the cluster's live nodes
    latest: dict[str, Any] | None  # the newest attempt, as the decision saw it
    decision: plan.ArmDecision
    owner: dict[str, Any]  # who may use the run directory (plan.run_owner)


def run_arm(p: ArmParams) -> dict[str, Any]:
    """The arm flow's work; returns {label, status, run_id, error?, ...}."""
    store = Store(p.store_url)
    arm = plan_arm(store, p)
    if arm.decision.action == "skip":
        progress.say(f"{arm.label}  skipped: {arm.decision.reason} (force to retrain)")
        return {
            "label": arm.label,
            "status": "skipped",
            "run_id": arm.decision.run_id,
            "reason": arm.decision.reason,
        }

    # --- the first write: the lease and the new attempt, one transaction ---
    attempt = claim_arm(store, p, arm)
    try:
        start_arm(store, p, arm, attempt)
        if (p.submit or arm.sweep.submit) == ray_jobs.RAY_JOBS:  # a Ray job, not an actor
            result = ray_jobs.train_in_job(
                store,
                run_id=attempt.run_id,
                label=arm.label,
                owner=arm.owner,
                resources=arm.resources,
                ray_address=p.ray_address or arm.sweep.ray_address,
            )
        else:
            result = train_in_ray(
                attempt.run_id,
                arm.label,
                arm.job.config,
                store.url,
                attempt.checkpoint_dir,
                arm.owner,
                arm.resources.model_dump(),
            )
        # Never "completed" with a hole in its curve (steps an outage took with a dead actor).
        check_every_step(store.engine, attempt.run_id, int(result["steps"]), where=store.where)
    except BaseException as exc:
        _record_failure(store, p, arm.label, attempt.run_id, exc)
        raise
    return finish_arm(store, p, arm.label, attempt.run_id, result)


def plan_arm(store: Store, p: ArmParams) -> ArmPlan:
    """Every check and the decision (skip, resume, start over), nothing written: the arm is
    in the sweep (or `extend`), its config and data work, it fits on the cluster, no live
    process holds it, and a directory it would resume is its own."""
    sweep = store.get_sweep(p.sweep_id)
    sweep_params = checks.arm_in_sweep(sweep, p.arm, p.seed, extend=p.extend)
    # Widened only when the (arm, seed) was not the sweep's (an adaptive sweep's stored
    # parameters keep its first round's seeds while its rounds widen the row's).
    extended = p.arm not in list(sweep["arms"]) or p.seed not in list(sweep["seeds"])
    job = plan.arm_job(sweep_params, p.arm, p.seed)
    checks.check_inputs([job.config])
    resources = p.resources or sweep_params.resources
    nodes = ray_worker.place_arm(p.ray_address or sweep_params.ray_address, resources, [job.config])

    latest = store.latest_attempt(p.sweep_id, p.arm, p.seed)
    decision = plan.decide_arm(
        config_hash=job.config_hash,
        force=p.force,
        completed_run_id=store.completed_run(p.sweep_id, p.arm, p.seed, job.config_hash),
        latest=latest,
        latest_checkpoint_step=resumable_step(
            store.engine, int(latest["run_id"]), latest_step(latest.get("checkpoint_dir"))
        )
        if latest
        else None,
    )
    owner = plan.run_owner(store.store_id, p.sweep_id, job)
    if decision.action != "skip":
        # Asked here so that a second command writes nothing (not even --extend); the claim
        # asks again, atomically.
        lease = store.lease_of(p.sweep_id, p.arm, p.seed)
        if lease is not None:
            raise RunHeld(lease.line(f"{job.label} of sweep {p.sweep_id}"), lease)
    if decision.action == "resume":
        # Read nothing from a directory the store names until it is known to be this run's.
        check_resumable_dir(str(decision.checkpoint_dir), owner, plan.runs_dir())
    return ArmPlan(
        label=job.label,
        job=job,
        sweep=sweep_params,
        extended=extended,
        resources=resources,
        nodes=nodes,
        latest=latest,
        decision=decision,
        owner=owner,
    )


def claim_arm(store: Store, p: ArmParams, arm: ArmPlan) -> Attempt:
    """The new attempt, held by this process (Store.resume_attempt): it resumes the newest
    attempt's checkpoint, or starts over in a directory of its own."""
    resume = arm.decision.action == "resume"

    def fresh_dir(run_id: int) -> str:
        return str(
            plan.fresh_run_dir(
                plan.runs_dir(),
                store.store_id,
                p.sweep_id,
                p.arm,
                p.seed,
                arm.job.config_hash,
                run_id,
            ).resolve()  # every node must find it: never relative
        )

    return store.resume_attempt(
        sweep_id=p.sweep_id,
        arm=p.arm,
        seed=p.seed,
        config=arm.job.config,
        config_hash=arm.job.config_hash,
        after=None if arm.latest is None else int(arm.latest["run_id"]),
        resume_step=arm.decision.resume_step if resume else None,
        checkpoint_dir=str(Path(str(arm.decision.checkpoint_dir)).resolve())
        if resume
        else fresh_dir,
        flow_run_id=current_flow_run_id(),
        label=arm.label,
    )


def start_arm(store: Store, p: ArmParams, arm: ArmPlan, attempt: Attempt) -> None:
    """What follows the claim before training: the sweep widened (`extend`), the resumed
    attempt's held-back writes, and the lines that say what is about to happen."""
    if arm.extended:
        store.extend_sweep(
            p.sweep_id, arms=arm.sweep.arms, seeds=arm.sweep.seeds, params=arm.sweep.model_dump()
        )
        progress.say(
            f"sweep {p.sweep_id} extended to arms {', '.join(arm.sweep.arms)} × seeds "
            f"{arm.sweep.seeds}"
        )
    resumed, step = arm.decision.run_id, arm.decision.resume_step
    # What an outage held back from the resumed attempt (its spill file, in the directory this
    # attempt now holds) goes into it, and its curve is copied again: the copy in the claim
    # keeps what it has and gains what the spill adds.
    if (
        arm.decision.action == "resume"
        and resumed is not None
        and step is not None
        and store.replay_spill(resumed, attempt.checkpoint_dir)
    ):
        store.copy_history(resumed, attempt.run_id, step)
    if p.publish:  # a sweep's own arms leave this to the sweep (said once)
        for warning in (
            cluster.runs_dir_warning(plan.runs_dir(), arm.nodes),
            cluster.unplanned_warning(arm.resources, arm.nodes),
        ):
            if warning:
                progress.say(warning, level="warning")
    progress.say(
        f"{arm.label}  run {attempt.run_id}: {arm.decision.reason}; "
        f"{ray_worker.resources_text(arm.resources)}; checkpoints in {attempt.checkpoint_dir}"
    )


def finish_arm(
    store: Store, p: ArmParams, label: str, run_id: int, result: dict[str, Any]
) -> dict[str, Any]:
    """Mark the attempt completed (its lease released), recompute the sweep's status when this
    run is alone, say so, and publish the table."""
    held = store.end_attempt(
        run_id,
        "completed",
        steps=result["steps"],
        grad_updates=result["grad_updates"],
        tokens=result["tokens"],
        host=result["host"],
        **unwritten_wall(run_id),
    )
    if not held:
        raise ray_worker.LeaseLost(
            f"{label}  run {run_id} trained to the end, but a newer attempt had taken it over "
            "meanwhile (its lease had no heartbeat for too long): the newer attempt is the record"
        )
    # An arm of a running sweep leaves the sweep's status to the sweep's own flow run (it
    # knows which arms are still to start); one run alone (`dapo arm`, a rerun) recomputes it.
    status = store.refresh_sweep_status(p.sweep_id) if p.publish else None
    run = store.get_run(run_id)
    tries = int(run.get("tries") or 1)
    progress.say(
        f"{label}  run {run_id} completed: {result['steps']} steps in "
        f"{progress.duration(run.get('wall_s'))}"
        + (f" over {tries} tries" if tries > 1 else "")
        + f" on {result['host']}"
        + f"; {progress.eval_text(result.get('final_eval'))}"
        + (f"; sweep {p.sweep_id} {status}" if status else "")
    )
    if p.publish:
        publish_sweep(store.url, p.sweep_id)
    return {"label": label, "status": "completed", "run_id": run_id, "tries": tries, **result}


def _record_failure(
    store: Store, p: ArmParams, label: str, run_id: int, exc: BaseException
) -> None:
    """The attempt ends failed (or cancelled, for a stop) and releases its lease; one taken
    over meanwhile is left as the takeover recorded it."""
    stopped = plan.is_stop(exc)
    error = plan.error_text(exc, getattr(exc, "remote_traceback", None))
    _bookkeeping(
        lambda: store.end_attempt(
            run_id,
            "cancelled" if stopped else "failed",
            outage_s=BOOKKEEPING_OUTAGE_S,
            error=error,
            **unwritten_wall(run_id),
        ),
        lambda: store.refresh_sweep_status(p.sweep_id) if p.publish else None,
    )
    progress.say(
        f"{label}  run {run_id} {'stopped' if stopped else 'failed'}: {first_line(exc, with_type=True)}",
        level="warning" if stopped else "error",
    )


def _bookkeeping(*steps: Any) -> None:
    """Record a failure in the store, each step on its own: a store that is down as well must
    not replace the failure's own one line with its."""
    for step in steps:
        try:
            step()
        except Exception as exc:
            progress.say(
                f"could not update the store: {first_line(exc, with_type=True)}", level="warning"
            )


def _mark_interrupted(flow: Any, flow_run: Any, state: Any) -> None:
    """A cancelled or crashed arm flow run leaves its attempt marked (and its lease released),
    not "running" forever."""
    params = dict(getattr(flow_run, "parameters", None) or {})
    try:
        store = Store(params.get("store_url"))
        latest = store.latest_attempt(
            int(params["sweep_id"]), str(params["arm"]), int(params.get("seed", 0))
        )
    except Exception:
        return
    if (
        latest
        and latest.get("status") == "running"
        and latest.get("flow_run_id") == str(flow_run.id)
    ):
        status = "cancelled" if state.is_cancelled() else "failed"
        _bookkeeping(
            lambda: store.end_attempt(
                int(latest["run_id"]),
                status,
                outage_s=BOOKKEEPING_OUTAGE_S,
                error=f"flow run {state.name}: {state.message or ''}".strip(),
            ),
            lambda: (
                store.refresh_sweep_status(int(params["sweep_id"]))
                if params.get("publish", True)
                else None
            ),
        )


@flow(
    name=FLOW_NAME,
    flow_run_name="{arm}-s{seed}-sweep{sweep_id}",
    validate_parameters=False,
    persist_result=False,
    on_cancellation=[ray_jobs.stop_on_cancel, _mark_interrupted],
    on_crashed=[_mark_interrupted],
)
@takes(ArmParams)
def ablation_arm(**parameters: Any) -> dict[str, Any]:
    """Train one arm × seed of a sweep in a Ray actor (a rerun makes a new attempt)."""
    try:
        return run_arm(validate(ArmParams, parameters))
    except ray_jobs.JobStopped as exc:  # its Ray job was stopped: the flow run is cancelled too
        from prefect.states import Cancelled

        return Cancelled(message=str(exc))  # type: ignore[return-value]
