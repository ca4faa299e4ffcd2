"""Dynamic sampling's filter (DAPO §3.2): which groups carry a learning signal.

A group whose responses are all correct or all wrong has identical rewards, hence zero
group-relative advantage for every response and no gradient; it only dilutes the batch. DAPO
keeps a group only if

    0 < |{o_i | is_equivalent(a, o_i)}| < G          (the constraint of Eq. 11)

and over-samples until the batch is full (the loop lives in the trainer).
"""

from __future__ import annotations

from torch import Tensor


def informative_groups(acc: Tensor, group_size: int) -> Tensor:
    """Mask of the groups with at least one correct and at least one wrong response.

    Args:
        acc: `[P*G]` accuracy per response, 0/1 (int, float) or bool, ordered group by group.
            This is correctness, not the shaped reward: with the soft overlong penalty two
            wrong answers of different lengths have different rewards, yet the group still
            teaches nothing about correctness, and the paper's constraint counts correct answers.
        group_size: G.

    Returns:
        `[P]` bool, True where 0 < #correct < G. With G = 1 no group is ever kept.
    """
    if group_size < 1:
        raise ValueError(f"group_size={group_size}: need at least one response per group")
    if acc.dim() != 1:
        raise ValueError(f"acc has shape {tuple(acc.shape)}: pass a flat [P*G] tensor")
    if acc.numel() % group_size != 0:
        raise ValueError(
            f"{acc.numel()} accuracies do not split into groups of {group_size}: "
            "pass G responses for every prompt, ordered group by group"
        )
    if not bool(((acc == 0) | (acc == 1)).all()):
        raise ValueError(
            "acc must hold 0/1 correctness per response (not the shaped reward, e.g. ±1 scores)"
        )
    n_correct = acc.bool().view(-1, group_size).sum(dim=1)  # [P]
    return (n_correct > 0) & (n_correct < group_size)
