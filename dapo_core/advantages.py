"""Group-relative advantages: GRPO's outcome advantage, shared by every token of a response.

DAPO paper (arXiv 2503.14476) Eq. 9, GRPO's advantage in DAPO's notation:

    Â_{i,t} = (R_i − mean({R_j}_{j=1..G})) / std({R_j}_{j=1..G})

One scalar per response i, broadcast over its tokens t by the loss. Dr.GRPO (Liu et al. 2025,
"Understanding R1-Zero-Like Training") drops the division by std, which otherwise up-weights
groups whose rewards barely differ; `scale_by_std=False` gives that variant.
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_advantages(
    rewards: Tensor, group_size: int, eps: float = 1e-6, scale_by_std: bool = True
) -> Tensor:
    """Normalise each response's reward within its group (DAPO Eq. 9).

    Args:
        rewards: `[P*G]` one scalar reward per response, ordered group by group (the G responses
            of prompt 0, then the G of prompt 1, ...).
        group_size: G, responses per prompt.
        eps: added to the std so that a near-constant group does not blow up.
        scale_by_std: False skips the division (Dr.GRPO); the result is then r − mean.

    Returns:
        `[P*G]` advantages (floating dtype of `rewards`, float32 for integer input).

    Choices, each so that no NaN and no rounding noise leaves this function:
      * std is unbiased (Bessel, divides by G − 1), as `torch.std` and verl compute it;
      * a group of one (G = 1) has no spread to compare against: its advantage is 0;
      * a constant group (all rewards equal) gets exactly 0, not ±1e-11 of float noise, so it
        contributes exactly nothing to the gradient whatever the aggregation.
    """
    if group_size < 1:
        raise ValueError(f"group_size={group_size}: need at least one response per group")
    if rewards.dim() != 1:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)}: pass a flat [P*G] tensor, group by group"
        )
    n = rewards.numel()
    if n % group_size != 0:
        raise ValueError(
            f"{n} rewards do not split into groups of {group_size}: "
            "pass G responses for every prompt, ordered group by group"
        )
    r = rewards if rewards.is_floating_point() else rewards.float()
    if group_size == 1:
        return torch.zeros_like(r)

    grouped = r.view(-1, group_size)  # [P, G]
    mean = grouped.mean(dim=1, keepdim=True)  # [P, 1]
    adv = grouped - mean  # [P, G]
    if scale_by_std:
        std = grouped.std(dim=1, keepdim=True, correction=1)  # [P, 1]
        adv = adv / (std + eps)
    constant = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)  # [P, 1]
    adv = adv.masked_fill(constant, 0.0)
    return adv.reshape(-1)
