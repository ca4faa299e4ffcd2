"""Run a whole training job: build the pieces, resume, step, evaluate, checkpoint.

`train(cfg, sink=..., out_dir=...)` is the one entry point the CLI and the Prefect/Ray flows
call. It resumes from out_dir/checkpoints/latest when present, so a killed run started again
with the same arguments continues exactly where the last checkpoint left it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import random
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
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
    retain_checkpoints,
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
        "run.keep_checkpoints",
        "run.collective_timeout_s",
        "data.eval_every",
        "run.loggers",
        "run.mlflow_uri",
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

    However it ends, the run's engine is closed and its device memory released
    (`run_resources`), so that the next run in this process starts on a free device.
    """
    with run_resources() as cleanup:
        return _train(
            cfg,
            sink=sink,
            out_dir=out_dir,
            resume=resume,
            progress=progress,
            owner=owner,
            cleanup=cleanup,
        )


def _train(
    cfg: ExperimentConfig,
    *,
    sink: MetricsSink,
    out_dir: Path,
    resume: bool,
    progress: Callable[[dict[str, Any]], None] | None,
    owner: Mapping[str, Any] | None,
    cleanup: contextlib.ExitStack,
) -> TrainResult:
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
    cleanup.callback(engine.close)
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


@contextlib.contextmanager
def run_resources() -> Iterator[contextlib.ExitStack]:
    """The scope of one run in this process: what is registered on the stack (its engines'
    close) is undone when the run ends, succeeded or failed, then the device memory the run
    held is released (release_device_memory). A pooled Ray actor trains arm after arm in one
    process; vLLM refuses to start when the device's free memory is short of its share."""
    error: BaseException | None = None
    try:
        with contextlib.ExitStack() as stack:
            yield stack
    except BaseException as exc:
        error = exc
        raise
    finally:
        release_device_memory(error)
        del error  # the traceback holds this frame: no cycle kept alive past the release


def release_device_memory(error: BaseException | None = None) -> None:
    """Collect what a finished run left behind and hand torch's cached device blocks back to
    the driver: vLLM's free-memory check counts them as used.

    A failed run's traceback keeps every frame below the handler alive, with their locals (the
    model, the optimizer, the engine): `error`'s frames are cleared first, so that a failure
    frees the device as a success does. The traceback's text (files, lines) is unchanged."""
    if error is not None:
        traceback.clear_frames(error.__traceback__)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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

    model, tokenizer = load_policy(cfg.model, device, dtype="float32")
    return _as_trained(cfg, model), tokenizer


def meta_masters(cfg: ExperimentConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """load_masters' model built on the meta device from its config, no weights read: a worker
    of N whose shards rank 0 then sends (distributed.shard_from_rank0)."""
    from dapo_core.models import load_policy_skeleton

    model, tokenizer = load_policy_skeleton(cfg.model, dtype="float32")
    return _as_trained(cfg, model), tokenizer


def _as_trained(cfg: ExperimentConfig, model: PreTrainedModel) -> PreTrainedModel:
    """Float32 masters, gradient checkpointing as configured."""
    from dapo_core.train.policy import as_masters

    as_masters(model)
    if cfg.model.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
        # Non-reentrant: the variant that composes with FSDP2's hooks.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


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
    from dapo_core.data.loaders import format_prompt, response_prefix

    problems = eval_problems(cfg)
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
        results = [
            math_score(response_prefix(cfg.data.prompt_template) + c.text, problems[i].answer)
            for c in completions[j * k : (j + 1) * k]
        ]
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


def eval_problems(cfg: ExperimentConfig) -> list[Any]:
    """The problems an evaluation samples: the first data.eval_problems of data.eval (0: all)."""
    from dapo_core.data.loaders import load_problems

    problems = load_problems(cfg.data.eval, seed=cfg.run.seed)
    if cfg.data.eval_problems:
        problems = problems[: cfg.data.eval_problems]
    if not problems:
        raise ValueError(f"data.eval={cfg.data.eval!r} holds no problems")
    return list(problems)


def evaluate_checkpoint(ckpt: Path, cfg: ExperimentConfig) -> dict[str, Any]:
    """`dapo eval`: evaluate_policy on a checkpoint with cfg's engine (rollout.engine).

    On a GPU the evaluation's memory plan (setup.plan.check_evaluation_fits, the checkpoint's own
    architecture, data.eval_k samples of each problem) runs before anything is loaded: a plan
    that does not fit is refused in one line. The vllm engine starts from the checkpoint's HF
    export as it is (no copy written; a copy in a temporary directory when the checkpoint has
    none), so the transformers model, of which only the tokenizer and the EOS tokens are read,
    stays in host memory. The engine is closed and the device memory released however the
    evaluation ends (run_resources)."""
    import tempfile

    from dapo_core.engines import make_engine
    from dapo_core.setup.architectures import resolve_architecture
    from dapo_core.setup.plan import check_evaluation_fits
    from dapo_core.train.checkpoint import ensure_export, has_export
    from dapo_core.train.run_dir import checkpoint_step

    model_dir = ensure_export(ckpt, cfg.model)  # N workers export their last checkpoint only
    device = setup_torch(cfg)
    if device == "cuda":
        model_cfg = cfg.model
        if (model_dir / "config.json").is_file():
            model_cfg = dataclasses.replace(model_cfg, name_or_path=str(model_dir))
        arch = resolve_architecture(model_cfg)
        check_evaluation_fits(cfg, len(eval_problems(cfg)), arch=arch)
    vllm = cfg.rollout.engine == "vllm"
    model, tokenizer = load_checkpoint_policy(ckpt, cfg, "cpu" if vllm else device)
    with run_resources() as cleanup:
        init_dir, work_dir = None, None
        if vllm and has_export(ckpt):
            init_dir = model_dir
        elif vllm:
            work_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="dapo-eval-")))
        engine = make_engine(
            cfg.rollout.engine, model, tokenizer, cfg, work_dir=work_dir, init_dir=init_dir
        )
        cleanup.callback(engine.close)
        return evaluate_policy(cfg, model, tokenizer, engine, step=checkpoint_step(ckpt))


def load_checkpoint_policy(
    ckpt: Path, cfg: ExperimentConfig, device: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A checkpoint's model and tokenizer on their own (for `dapo eval`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_core.train.checkpoint import ensure_export

    path = ensure_export(ckpt, cfg.model)  # N workers export their last checkpoint only
    dtype = getattr(torch, cfg.model.dtype)  # evaluation runs in the compute dtype
    from dapo_core.cache import quiet_progress

    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
    model.to(torch.device(device))  # type: ignore[arg-type]
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
