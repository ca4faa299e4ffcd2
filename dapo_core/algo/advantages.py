"""Group-relative advantages: one scalar per response, shared by every token of it.

Estimators, found by name in `ADVANTAGE_ESTIMATORS` (`algo.adv_estimator`), each a pure function
of the rewards `[P, G]` (one row per prompt, its G responses) returning advantages `[P, G]`:

  * ``grpo`` (DAPO paper, arXiv 2503.14476, Eq. 9, GRPO's advantage in DAPO's notation):
        Â_i = (R_i − mean({R_j}_{j=1..G})) / (std({R_j}_{j=1..G}) + ε)
    Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") drops the division by std,
    which otherwise up-weights groups whose rewards barely differ: `scale_by_std=False`.
  * ``rloo`` (REINFORCE Leave-One-Out, Ahmadian et al. 2024, arXiv 2402.14740): each
    response's baseline is the mean reward of the OTHER G − 1 responses of its group,
        Â_i = R_i − 1/(G−1) Σ_{j≠i} R_j = G/(G−1) · (R_i − mean_j R_j),
    an unbiased baseline (it does not depend on R_i). No std: `scale_by_std` and `eps` are unused.
  * ``grpo_batch_std`` (Lite PPO, Liu et al. 2025, "Tricks or Traps? A Deep Dive into RL for LLM
    Reasoning", arXiv 2508.08221, "group-level mean, batch-level std"): the whole batch's std,
        Â_i = (R_i − mean_group) / (std_batch + ε),
    so that a group with a small spread is not blown up (TRL's `scale_rewards="batch"`).

The batch is what the caller passes: in the trainer, the groups kept by dynamic sampling.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Estimator = Callable[[Tensor, float, bool], Tensor]
"""(rewards `[P, G]`, eps, scale_by_std) → advantages `[P, G]`."""


def grpo_advantages(grouped: Tensor, eps: float, scale_by_std: bool) -> Tensor:
    """GRPO (DAPO Eq. 9): (R − group mean) / (group std + ε), std unbiased; `[P, G]` → `[P, G]`."""
    adv = grouped - grouped.mean(dim=1, keepdim=True)  # [P, G]
    if scale_by_std:
        std = grouped.std(dim=1, keepdim=True, correction=1)  # [P, 1]
        adv = adv / (std + eps)
    return adv


def rloo_advantages(grouped: Tensor, eps: float, scale_by_std: bool) -> Tensor:
    """RLOO (arXiv 2402.14740): R_i − mean of the other G − 1 rewards; `[P, G]` → `[P, G]`.

    Computed as (G·R_i − Σ_j R_j) / (G − 1): one subtraction of the sum, no per-element loop.
    """
    g = grouped.shape[1]
    return (g * grouped - grouped.sum(dim=1, keepdim=True)) / (g - 1)


def grpo_batch_std_advantages(grouped: Tensor, eps: float, scale_by_std: bool) -> Tensor:
    """Lite PPO (arXiv 2508.08221): (R − group mean) / (std of every reward in the batch + ε),
    std unbiased; `[P, G]` → `[P, G]`."""
    adv = grouped - grouped.mean(dim=1, keepdim=True)  # [P, G]
    if scale_by_std:
        adv = adv / (grouped.std(correction=1) + eps)  # one scalar for the whole batch
    return adv


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "grpo_batch_std": grpo_batch_std_advantages,
}


def group_advantages(
    rewards: Tensor,
    group_size: int,
    eps: float = 1e-6,
    scale_by_std: bool = True,
    estimator: str = "grpo",
) -> Tensor:
    """Advantages of each response relative to its group, by the named estimator.

    Args:
        rewards: `[P*G]` one scalar reward per response, ordered group by group (the G responses
            of prompt 0, then the G of prompt 1, ...).
        group_size: G, responses per prompt.
        eps: added to the std so that a near-constant group does not blow up.
        scale_by_std: False skips the division by the std (Dr.GRPO); the result is then r − mean.
        estimator: a name of ADVANTAGE_ESTIMATORS (see the module docstring).

    Returns:
        `[P*G]` advantages (floating dtype of `rewards`, float32 for integer input).

    Choices, each so that no NaN and no rounding noise leaves this function, for every estimator:
      * std is unbiased (Bessel, divides by n − 1), as `torch.std` and verl compute it;
      * a group of one (G = 1) has nothing to compare against: its advantage is 0;
      * a constant group (all rewards equal) gets exactly 0, not ±1e-11 of float noise, so it
        contributes exactly nothing to the gradient whatever the aggregation.
    """
    try:
        fn = ADVANTAGE_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(
            f"estimator={estimator!r}: use one of {', '.join(ADVANTAGE_ESTIMATORS)}"
        ) from None
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
    if group_size == 1 or n == 0:
        return torch.zeros_like(r)

    grouped = r.view(-1, group_size)  # [P, G]
    adv = fn(grouped, eps, scale_by_std)  # [P, G]
    constant = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)  # [P, 1]
    adv = adv.masked_fill(constant, 0.0)
    return adv.reshape(-1)
