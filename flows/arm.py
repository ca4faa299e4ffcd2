"""`ablation_arm`: train one (arm, seed) of a sweep in a Ray actor and record it in the store.

Each flow run is a new attempt row in the store, unless the arm already completed with the same
config (skipped, unless forced). An (arm, seed) outside the sweep is refused unless `extend`,
which adds it to the sweep's definition. An attempt resumes the previous attempt's checkpoint
when that one did not complete and had the same config; the new attempt then gets the old curve
copied in, so it holds the whole history, and the old one is marked superseded (so is an
unfinished one that a new attempt starts over from scratch). An actor that dies mid-run
(killed, node lost) is replaced by the task's retry, which resumes from the run's last
checkpoint inside the same attempt; the store's upsert keeps every (step, metric) once.

Where it ran: as soon as a try's actors are placed, the run's `host` says where, by host, Ray
node (id and address) and rank, e.g. `gpu-7 (node 1a2b3c4d@10.0.0.5: rank 0; node
5e6f7a8b@10.0.0.6: rank 1)` (cluster.describe): on one machine every node has the same host
name, so the node is what tells them apart. `checkpoint_dir` is the run directory, absolute.
A try lost with its actor (a node died) leaves its one line in the run's `error` while the
task retries; the final outcome replaces it (a completed run keeps no error).

Wall time: an attempt's `wall_s` is the sum over its tries (each actor that trained it, and the
tries of the attempt it resumed), `tries` counts them. It is written every WALL_EVERY_S on a
clock of its own, and is the run row's heartbeat: a run nobody has touched for
db.models.RUN_LEASE_S reads "interrupted". When an arm finishes, its sweep's status
is recomputed from its runs, so a sweep whose driver died does not stay "running".
"""

from __future__ import annotations

import contextvars
import socket
import threading
import time
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext

from dapo_core.train.run_dir import check_resumable_dir, latest_step
from db.store import Store
from flows import checks, cluster, plan, progress, ray_worker
from flows.params import ArmParams, Resources, takes, validate
from flows.publish import publish_sweep

FLOW_NAME = "ablation-arm"
DEPLOYMENT_NAME = "dapo-arm"
TRAIN_RETRIES = 2
# The attempt's wall time is written this often while it trains (whatever the steps do), so a
# driver that dies loses at most this much of it; it is also the run's heartbeat.
WALL_EVERY_S = 10.0
# Bookkeeping after a failure waits this long for an unreachable store (the failure itself
# is already the answer; the outage budget was spent by whatever failed first).
BOOKKEEPING_OUTAGE_S = 5.0
# The wall time of a try that the store did not take (it was down when the try ended), by run:
# the task's retry, in this process, starts from it (else the first try's time was lost).
_UNWRITTEN_WALL: dict[int, float] = {}


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
    # An earlier try in this process whose last writes met a store outage knows more of the
    # attempt's time than the store does.
    before = max(store.begin_try(run_id), _UNWRITTEN_WALL.pop(run_id, 0.0))
    t0 = time.monotonic()

    def write_wall(*, outage_s: float) -> float:
        wall = before + time.monotonic() - t0
        try:
            store.set_wall(run_id, wall, outage_s=outage_s)
            _UNWRITTEN_WALL.pop(run_id, None)
        except Exception as exc:  # the time is bookkeeping: never fail training for it
            _UNWRITTEN_WALL[run_id] = wall
            progress.say(f"{label}  could not record the wall time: {plan.first_line(exc)}")
        return wall

    def on_progress(update: dict[str, Any]) -> None:
        progress.say(progress.step_line(label, update))

    # The wall time doubles as the run's heartbeat (db.models.RUN_LEASE_S): written on a clock
    # of its own, so that a long step, evaluation or placement never reads as a dead driver.
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(WALL_EVERY_S):
            write_wall(outage_s=0.0)

    # In a copy of this task's context, so that what it says goes to the task's Prefect log.
    beat = threading.Thread(
        target=contextvars.copy_context().run,
        args=(heartbeat,),
        name=f"heartbeat-run{run_id}",
        daemon=True,
    )
    beat.start()

    def on_placed(places: list[dict[str, Any]]) -> None:
        where = cluster.describe(places)
        progress.say(f"{label}  run {run_id} placed: {where}")
        _bookkeeping(lambda: store.update_run(run_id, host=where, outage_s=0.0))

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
        )
    except ray_worker.ActorLost as exc:
        # The try is lost, not the attempt: say why in the run's error while the task retries
        # (a last failure's own error replaces it, see run_arm).
        line = plan.first_line(exc)
        progress.say(f"{label}  run {run_id}: {line}", level="warning")
        _bookkeeping(lambda: store.update_run(run_id, error=line, outage_s=0.0))
        raise
    finally:
        stop.set()
        beat.join(timeout=WALL_EVERY_S)  # a write stuck on a hung store must not hold us
        write_wall(outage_s=BOOKKEEPING_OUTAGE_S)
    return result


