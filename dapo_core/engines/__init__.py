"""Rollout engines behind one protocol (dapo_core.engines.base.RolloutEngine).

HFEngine is imported on first use: the protocol alone (what a launcher needs) does not pull in
transformers.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
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
    seed: int | None = None,
    init_dir: Path | None = None,
    sync_first: bool = True,
    llm_kwargs: Mapping[str, Any] | None = None,
    device: str | None = None,
) -> RolloutEngine:
    """The rollout engine `name` (`hf` or `vllm`) sampling from `model`.

    `hf` samples from `model` itself under autocast to the compute dtype (model.dtype).
    `vllm` starts from a skeleton (config, generation config and tokenizer; no weights) that it
    writes in a temporary directory of its own process (removed when the engine closes: an
    engine hosted on another node needs no directory shared with the trainer's), with vLLM's
    dummy weights, then receives the model's current weights from memory through
    load_weights, as every later sync does: no float32 copy of the model goes through disk
    (at 7B it was ~28 GiB written, then read, per start). `init_dir` names a directory
    already holding a skeleton (the workers of one arm share the one rank 0 wrote:
    `sync_first=False`, each rank pushes its gathered shards itself) or a whole model (an HF export to evaluate: loaded as it is); `seed` overrides run.seed (each
    worker's engine draws from its own stream); `llm_kwargs` go to vLLM's `LLM` as they are.
    `device` (hf): move the model there first, `auto` being this process's GPU when it has one,
    else the CPU: a hosted engine's recipe (EngineHost) carries its model on the CPU.
    """
    import torch

    seed = cfg.run.seed if seed is None else seed
    if name == "hf":
        from dapo_core.engines.hf import HFEngine

        if device is not None:
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            torch.nn.Module.to(model, device)  # in place (transformers' own `to` is typed oddly)

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

        import_vllm()  # fail with the install hint before writing anything
        scratch = None
        if init_dir is not None:
            target = Path(init_dir)
        else:
            scratch = tempfile.mkdtemp(prefix="dapo-vllm-")
            target = Path(scratch)
            write_skeleton(model, tokenizer, target)
        skeleton = not has_weights(target)
        try:
            engine = VLLMEngine(
                str(target),
                eos_token_ids=eos_token_ids(model, tokenizer),
                max_prompt_len=cfg.rollout.max_prompt_len,
                max_response_len=cfg.rollout.max_response_len,
                dtype=cfg.model.dtype,
                gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                seed=seed,
                llm_kwargs={
                    **({"load_format": "dummy"} if skeleton else {}),
                    **(llm_kwargs or {}),
                },
                scratch_dir=scratch,
            )
        except BaseException:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            raise
        if skeleton and sync_first:
            # Before the first sample: vLLM's dummy weights are random numbers.
            engine.load_weights(model.state_dict())
        return engine
    raise ValueError(f"unknown rollout engine {name!r}: use hf or vllm")


# What a model directory holds its weights in (transformers' and vLLM's loaders).
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


def write_skeleton(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path
) -> None:
    """A model directory without weights: what vLLM reads to build its model and tokenizer."""
    target.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(target)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(target)
    tokenizer.save_pretrained(target)


def has_weights(model_dir: Path) -> bool:
    """Whether `model_dir` holds a whole model (an export to load) rather than a skeleton."""
    return any(any(model_dir.glob(p)) for p in WEIGHT_PATTERNS)
