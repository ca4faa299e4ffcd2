"""Run a whole training job: build the pieces, resume, step, evaluate, checkpoint.

`train(cfg, sink=..., out_dir=...)` is the one entry point the CLI and the Prefect/Ray flows
call. It resumes from out_dir/checkpoints/latest when present, so a killed run started again
with the same arguments continues exactly where the last checkpoint left it.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dapo_core import metric_names as M
from dapo_core.engines.base import RolloutEngine, SamplingParams
from dapo_core.setup.config import ExperimentConfig, flatten
from dapo_core.train.checkpoint import (
    load_checkpoint_config,
    load_model_weights,
    load_trainer_state,
    save_checkpoint,
)
from dapo_core.train.collective import LOCAL, Collective, shard
from dapo_core.train.protocols import MetricsSink
from dapo_core.train.run_dir import CONFIG_FILE, claim, latest_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from dapo_core.train.trainer import Trainer

log = logging.getLogger(__name__)

DEFAULT_OWNER: Mapping[str, Any] = {"made_by": "dapo_core.train.runner"}
"""The owner of a directory `dapo train` writes (one worker or many: a run may change N)."""

# Fields a resumed run may change without invalidating its checkpoint: how long it runs and
# how often it reports, never what it computes.
RESUMABLE_CHANGES = frozenset(
    {
        "run.steps",
        "run.checkpoint_every",
        "run.num_threads",
        "run.samples_per_step",
        "data.eval_every",
    }
)


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


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("run.device=cuda but no CUDA device is visible; use --set run.device=cpu")
    return name


def setup_torch(cfg: ExperimentConfig) -> str:
    """Threads, seeds and (on CPU) deterministic kernels; returns the device."""
    if cfg.run.num_threads > 0:
        torch.set_num_threads(cfg.run.num_threads)
    device = resolve_device(cfg.run.device)
    if device == "cpu":
        # Bit-identical reruns on CPU make resume-equivalence testable; on GPU the cost of
        # deterministic kernels is not worth it for long runs.
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed = cfg.run.seed
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass
    return device


def train(
    cfg: ExperimentConfig,
    *,
    sink: MetricsSink,
    out_dir: Path,
    resume: bool = True,
    progress: Callable[[dict[str, Any]], None] | None = None,
    owner: Mapping[str, Any] | None = None,
) -> TrainResult:
    """Train `cfg.run.steps` rollout steps in this process (resuming from out_dir when a
    checkpoint is there, written by one worker or by many).

    `owner` names the job the directory belongs to (see dapo_core.train.run_dir.claim); a
    directory owned by another job is refused before anything in it is read. Many workers:
    dapo_core.train.distributed.train_worker.
    """
    from dapo_core.data.loaders import load_problems
    from dapo_core.engines import make_engine
    from dapo_core.train.checkpoint import (
        is_sharded,
        load_sharded_model,
        load_sharded_optimizer,
    )
    from dapo_core.train.trainer import Trainer

    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    device = setup_torch(cfg)
    # Data first: a malformed file fails in a second, not after the model is built.
    problems = load_problems(cfg.data.train, seed=cfg.run.seed)
    ckpt = open_run_dir(cfg, out_dir, resume=resume, owner=owner)
    model, tokenizer = load_masters(cfg, device)
    sharded = ckpt is not None and is_sharded(ckpt)
    if ckpt is not None:
        # Before the engine exists: vllm starts from the model's weights as they are now.
        if sharded:
            load_sharded_model(model, ckpt)  # N workers' masters, resharded into one process
        else:
            load_model_weights(model, ckpt)
    engine = make_engine(cfg.rollout.engine, model, tokenizer, cfg, work_dir=out_dir)
    trainer = Trainer(cfg, model, tokenizer, engine, problems)
    if ckpt is not None:
        state = load_trainer_state(ckpt)
        if sharded:
            load_sharded_optimizer(model, trainer.optimizer, ckpt)
        trainer.load_state_dict(state, optimizer=not sharded)
        log.info("resumed %s at rollout step %d", out_dir, trainer.rollout_step)
    (out_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))

    def checkpoint() -> Path:
        return save_checkpoint(
            out_dir,
            trainer.rollout_step,
            model=model,
            tokenizer=tokenizer,
            trainer_state=trainer.state_dict(),
            config=cfg.to_dict(),
        )

    job = Job(
        cfg=cfg,
        trainer=trainer,
        sink=sink,
        evaluate=lambda step: evaluate_policy(cfg, model, tokenizer, engine, step=step),
        checkpoint=checkpoint,
    )
    return run_steps(job, ckpt=ckpt, progress=progress, t_start=t_start)


def open_run_dir(
    cfg: ExperimentConfig,
    out_dir: Path,
    *,
    resume: bool,
    owner: Mapping[str, Any] | None,
) -> Path | None:
    """Claim out_dir for `owner` and return the checkpoint to resume from (None: start), after
    checking that its config may be resumed with `cfg`."""
    claim(out_dir, owner if owner is not None else DEFAULT_OWNER)
    ckpt = latest_checkpoint(out_dir) if resume else None
    if ckpt is not None:
        _check_resumable(cfg, load_checkpoint_config(ckpt), out_dir)
    return ckpt


def load_masters(
    cfg: ExperimentConfig, device: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy with float32 parameters (the optimizer's masters) whatever model.dtype says:
    model.dtype is the compute dtype (autocast on one worker, FSDP2's cast on many)."""
    from dapo_core.models import load_policy
    from dapo_core.train.policy import as_masters

    model, tokenizer = load_policy(cfg.model, device, dtype="float32")
    as_masters(model)
    if cfg.model.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
        # Non-reentrant: the variant that composes with FSDP2's hooks.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, tokenizer


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

    def checkpoint() -> None:
        nonlocal last_ckpt, last_saved
        last_ckpt, last_saved = str(job.checkpoint()), trainer.rollout_step

    while trainer.rollout_step < steps:
        t0 = time.perf_counter()
        result = trainer.step()
        s = result.step
        metrics = dict(result.metrics)
        if dist.world_size > 1:
            metrics.update(per_rank_timings(metrics, dist))
        is_last = s == steps
        if is_last or (cfg.data.eval_every and s % cfg.data.eval_every == 0):
            evaluation = job.evaluate(s)
            sink.log_evaluation(s, evaluation)
            metrics.update(_eval_metrics(evaluation))
            if is_last:
                final_eval = evaluation
        sink.log_metrics(s, metrics)
        if result.samples:
            sink.log_samples(s, result.samples)
        if is_last or (cfg.run.checkpoint_every and s % cfg.run.checkpoint_every == 0):
            checkpoint()
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
        checkpoint()
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


