"""Rollout engines behind one protocol (dapo_core.engines.base.RolloutEngine)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from dapo_core.engines.base import Completion, RolloutEngine, SamplingParams
from dapo_core.engines.hf import HFEngine

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from dapo_core.config import ExperimentConfig

__all__ = ["Completion", "HFEngine", "RolloutEngine", "SamplingParams", "make_engine"]


def make_engine(
    name: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: ExperimentConfig,
    *,
    work_dir: Path | None = None,
) -> RolloutEngine:
    """The rollout engine `name` (`hf` or `vllm`) sampling from `model`.

    `vllm` starts from the model's current weights, saved once under `work_dir` (a temporary
    directory by default) for vLLM's loader: the embedded tiny model exists only in memory, and a
    resumed run's weights are not the hub checkpoint's. Later weights arrive in place through
    load_weights, never through disk.
    """
    if name == "hf":
        return HFEngine(
            model, tokenizer, max_prompt_len=cfg.rollout.max_prompt_len, seed=cfg.run.seed
        )
    if name == "vllm":
        from dapo_core.engines.hf import eos_token_ids
        from dapo_core.engines.vllm_engine import VLLMEngine, import_vllm

        import_vllm()  # fail with the install hint before saving anything
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
            seed=cfg.run.seed,
        )
    raise ValueError(f"unknown rollout engine {name!r}: use hf or vllm")
