"""Presets: base configurations the ladder's arms are built on.

`tiny` is the embedded default (no GPU, no network: a tiny Llama-style model warm-started on a
synthetic integer-answer task, 2 CPU cores). The others are real runs with the same code path.
"""

from __future__ import annotations

from typing import Any

from dapo_core.config import ConfigError, ExperimentConfig

# Dotted overrides on top of the dataclass defaults. The paper's recipe (§4.1): AdamW lr 1e-6,
# warm-up 20 rollout steps, 512 prompts × 16 responses per step, mini-batch 512 responses
# (16 gradient updates per rollout step), L_max 20480 with a 4096-token cache.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "model.name_or_path": "tiny",
        "rollout.engine": "hf",
        "rollout.group_size": 8,
        "rollout.max_response_len": 40,
        "algo.overlong_cache_len": 12,
        "batch.train_batch_size": 16,
        "batch.gen_batch_size": 16,
        "batch.mini_batch_size": 4,
        "batch.micro_batch_size": 64,
        "optim.lr": 2e-4,
        "optim.weight_decay": 0.0,
        "optim.warmup_updates": 4,
        "data.train": "synthetic",
        "data.eval": "synthetic-eval",
        "data.eval_k": 4,
        "data.eval_problems": 256,
        "data.eval_every": 10,
        "data.prompt_template": "raw",
        "run.steps": 60,
        "run.device": "cpu",
    },
    "qwen2.5-7b": {
        "model.name_or_path": "Qwen/Qwen2.5-7B-Instruct",
        "model.dtype": "bfloat16",
        "model.gradient_checkpointing": True,
        "rollout.engine": "vllm",
        "rollout.group_size": 16,
        "rollout.max_prompt_len": 1024,
        "rollout.max_response_len": 8192,
        "algo.overlong_cache_len": 2048,
        "algo.max_gen_batches": 10,
        "batch.train_batch_size": 64,
        "batch.gen_batch_size": 96,
        "batch.mini_batch_size": 16,
        "batch.micro_batch_size": 8,
        "optim.lr": 1e-6,
        "optim.warmup_updates": 40,
        "data.train": "dapo-math-17k",
        "data.eval": "aime2024",
        "data.eval_k": 32,
        "data.eval_every": 10,
        "data.prompt_template": "chat",
        "run.steps": 200,
        "run.checkpoint_every": 10,
        "run.device": "cuda",
    },
    "paper": {
        "model.name_or_path": "Qwen/Qwen2.5-32B",
        "model.dtype": "bfloat16",
        "model.gradient_checkpointing": True,
        "rollout.engine": "vllm",
        "rollout.group_size": 16,
        "rollout.max_prompt_len": 2048,
        "rollout.max_response_len": 20480,
        "algo.overlong_cache_len": 4096,
        "algo.max_gen_batches": 10,
        "batch.train_batch_size": 512,
        "batch.gen_batch_size": 1536,
        "batch.mini_batch_size": 32,
        "batch.micro_batch_size": 4,
        "optim.lr": 1e-6,
        "optim.warmup_updates": 320,
        "data.train": "dapo-math-17k",
        "data.eval": "aime2024",
        "data.eval_k": 32,
        "data.eval_every": 5,
        "data.prompt_template": "dapo",
        "run.steps": 500,
        "run.checkpoint_every": 10,
        "run.device": "cuda",
    },
}


def preset_config(preset: str, arm: str = "grpo") -> ExperimentConfig:
    """The preset's base configuration (before any arm's changes)."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
    overrides = dict(PRESETS[preset])
    overrides["preset"] = preset
    overrides["arm"] = arm
    return _with(ExperimentConfig(), overrides)


def _with(cfg: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    # Cross-field checks (e.g. cache < budget) run on the final values only, so build the dict
    # in one go instead of override by override.
    return cfg.with_overrides(overrides)
