"""Rollout correction (TIS, MIS, TRL's sequence mask, AReaL's decoupled weight) and the
sampler–trainer mismatch sums: hand-computed cases and invariants (weights ≤ cap, `none` changes
nothing, MIS keeps exactly the tokens whose ratio lies in [1/cap, cap], the sequence mask keeps
or drops whole sequences by their product of ratios, k3 ≥ 0 and 0 only where the two log-probs
agree)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dapo_core.algo.correction import MODES, rollout_correction
from dapo_core.algo.losses import k3, kl_penalty
from dapo_core.setup.config import ROLLOUT_CORRECTIONS

FAST = settings(max_examples=80, deadline=None)
F64 = torch.float64

# ρ = π_old / π_sampler per token: [3, 1.5, 0.25, 1] with a padded 5th position; cap = 2.
RHO = [3.0, 1.5, 0.25, 1.0]
SAMPLER = torch.tensor([[-1.0, -2.0, -0.5, -0.7, 0.0]], dtype=F64)
OLD = SAMPLER + torch.log(torch.tensor([[*RHO, 1e9]], dtype=F64))  # padding: a huge ratio
MASK = torch.tensor([[1, 1, 1, 1, 0]])
# Σ|log ρ| = ln 3 + ln 1.5 + ln 4 + 0 = 1.098612 + 0.405465 + 1.386294 = 2.890372
ABS = 2.890372
# Σ k3 = Σ (ρ − ln ρ − 1) = (3 − 1.098612 − 1) + (1.5 − 0.405465 − 1) + (0.25 + 1.386294 − 1) + 0
#      = 0.901388 + 0.094535 + 0.636294 = 1.632217
K3 = 1.632217


def test_registry_matches_the_config() -> None:
    assert MODES == ROLLOUT_CORRECTIONS


def test_tis_hand_computed() -> None:
    weights, mask, sums = rollout_correction(OLD, SAMPLER, MASK, mode="tis", cap=2.0)
    assert weights is not None
    # min(ρ, 2) on loss tokens, 0 on padding
    torch.testing.assert_close(weights, torch.tensor([[2.0, 1.5, 0.25, 1.0, 0.0]], dtype=F64))
    assert mask is MASK  # TIS reweights, it removes nothing
    assert sums["mismatch_tokens"] == 4
    assert sums["is_masked"] == 1  # only ρ = 3 is capped
    assert sums["mismatch_abs"] == pytest.approx(ABS, abs=1e-6)
    assert sums["mismatch_k3"] == pytest.approx(K3, abs=1e-6)


def test_mis_hand_computed() -> None:
    weights, mask, sums = rollout_correction(OLD, SAMPLER, MASK, mode="mis", cap=2.0)
    assert weights is None
    # [1/2, 2] keeps ρ = 1.5 and ρ = 1; ρ = 3 and ρ = 0.25 leave the loss; padding stays out
    assert mask.tolist() == [[0, 1, 0, 1, 0]]
    assert mask.dtype == MASK.dtype
    assert sums["is_masked"] == 2
    assert sums["mismatch_abs"] == pytest.approx(ABS, abs=1e-6)  # measured before masking


def test_sequence_mask_hand_computed() -> None:
    # Row 0: ρ = [3, 1.5, 0.25, 1] → ρ_seq = 3·1.5·0.25·1 = 1.125 ≤ 2: every token weighs 1.125.
    # Row 1: ρ = [3, 1.5, 1, 1] → ρ_seq = 4.5 > 2: the whole sequence weighs 0 (TRL's mask).
    sampler = torch.cat([SAMPLER, SAMPLER])
    rho1 = torch.tensor([[3.0, 1.5, 1.0, 1.0, 1e9]], dtype=F64)
    old = torch.cat([OLD, SAMPLER[:1] + torch.log(rho1)])
    mask = torch.cat([MASK, MASK])
    weights, kept, sums = rollout_correction(old, sampler, mask, mode="sequence_mask", cap=2.0)
    assert weights is not None and kept is mask  # the normaliser keeps every token, as in TRL
    want = torch.tensor([[1.125] * 4 + [0.0], [0.0] * 5], dtype=F64)
    torch.testing.assert_close(weights, want)
    assert sums["is_masked"] == 4  # row 1's four tokens
    assert sums["mismatch_tokens"] == 8
    # A lower bound C_min = 1.2 drops row 0 too (1.125 < 1.2); TRL's default has none.
    weights, _, sums = rollout_correction(
        old, sampler, mask, mode="sequence_mask", cap=2.0, cap_min=1.2
    )
    assert weights is not None and bool((weights == 0).all()) and sums["is_masked"] == 8


def test_decoupled_hand_computed() -> None:
    # AReaL: w = π_prox/π_behav = ρ where ρ ≤ cap, else 0: [3, 1.5, 0.25, 1] → [0, 1.5, 0.25, 1]
    weights, mask, sums = rollout_correction(OLD, SAMPLER, MASK, mode="decoupled", cap=2.0)
    assert weights is not None and mask is MASK
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.5, 0.25, 1.0, 0.0]], dtype=F64))
    assert sums["is_masked"] == 1
    assert sums["mismatch_abs"] == pytest.approx(ABS, abs=1e-6)


def test_none_measures_and_changes_nothing() -> None:
    weights, mask, sums = rollout_correction(OLD, SAMPLER, MASK, mode="none", cap=2.0)
    assert weights is None
    assert mask is MASK
    assert sums == pytest.approx(
        {"mismatch_tokens": 4, "mismatch_abs": ABS, "mismatch_k3": K3, "is_masked": 0}, abs=1e-6
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"mode": "ppo", "cap": 2.0},
            "rollout correction 'ppo': use one of none, tis, mis, sequence_mask, decoupled",
        ),
        ({"mode": "sequence_mask", "cap": 2.0, "cap_min": 2.0}, r"cap_min=2.0: must be in \(0, "),
        ({"mode": "sequence_mask", "cap": 2.0, "cap_min": 0.0}, "cap_min=0.0: must be in"),
        ({"mode": "tis", "cap": 1.0}, "cap=1.0: must be a finite number > 1"),
        ({"mode": "mis", "cap": math.inf}, "must be a finite number > 1"),
        ({"mode": "tis", "cap": math.nan}, "must be a finite number > 1"),
    ],
)
def test_bad_arguments_are_clear_value_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rollout_correction(OLD, SAMPLER, MASK, **kwargs)


# --- properties ----------------------------------------------------------------------------------

LOGP = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)
CAP = st.floats(min_value=1.01, max_value=10.0)


@st.composite
def batches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    old = torch.tensor(draw(st.lists(LOGP, min_size=B * T, max_size=B * T)), dtype=F64)
    sampler = torch.tensor(draw(st.lists(LOGP, min_size=B * T, max_size=B * T)), dtype=F64)
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T)))
    return old.view(B, T), sampler.view(B, T), mask.view(B, T)


@FAST
@given(batches(), CAP)
def test_tis_weights_lie_in_zero_cap(batch: tuple[torch.Tensor, ...], cap: float) -> None:
    old, sampler, mask = batch
    weights, _, sums = rollout_correction(old, sampler, mask, mode="tis", cap=cap)
    assert weights is not None
    assert bool((weights <= cap).all()) and bool((weights >= 0).all())
    assert bool((weights[~mask] == 0).all())
    # below the cap, the weight is the ratio itself
    rho = torch.exp(old - sampler)
    free = mask & (rho < cap)
    torch.testing.assert_close(weights[free], rho[free])
    assert sums["is_masked"] == float((mask & (rho > cap)).sum())


@FAST
@given(batches(), CAP)
def test_mis_keeps_exactly_the_ratios_within_the_cap(
    batch: tuple[torch.Tensor, ...], cap: float
) -> None:
    old, sampler, mask = batch
    log_rho = (old - sampler).flatten().tolist()
    # stay clear of the boundary, where log-space and ratio-space rounding may disagree
    assume(all(abs(abs(x) - math.log(cap)) > 1e-9 for x in log_rho))
    _, kept, sums = rollout_correction(old, sampler, mask, mode="mis", cap=cap)
    expected = [
        bool(m) and 1 / cap <= math.exp(x) <= cap
        for x, m in zip(log_rho, mask.flatten().tolist(), strict=True)
    ]
    assert kept.bool().flatten().tolist() == expected
    assert sums["is_masked"] == float(mask.sum()) - sum(expected)


@FAST
@given(batches(), CAP)
def test_none_leaves_mask_and_loss_untouched(batch: tuple[torch.Tensor, ...], cap: float) -> None:
    old, sampler, mask = batch
    weights, kept, sums = rollout_correction(old, sampler, mask, mode="none", cap=cap)
    assert weights is None and kept is mask
    assert sums["is_masked"] == 0
    assert sums["mismatch_tokens"] == float(mask.sum())


# log-probs on a 1e-4 grid: two different values differ by at least 1e-4, so k3 ≈ x²/2 ≥ 5e-9.
GRID = st.integers(-300_000, 0).map(lambda i: i / 10_000)


@FAST
@given(st.lists(st.tuples(GRID, GRID), min_size=1, max_size=12))
def test_k3_is_nonnegative_and_zero_only_where_equal(pairs: list[tuple[float, float]]) -> None:
    mask = torch.ones(1, 1, dtype=torch.bool)
    for a, b in pairs:
        _, _, sums = rollout_correction(
            torch.tensor([[a]], dtype=F64), torch.tensor([[b]], dtype=F64), mask, mode="none", cap=2
        )
        assert sums["mismatch_k3"] >= 0
        assert (sums["mismatch_k3"] == 0) == (a == b)
        assert (sums["mismatch_abs"] == 0) == (a == b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_k3_never_rounds_below_zero(dtype: torch.dtype) -> None:
    """ρ − log ρ − 1 computed as exp(x) − x − 1 comes out below 0 at some small x in floating
    point; the estimate (losses.k3, in the correction's mismatch and in kl_penalty) must not."""
    x = torch.linspace(-1e-3, 1e-3, 200_001, dtype=dtype)
    bad = x[(torch.exp(x) - x - 1) < 0]  # where the naive formula rounds below 0
    assert bad.numel() > 0
    assert (k3(bad) >= 0).all()
    assert (kl_penalty(torch.zeros_like(bad), bad, kind="k3") >= 0).all()
    for value in bad[:: max(1, bad.numel() // 50)]:  # the mismatch sum, one token at a time
        one = value.reshape(1, 1)
        _, _, sums = rollout_correction(
            one, torch.zeros_like(one), torch.ones_like(one), mode="none", cap=2
        )
        assert sums["mismatch_k3"] >= 0


def test_extreme_log_probs_stay_finite() -> None:
    # A sampler log-prob of −1000 (a token the trainer finds likely): log ρ is clamped at 20.
    old = torch.tensor([[-0.1, -1000.0]], dtype=F64)
    sampler = torch.tensor([[-1000.0, -0.1]], dtype=F64)
    expected = {
        "tis": [[2.0, math.exp(-20.0)]],
        "decoupled": [[0.0, math.exp(-20.0)]],  # ρ = e^20 > cap leaves the loss
        "sequence_mask": [[1.0, 1.0]],  # the two log ratios cancel: ρ_seq = 1
    }
    for mode in MODES:
        weights, _, sums = rollout_correction(old, sampler, torch.ones(1, 2), mode=mode, cap=2.0)
        assert all(math.isfinite(v) for v in sums.values())
        assert (weights is None) == (mode not in expected)
        if weights is not None:
            torch.testing.assert_close(weights, torch.tensor(expected[mode], dtype=F64))
    # A sequence whose ratio overflows float is masked, not inf: Σ log ρ = 2·999.9.
    weights, _, _ = rollout_correction(
        torch.full((1, 2), -0.1, dtype=F64),
        torch.full((1, 2), -1000.0, dtype=F64),
        torch.ones(1, 2),
        mode="sequence_mask",
        cap=2.0,
    )
    assert weights is not None and weights.tolist() == [[0.0, 0.0]]


@FAST
@given(batches(), CAP, st.one_of(st.none(), st.floats(min_value=0.05, max_value=0.99)))
def test_sequence_mask_keeps_or_drops_whole_sequences_by_their_ratio(
    batch: tuple[torch.Tensor, ...], cap: float, low: float | None
) -> None:
    old, sampler, mask = batch
    cap_min = None if low is None else low * cap
    seq = ((old - sampler) * mask).sum(dim=1)  # [B] log ρ_seq
    lo = -math.inf if cap_min is None else math.log(cap_min)
    # stay clear of the bounds, where rounding may fall either way
    assume(all(abs(x - math.log(cap)) > 1e-9 and abs(x - lo) > 1e-9 for x in seq.tolist()))
    weights, kept, sums = rollout_correction(
        old, sampler, mask, mode="sequence_mask", cap=cap, cap_min=cap_min
    )
    assert weights is not None and kept is mask
    assert bool(torch.isfinite(weights).all()) and bool((weights <= cap).all())
    assert bool((weights[~mask] == 0).all())
    for b in range(old.shape[0]):
        row, m = weights[b], mask[b]
        inside = lo <= float(seq[b]) <= math.log(cap)
        want = math.exp(float(seq[b])) if inside else 0.0
        torch.testing.assert_close(row[m], torch.full_like(row[m], want))
    masked_tokens = sum(
        int(mask[b].sum()) for b in range(old.shape[0]) if not lo <= float(seq[b]) <= math.log(cap)
    )
    assert sums["is_masked"] == masked_tokens


@FAST
@given(batches(), CAP)
def test_decoupled_weight_is_the_ratio_up_to_the_cap_and_zero_beyond(
    batch: tuple[torch.Tensor, ...], cap: float
) -> None:
    old, sampler, mask = batch
    rho = torch.exp(old - sampler)
    assume(bool((abs(rho - cap) > 1e-9 * cap).all()))
    weights, kept, sums = rollout_correction(old, sampler, mask, mode="decoupled", cap=cap)
    assert weights is not None and kept is mask
    keep = mask & (rho <= cap)
    torch.testing.assert_close(weights[keep], rho[keep].clamp(min=math.exp(-20.0)))
    assert bool((weights[~keep] == 0).all())
    assert sums["is_masked"] == float((mask & (rho > cap)).sum())
