"""Soft overlong punishment (DAPO Eq. 13) and the overlong filter (§3.4)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.algo.losses import policy_loss
from dapo_core.algo.overlong import overlong_filter_mask, overlong_penalty

FAST = settings(max_examples=60, deadline=None)


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        # L_max = 20 (budget), L_cache = 4 → no penalty up to L_max − L_cache = 16
        (0, 0.0),
        (10, 0.0),
        (16, 0.0),
        (17, -0.25),  # (16 − 17) / 4
        (18, -0.5),  # (16 − 18) / 4
        (19, -0.75),  # (16 − 19) / 4
        (20, -1.0),  # (16 − 20) / 4: a response cut at the budget gets the full −1
        (21, -1.0),  # beyond L_max
        (1000, -1.0),
    ],
)
def test_penalty_hand_computed(length: int, expected: float) -> None:
    assert overlong_penalty(length, 20, 4) == pytest.approx(expected)


def test_factor_scales_the_penalty() -> None:
    # (16 − 18) / 4 · 0.5 = −0.25; beyond the budget −0.5
    assert overlong_penalty(18, 20, 4, factor=0.5) == pytest.approx(-0.25)
    assert overlong_penalty(25, 20, 4, factor=0.5) == pytest.approx(-0.5)
    assert overlong_penalty(25, 20, 4, factor=0.0) == 0.0


def test_paper_lengths() -> None:
    # budget 20480, cache 4096 → expected max 16384; 18432 is half-way: (16384 − 18432)/4096 = −0.5
    assert overlong_penalty(16384, 20480, 4096) == 0.0
    assert overlong_penalty(18432, 20480, 4096) == pytest.approx(-0.5)
    assert overlong_penalty(20480, 20480, 4096) == pytest.approx(-1.0)


def test_cache_as_long_as_the_budget() -> None:
    # L_cache = L_max = 8: the ramp starts at 0: length 2 → (0 − 2)/8 = −0.25
    assert overlong_penalty(0, 8, 8) == 0.0
    assert overlong_penalty(2, 8, 8) == pytest.approx(-0.25)


def test_int_gives_float_and_tensor_gives_tensor() -> None:
    assert isinstance(overlong_penalty(17, 20, 4), float)
    lengths = torch.tensor([[10, 17], [20, 30]])
    out = overlong_penalty(lengths, 20, 4)
    assert isinstance(out, torch.Tensor)
    assert out.shape == (2, 2) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[0.0, -0.25], [-1.0, -1.0]]))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((10, 20, 0), "0 < cache_len <= max_len"),
        ((10, 20, 21), "0 < cache_len <= max_len"),
        ((-1, 20, 4), "must be >= 0"),
    ],
)
def test_bad_arguments(args: tuple[int, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        overlong_penalty(*args)


def test_negative_factor_and_negative_tensor_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="factor"):
        overlong_penalty(10, 20, 4, factor=-1.0)
    with pytest.raises(ValueError, match="must be >= 0"):
        overlong_penalty(torch.tensor([3, -2]), 20, 4)


@FAST
@given(
    max_len=st.integers(1, 200),
    data=st.data(),
    factor=st.floats(0.0, 5.0),
)
def test_shape_of_the_penalty(max_len: int, data: st.DataObject, factor: float) -> None:
    cache = data.draw(st.integers(1, max_len))
    expected = max_len - cache
    lengths = torch.arange(0, max_len + 10)
    pen = overlong_penalty(lengths, max_len, cache, factor)
    as_ints = torch.tensor([overlong_penalty(int(n), max_len, cache, factor) for n in lengths])
    torch.testing.assert_close(pen, as_ints.float())  # the int and tensor paths agree
    assert bool((pen <= 0).all())  # never positive
    assert bool((pen[1:] <= pen[:-1] + 1e-6).all())  # non-increasing
    assert bool((pen[: expected + 1] == 0).all())  # 0 region
    torch.testing.assert_close(pen[max_len:], torch.full_like(pen[max_len:], -factor))  # floor
    # linear ramp: each token inside the cache costs factor / L_cache
    steps = pen[expected + 1 : max_len + 1] - pen[expected:max_len]
    torch.testing.assert_close(steps, torch.full_like(steps, -factor / cache))


# --- the overlong filter -----------------------------------------------------------------------


def test_filter_zeroes_truncated_rows_of_a_float_mask() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    truncated = torch.tensor([False, True, False])
    out = overlong_filter_mask(truncated, mask)
    assert out.dtype == mask.dtype
    assert torch.equal(out, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert torch.equal(mask[1], torch.ones(3))  # the input is not modified


def test_filter_on_a_bool_mask_and_without_a_mask() -> None:
    mask = torch.ones(2, 2, dtype=torch.bool)
    out = overlong_filter_mask(torch.tensor([1, 0]), mask)
    assert torch.equal(out, torch.tensor([[False, False], [True, True]]))
    assert torch.equal(
        overlong_filter_mask(torch.tensor([True, False, True])), torch.tensor([False, True, False])
    )


def test_filtered_rows_leave_loss_and_token_count() -> None:
    # token-mean over the filtered mask equals token-mean over the kept rows alone.
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    old = lp - 0.1 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    truncated = torch.tensor([False, True, False])
    kw = {"clip_low": 0.2, "clip_high": 0.28}
    for agg in ("token-mean", "seq-mean-token-mean"):
        filtered, metrics = policy_loss(
            lp, old, adv, overlong_filter_mask(truncated, mask), agg=agg, **kw
        )
        kept = torch.tensor([0, 2])
        alone, _ = policy_loss(lp[kept], old[kept], adv[kept], mask[kept], agg=agg, **kw)
        torch.testing.assert_close(filtered, alone)
        assert metrics.counts.tokens == 5  # 2 + 3 tokens of the kept rows


def test_filter_shape_errors() -> None:
    with pytest.raises(ValueError, match="one flag per row"):
        overlong_filter_mask(torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"must be \[B, T\] with B = 3"):
        overlong_filter_mask(torch.zeros(3, dtype=torch.bool), torch.ones(2, 4))
