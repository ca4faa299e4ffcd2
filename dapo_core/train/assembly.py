"""One run put together, the same way on one worker and on each of N workers.

`assemble_and_train` is the order of a run; a `Layout` is what differs between one process
(runner.OneWorker) and one rank of N (distributed.Ranks):

    training data      read first: a malformed file fails in a second, not after the model
    run directory      claimed, the checkpoint to resume from chosen        layout.claim
    the policy         model, tokenizer, rollout engine, trainer; the
                       checkpoint's weights loaded                          layout.build
    trainer state      counters, data stream; optimizer and random streams  layout.restore
    config.json        written by rank 0
    metrics sink       rank 0's; a no-op one on the other ranks             layout.sink
    the loop           steps, evaluations, checkpoints, the last export     loop.run_steps,
                                                                            layout.save

The engine (and, on N workers, the sink) is closed by the caller's ExitStack however the run
ends (runner.run_resources).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dapo_core.engines.base import RolloutEngine
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.checkpoint import load_trainer_state
from dapo_core.train.collective import Collective
from dapo_core.train.evaluation import evaluate_policy
from dapo_core.train.loop import Job, TrainResult, run_steps
from dapo_core.train.protocols import MetricsSink
from dapo_core.train.run_dir import CONFIG_FILE

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from dapo_core.data.loaders import Problem
    from dapo_core.train.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class Parts:
    """What layout.build makes: the pieces the loop, the evaluations and checkpoints use."""

    model: PreTrainedModel
    """The causal LM with the float32 masters (on N workers: sharded in place by FSDP2)."""
    tokenizer: PreTrainedTokenizerBase
    engine: RolloutEngine
    """This process's rollout engine (on N workers: one per rank)."""
    trainer: Trainer


@dataclass(frozen=True)
class Run:
    """What the layout reads of the run being assembled."""

    cfg: ExperimentConfig
    out_dir: Path
    resume: bool
    """False: start over whatever checkpoint out_dir holds."""
    owner: Mapping[str, Any] | None
    """The job out_dir belongs to (run_dir.claim); None: `dapo train`'s default."""
    problems: Sequence[Problem]
    """The training data."""
    cleanup: contextlib.ExitStack
    """The run's scope: what is put on it (the engine's close) is undone when the run ends."""


class Layout(Protocol):
    """Where one worker and one rank of N differ; every method is called on every rank."""

    dist: Collective
    """The ranks of this run (collective.LOCAL on one worker)."""

    def claim(self, run: Run) -> Path | None:
        """Claim run.out_dir (runner.open_run_dir); the checkpoint to resume from, or None."""
        ...

    def build(self, run: Run, ckpt: Path | None) -> Parts:
        """The policy (with `ckpt`'s weights), its engine (closed by run.cleanup), the trainer."""
        ...

    def restore(self, parts: Parts, ckpt: Path, state: dict[str, Any]) -> None:
        """Resume the trainer from `ckpt` and its trainer state `state`."""
        ...

    def save(self, run: Run, parts: Parts) -> Path:
        """A checkpoint of the current step (a collective on N workers)."""
        ...

    def sink(self, run: Run) -> MetricsSink:
        """Where this rank's metrics go (closed by run.cleanup when this rank owns it)."""
        ...


def assemble_and_train(
    cfg: ExperimentConfig,
    layout: Layout,
    *,
    out_dir: Path,
    resume: bool,
    owner: Mapping[str, Any] | None,
    progress: Callable[[dict[str, Any]], None] | None,
    t_start: float,
    cleanup: contextlib.ExitStack,
) -> TrainResult:
    """Train `cfg.run.steps` rollout steps in this process, laid out by `layout`; `cfg`'s
    threads and seeds are set already (runner.setup_torch)."""
    from dapo_core.data.loaders import load_problems

    dist = layout.dist
    # Data first: a malformed file fails in a second, not after the model is built.
    problems = load_problems(cfg.data.train, seed=cfg.run.seed)
    run = Run(cfg, out_dir, resume, owner, problems, cleanup)
    ckpt = layout.claim(run)
    parts = layout.build(run, ckpt)
    trainer = parts.trainer
    if ckpt is not None:
        layout.restore(parts, ckpt, load_trainer_state(ckpt))
        if dist.rank == 0:
            workers = f" on {dist.world_size} workers" if dist.world_size > 1 else ""
            log.info("resumed %s at rollout step %d%s", out_dir, trainer.rollout_step, workers)
    if dist.rank == 0:
        (out_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))

    job = Job(
        cfg=cfg,
        trainer=trainer,
        sink=layout.sink(run),
        evaluate=lambda step: evaluate_policy(
            cfg, parts.model, parts.tokenizer, parts.engine, step=step, dist=dist
        ),
        checkpoint=lambda: layout.save(run, parts),
        dist=dist,
    )
    return run_steps(job, ckpt=ckpt, progress=progress if dist.rank == 0 else None, t_start=t_start)