def resources_text(resources: Resources) -> str:
    """`1 CPU`, `2 workers × (1 CPU, 1 GPU), SPREAD`."""
    each = f"{resources.cpus:g} CPU" + (f", {resources.gpus:g} GPU" if resources.gpus else "")
    if resources.workers == 1:
        return each
    return f"{resources.workers} workers × ({each}), {resources.placement}"


def current_flow_run_id() -> str | None:
    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx and ctx.flow_run else None


def run_arm(p: ArmParams) -> dict[str, Any]:
    """The arm flow's work; returns {label, status, run_id, error?, ...}."""
    store = Store(p.store_url)
    url = store.url
    sweep = store.get_sweep(p.sweep_id)
    sweep_params = checks.arm_in_sweep(sweep, p.arm, p.seed, extend=p.extend)
    extended = sweep_params.arms != list(sweep["arms"]) or sweep_params.seeds != list(
        sweep["seeds"]
    )
    job = plan.arm_job(sweep_params, p.arm, p.seed)
    checks.check_inputs([job.config])
    resources = p.resources or sweep_params.resources
    totals = ray_worker.connect(p.ray_address or sweep_params.ray_address)
    plan.check_fits(totals, resources)
    nodes = cluster.check_placement(resources, [job.config])
    label = f"{job.label}"

    latest = store.latest_attempt(p.sweep_id, p.arm, p.seed)
    completed = store.completed_run(p.sweep_id, p.arm, p.seed, job.config_hash)
    decision = plan.decide_arm(
        config_hash=job.config_hash,
        force=p.force,
        completed_run_id=completed,
        latest=latest,
        latest_checkpoint_step=latest_step(latest.get("checkpoint_dir")) if latest else None,
    )
    if decision.action == "skip":
        progress.say(f"{label}  skipped: {decision.reason} (force to retrain)")
        return {
            "label": label,
            "status": "skipped",
            "run_id": decision.run_id,
            "reason": decision.reason,
        }
    if (
        latest
        and latest.get("status") == "running"
        and ray_worker.actor_alive(int(latest["run_id"]))
    ):
        raise ValueError(
            f"{label} of sweep {p.sweep_id} is still training as run {latest['run_id']}: "
            "wait for it or cancel its flow run"
        )

    owner = plan.run_owner(store.store_id, p.sweep_id, job)
    if decision.action == "resume":
        # Read nothing from a directory the store names until it is known to be this run's.
        check_resumable_dir(str(decision.checkpoint_dir), owner, plan.runs_dir())

    # --- the first write: everything above has been checked ---
    if extended:
        store.extend_sweep(
            p.sweep_id,
            arms=sweep_params.arms,
            seeds=sweep_params.seeds,
            params=sweep_params.model_dump(),
        )
        progress.say(
            f"sweep {p.sweep_id} extended to arms {', '.join(sweep_params.arms)} × seeds "
            f"{sweep_params.seeds}"
        )
    run_id = store.start_run(
        sweep_id=p.sweep_id,
        arm=p.arm,
        seed=p.seed,
        config=job.config,
        config_hash=job.config_hash,
        host=socket.gethostname(),
        flow_run_id=current_flow_run_id(),
    )
    try:
        if decision.action == "resume":
            assert decision.run_id is not None and decision.resume_step is not None
            out_dir = str(decision.checkpoint_dir)
            # What an outage held back from the older attempt goes in before its curve is
            # copied over, so the copy misses nothing.
            store.replay_spill(decision.run_id, out_dir)
            store.copy_history(decision.run_id, run_id, decision.resume_step)
            store.supersede(decision.run_id, run_id, "it resumed this attempt's checkpoint")
            older = store.get_run(decision.run_id)
            # The resumed curve's time so far belongs to this attempt too.
            store.update_run(run_id, wall_s=older.get("wall_s"), tries=older.get("tries"))
        else:
            if latest and latest.get("status") == "running":
                store.supersede(int(latest["run_id"]), run_id, "it started over")
            out_dir = str(
                plan.fresh_run_dir(
                    plan.runs_dir(),
                    store.store_id,
                    p.sweep_id,
                    p.arm,
                    p.seed,
                    job.config_hash,
                    run_id,
                )
            )
        out_dir = str(Path(out_dir).resolve())  # every node must find it: never relative
        store.update_run(run_id, checkpoint_dir=out_dir)
        if p.publish:  # a sweep's own arms leave this to the sweep (said once)
            for warning in (
                cluster.runs_dir_warning(plan.runs_dir(), nodes),
                cluster.unplanned_warning(resources, nodes),
            ):
                if warning:
                    progress.say(warning, level="warning")
        progress.say(
            f"{label}  run {run_id}: {decision.reason}; {resources_text(resources)}; "
            f"checkpoints in {out_dir}"
        )
        result = train_in_ray(
            run_id, label, job.config, url, out_dir, owner, resources.model_dump()
        )
    except BaseException as exc:
        stopped = plan.is_stop(exc)
        error = plan.error_text(exc, getattr(exc, "remote_traceback", None))
        _bookkeeping(
            lambda: store.update_run(
                run_id,
                outage_s=BOOKKEEPING_OUTAGE_S,
                status="cancelled" if stopped else "failed",
                error=error,
            ),
            lambda: store.refresh_sweep_status(p.sweep_id) if p.publish else None,
        )
        progress.say(
            f"{label}  run {run_id} {'stopped' if stopped else 'failed'}: {plan.first_line(exc)}",
            level="warning" if stopped else "error",
        )
        raise
    store.update_run(
        run_id,
        status="completed",
        steps=result["steps"],
        grad_updates=result["grad_updates"],
        tokens=result["tokens"],
        host=result["host"],
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
        publish_sweep(url, p.sweep_id)
    return {"label": label, "status": "completed", "run_id": run_id, "tries": tries, **result}


def _bookkeeping(*steps: Any) -> None:
    """Record a failure in the store, each step on its own: a store that is down as well must
    not replace the failure's own one line with its."""
    for step in steps:
        try:
            step()
        except Exception as exc:
            progress.say(f"could not update the store: {plan.first_line(exc)}", level="warning")


def _mark_interrupted(flow: Any, flow_run: Any, state: Any) -> None:
    """A cancelled or crashed arm flow run leaves its attempt marked, not "running" forever."""
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
            lambda: store.update_run(
                int(latest["run_id"]),
                outage_s=BOOKKEEPING_OUTAGE_S,
                status=status,
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
    on_cancellation=[_mark_interrupted],
    on_crashed=[_mark_interrupted],
)
@takes(ArmParams)
def ablation_arm(**parameters: Any) -> dict[str, Any]:
    """Train one arm × seed of a sweep in a Ray actor (a rerun makes a new attempt)."""
    return run_arm(validate(ArmParams, parameters))