def _check_resumable(cfg: ExperimentConfig, saved: dict[str, Any], out_dir: Path) -> None:
    now, then = flatten(cfg.to_dict()), flatten(saved)
    differ = sorted(k for k in now.keys() | then.keys() if now.get(k) != then.get(k))
    differ = [k for k in differ if k not in RESUMABLE_CHANGES]
    # JSON turns tuples into lists; compare those by value.
    differ = [k for k in differ if not _same(now.get(k), then.get(k))]
    if differ:
        raise ValueError(
            f"{out_dir} holds a checkpoint of a different config (differs in "
            f"{', '.join(differ[:5])}): pass --no-resume to start over or choose another --out"
        )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return list(a) == list(b)
    return bool(a == b)


def _eval_metrics(evaluation: dict[str, Any]) -> dict[str, float]:
    return {
        M.EVAL_AVG_AT_K: float(evaluation["avg_at_k"]),
        M.EVAL_PASS_AT_K: float(evaluation["pass_at_k"]),
        M.EVAL_CONS_AT_K: float(evaluation["cons_at_k"]),
    }


# --- evaluation ------------------------------------------------------------------------------
def evaluate_policy(
    cfg: ExperimentConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    engine: RolloutEngine | None = None,
    *,
    step: int = 0,
    dist: Collective = LOCAL,
) -> dict[str, Any]:
    """avg@k, pass@k and cons@k of the policy on cfg.data.eval (first data.eval_problems), and
    the number of correct samples per problem (`correct_per_problem`).

    Samples k responses per problem at data.eval_temperature with a seed derived from
    (run.seed, step): an evaluation never advances the training sampler's random stream, so
    evaluating (or not) leaves the training run unchanged, and it is reproducible for a given
    number of workers. On N workers (a collective) each rank samples a share of the problems
    with its own engine and every rank returns the whole result.
    """
    from dapo_core.algo.evaluate import summarize
    from dapo_core.algo.rewards import math_score
    from dapo_core.data.loaders import format_prompt, load_problems

    problems = load_problems(cfg.data.eval, seed=cfg.run.seed)
    if cfg.data.eval_problems:
        problems = problems[: cfg.data.eval_problems]
    if not problems:
        raise ValueError(f"data.eval={cfg.data.eval!r} holds no problems")
    if engine is None:
        from dapo_core.engines import make_engine

        engine = make_engine("hf", model, tokenizer, cfg)
    k = cfg.data.eval_k
    mine = shard(list(range(len(problems))), dist.rank, dist.world_size)
    prompts = [format_prompt(problems[i], cfg.data.prompt_template, tokenizer) for i in mine]
    completions = (
        engine.generate(
            prompts,
            SamplingParams(
                n=k,
                max_tokens=cfg.rollout.max_response_len,
                temperature=cfg.data.eval_temperature,
                top_p=cfg.rollout.top_p,
                seed=cfg.run.seed * 1_000_003 + step + 17 + 7919 * dist.rank,
            ),
        )
        if prompts
        else []
    )
    scored: dict[int, tuple[list[bool], list[str | None]]] = {}
    for j, i in enumerate(mine):
        results = [math_score(c.text, problems[i].answer) for c in completions[j * k : (j + 1) * k]]
        scored[i] = ([bool(r.acc) for r in results], [r.pred for r in results])
    if dist.world_size > 1:
        for part in dist.all_gather_object(scored):
            scored.update(part)
    correct = [scored[i][0] for i in range(len(problems))]
    preds = [scored[i][1] for i in range(len(problems))]
    answers = [p.answer for p in problems]
    summary = summarize(correct, preds, answers, k)
    return {
        "dataset": cfg.data.eval,
        "k": k,
        "avg_at_k": float(summary["avg_at_k"]),
        "pass_at_k": float(summary["pass_at_k"]),
        "cons_at_k": float(summary["cons_at_k"]),
        "n_problems": len(problems),
        # Correct samples (of k) per problem, in the eval set's order: what a paired comparison
        # of two arms on the same problems, or a bootstrap over problems, needs.
        "correct_per_problem": [sum(c) for c in correct],
    }


def load_checkpoint_policy(
    ckpt: Path, cfg: ExperimentConfig, device: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A checkpoint's model and tokenizer on their own (for `dapo eval`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_core.train.run_dir import MODEL_DIR

    path = Path(ckpt) / MODEL_DIR
    dtype = getattr(torch, cfg.model.dtype)  # evaluation runs in the compute dtype
    from dapo_core.models import quiet_progress

    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
    model.to(torch.device(device))  # type: ignore[arg-type]
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
