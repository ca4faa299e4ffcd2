"""Overlong reward shaping (DAPO §3.4): soft punishment of long responses, and the overlong filter.

Truncated responses are a noisy signal: a sound line of reasoning gets −1 only because it ran out
of budget. DAPO offers two remedies, both here:
  * Overlong Filtering: truncated samples leave the loss (and its token count);
  * Soft Overlong Punishment (Eq. 13): a length-aware penalty added to the correctness reward,
    ramping from 0 to −1 over the last L_cache tokens of the budget.
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(
    length: int | Tensor, max_len: int, cache_len: int, factor: float = 1.0
) -> float | Tensor:
    """Soft overlong punishment R_length(y) of DAPO Eq. 13, scaled by `factor`.

        R_length(y) = 0                                   if |y| ≤ L_max − L_cache
                    = ((L_max − L_cache) − |y|) / L_cache  if L_max − L_cache < |y| ≤ L_max
                    = −1                                   if |y| > L_max

    Which length is which:
      * `max_len` = L_max, the generation budget (max new tokens). The paper runs with a budget
        of 20,480 tokens;
      * `cache_len` = L_cache, the soft punish cache at the end of the budget (paper: 4,096);
      * L_max − L_cache is the expected maximum length, up to which there is no penalty
        (paper: 16,384).
    This matches verl's DAPO recipe (max_response_length 20480, overlong_buffer.len 4096). A
    response cut off at the budget gets exactly −factor from the ramp, so the third branch is
    reached only by lengths beyond the budget (e.g. when the budget used for scoring is smaller
    than the one used for generation).

    Args:
        length: |y| in tokens, an int or a tensor of lengths (any shape).
        max_len: L_max.
        cache_len: L_cache, with 0 < L_cache ≤ L_max.
        factor: penalty at and beyond the budget is −factor (≥ 0).

    Returns:
        A float for an int length, a float tensor of the same shape for a tensor. Never positive;
        continuous and non-increasing in the length.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(
            f"overlong cache_len={cache_len} must satisfy 0 < cache_len <= max_len={max_len}"
        )
    if factor < 0:
        raise ValueError(
            f"overlong penalty factor={factor} must be >= 0 (a penalty is never a bonus)"
        )
    expected = max_len - cache_len  # L_max − L_cache

    if isinstance(length, Tensor):
        if bool((length < 0).any()):
            raise ValueError("response lengths must be >= 0")
        lens = length if length.is_floating_point() else length.float()
        ramp = (expected - lens) / cache_len * factor
        out = torch.where(lens <= expected, torch.zeros_like(lens), ramp)
        return torch.where(lens > max_len, torch.full_like(lens, -factor), out)

    if length < 0:
        raise ValueError(f"response length={length} must be >= 0")
    if length <= expected:
        return 0.0
    if length <= max_len:
        return (expected - length) / cache_len * factor
    return -float(factor)


def overlong_filter_mask(truncated: Tensor, mask: Tensor | None = None) -> Tensor:
    """The overlong filter (DAPO §3.4, "Overlong Filtering"): truncated rows leave the loss.

    A response that hit the length limit without EOS has no verdict of its own, so its tokens are
    masked out; with token-level aggregation they also leave the token count, and with the
    sample-level mode's defaulted count the row leaves the number of sequences.

    Args:
        truncated: `[B]` bool (or 0/1), True where generation stopped at the length limit.
        mask: `[B, T]` response mask, or None.

    Returns:
        With `mask`: a copy of it (same dtype) whose truncated rows are all zero.
        Without: the `[B]` bool keep-vector, True for rows that stay in the loss.
    """
    if truncated.dim() != 1:
        raise ValueError(f"truncated has shape {tuple(truncated.shape)}: pass one flag per row [B]")
    keep = ~truncated.bool()  # [B]
    if mask is None:
        return keep
    if mask.dim() != 2 or mask.shape[0] != truncated.shape[0]:
        raise ValueError(
            f"mask {tuple(mask.shape)} must be [B, T] with B = {truncated.shape[0]} rows"
        )
    return mask * keep[:, None].to(mask.dtype) if mask.dtype != torch.bool else mask & keep[:, None]
