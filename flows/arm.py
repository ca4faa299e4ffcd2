"""`ablation_arm`: train one (arm, seed) of a sweep in a Ray actor and record it in the store.

Each flow run is a new attempt row in the store, unless the arm already completed with the same
config (skipped, unless forced). An attempt resumes the previous attempt's checkpoint when that
one did not complete and had the same config; the new attempt then gets the old curve copied in,
so it holds the whole history. An actor that dies mid-run (killed, node lost) is replaced by the
task's retry, which resumes from the run's last checkpoint inside the same attempt; the store's
upsert keeps every (step, metric) once.
"""

from __future__ import annotations

import socket
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext

from db.store import Store
from flows import plan, progress, ray_worker
from flows.params import ArmName, ArmParams, Resources, SweepParams, validate
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
    resources: dict[str, float],
) -> dict[str, Any]:
    """One try at training store run `run_id`: a fresh actor that resumes from out_dir."""
    step = plan.checkpoint_step(out_dir)
    if step is not None:
        progress.say(f"{label}  resuming from the checkpoint at step {step} in {out_dir}")
    return ray_worker.run_training(
        run_id=run_id,
        config=config,
        store_url=store_url,
        out_dir=out_dir,
        resources=Resources.model_validate(resources),
        on_progress=lambda update: progress.say(progress.step_line(label, update)),
    )


def current_flow_run_id() -> str | None:
    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx and ctx.flow_run else None


def run_arm(p: ArmParams) -> dict[str, Any]:
    """The arm flow's work; returns {label, status, run_id, error?, ...}."""
    store = Store(p.store_url)
    url = store.url
    sweep = store.get_sweep(p.sweep_id)
    sweep_params = validate(SweepParams, dict(sweep.get("params") or {}))
    job = plan.arm_job(sweep_params, p.arm, p.seed)
    plan.check_local_paths(job.config)
    resources = p.resources or sweep_params.resources
    cluster = ray_worker.connect(p.ray_address or sweep_params.ray_address)
    plan.check_fits(cluster, resources)
    label = f"{job.label}"

    latest = store.latest_attempt(p.sweep_id, p.arm, p.seed)
    completed = store.completed_run(p.sweep_id, p.arm, p.seed, job.config_hash)
    latest_step = plan.checkpoint_step(latest.get("checkpoint_dir")) if latest else None
    decision = plan.decide_arm(
        config_hash=job.config_hash,
        force=p.force,
        completed_run_id=completed,
        latest=latest,
        latest_checkpoint_step=latest_step,
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
            store.copy_history(decision.run_id, run_id, decision.resume_step)
            if latest and latest.get("status") == "running":
                store.update_run(
                    decision.run_id, status="failed", error=f"interrupted; resumed by run {run_id}"
                )
        else:
            out_dir = str(
                plan.fresh_run_dir(
                    plan.runs_dir(), p.sweep_id, p.arm, p.seed, job.config_hash, run_id
                )
            )
        store.update_run(run_id, checkpoint_dir=out_dir)
        progress.say(
            f"{label}  run {run_id}: {decision.reason}; {resources.cpus:g} CPU"
            + (f", {resources.gpus:g} GPU" if resources.gpus else "")
        )
        result = train_in_ray(run_id, label, job.config, url, out_dir, resources.model_dump())
    except BaseException as exc:
        stopped = plan.is_stop(exc)
        store.update_run(
            run_id,
            status="cancelled" if stopped else "failed",
            error=plan.error_text(exc, getattr(exc, "remote_traceback", None)),
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
        wall_s=result["wall_s"],
        host=result["host"],
    )
    progress.say(
        f"{label}  run {run_id} completed: {result['steps']} steps in "
        f"{progress.duration(result['wall_s'])}; {progress.eval_text(result.get('final_eval'))}"
    )
    if p.publish:
        publish_sweep(url, p.sweep_id)
    return {"label": label, "status": "completed", "run_id": run_id, **result}


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
        store.update_run(
            int(latest["run_id"]),
            status=status,
            error=f"flow run {state.name}: {state.message or ''}".strip(),
        )


@flow(
    name=FLOW_NAME,
    flow_run_name="{arm}-s{seed}-sweep{sweep_id}",
    validate_parameters=False,
    persist_result=False,
    on_cancellation=[_mark_interrupted],
    on_crashed=[_mark_interrupted],
)
def ablation_arm(
    sweep_id: int,
    arm: ArmName,
    seed: int = 0,
    force: bool = False,
    resources: Resources | None = None,
    store_url: str | None = None,
    ray_address: str | None = None,
    publish: bool = True,
) -> dict[str, Any]:
    """Train one arm × seed of a sweep in a Ray actor (a rerun makes a new attempt).

    Args:
        sweep_id: The sweep this arm belongs to (its parameters define the arm's config).
        arm: The ladder arm to train.
        seed: The seed of the run.
        force: Retrain even if this arm already completed with the same config.
        resources: CPUs / GPUs for the arm's Ray actor (default: the sweep's).
        store_url: SQLAlchemy URL of the store (default: $DAPO_DB_URL, else the SQLite file).
        ray_address: Ray cluster to join (default: the sweep's, else $RAY_ADDRESS, else local).
        publish: Publish the sweep's ablation table artifact when done.
    """
    params = validate(
        ArmParams,
        {
            "sweep_id": sweep_id,
            "arm": arm,
            "seed": seed,
            "force": force,
            "resources": resources.model_dump() if isinstance(resources, Resources) else resources,
            "store_url": store_url,
            "ray_address": ray_address,
            "publish": publish,
        },
    )
    return run_arm(params)
