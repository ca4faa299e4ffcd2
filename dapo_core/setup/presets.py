"""Presets: base configurations the ladder's arms are built on.

`tiny` is the embedded default (no GPU, no network: a tiny Llama-style model warm-started on a
synthetic integer-answer task, 2 CPU cores); `explore` is the same machinery on a second
embedded task built so that each mechanism of the ladder has something to act on; `lookup` a
third, where the response is one decision (the clip's mechanism checks, docs/mechanisms.md).
The others are real runs with the same code path:
each names the recipe its numbers follow, HARDWARE the GPUs `dapo plan` accepts it on (a test
checks every one), and its comment an estimated cost (the assumptions are in COST).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dapo_core.setup.config import ConfigError, ExperimentConfig

# The small presets' shared recipe (see qwen2.5-0.5b below).
_SMALL: dict[str, Any] = {
    "model.dtype": "bfloat16",
    "model.gradient_checkpointing": True,
    "rollout.engine": "vllm",
    "rollout.group_size": 16,
    "rollout.max_prompt_len": 1024,
    "rollout.max_response_len": 4096,
    "rollout.gpu_memory_utilization": 0.3,
    "algo.overlong_cache_len": 1024,
    "algo.max_gen_batches": 10,
    "batch.train_batch_size": 64,
    "batch.gen_batch_size": 96,
    "batch.mini_batch_size": 16,
    "optim.lr": 1e-6,
    "optim.warmup_updates": 80,
    "data.train": "dapo-math-17k",
    "data.eval": "math500",
    "data.eval_k": 4,
    "data.eval_every": 10,
    "data.prompt_template": "chat",
    "run.steps": 200,
    "run.checkpoint_every": 10,
    "run.device": "cuda",
}

# Dotted overrides on top of the dataclass defaults. The paper's recipe (§4.1): AdamW lr 1e-6,
# warm-up 20 rollout steps, 512 prompts × 16 responses per step, mini-batch 512 responses
# (16 gradient updates per rollout step), L_max 20480 with a 4096-token cache.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "model.name_or_path": "tiny",
        "rollout.engine": "hf",
        "rollout.group_size": 8,
        "rollout.max_response_len": 44,
        "algo.overlong_cache_len": 6,
        "batch.train_batch_size": 16,
        "batch.gen_batch_size": 16,
        "batch.mini_batch_size": 4,
        "batch.micro_batch_size": 64,
        "algo.ppo_epochs": 2,
        "optim.lr": 3e-5,
        "optim.weight_decay": 0.0,
        "optim.warmup_updates": 4,
        "data.train": "synthetic",
        "data.eval": "synthetic-eval",
        "data.eval_k": 4,
        "data.eval_problems": 256,
        "data.eval_every": 10,
        "data.prompt_template": "raw",
        "run.steps": 150,
        "run.device": "cpu",
    },
    # The second embedded task (dapo_core.data.explore): the tiny model warm-started on a task
    # with a fork at the first response token (answer at once, right about 1 time in 7; or
    # write the working, rare after the warm start and right far more often), so that rewarded
    # tokens are rare and each mechanism has work to do. Same sizes and budget as `tiny`:
    # L_max 44 with L_cache 6 puts the penalty and the budget on six-term worked answers, right
    # ones too. lr and steps are calibrated (docs/explore.md).
    "explore": {
        "model.name_or_path": "tiny-explore",
        "model.warm_start_steps": 900,
        "rollout.engine": "hf",
        "rollout.group_size": 8,
        "rollout.max_response_len": 44,
        "algo.overlong_cache_len": 6,
        "batch.train_batch_size": 16,
        "batch.gen_batch_size": 16,
        "batch.mini_batch_size": 4,
        "batch.micro_batch_size": 64,
        "algo.ppo_epochs": 2,
        "optim.lr": 1e-4,
        "optim.weight_decay": 0.0,
        "optim.warmup_updates": 4,
        "data.train": "explore",
        "data.eval": "explore-eval",
        "data.eval_k": 4,
        "data.eval_problems": 256,
        "data.eval_every": 10,
        "data.prompt_template": "raw",
        "run.steps": 150,
        "run.device": "cpu",
    },
    # The third embedded task (dapo_core.data.lookup): a key in, one of 8 symbols out, then EOS,
    # so the decision is half the loss tokens; the tiny model warm-started to answer right about
    # 15% of the time. A rollout step is every key once (32 prompts × 8 responses); μ = 4
    # epochs of 4 mini-batches (16 updates a step) and lr calibrated on how far the ratios move
    # within a step (training-side; docs/mechanisms.md), so that the clip bounds bind: the
    # mechanism checks `clip-dose` and `clip-entropy` (dapo_core/setup/ladders/) run on it.
    # Evaluation after every step (32 keys × 16 samples, 2 tokens each: cheap).
    "lookup": {
        "model.name_or_path": "tiny-lookup",
        "model.warm_start_steps": 1000,
        "rollout.engine": "hf",
        "rollout.group_size": 8,
        "rollout.max_response_len": 4,
        "algo.overlong_cache_len": 1,
        "batch.train_batch_size": 32,
        "batch.gen_batch_size": 32,
        "batch.mini_batch_size": 8,
        "batch.micro_batch_size": 256,
        "algo.ppo_epochs": 4,
        "optim.lr": 6e-4,
        "optim.weight_decay": 0.0,
        "optim.warmup_updates": 0,
        "data.train": "lookup",
        "data.eval": "lookup-eval",
        "data.eval_k": 16,
        "data.eval_problems": 0,
        "data.eval_every": 1,
        "data.prompt_template": "raw-answer",
        "run.steps": 10,
        "run.checkpoint_every": 0,
        "run.device": "cpu",
    },
    # SmolLM2-135M-Instruct, a real pretrained model with its 49,152-token tokenizer and chat
    # template, on the 2-core CPU (`make real-model` converts it once per machine;
    # dapo_core.real_model). Task: easy addition in words with the reply begun as `Answer: `
    # (dapo_core.data.arithmetic), on which it starts with signal; a reply is `42` + EOS, so a
    # budget of 16 tokens leaves room for chatter and L_cache 4 punishes only that. Batches are
    # small because one forward+backward of 135M parameters costs seconds here; lr 5e-6 is a
    # first guess, not calibrated yet.
    "smollm2-135m": {
        "model.name_or_path": "smollm2-135m",
        "rollout.engine": "hf",
        "rollout.group_size": 8,
        "rollout.max_prompt_len": 64,
        "rollout.max_response_len": 16,
        "algo.overlong_cache_len": 4,
        "batch.train_batch_size": 8,
        "batch.gen_batch_size": 8,
        "batch.mini_batch_size": 4,
        "batch.micro_batch_size": 32,
        "algo.ppo_epochs": 1,
        "optim.lr": 5e-6,
        "optim.weight_decay": 0.0,
        "optim.warmup_updates": 2,
        "data.train": "arithmetic",
        "data.eval": "arithmetic-eval",
        "data.eval_k": 4,
        "data.eval_problems": 96,
        "data.eval_every": 10,
        "data.prompt_template": "chat-answer",
        "run.steps": 40,
        "run.device": "cpu",
    },
    # Qwen2.5-0.5B/1.5B-Instruct: verl's DAPO recipe (recipe/dapo/run_dapo_qwen2.5_32b.sh and
    # test_dapo_7b_math.sh: clip 0.2/0.28, G 16, lr 1e-6, weight decay 0.1, grad clip 1.0, token-
    # mean loss, 10 generation batches at most) scaled down so that one arm is one 80 GB GPU and
    # the six-arm ladder one 8-GPU node: 64 prompts × 16 responses per step, mini-batch 16 prompts
    # (4 updates per step), L_max 4096 with L_cache 1024 (the paper's 20480/4096, shortened),
    # prompts up to 1024 tokens; the paper's warm-up of 20 rollout steps (× 4 updates).
    # `dapo plan` on one 80 GB GPU (79 GiB): 0.5B peaks at 55 GiB, 1.5B at 71 GiB, vLLM's share
    # (0.3) included. Cost, an ESTIMATE (assumptions in COST): about 8 GPU-hours per arm for 0.5B
    # and 12 for 1.5B, so the six-arm ladder takes one 8-GPU node about half a day.
    "qwen2.5-0.5b": {
        **_SMALL,
        "model.name_or_path": "Qwen/Qwen2.5-0.5B-Instruct",
        "batch.micro_batch_size": 16,
    },
    "qwen2.5-1.5b": {
        **_SMALL,
        "model.name_or_path": "Qwen/Qwen2.5-1.5B-Instruct",
        "batch.micro_batch_size": 8,
    },
    # Qwen2.5-7B-Instruct: verl's test_dapo_7b_math.sh budget (prompts 2048, L_max 8192 with
    # L_cache 4096, G 16, mini-batch 32 prompts, lr 1e-6, 200 steps) with 128 prompts per step
    # instead of 512 (4 updates per step, a quarter of the cost). One sequence per micro-batch
    # (half verl's per-GPU token budget of 2 × 10240), gradient checkpointing, vLLM with half the
    # GPU.
    # `dapo plan` asks for at least 6 workers of 80 GB; 8 (one node per arm) peak at 73 of 79 GiB.
    # Cost, an ESTIMATE (assumptions in COST): about 180 GPU-hours per arm (a day on 8 GPUs).
    "qwen2.5-7b": {
        "model.name_or_path": "Qwen/Qwen2.5-7B-Instruct",
        "model.dtype": "bfloat16",
        "model.gradient_checkpointing": True,
        "rollout.engine": "vllm",
        "rollout.group_size": 16,
        "rollout.max_prompt_len": 2048,
        "rollout.max_response_len": 8192,
        "rollout.gpu_memory_utilization": 0.5,
        "algo.overlong_cache_len": 4096,
        "algo.max_gen_batches": 10,
        "batch.train_batch_size": 128,
        "batch.gen_batch_size": 192,
        "batch.mini_batch_size": 32,
        "batch.micro_batch_size": 1,
        "optim.lr": 1e-6,
        "optim.warmup_updates": 80,
        "data.train": "dapo-math-17k",
        "data.eval": "aime2024",
        "data.eval_k": 32,
        "data.eval_every": 10,
        "data.prompt_template": "chat",
        "run.steps": 200,
        "run.checkpoint_every": 10,
        "run.device": "cuda",
    },
    # The paper (§4.1) on Qwen2.5-32B base: 512 prompts × 16 responses per step, mini-batch 512
    # responses (32 prompts: 16 updates per step), AdamW lr 1e-6 with warm-up over 20 rollout steps
    # (320 updates), L_max 20480 with L_cache 4096, prompts up to 2048 tokens (verl's
    # run_dapo_qwen2.5_32b.sh), generation batches of 1536 prompts (3×, verl's gen_prompt_bsz), AIME
    # 2024 avg@32. One sequence of up to 22528 tokens per micro-batch, gradient checkpointing.
    # `dapo plan`: no number of 80 GB GPUs fits, because each worker's colocated vLLM engine holds
    # all 61 GiB of bf16 weights (no tensor parallelism) plus at least one full sequence of KV
    # cache; on 141 GB H200s with 0.6 of the GPU for vLLM it asks for at least 45 workers, and 48
    # (6 nodes) peak at 138.3 of 139 GiB. (The paper used 128 H20s; verl's script 16 nodes of 8
    # with tensor-parallel rollout, sequence parallelism and offload.)
    # Cost, an ESTIMATE (assumptions in COST): about 91,000 GPU-hours per arm at a mean response of
    # half the budget, 17,000 at 4,000 tokens. Generation-bound: each engine's KV cache holds about
    # 16 sequences of 10k tokens, so an H200 decodes about 400-1,000 tokens/s.
    "paper": {
        "model.name_or_path": "Qwen/Qwen2.5-32B",
        "model.dtype": "bfloat16",
        "model.gradient_checkpointing": True,
        "rollout.engine": "vllm",
        "rollout.group_size": 16,
        "rollout.max_prompt_len": 2048,
        "rollout.max_response_len": 20480,
        "rollout.gpu_memory_utilization": 0.6,
        "algo.overlong_cache_len": 4096,
        "algo.max_gen_batches": 10,
        "batch.train_batch_size": 512,
        "batch.gen_batch_size": 1536,
        "batch.mini_batch_size": 32,
        "batch.micro_batch_size": 1,
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


@dataclass(frozen=True)
class Hardware:
    """The GPUs a preset's numbers were planned for: `dapo plan --preset P` uses them by default
    and a test checks that every preset fits them."""

    workers: int
    """GPUs (FSDP2 workers) per arm."""
    gpu: str
    gpu_memory_gib: float
    """What torch.cuda reports for that GPU, rounded down (dapo_core.setup.plan.GPU_SIZES)."""


HARDWARE: dict[str, Hardware] = {
    "qwen2.5-0.5b": Hardware(1, "80 GB A100/H100", 79.0),
    "qwen2.5-1.5b": Hardware(1, "80 GB A100/H100", 79.0),
    "qwen2.5-7b": Hardware(8, "80 GB A100/H100", 79.0),
    "paper": Hardware(48, "141 GB H200", 139.0),
}

COST = """GPU-hours per arm are ESTIMATES, not measurements: per rollout step, one generation batch of
gen_batch_size × G responses of half the budget on average after prompts of about 200 tokens;
vLLM decoding bound by memory bandwidth at 50% of the GPU's (3.35 TB/s H100, 4.8 TB/s H200),
each step reading the bf16 weights once and the KV cache of as many sequences as the plan's KV
share holds (256 at most), and at least 10 ms a step (scheduling, launches); training at 40% of
989 bf16 TFLOP/s with 10·P FLOPs per token (forward, backward, recomputation, and the old
log-probs' forward). Evaluation is not counted."""


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
