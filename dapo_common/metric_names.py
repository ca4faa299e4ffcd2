"""Metric names: the one vocabulary shared by the trainer, the store, the dashboard and the tests.

Names are slash-namespaced like CleanRL's (`group/what`). It lives in dapo_common, below every
layer, so that the store (db: its mechanism table, its curves) and the dashboard read the same
constants without importing dapo_core or torch.
"""

from __future__ import annotations

# --- rewards and accuracy (over every generated response of the step, before filtering) ---
REWARD_MEAN = "reward/mean"  # shaped reward: correctness score + overlong penalty
SCORE_MEAN = "reward/score_mean"  # correctness part only (+1 / -1)
OVERLONG_PENALTY_MEAN = "reward/overlong_penalty_mean"
ACC_MEAN = "acc/mean"

# --- policy ---
ENTROPY_MEAN = "entropy/mean"
# Mean entropy at the response positions where the task takes its decision (the explore task's
# fork: dapo_core.data.loaders.decision_positions), under the policy that sampled the batch;
# logged only for a task that names such positions.
ENTROPY_DECISION = "entropy/decision"
POLICY_LOSS = "losses/policy_loss"
KL_LOSS = "losses/kl_loss"
APPROX_KL = "losses/approx_kl"  # k1 estimate of KL(old || new), Schulman's k1
CLIP_RATIO_HIGH = "clip_ratio/high"  # tokens clipped at 1 + eps_high (A > 0)
CLIP_RATIO_LOW = "clip_ratio/low"  # tokens clipped at 1 - eps_low (A < 0)
CLIP_RATIO_DUAL = "clip_ratio/dual"  # tokens bounded by the dual clip c (A < 0)
# Tokens that could reach the upper bound at all: A > 0 and old probability < 1 / (1 + eps_high)
# (a ratio is at most 1 / p_old); the room Clip-Higher has (dapo_core.algo.losses.clip_eligible).
CLIP_RATIO_HIGH_ELIGIBLE = "clip_ratio/high_eligible"
# Of those eligible tokens, the share whose own (unclipped) token ratio passed 1 + eps_high over
# the update, whatever the loss mode does with it: the natural upper tail the clip would cut.
CLIP_RATIO_HIGH_NATURAL = "clip_ratio/high_natural"
# At the task's decision positions only (see ENTROPY_DECISION): the share of their loss tokens
# with A > 0 whose unclipped ratio passed 1 + eps_high over the update, i.e. where the vanilla
# clip cuts the gradient; the mean over every token dilutes it with the near-certain rest.
CLIP_RATIO_HIGH_DECISION = "clip_ratio/high_decision"
RATIO_MAX = "ratio/max"  # the largest token ratio pi_theta / pi_old over the update's loss tokens
# Loss tokens a covariance loss chose (clip_cov: gradient detached; kl_cov: KL-penalised).
COV_SELECTED = "loss/cov_selected_share"
# Loss tokens whose sequence the off-policy mask dropped (negative advantage, high KL to the
# sampler: DeepSeek-V3.2's mask); 0 when the mask is off.
OFF_POLICY_MASKED = "loss/off_policy_masked_share"
# Loss tokens the top-entropy filter kept (the 80/20 rule); 1 when the filter is off.
ENTROPY_KEPT = "loss/entropy_kept_share"
# Share of the loss weight carried by the longer half of the batch's responses: 0.5 under the
# sample-level loss (each response weighs the same), above under the token-level loss (Eq. 12).
LOSS_LONG_SHARE = "loss/long_share"
# Share of the loss weight carried by truncated responses: 0 under the overlong filter (§3.4),
# which takes them out of the loss; without it, what the filter would take out.
LOSS_TRUNCATED_SHARE = "loss/truncated_share"
GRAD_NORM = "optim/grad_norm"
LR = "optim/lr"
NONFINITE_UPDATES = "optim/nonfinite_skipped"  # updates skipped: NaN / inf loss or gradient

# --- sampler vs trainer (rollout correction) ---
MISMATCH_ABS_LOGP = "mismatch/abs_logp"  # mean |log π_old − log π_sampler| over response tokens
MISMATCH_KL = "mismatch/kl"  # k3 estimate of KL(π_sampler ‖ π_old)
IS_MASKED_FRAC = "mismatch/is_masked"  # tokens capped (TIS) or masked (MIS) by the correction

# --- responses ---
RESPONSE_LENGTH_MEAN = "response_length/mean"
RESPONSE_LENGTH_MAX = "response_length/max"
RESPONSE_CLIP_RATIO = "response_length/clip_ratio"  # fraction truncated at the length limit

# --- dynamic sampling ---
KEPT_GROUPS = "sampling/kept_groups"  # fraction of generated groups that were informative
# fraction of the training batch's groups that are informative (0 < #correct < G): 1 under
# dynamic sampling when the batch fills, the generated fraction without it
TRAIN_INFORMATIVE = "sampling/train_informative"
GEN_BATCHES = "sampling/gen_batches"  # generation batches this step
CARRIED_GROUPS = "sampling/carried_groups"  # informative groups carried over to the next step
TRAIN_GROUPS = "sampling/train_groups"  # groups in this step's training batch

