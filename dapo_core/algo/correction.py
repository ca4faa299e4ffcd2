"""Rollout correction: the sampler that generated the tokens (vLLM, or HF generate in another
numeric precision) is not exactly the policy the trainer scores them with. Its log-probs
log π_sampler come with every completion; the old log-probs log π_old are the trainer's.

* `tis` — truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training"; verl's `rollout_correction`): every token's loss is
  weighted by w = min(π_old / π_sampler, cap), a constant (no gradient).
* `mis` — masked importance sampling: tokens whose ratio lies outside [1/cap, cap] leave the
  loss; the rest keep weight 1.
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

MODES: tuple[str, ...] = ("none", "tis", "mis")


def rollout_correction(
    old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *, mode: str, cap: float
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """Token weights, loss mask and mismatch sums for one batch.

    Args:
        old_logprobs, sampler_logprobs: `[B, T]` log π_old and log π_sampler of the tokens.
        mask: `[B, T]` 1 for the tokens in the loss.
        mode: `none`, `tis` or `mis`; cap > 1.
    Returns:
        (weights `[B, T]` or None, mask `[B, T]` (MIS removes tokens), sums): mismatch_tokens,
        mismatch_abs (Σ |Δ log p|), mismatch_k3 (Σ k3), is_masked (tokens capped or masked).
    """
    if mode not in MODES:
        raise ValueError(f"rollout correction {mode!r}: use one of {', '.join(MODES)}")
    if not cap > 1 or not math.isfinite(cap):
        raise ValueError(f"cap={cap}: must be a finite number > 1")
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
    else:
        touched = torch.zeros_like(m)
    sums = {
        "mismatch_tokens": float(m.sum()),
        "mismatch_abs": float(log_rho.abs().sum()),
        "mismatch_k3": float(kl.sum()),
        "is_masked": float(touched.sum()),
    }
    return weights, new_mask, sums
