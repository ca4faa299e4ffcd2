"""The step loop of one run: step, evaluate, log and checkpoint until run.steps.

The same loop runs on one worker and on every rank of N (`run_steps`); what it needs from the
process it runs in is a `Job`, which dapo_core.train.assembly puts together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_common import metric_names as M
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.checkpoint import retain_checkpoints
from dapo_core.train.collective import LOCAL, Collective
from dapo_core.train.protocols import MetricsSink

if TYPE_CHECKING:
    from dapo_core.train.trainer import Trainer


class TrainingDiverged(ValueError):
    """Too many gradient updates in a row had a NaN / inf loss or gradient."""


@dataclass
class TrainResult:
    steps: int
    """Rollout steps completed."""
    grad_updates: int
    """Gradient updates applied (cumulative)."""
    tokens: int
    """Response tokens generated (cumulative)."""
    wall_s: float
    """Wall time of this call."""
    final_eval: dict[str, Any] | None
    """Keys: dataset, k, avg_at_k, pass_at_k, cons_at_k, n_problems, correct_per_problem."""
    checkpoint_dir: str
    """The final checkpoint."""


@dataclass
class Job:
    """What the step loop needs from a training process, one worker or one of N."""

    cfg: ExperimentConfig
    trainer: Trainer
    sink: MetricsSink
    """Rank 0's sink; the other ranks get a no-op one."""
    evaluate: Callable[[int], dict[str, Any]]
    """Evaluation at a step (a collective on N workers: every rank calls it)."""
    checkpoint: Callable[[], Path]
    """Save a checkpoint of the current step (a collective on N workers)."""
    dist: Collective = LOCAL


def run_steps(
    job: Job,
    *,
    ckpt: Path | None,
    progress: Callable[[dict[str, Any]], None] | None,
    t_start: float,
) -> TrainResult:
    """Step, evaluate, log and checkpoint until cfg.run.steps; the same loop on every rank."""
    cfg, trainer, sink, dist = job.cfg, job.trainer, job.sink, job.dist
    if ckpt is None:
        # The starting model's score: every gain in the table is measured against it.
        sink.log_evaluation(0, job.evaluate(0))

    steps = cfg.run.steps
    last_ckpt = str(ckpt) if ckpt is not None else ""
    last_saved = trainer.rollout_step if ckpt is not None else -1
    final_eval: dict[str, Any] | None = None
    step_times: list[float] = []

    def checkpoint(score: float | None) -> None:
        nonlocal last_ckpt, last_saved
        saved = job.checkpoint()
        last_ckpt, last_saved = str(saved), trainer.rollout_step
        if dist.rank == 0:  # after every rank's save returned: nobody reads the old ones
            retain_checkpoints(saved, keep=cfg.run.keep_checkpoints, score=score, resumed_from=ckpt)

    while trainer.rollout_step < steps:
        t0 = time.perf_counter()
        result = trainer.step()
        s = result.step
        metrics = dict(result.metrics)
        if dist.world_size > 1:
            metrics.update(per_rank_timings(metrics, dist))
        is_last = s == steps
        score = None  # this step's held-out avg@k: which checkpoint is the best
        if is_last or (cfg.data.eval_every and s % cfg.data.eval_every == 0):
            evaluation = job.evaluate(s)
            sink.log_evaluation(s, evaluation)
            metrics.update(_eval_metrics(evaluation))
            score = float(evaluation["avg_at_k"])
            if is_last:
                final_eval = evaluation
        sink.log_metrics(s, metrics)
        if result.samples:
            sink.log_samples(s, result.samples)
        if is_last or (cfg.run.checkpoint_every and s % cfg.run.checkpoint_every == 0):
            checkpoint(score)
        if trainer.diverged:
            raise TrainingDiverged(
                f"training diverged at step {s}: {trainer.nonfinite_streak} gradient updates in a "
                "row had a NaN or inf loss or gradient and were skipped; lower optim.lr (the "
                "metrics so far are kept)"
            )
        step_times.append(time.perf_counter() - t0)
        if progress is not None:
            eta = (sum(step_times) / len(step_times)) * (steps - s)
            progress(
                {
                    "step": s,
                    "steps": steps,
                    "workers": dist.world_size,
                    "reward": metrics.get(M.REWARD_MEAN),
                    "acc": metrics.get(M.ACC_MEAN),
                    "entropy": metrics.get(M.ENTROPY_MEAN),
                    "response_length": metrics.get(M.RESPONSE_LENGTH_MEAN),
                    "tokens_per_s": metrics.get(M.TOKENS_PER_S),
                    "eta_s": eta,
                    "eval": final_eval if is_last else None,
                }
            )

    if final_eval is None:  # resumed a run that had already finished its steps
        final_eval = job.evaluate(trainer.rollout_step)
        sink.log_evaluation(trainer.rollout_step, final_eval)
    if last_saved != trainer.rollout_step:
        checkpoint(float(final_eval["avg_at_k"]))
    return TrainResult(
        steps=trainer.rollout_step,
        grad_updates=trainer.grad_updates,
        tokens=trainer.tokens_total,
        wall_s=time.perf_counter() - t_start,
        final_eval=final_eval,
        checkpoint_dir=last_ckpt,
    )


def per_rank_timings(metrics: Mapping[str, float], dist: Collective) -> dict[str, float]:
    """Every rank's `time/...` values as `time/rank<r>/...` (a collective). The unprefixed
    names keep rank 0's own timings; the other metrics are global already."""
    mine = {k: v for k, v in metrics.items() if k.startswith(M.TIME_PREFIX)}
    out: dict[str, float] = {}
    for r, theirs in enumerate(dist.all_gather_object(mine)):
        out.update({M.per_rank(name, r): value for name, value in theirs.items()})
    return out


def _eval_metrics(evaluation: dict[str, Any]) -> dict[str, float]:
    return {
        M.EVAL_AVG_AT_K: float(evaluation["avg_at_k"]),
        M.EVAL_PASS_AT_K: float(evaluation["pass_at_k"]),
        M.EVAL_CONS_AT_K: float(evaluation["cons_at_k"]),
    }