# --- progress counters (cumulative; the paper's x-axis is gradient updates) ---
ROLLOUT_STEP = "progress/rollout_step"
GRAD_UPDATES = "progress/grad_updates"
GEN_BATCHES_TOTAL = "progress/gen_batches"
TOKENS_TOTAL = "progress/tokens"  # generated response tokens, cumulative

# --- performance ---
TOKENS_PER_S = "perf/tokens_per_s"  # generated tokens / rollout seconds (rollout throughput)
UPDATE_TOKENS_PER_S = "perf/update_tokens_per_s"
# Peak CUDA memory per phase of a step, GiB (torch.cuda.max_memory_allocated, reset at each
# phase's start; GPU runs only): next to `dapo plan`'s items for that phase.
PEAK_MEM_PREFIX = "perf/peak_mem_gib/"
MEMORY_PHASES = ("load", "rollout", "logprob", "update", "sync", "checkpoint")
PEAK_MEM_LOAD = PEAK_MEM_PREFIX + "load"  # the fp32 masters loaded (the runner's phase)
PEAK_MEM_ROLLOUT = PEAK_MEM_PREFIX + "rollout"  # generation: resident + the engine's KV cache
PEAK_MEM_LOGPROB = PEAK_MEM_PREFIX + "logprob"  # the old log-prob pass (no grad)
PEAK_MEM_UPDATE = PEAK_MEM_PREFIX + "update"  # μ epochs: activations, head, gradients, step
PEAK_MEM_SYNC = PEAK_MEM_PREFIX + "sync"  # weights pushed to the engine
PEAK_MEM_CHECKPOINT = PEAK_MEM_PREFIX + "checkpoint"  # a checkpoint written (the runner's)


def peak_mem(phase: str) -> str:
    """The metric of one of MEMORY_PHASES: `rollout` → `perf/peak_mem_gib/rollout`."""
    if phase not in MEMORY_PHASES:
        raise ValueError(f"unknown memory phase {phase!r}: one of {', '.join(MEMORY_PHASES)}")
    return PEAK_MEM_PREFIX + phase


# --- staleness of the trained samples (both rollout modes; docs/async.md) ---
# A sample's lag: the rollout step that trains it minus the one whose starting weights sampled
# it (its policy version). Sync: 0, or 1 for dynamic sampling's carried groups; async: at most
# rollout.max_staleness when taken from the stream, one more if then carried.
STALENESS_MEAN = "staleness/mean"  # over the trained samples (responses)
STALENESS_MAX = "staleness/max"
STALENESS_LAG_PREFIX = "staleness/lag_"  # trained samples at each lag: staleness/lag_0, ...
STALE_DROPPED = "staleness/dropped_samples"  # samples taken but too stale to train, this step


def staleness_lag(lag: int) -> str:
    """The count of trained samples at one lag: 1 → `staleness/lag_1`."""
    if lag < 0:
        raise ValueError(f"lag {lag}: a sample cannot come from a later policy than its trainer")
    return f"{STALENESS_LAG_PREFIX}{lag}"


# Response tokens of the training batch per second the trainer was busy (the step's wall time
# less its wait for rollouts): the trainer side's rate, beside perf/tokens_per_s (the rollout
# side's: generated tokens per second of generation).
TRAIN_TOKENS_PER_S = "perf/train_tokens_per_s"

ROLLOUT_S = "time/rollout_s"
REWARD_S = "time/reward_s"
# rollout.mode=async only: seconds the rollout worker waited (for weights, or for the trainer
# to take what it made) since the previous step, and seconds the trainer waited for rollouts.
ROLLOUT_IDLE_S = "time/rollout_idle_s"
TRAINER_IDLE_S = "time/trainer_idle_s"
OLD_LOGPROB_S = "time/old_logprob_s"
UPDATE_S = "time/update_s"
STEP_S = "time/step_s"
TIME_PREFIX = "time/"


def per_rank(name: str, rank: int) -> str:
    """A worker's own timing on N workers: `time/update_s` of rank 1 → `time/rank1/update_s`."""
    return f"{TIME_PREFIX}rank{rank}/{name.removeprefix(TIME_PREFIX)}"


# --- evaluation (also kept in the store's evaluations table) ---
EVAL_AVG_AT_K = "eval/avg_at_k"
EVAL_PASS_AT_K = "eval/pass_at_k"
EVAL_CONS_AT_K = "eval/cons_at_k"

# The metrics a researcher looks at first; the dashboard offers these by default.
HEADLINE = (
    ACC_MEAN,
    REWARD_MEAN,
    ENTROPY_MEAN,
    RESPONSE_LENGTH_MEAN,
    RESPONSE_CLIP_RATIO,
    CLIP_RATIO_HIGH,
    CLIP_RATIO_LOW,
    KEPT_GROUPS,
    APPROX_KL,
    GRAD_NORM,
)

# x-axes a curve can be drawn against (all logged every step).
X_AXES = {"rollout step": ROLLOUT_STEP, "gradient updates": GRAD_UPDATES, "tokens": TOKENS_TOTAL}
