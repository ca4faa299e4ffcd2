"""`ablation_sweep`: validate, create the sweep, run one `ablation_arm` per arm × seed, publish.

Everything is checked before the first write (parameters, every arm's config, local paths, the
store, the Ray cluster and whether an arm fits on it), so a bad sweep leaves nothing behind.
Arms run concurrently, as many at once as the Ray cluster's resources allow. Served by
`dapo serve`, each arm is a flow run of the `dapo-arm` deployment (its own run in the UI,
rerunnable alone); run from the terminal, each is a subflow in this process.
"""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prefect import flow
from prefect.context import FlowRunContext

from dapo_common.util import first_line
from db.store import Store
from flows import arm as arm_flow
from flows import checks, plan, progress, ray_worker
from flows.cluster import check_placement, runs_dir_warning, unplanned_warning
from flows.params import ArmParams, SweepParams, takes
from flows.publish import publish_sweep

FLOW_NAME = "ablation-sweep"
DEPLOYMENT_NAME = "dapo-sweep"
ARM_DEPLOYMENT = f"{arm_flow.FLOW_NAME}/{arm_flow.DEPLOYMENT_NAME}"
CHILD_POLL_S = 2.0
SWEEP_ID_DOC = (
    "run an existing sweep again with its stored parameters (completed arms are skipped "
    "unless force)"
)


def launch_mode() -> str:
    """`deployment` when this sweep is itself a deployment run and the arm deployment exists
    (a served setup); `subflow` otherwise (the terminal)."""
    ctx = FlowRunContext.get()
    if not (ctx and ctx.flow_run and ctx.flow_run.deployment_id):
        return "subflow"
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(ARM_DEPLOYMENT)
    except ObjectNotFound:
        return "subflow"
    return "deployment"


def run_child(
    mode: str, sweep_id: int, job: plan.ArmJob, params: SweepParams, store: Store
) -> dict[str, Any]:
    """One arm × seed to the end; {label, status, run_id?, error?}."""
    child = ArmParams(
        sweep_id=sweep_id,
        arm=job.arm,
        seed=job.seed,
        force=params.force,
        resources=params.resources,
        store_url=params.store_url,
        ray_address=params.ray_address,
        publish=False,
    ).model_dump(mode="json")
    if mode == "deployment":
        from prefect.deployments import run_deployment

        created = run_deployment(
            ARM_DEPLOYMENT,
            parameters=child,
            flow_run_name=plan.arm_flow_run_name(job.arm, job.seed, sweep_id),
            timeout=0,  # wait below, where a stopped sweep can cancel the child
        )
        flow_run = wait_for_child(created.id)
        state = flow_run.state
        if state is None or not state.is_completed():
            message = plan.state_line(state.message if state else None) or (
                state.name if state else "no state"
            )
            return {
                "label": job.label,
                "status": "failed",
                "error": message,
                "flow_run_id": str(flow_run.id),
            }
        latest = store.latest_attempt(sweep_id, job.arm, job.seed)
        mine = latest is not None and latest.get("flow_run_id") == str(flow_run.id)
        return {
            "label": job.label,
            "status": "completed" if mine else "skipped",
            "run_id": latest.get("run_id") if latest else None,
            "flow_run_id": str(flow_run.id),
        }
    state = arm_flow.ablation_arm(**child, return_state=True)
    if state.is_completed():
        return dict(state.result())
    return {
        "label": job.label,
        "status": "failed",
        "error": plan.state_line(state.message) or state.name,
    }


