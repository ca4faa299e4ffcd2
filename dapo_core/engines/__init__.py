"""Rollout engines behind one protocol (dapo_core.engines.base.RolloutEngine).

HFEngine is imported on first use: the protocol alone (what a launcher needs) does not pull in
transformers.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_core.engines.base import Completion, RolloutEngine, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from dapo_core.engines.hf import HFEngine
    from dapo_core.setup.config import ExperimentConfig


def __getattr__(name: str) -> Any:
    if name == "HFEngine":
        from dapo_core.engines.hf import HFEngine

        return HFEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Completion", "HFEngine", "RolloutEngine", "SamplingParams", "make_engine"]


def make_engine(
    name: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: ExperimentConfig,
    *,
    work_dir: Path | None = None,
    seed: int | None = None,
    init_dir: Path | None = None,
) -> RolloutEngine:
    """The rollout engine `name` (`hf` or `vllm`) sampling from `model`.

    `hf` samples from `model` itself under autocast to the compute dtype (model.dtype).
    `vllm` starts from the model's current weights, saved once under `work_dir` (a temporary
    directory by default) for vLLM's loader: the embedded tiny model exists only in memory, and a
    resumed run's weights are not the hub checkpoint's. Later weights arrive in place through
    load_weights, never through disk. `init_dir` names a directory already holding them (the
    workers of one arm share the one rank 0 wrote); `seed` overrides run.seed (each worker's
    engine draws from its own stream).
    """
    import torch

    seed = cfg.run.seed if seed is None else seed
    if name == "hf":
        from dapo_core.engines.hf import HFEngine

        return HFEngine(
            model,
            tokenizer,
            max_prompt_len=cfg.rollout.max_prompt_len,
            seed=seed,
            compute_dtype=getattr(torch, cfg.model.dtype),
        )
    if name == "vllm":
        from dapo_core.engines.hf import eos_token_ids
        from dapo_core.engines.vllm_engine import VLLMEngine, import_vllm

        import_vllm()  # fail with the install hint before saving anything
        if init_dir is not None:
            target = Path(init_dir)
        else:
            target = Path(work_dir or tempfile.mkdtemp(prefix="dapo-vllm-")) / "vllm-init"
            model.save_pretrained(target)
            tokenizer.save_pretrained(target)
        return VLLMEngine(
            str(target),
            eos_token_ids=eos_token_ids(model, tokenizer),
            max_prompt_len=cfg.rollout.max_prompt_len,
            max_response_len=cfg.rollout.max_response_len,
            dtype=cfg.model.dtype,
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
            seed=seed,
        )
    raise ValueError(f"unknown rollout engine {name!r}: use hf or vllm")
