"""`evaluate_run` (deployment `dapo-eval`): evaluate a stored run's latest checkpoint on an eval
set in a Ray actor; the result joins the run's evaluations in the store.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from dapo_common.util import first_line
from dapo_core.setup.config import ExperimentConfig
from dapo_core.setup.sweep_fields import field_overrides
from dapo_core.train.run_dir import latest_step
from db.store import Store
from flows import plan, progress, ray_worker
from flows.params import EvalParams, SweepParams, takes, validate

FLOW_NAME = "evaluate-run"
DEPLOYMENT_NAME = "dapo-eval"


def run_eval(p: EvalParams) -> dict[str, Any]:
    store = Store(p.store_url)
    run = store.get_run(p.run_id)
    step = latest_step(run.get("checkpoint_dir"))
    if step is None:
        raise ValueError(
            f"run {p.run_id} has no checkpoint to evaluate (checkpoint_dir {run.get('checkpoint_dir')})"
        )
    # EvalParams' fields are rows of the sweep's table: each given one sets its config key.
    overrides = field_overrides(p)
    cfg = ExperimentConfig.from_dict(dict(run["config"])).with_overrides(overrides)
    plan.check_local_paths(cfg.to_dict())
    sweep_params = validate(
        SweepParams, dict(store.get_sweep(int(run["sweep_id"])).get("params") or {})
    )
    # An evaluation is one actor, whatever the workers the arm trained on.
    resources = (p.resources or sweep_params.resources).model_copy(update={"workers": 1})
    cluster = ray_worker.connect(p.ray_address or sweep_params.ray_address)
    plan.check_fits(cluster, resources)
    progress.say(
        f"evaluating run {p.run_id} ({run['arm']} s{run['seed']}) at step {step} on {cfg.data.eval}"
    )
    result = ray_worker.run_evaluation(
        run_id=p.run_id,
        config=cfg.to_dict(),
        checkpoint=str(run["checkpoint_dir"]),
        store_url=store.url,
        resources=resources,
    )
    progress.say(f"run {p.run_id} at step {result['step']}: {progress.eval_text(result)}")
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(
            markdown=(
                f"# Evaluation of run {p.run_id} ({run['arm']} seed {run['seed']}, step {result['step']})\n\n"
                "| data set | k | avg@k (%) | pass@k (%) | cons@k (%) | problems |\n"
                "|---|---|---|---|---|---|\n"
                f"| {result['dataset']} | {result['k']} | {100 * result['avg_at_k']:.1f} | "
                f"{100 * result['pass_at_k']:.1f} | {100 * result['cons_at_k']:.1f} | "
                f"{result['n_problems']} |\n"
            ),
            key=f"evaluation-run-{p.run_id}",
            description=f"Evaluation of run {p.run_id}",
        )
    except Exception as exc:  # the store holds the result; a missing artifact is not a failure
        progress.say(
            f"could not publish the evaluation artifact: {first_line(exc, with_type=True)}",
            level="warning",
        )
    return result


@flow(
    name=FLOW_NAME,
    flow_run_name="eval-run{run_id}",
    validate_parameters=False,
    persist_result=False,
)
@takes(EvalParams)
def evaluate_run(**parameters: Any) -> dict[str, Any]:
    """Evaluate a run's latest checkpoint (avg@k, pass@k, cons@k) and store the result."""
    return run_eval(validate(EvalParams, parameters))