def wait_for_child(flow_run_id: Any) -> Any:
    """Poll an arm's flow run until it is final. When this sweep stops (cancelled from the UI,
    Ctrl-C), cancel the child at once rather than wait for it: a cancelled sweep's arms must
    not go on training, and the sweep's process cannot exit while this thread waits."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            if run.state is not None and run.state.is_final():
                return run
            if ray_worker.STOP.wait(CHILD_POLL_S):
                cancel_flow_run(client, flow_run_id)
                raise ray_worker.Interrupted("stopped: the sweep was cancelled")


def cancel_flow_run(client: Any, flow_run_id: Any) -> None:
    """Cancel an arm's flow run unless it is final already. Never forced: forcing skips
    Prefect's rules, and a forced Cancelling once put a run that its runner had just finished
    cancelling back into a state that no process would ever end. Unforced, Prefect refuses
    Cancelling on a final run and turns it into Cancelled for a run no process has picked up."""
    from prefect.states import Cancelling

    state = client.read_flow_run(flow_run_id).state
    if state is not None and not state.is_final():
        client.set_flow_run_state(flow_run_id, Cancelling())


def run_sweep(
    params: SweepParams, store: Store, jobs: list[plan.ArmJob], sweep_id: int | None
) -> dict[str, Any]:
    cluster = ray_worker.connect(params.ray_address)
    plan.check_fits(cluster, params.resources)
    nodes = check_placement(params.resources, [job.config for job in jobs])
    mode = launch_mode()
    slots = plan.concurrency(cluster, params.resources, len(jobs))
    # The arms train in this process's actors: start them now (Ray jobs start their own).
    if mode == "subflow" and params.submit != "ray-jobs":
        ray_worker.prewarm(params.resources, slots)

    # --- the first write: everything above has been checked ---
    ctx = FlowRunContext.get()
    flow_run_id = str(ctx.flow_run.id) if ctx and ctx.flow_run else None
    if sweep_id is None:
        ladder = params.parsed_ladder
        base = ladder.config(
            ladder.names[0],
            params.preset,
            {k: v for k, v in params.config_overrides(params.seeds[0]).items() if k != "run.seed"},
        )
        seeds = (
            f"seeds until decided (at most {params.adaptive.max_seeds})"
            if params.adaptive.until_decided
            else f"{len(params.seeds)} seed(s)"
        )
        sweep_id = store.create_sweep(
            name=params.name
            or f"{ladder.name} on {params.preset}: {len(params.arms)} arms × {seeds}",
            preset=params.preset,
            arms=params.arms,
            seeds=params.seeds,
            base_config=base.to_dict(),
            # Every rung of the ladder with its parent (the table's Δ) and grid point (the
            # dashboard's grid page), also for arms this sweep does not run.
            ladder=ladder.rows(),
            flow_run_id=flow_run_id,
            params=params.model_dump(),
        )
    elif flow_run_id:
        store.set_sweep_flow_run(sweep_id, flow_run_id)
    store.set_sweep_status(sweep_id, "running")
    progress.say(
        f"sweep {sweep_id}: {len(jobs)} arm run(s) ({', '.join(params.arms)} × seeds {params.seeds}), "
        f"{slots} at a time on Ray ({cluster.get('CPU', 0):g} CPU, {cluster.get('GPU', 0):g} GPU), "
        f"arms as {'deployment runs' if mode == 'deployment' else 'subflows'}; store {store.where}",
        sweep_id=sweep_id,
        slots=slots,
    )
    for warning in (
        runs_dir_warning(plan.runs_dir(), nodes),
        unplanned_warning(params.resources, nodes),
    ):
        if warning:
            progress.say(warning, level="warning")

    results: list[dict[str, Any]] = []
    try:
        if params.adaptive.until_decided:
            from flows import adaptive

            def run_jobs(round_jobs: list[plan.ArmJob]) -> list[dict[str, Any]]:
                assert sweep_id is not None
                return _run_all(mode, sweep_id, round_jobs, params, store, slots)

            results = adaptive.run_rounds(params, store, sweep_id, run_jobs)
        else:
            results = _run_all(mode, sweep_id, jobs, params, store, slots)
    except BaseException as exc:
        if mode == "subflow":  # deployment runs are their own flow runs: they go on
            _cancel_running(store, sweep_id, _cells(store, sweep_id, jobs, params))
        status = "cancelled" if plan.is_stop(exc) else "failed"
        store.set_sweep_status(sweep_id, status, error=first_line(exc, with_type=True))
        raise
    status, error = plan.sweep_outcome(results)
    store.set_sweep_status(sweep_id, status, error=error)
    rows = publish_sweep(store.url, sweep_id, note=error)
    progress.say(f"sweep {sweep_id} {status}" + (f": {error}" if error else ""))
    if error:
        raise RuntimeError(error)
    return {"sweep_id": sweep_id, "status": status, "results": results, "table": rows}


def _run_all(
    mode: str, sweep_id: int, jobs: list[plan.ArmJob], params: SweepParams, store: Store, slots: int
) -> list[dict[str, Any]]:
    lock = threading.Lock()

    def one(job: plan.ArmJob) -> dict[str, Any]:
        try:
            return run_child(mode, sweep_id, job, params, store)
        except Exception as exc:  # a child that could not even start counts as failed
            with lock:
                progress.say(
                    f"{job.label}  failed: {first_line(exc, with_type=True)}", level="error"
                )
            return {
                "label": job.label,
                "status": "failed",
                "error": first_line(exc, with_type=True),
            }

    # Each thread runs in a copy of this flow run's context, so that its arm is linked to this
    # sweep as a child flow run.
    pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="arm")
    try:
        # Longest first (LPT): the last round then holds the short arms, so the slots finish
        # close together instead of one arm running on alone. Results keep the jobs' order.
        order = plan.longest_first(jobs)
        futures = {i: pool.submit(contextvars.copy_context().run, one, jobs[i]) for i in order}
        results = [futures[i].result() for i in range(len(jobs))]
    except BaseException:
        # Stop the arms (their actors are killed) instead of waiting for them to finish.
        ray_worker.STOP.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results


def _cells(
    store: Store, sweep_id: int, jobs: list[plan.ArmJob], params: SweepParams
) -> list[tuple[str, int]]:
    """The (arm, seed)s this sweep may be running: its jobs, or every arm × seed an adaptive
    sweep's rounds have reached so far."""
    if not params.adaptive.until_decided:
        return [(job.arm, job.seed) for job in jobs]
    try:
        seeds = store.get_sweep(sweep_id)["seeds"]
    except Exception:  # best effort while shutting down
        seeds = params.seeds
    return [(arm, int(seed)) for arm in params.arms for seed in seeds]


