"""Token filters: which loss tokens keep their gradient, decided before the loss (TRL 1.16's
GRPOConfig `top_entropy_quantile` and `off_policy_mask_threshold`).

Both return a keep-mask the trainer multiplies into the per-token loss as a 0/1 weight, as TRL
does (`per_token_loss * mask`): a dropped token contributes no loss and no gradient, and it still
counts in the aggregation's normaliser. Pure torch functions; shapes in each docstring.
"""

from __future__ import annotations

import torch
from torch import Tensor

# torch.quantile refuses inputs above 2**24 elements; past that the same linear interpolation
# is computed from a sort.
_QUANTILE_MAX = 2**24


def _quantile(values: Tensor, q: float) -> Tensor:
    """The q-quantile of a 1-D tensor with linear interpolation (torch.quantile's default)."""
    if values.numel() <= _QUANTILE_MAX:
        return torch.quantile(values, q)
    ordered = values.sort().values
    pos = q * (ordered.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, ordered.numel() - 1)
    return torch.lerp(ordered[lo], ordered[hi], pos - lo)


def high_entropy_mask(entropy: Tensor, mask: Tensor, *, top_quantile: float) -> Tensor:
    """The 80/20 rule's filter (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority
    Tokens Drive Effective RL for LLM Reasoning", arXiv 2506.01939, §4 Eq. 5): keep only the
    tokens whose entropy is in the top `top_quantile` (ρ) of the batch's loss tokens, the
    "forking" tokens where the policy chooses; the paper keeps ρ = 0.2.

        τ = the (1 − ρ)-quantile of {H_{i,t} : mask_{i,t}} (linear interpolation)
        keep_{i,t} = mask_{i,t} and H_{i,t} ≥ τ

    As TRL 1.16's `get_high_entropy_mask(entropies, mask, 1 − top_entropy_quantile)`: ρ = 1 keeps
    every token, ρ = 0 only those at the highest entropy; no loss token keeps nothing. The
    quantile is over every token passed in: pass the whole mini-batch (all ranks) for a filter
    that does not depend on how it is split. `entropy` and `mask` `[B, T]` → keep `[B, T]` bool.
    """
    if not 0.0 <= top_quantile <= 1.0:
        raise ValueError(f"top_quantile={top_quantile}: use a share in [0, 1]")
    if entropy.shape != mask.shape:
        raise ValueError(
            f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must both be [B, T]"
        )
    m = mask.bool()
    values = entropy.detach()[m].float()
    if values.numel() == 0:
        return torch.zeros_like(m)
    threshold = _quantile(values, 1.0 - top_quantile)
    return m & (entropy.detach().float() >= threshold)


def off_policy_sequence_mask(
    advantages: Tensor,
    logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    *,
    threshold: float,
) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (DeepSeek-AI 2025, "DeepSeek-V3.2", arXiv
    2512.02556, §3.1 Eq. 9): drop a sequence with a negative advantage whose tokens the current
    policy has moved far from the policy that sampled them,

        D_i = 1/|o_i| Σ_t (log π_sampler(o_{i,t}) − log π_θ(o_{i,t}))     (k1 of KL(π_sampler ‖ π_θ))
        keep_i = A_i ≥ 0 or D_i ≤ δ

    As TRL 1.16's `get_off_policy_mask` (`off_policy_mask_threshold` = δ): NaN log-prob
    differences count as 0, |o_i| counts the tokens of `mask` (at least 1). `advantages` `[B]`,
    the log-probs and `mask` `[B, T]` (`logprobs` is read without gradient) → keep `[B]` bool.
    """
    if logprobs.shape != sampler_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, sampler_logprobs "
            f"{tuple(sampler_logprobs.shape)} and mask {tuple(mask.shape)} must all be [B, T]"
        )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [B]")
    m = mask.bool()
    with torch.no_grad():
        kl = torch.nan_to_num(sampler_logprobs.detach() - logprobs.detach(), nan=0.0)
        kl = torch.where(m, kl, torch.zeros_like(kl))
        mean_kl = kl.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)
        return (advantages >= 0) | (mean_kl <= threshold)
