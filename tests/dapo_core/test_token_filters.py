"""The token filters (dapo_core.algo.token_filters): the 80/20 rule's top-entropy mask and
DeepSeek-V3.2's off-policy sequence mask. Hand-computed cases and invariants; the differential
tests against TRL 1.16's own functions are in tests/reference/test_losses_vs_trl.py, the filters
inside the update (one quantile over the whole mini-batch, exact over micro-batches and workers)
in tests/dapo_core/test_update_variants.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.algo.token_filters import high_entropy_mask, off_policy_sequence_mask

FAST = settings(max_examples=60, deadline=None)

# Four loss tokens with entropies 0.1, 0.5, 0.9, 0.3 and a padded one holding 5.0.
ENT = torch.tensor([[0.1, 0.5, 0.9], [0.3, 5.0, 0.0]])
MASK = torch.tensor([[True, True, True], [True, False, False]])


def test_high_entropy_mask_hand_computed() -> None:
    # Sorted loss entropies 0.1, 0.3, 0.5, 0.9. ρ = 0.5: the 0.5-quantile, position 0.5·3 = 1.5,
    # is 0.3 + 0.5·(0.5 − 0.3) = 0.4 → keep 0.5 and 0.9. The padded 5.0 is never kept.
    keep = high_entropy_mask(ENT, MASK, top_quantile=0.5)
    assert keep.tolist() == [[False, True, True], [False, False, False]]
    # ρ = 0: the 1-quantile, the largest entropy only; ρ = 1: the 0-quantile, every loss token.
    only = high_entropy_mask(ENT, MASK, top_quantile=0.0)
    assert only.tolist() == [[False, False, True], [False, False, False]]
    assert torch.equal(high_entropy_mask(ENT, MASK, top_quantile=1.0), MASK)
    # ρ = 0.2 (the paper's): position 0.8·3 = 2.4 → 0.5 + 0.4·0.4 = 0.66 → 0.9 only.
    assert int(high_entropy_mask(ENT, MASK, top_quantile=0.2).sum()) == 1


def test_high_entropy_mask_of_no_token_keeps_nothing() -> None:
    none = torch.zeros(2, 3, dtype=torch.bool)
    assert not bool(high_entropy_mask(ENT, none, top_quantile=0.2).any())
    with pytest.raises(ValueError, match=r"top_quantile=1\.5"):
        high_entropy_mask(ENT, MASK, top_quantile=1.5)


@FAST
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(1, 6),
    T=st.integers(1, 8),
    rho=st.floats(0.0, 1.0),
)
def test_high_entropy_mask_keeps_the_top_share(seed: int, B: int, T: int, rho: float) -> None:
    g = torch.Generator().manual_seed(seed)
    ent = torch.rand(B, T, generator=g) * 3
    mask = torch.rand(B, T, generator=g) < 0.7
    keep = high_entropy_mask(ent, mask, top_quantile=rho)
    assert not bool((keep & ~mask).any())
    n = int(mask.sum())
    if n == 0:
        assert not bool(keep.any())
        return
    kept, dropped = ent[keep], ent[mask & ~keep]
    # Every kept token is at least as uncertain as every dropped one, at least one is kept, and
    # about the top ρ of them: the quantile falls between the ⌊(1 − ρ)(n − 1)⌋-th and the next.
    assert kept.numel() >= 1
    if dropped.numel():
        assert float(kept.min()) >= float(dropped.max())
    assert n - kept.numel() <= int((1 - rho) * (n - 1)) + 1


def test_off_policy_mask_hand_computed() -> None:
    # δ = 0.25. Row 0: A < 0, log π_sampler − log π = [0.2, 0.4] → mean 0.3 > δ: dropped.
    # Row 1: A < 0, [0.1, 0.1] → 0.1: kept. Row 2: A > 0, mean 1.0: kept (A ≥ 0 always is).
    # Row 3: A < 0, one token 0.2 and a padded one holding inf: mean 0.2 (padding is not read).
    lp = torch.zeros(4, 2)
    sampler = torch.tensor([[0.2, 0.4], [0.1, 0.1], [1.0, 1.0], [0.2, float("inf")]])
    mask = torch.tensor([[True, True], [True, True], [True, True], [True, False]])
    adv = torch.tensor([-1.0, -1.0, 1.0, -0.5])
    keep = off_policy_sequence_mask(adv, lp, sampler, mask, threshold=0.25)
    assert keep.tolist() == [False, True, True, True]
    # NaN log-prob differences count as 0 (TRL: a token the sampler could not score).
    sampler[0, 1] = float("nan")
    assert bool(off_policy_sequence_mask(adv, lp, sampler, mask, threshold=0.25)[0])


@FAST
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(1, 6),
    T=st.integers(1, 6),
    lo=st.floats(0.01, 1.0),
    hi=st.floats(0.01, 1.0),
)
def test_off_policy_mask_never_drops_a_positive_advantage_and_loosens_with_delta(
    seed: int, B: int, T: int, lo: float, hi: float
) -> None:
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g) * 2
    sampler = lp + torch.randn(B, T, generator=g)
    mask = torch.rand(B, T, generator=g) < 0.8
    adv = torch.randn(B, generator=g)
    tight = off_policy_sequence_mask(adv, lp, sampler, mask, threshold=min(lo, hi))
    loose = off_policy_sequence_mask(adv, lp, sampler, mask, threshold=max(lo, hi))
    assert bool(tight[adv >= 0].all())
    assert bool((loose | ~tight).all())  # kept at the tighter bound ⇒ kept at the looser
