"""Rollout correction: the sampler that generated the tokens (vLLM, or HF generate in another
numeric precision) is not exactly the policy the trainer scores them with. Its log-probs
log π_sampler come with every completion; the old log-probs log π_old are the trainer's.

* `tis` — truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training"; verl's `rollout_correction`): every token's loss is
  weighted by w = min(π_old / π_sampler, cap), a constant (no gradient).
* `mis` — masked importance sampling: tokens whose ratio lies outside [1/cap, cap] leave the
  loss; the rest keep weight 1.
* `sequence_mask` — TRL 1.16's sequence-level masked importance sampling
  (`vllm_importance_sampling_mode="sequence_mask"`, its default): one ratio per sequence,
  ρ_seq = exp(Σ_t (log π_old − log π_sampler)) = Π_t ρ_t over its tokens, weights every token of
  the sequence when C_min ≤ ρ_seq ≤ C_max and zeroes all of them otherwise (C_max = cap,
  C_min = `cap_min`, none by default as in TRL). The zeroed tokens stay in the loss's
  normaliser, as in TRL, which multiplies its per-token loss by the weight.
* `decoupled` — AReaL's decoupled PPO (Fu et al. 2025, "AReaL", arXiv 2505.24298; the
  objective of Hilton et al. 2021, arXiv 2110.00641): the clipped ratio is taken against a
  proximal policy π_prox and every token weighted by the behaviour weight π_prox / π_behav,
  zeroed where it exceeds the cap (`behav_imp_weight_cap`). Here the trainer recomputes the
  old log-probs with the current policy before the update, so π_old is AReaL's π_prox and the
  sampler's log-probs are π_behav: w = ρ where ρ ≤ cap, else 0, with no second forward pass.
  The zeroed tokens stay in the normaliser, as in AReaL. (TRL's `token_mask` with no C_min.)
* `none` — no change to the loss.

The mismatch itself is measured in every mode: mean |log π_old − log π_sampler| and the k3
estimate of KL(π_sampler ‖ π_old) on the sampled tokens (Schulman 2020):
ρ = π_old / π_sampler, k3 = ρ − log ρ − 1 ≥ 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dapo_core.algo.losses import MAX_LOG_RATIO, k3

MODES: tuple[str, ...] = ("none", "tis", "mis", "sequence_mask", "decoupled")


def rollout_correction(
    old_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    *,
    mode: str,
    cap: float,
    cap_min: float | None = None,
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """Token weights, loss mask and mismatch sums for one batch.

    Args:
        old_logprobs, sampler_logprobs: `[B, T]` log π_old and log π_sampler of the tokens.
        mask: `[B, T]` 1 for the tokens in the loss.
        mode: one of MODES; cap > 1 (TIS's cap, MIS's bound, the sequence mask's C_max, the
            decoupled weight's cap).
        cap_min: the sequence mask's lower bound C_min in (0, cap), or None for none (TRL's
            `vllm_importance_sampling_clip_min`); only `sequence_mask` reads it.
    Returns:
        (weights `[B, T]` or None, mask `[B, T]` (MIS removes tokens), sums): mismatch_tokens,
        mismatch_abs (Σ |Δ log p|), mismatch_k3 (Σ k3), is_masked (tokens capped or masked:
        for `sequence_mask`, every token of a masked sequence).
    """
    if mode not in MODES:
        raise ValueError(f"rollout correction {mode!r}: use one of {', '.join(MODES)}")
    if not cap > 1 or not math.isfinite(cap):
        raise ValueError(f"cap={cap}: must be a finite number > 1")
    if cap_min is not None and not 0 < cap_min < cap:
        raise ValueError(f"cap_min={cap_min}: must be in (0, cap={cap}), or None for no bound")
    m = mask.bool()
    log_rho = torch.where(m, old_logprobs - sampler_logprobs, torch.zeros_like(old_logprobs))
    log_rho = log_rho.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    rho = torch.exp(log_rho)  # [B, T] π_old / π_sampler
    kl = k3(log_rho)  # 0 outside the mask, like log_rho
    log_cap = math.log(cap)
    weights: Tensor | None = None
    new_mask = mask
    if mode == "tis":
        weights = torch.where(m, rho.clamp(max=cap), torch.zeros_like(rho))
        touched = m & (log_rho > log_cap)
    elif mode == "mis":
        keep = (log_rho >= -log_cap) & (log_rho <= log_cap)
        touched = m & ~keep
        new_mask = (m & keep).to(mask.dtype)
    elif mode == "sequence_mask":
        weights, touched = sequence_mask_weights(
            old_logprobs, sampler_logprobs, m, cap=cap, cap_min=cap_min
        )
    elif mode == "decoupled":
        keep = log_rho <= log_cap  # ρ ≤ cap: the weight π_prox / π_behav is kept whole
        weights = torch.where(m & keep, rho, torch.zeros_like(rho))
        touched = m & ~keep
    else:
        touched = torch.zeros_like(m)
    sums = {
        "mismatch_tokens": float(m.sum()),
        "mismatch_abs": float(log_rho.abs().sum()),
        "mismatch_k3": float(kl.sum()),
        "is_masked": float(touched.sum()),
    }
    return weights, new_mask, sums


def sequence_mask_weights(
    old_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    *,
    cap: float,
    cap_min: float | None = None,
) -> tuple[Tensor, Tensor]:
    """TRL 1.16's sequence-level masked IS (`vllm_importance_sampling_mode="sequence_mask"`).

    S_b = Σ_t mask · (log π_old − log π_sampler) (a NaN difference counts 0, as in TRL), and every
    token of sequence b gets weight exp(S_b) when log C_min ≤ S_b ≤ log C_max, else 0. Compared
    in log space, so a ratio that overflows float is masked, never inf or NaN.

    Args:
        old_logprobs, sampler_logprobs, mask: `[B, T]`; cap = C_max > 1; cap_min = C_min or None.
    Returns:
        (weights `[B, T]`, 0 off the mask; masked `[B, T]` bool: the tokens of masked sequences).
    """
    m = mask.bool()
    diff = torch.where(m, old_logprobs - sampler_logprobs, torch.zeros_like(old_logprobs))
    seq = torch.nan_to_num(diff, nan=0.0).sum(dim=-1, keepdim=True)  # [B, 1] log ρ_seq
    keep = seq <= math.log(cap)
    if cap_min is not None:
        keep = keep & (seq >= math.log(cap_min))
    rho = torch.exp(torch.where(keep, seq, torch.zeros_like(seq)))  # [B, 1], finite
    weights = torch.where(m & keep, rho.expand_as(diff), torch.zeros_like(diff))
    return weights, m & ~keep
