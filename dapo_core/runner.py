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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dapo_core import metric_names as M
from dapo_core.checkpoint import (
    latest_checkpoint,
    load_checkpoint_config,
    load_model_weights,
    load_trainer_state,
    save_checkpoint,
)
from dapo_core.config import ExperimentConfig, flatten
from dapo_core.engines import make_engine
from dapo_core.engines.base import RolloutEngine, SamplingParams
from dapo_core.protocols import MetricsSink

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

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
    """Keys: dataset, k, avg_at_k, pass_at_k, cons_at_k, n_problems."""
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
) -> TrainResult:
    """Train `cfg.run.steps` rollout steps (resuming from out_dir when a checkpoint is there)."""
    from dapo_core.data import load_problems
    from dapo_core.models import load_policy
    from dapo_core.trainer import Trainer

    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    device = setup_torch(cfg)
    # Data first: a malformed file fails in a second, not after the model is built.
    problems = load_problems(cfg.data.train, seed=cfg.run.seed)
    ckpt = latest_checkpoint(out_dir) if resume else None
    if ckpt is not None:
        _check_resumable(cfg, load_checkpoint_config(ckpt), out_dir)
    model, tokenizer = load_policy(cfg.model, device)
    if cfg.model.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable()
    if ckpt is not None:
        load_model_weights(model, ckpt)
    engine = make_engine(cfg.rollout.engine, model, tokenizer, cfg, work_dir=out_dir)
    trainer = Trainer(cfg, model, tokenizer, engine, problems)
    if ckpt is not None:
        trainer.load_state_dict(load_trainer_state(ckpt))
        log.info("resumed %s at rollout step %d", out_dir, trainer.rollout_step)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))

    steps = cfg.run.steps
    last_ckpt = str(ckpt) if ckpt is not None else ""
    last_saved = trainer.rollout_step if ckpt is not None else -1
    final_eval: dict[str, Any] | None = None
    step_times: list[float] = []

    def checkpoint() -> None:
        nonlocal last_ckpt, last_saved
        path = save_checkpoint(
            out_dir,
            trainer.rollout_step,
            model=model,
            tokenizer=tokenizer,
            trainer_state=trainer.state_dict(),
            config=cfg.to_dict(),
        )
        last_ckpt, last_saved = str(path), trainer.rollout_step

    while trainer.rollout_step < steps:
        t0 = time.perf_counter()
        result = trainer.step()
        s = result.step
        metrics = dict(result.metrics)
        is_last = s == steps
        if is_last or (cfg.data.eval_every and s % cfg.data.eval_every == 0):
            evaluation = evaluate_policy(cfg, model, tokenizer, engine, step=s)
            sink.log_evaluation(s, evaluation)
            metrics.update(_eval_metrics(evaluation))
            if is_last:
                final_eval = evaluation
        sink.log_metrics(s, metrics)
        if result.samples:
            sink.log_samples(s, result.samples)
        if is_last or (cfg.run.checkpoint_every and s % cfg.run.checkpoint_every == 0):
            checkpoint()
        step_times.append(time.perf_counter() - t0)
        if progress is not None:
            eta = (sum(step_times) / len(step_times)) * (steps - s)
            progress(
                {
                    "step": s,
                    "steps": steps,
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
        final_eval = evaluate_policy(cfg, model, tokenizer, engine, step=trainer.rollout_step)
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
) -> dict[str, Any]:
    """avg@k, pass@k and cons@k of the policy on cfg.data.eval (first data.eval_problems).

    Samples k responses per problem at data.eval_temperature with a seed derived from
    (run.seed, step): an evaluation never advances the training sampler's random stream, so
    evaluating (or not) leaves the training run unchanged, and it is reproducible.
    """
    from dapo_core.data import format_prompt, load_problems
    from dapo_core.evaluate import summarize
    from dapo_core.rewards import math_score

    problems = load_problems(cfg.data.eval, seed=cfg.run.seed)
    if cfg.data.eval_problems:
        problems = problems[: cfg.data.eval_problems]
    if not problems:
        raise ValueError(f"data.eval={cfg.data.eval!r} holds no problems")
    if engine is None:
        engine = make_engine("hf", model, tokenizer, cfg)
    k = cfg.data.eval_k
    prompts = [format_prompt(p, cfg.data.prompt_template, tokenizer) for p in problems]
    completions = engine.generate(
        prompts,
        SamplingParams(
            n=k,
            max_tokens=cfg.rollout.max_response_len,
            temperature=cfg.data.eval_temperature,
            top_p=cfg.rollout.top_p,
            seed=cfg.run.seed * 1_000_003 + step + 17,
        ),
    )
    correct: list[list[bool]] = []
    preds: list[list[str | None]] = []
    for i, problem in enumerate(problems):
        results = [math_score(c.text, problem.answer) for c in completions[i * k : (i + 1) * k]]
        correct.append([bool(r.acc) for r in results])
        preds.append([r.pred for r in results])
    answers = [p.answer for p in problems]
    summary = summarize(correct, preds, answers, k)
    return {
        "dataset": cfg.data.eval,
        "k": k,
        "avg_at_k": float(summary["avg_at_k"]),
        "pass_at_k": float(summary["pass_at_k"]),
        "cons_at_k": float(summary["cons_at_k"]),
        "n_problems": len(problems),
    }


def load_checkpoint_policy(
    ckpt: Path, cfg: ExperimentConfig, device: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A checkpoint's model and tokenizer on their own (for `dapo eval`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_core.checkpoint import MODEL_DIR

    path = Path(ckpt) / MODEL_DIR
    dtype = getattr(torch, cfg.model.dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.to(torch.device(device))  # type: ignore[arg-type]
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
