"""Run a whole training job in this process: `train`, and `dapo eval`'s `evaluate_checkpoint`.

`train(cfg, sink=..., out_dir=...)` is the one entry point the CLI and the Prefect/Ray flows
call for one worker. It resumes from out_dir/checkpoints/latest when present, so a killed run
started again with the same arguments continues exactly where the last checkpoint left it.
The run's order is dapo_core.train.assembly's, the same as each of N workers'
(dapo_core.train.distributed); `OneWorker` is what is particular to one process. The step loop
is dapo_core.train.loop, the evaluations dapo_core.train.evaluation.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
import logging
import random
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dapo_common.util import flatten
from dapo_core.engines.base import EngineHost
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.assembly import Parts, Run, assemble_and_train
from dapo_core.train.checkpoint import (
    load_checkpoint_config,
    load_model_weights,
    save_checkpoint,
)
from dapo_core.train.collective import LOCAL, Collective
from dapo_core.train.evaluation import eval_problems, evaluate_policy
from dapo_core.train.loop import TrainResult
from dapo_core.train.protocols import MetricsSink
from dapo_core.train.run_dir import claim, latest_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


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
    engine_host: EngineHost | None = None,
) -> TrainResult:
    """Train `cfg.run.steps` rollout steps in this process (resuming from out_dir when a
    checkpoint is there, written by one worker or by many).

    `engine_host` places the rollout engine (dapo_core.engines.base.EngineHost: e.g. on a Ray
    actor of its own); by default it is built here.

    `owner` names the job the directory belongs to (see dapo_core.train.run_dir.claim); a
    directory owned by another job is refused before anything in it is read. Many workers:
    dapo_core.train.distributed.train_worker.

    However it ends, the run's engine is closed and its device memory released
    (`run_resources`), so that the next run in this process starts on a free device.
    """
    with run_resources() as cleanup:
        t_start = time.perf_counter()
        device = setup_torch(cfg)
        return assemble_and_train(
            cfg,
            OneWorker(device, sink, engine_host=engine_host),
            out_dir=Path(out_dir),
            resume=resume,
            owner=owner,
            progress=progress,
            t_start=t_start,
            cleanup=cleanup,
        )


@dataclass
class OneWorker:
    """The assembly's layout for one process: the policy whole on `device` (autocast to the
    compute dtype), one-worker checkpoints, the caller's sink (which the caller closes)."""

    device: str
    metrics: MetricsSink
    dist: Collective = LOCAL
    engine_host: EngineHost | None = None

    def claim(self, run: Run) -> Path | None:
        return open_run_dir(run.cfg, run.out_dir, resume=run.resume, owner=run.owner)

    def build(self, run: Run, ckpt: Path | None) -> Parts:
        from dapo_core.engines import make_engine
        from dapo_core.train.checkpoint import is_sharded, load_sharded_model
        from dapo_core.train.trainer import Trainer

        cfg = run.cfg
        model, tokenizer = load_masters(cfg, self.device)
        if ckpt is not None:
            # Before the engine exists: vllm starts from the model's weights as they are now.
            if is_sharded(ckpt):
                load_sharded_model(model, ckpt)  # N workers' masters, resharded into one process
            else:
                load_model_weights(model, ckpt)
        recipe = functools.partial(
            make_engine,
            cfg.rollout.engine,
            rollout_model(cfg, model, hosted=self.engine_host is not None),
            copy.deepcopy(tokenizer) if cfg.rollout.mode == "async" else tokenizer,
            cfg,
            device="auto" if self.engine_host is not None else None,
        )
        engine = recipe() if self.engine_host is None else self.engine_host(recipe)
        run.cleanup.callback(engine.close)
        trainer = Trainer(cfg, model, tokenizer, engine, run.problems)
        run.cleanup.callback(trainer.close)  # the rollout worker stops before its engine closes
        # Evaluations sample through the trainer's engine: async, the worker's, seeded.
        return Parts(model, tokenizer, trainer.engine, trainer)

    def restore(self, parts: Parts, ckpt: Path, state: dict[str, Any]) -> None:
        from dapo_core.train.checkpoint import is_sharded, load_sharded_optimizer

        sharded = is_sharded(ckpt)
        if sharded:
            load_sharded_optimizer(parts.model, parts.trainer.optimizer, ckpt)
        # A one-worker checkpoint holds the optimizer and this process's random streams.
        parts.trainer.load_state_dict(state, optimizer=not sharded)

    def save(self, run: Run, parts: Parts) -> Path:
        trainer = parts.trainer
        return save_checkpoint(
            run.out_dir,
            trainer.rollout_step,
            model=parts.model,
            tokenizer=parts.tokenizer,
            trainer_state=trainer.state_dict(),
            config=run.cfg.to_dict(),
        )

    def sink(self, run: Run) -> MetricsSink:
        return self.metrics


def rollout_model(
    cfg: ExperimentConfig, model: PreTrainedModel, *, hosted: bool = False
) -> PreTrainedModel:
    """The model the one-worker hf engine samples from: the trainer's own in sync mode (weight
    sync is free), a copy in async mode, where the rollout worker samples while the trainer
    updates (the copy gets the weights by version; vllm holds its own copy either way). A
    hosted engine (an EngineHost) gets the model pickled into its recipe, a copy already, from
    the CPU: a model on a GPU is copied there first (the engine's process, which may have no
    GPU or another one, moves it to its own device: make_engine's `device`)."""
    if hosted:
        from dapo_core.engines.hf import rollout_copy

        first = next(model.parameters())
        on_cpu = first.device.type == "cpu"
        return model if on_cpu else rollout_copy(model, first.dtype, torch.device("cpu"))
    if cfg.rollout.mode != "async" or cfg.rollout.engine != "hf":
        return model
    return copy.deepcopy(model)


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


# --- evaluation ------------------------------------------------------------------------------
def evaluate_checkpoint(ckpt: Path, cfg: ExperimentConfig) -> dict[str, Any]:
    """`dapo eval`: evaluate_policy on a checkpoint with cfg's engine (rollout.engine).

    On a GPU the evaluation's memory plan (setup.plan.check_evaluation_fits, the checkpoint's own
    architecture, data.eval_k samples of each problem) runs before anything is loaded: a plan
    that does not fit is refused in one line. The vllm engine starts from the checkpoint's HF
    export as it is (no copy written; a copy in a temporary directory when the checkpoint has
    none), so the transformers model, of which only the tokenizer and the EOS tokens are read,
    stays in host memory. The engine is closed and the device memory released however the
    evaluation ends (run_resources)."""

    from dapo_core.engines import make_engine
    from dapo_core.setup.architectures import resolve_architecture
    from dapo_core.setup.plan import check_evaluation_fits
    from dapo_core.train.checkpoint import ensure_export
    from dapo_core.train.run_dir import checkpoint_step, has_export

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
        # An HF export is loaded as it is; without one vLLM starts from the model's weights.
        init_dir = model_dir if vllm and has_export(ckpt) else None
        engine = make_engine(cfg.rollout.engine, model, tokenizer, cfg, init_dir=init_dir)
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