def _cancel_running(store: Store, sweep_id: int, cells: list[tuple[str, int]]) -> None:
    for arm, seed in cells:
        try:
            latest = store.latest_attempt(sweep_id, arm, seed)
            if latest and latest.get("status") == "running":
                store.update_run(
                    int(latest["run_id"]), status="cancelled", error="sweep interrupted"
                )
        except Exception:  # best effort while shutting down
            continue


def child_flow_runs(client: Any, parent_id: Any) -> list[Any]:
    """Every flow run whose parent is `parent_id` (a sweep's arms), page by page: one read
    returns at most the server's page (PREFECT_SERVER_API_DEFAULT_LIMIT, 200 by default), and
    a sweep can have more arms than that. Pages are read in a fixed order (by id) until one
    comes back empty; no limit is asked for, so a server with a smaller page works too."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort

    found: list[Any] = []
    while True:
        page = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])
            ),
            sort=FlowRunSort.ID_DESC,
            offset=len(found),
        )
        if not page:
            return found
        found.extend(page)


def _sweep_interrupted(flow: Any, flow_run: Any, state: Any) -> None:
    """A cancelled or crashed sweep cancels its arm flow runs (each then marks its own store
    run) and marks its sweep row, instead of leaving them "running"."""
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            # An adaptive sweep's arms are the children of its rounds: walk down the tree.
            pending = [flow_run.id]
            while pending:
                for child in child_flow_runs(client, pending.pop()):
                    cancel_flow_run(client, child.id)
                    pending.append(child.id)
    except Exception:  # best effort: the server may be going away too
        pass
    try:
        from db import ablation

        store = Store(dict(flow_run.parameters or {}).get("store_url"))
        sweeps = ablation.list_sweeps(store.engine)
        mine = sweeps[
            (sweeps["flow_run_id"] == str(flow_run.id))
            & sweeps["status"].isin(["pending", "running"])
        ]
        for sweep_id in mine["sweep_id"]:
            status = "cancelled" if state.is_cancelled() else "failed"
            store.set_sweep_status(int(sweep_id), status, error=f"flow run {state.name}")
    except Exception:
        pass


@flow(
    name=FLOW_NAME,
    validate_parameters=False,
    persist_result=False,
    on_cancellation=[_sweep_interrupted],
    on_crashed=[_sweep_interrupted],
)
@takes(SweepParams, ("sweep_id", int | None, None, SWEEP_ID_DOC))
def ablation_sweep(**parameters: Any) -> dict[str, Any]:
    """Run an ablation ladder (built-in or your own): one run per arm × seed, then the table."""
    sweep_id = parameters.pop("sweep_id", None)
    params, store, jobs = checks.prepare_sweep(parameters, sweep_id)
    return run_sweep(params, store, jobs, sweep_id)
