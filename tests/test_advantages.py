"""Group-relative advantages (DAPO Eq. 9): hand-computed cases, invariants, loop vs vectorized."""

from __future__ import annotations

import random
import statistics

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dapo_core.advantages import group_advantages

FAST = settings(max_examples=60, deadline=None)


def test_one_group_of_four_hand_computed() -> None:
    # mean = 0; unbiased var = (1+1+1+1)/3 = 4/3; std = 1.154700; Â = ±1/1.154700 = ±0.866025
    adv = group_advantages(torch.tensor([1.0, -1.0, -1.0, 1.0]), 4)
    torch.testing.assert_close(adv, torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]))


def test_two_groups_hand_computed() -> None:
    # group 0 constant → 0.
    # group 1: [1, -1, -1, -1]: mean = -0.5; deviations [1.5, -0.5, -0.5, -0.5];
    # unbiased var = (2.25 + 3·0.25)/3 = 1; std = 1 → Â = deviations / (1 + 1e-6)
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0]), 4)
    expected = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.5, -0.5, -0.5, -0.5]) / (1 + 1e-6)
    torch.testing.assert_close(adv, expected)


def test_group_of_two_and_eps() -> None:
    # [1, 0]: mean 0.5, std = sqrt((0.25+0.25)/1) = 0.707107; Â = ±0.5/(0.707107 + 0.1) = ±0.619497
    adv = group_advantages(torch.tensor([1.0, 0.0]), 2, eps=0.1)
    torch.testing.assert_close(adv, torch.tensor([0.619497, -0.619497]))


def test_dr_grpo_skips_the_std() -> None:
    # [3, 1, 2]: mean 2 → [1, -1, 0]; [5, 5, 8]: mean 6 → [-1, -1, 2]
    adv = group_advantages(torch.tensor([3.0, 1.0, 2.0, 5.0, 5.0, 8.0]), 3, scale_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, -1.0, -1.0, 2.0]))


def test_group_of_one_is_zero_not_nan() -> None:
    adv = group_advantages(torch.tensor([1.0, -1.0, 0.5]), 1)
    assert torch.equal(adv, torch.zeros(3))


def test_integer_rewards_give_float_advantages() -> None:
    adv = group_advantages(torch.tensor([1, 0]), 2)
    assert adv.dtype == torch.float32
    assert adv[0] > 0 > adv[1]


def test_float64_is_kept() -> None:
    assert group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), 2).dtype == torch.float64


@pytest.mark.parametrize(
    ("rewards", "group_size", "match"),
    [
        (torch.zeros(5), 2, "do not split into groups of 2"),
        (torch.zeros(4), 0, "at least one response"),
        (torch.zeros(2, 2), 2, r"flat \[P\*G\]"),
    ],
)
def test_bad_input_is_a_clear_value_error(
    rewards: torch.Tensor, group_size: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, group_size)


rewards_and_g = st.integers(min_value=2, max_value=6).flatmap(
    lambda g: st.tuples(
        st.lists(
            st.floats(min_value=-5, max_value=5, allow_nan=False, width=32),
            min_size=g,
            max_size=4 * g,
        ).map(lambda xs, g=g: xs[: len(xs) // g * g]),
        st.just(g),
    )
)


@FAST
@given(rewards_and_g, st.booleans())
def test_zero_mean_per_group(data: tuple[list[float], int], scale: bool) -> None:
    rewards, g = data
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), g, scale_by_std=scale)
    means = adv.view(-1, g).mean(dim=1)
    torch.testing.assert_close(means, torch.zeros_like(means), atol=1e-9, rtol=0)


@FAST
@given(
    st.integers(min_value=1, max_value=8),
    st.floats(min_value=-10, max_value=10, allow_nan=False, width=32),
    st.booleans(),
)
def test_constant_group_is_exactly_zero(g: int, value: float, scale: bool) -> None:
    # 0.1 three times has a float mean != 0.1; the advantage must still be exactly 0.
    adv = group_advantages(torch.full((3 * g,), value), g, scale_by_std=scale)
    assert torch.equal(adv, torch.zeros(3 * g))


def _loop_advantages(rewards: list[float], g: int, eps: float, scale: bool) -> list[float]:
    """Straightforward per-group reference with the statistics module."""
    out: list[float] = []
    for start in range(0, len(rewards), g):
        group = rewards[start : start + g]
        if g == 1 or len(set(group)) == 1:
            out.extend([0.0] * g)
            continue
        mean = statistics.fmean(group)
        std = statistics.stdev(group)  # sample std, Bessel-corrected
        out.extend((r - mean) / (std + eps) if scale else r - mean for r in group)
    return out


@pytest.mark.parametrize("scale", [True, False])
def test_loop_matches_vectorized_over_many_seeds(scale: bool) -> None:
    for seed in range(100):
        rng = random.Random(seed)
        g = rng.randint(1, 8)
        p = rng.randint(1, 6)
        # Binary ±1 rewards plus a shaped penalty on some, like the trainer's rewards.
        rewards = [
            rng.choice([-1.0, 1.0]) + rng.choice([0.0, 0.0, -rng.random()]) for _ in range(p * g)
        ]
        got = group_advantages(torch.tensor(rewards, dtype=torch.float64), g, scale_by_std=scale)
        want = torch.tensor(_loop_advantages(rewards, g, 1e-6, scale), dtype=torch.float64)
        torch.testing.assert_close(got, want, msg=f"seed {seed}")


@FAST
@given(rewards_and_g, st.floats(min_value=0.5, max_value=4), st.floats(min_value=-3, max_value=3))
def test_invariant_to_reward_shift_and_scale(
    data: tuple[list[float], int], a: float, b: float
) -> None:
    # (a·r + b − mean) / std(a·r + b) = (r − mean)/std for a > 0 (up to eps); with eps=1e-12.
    rewards, g = data
    r = torch.tensor(rewards, dtype=torch.float64)
    grouped = r.view(-1, g)
    assume(bool((grouped.std(dim=1) > 1e-2).all()))  # a clear spread, where eps is negligible
    torch.testing.assert_close(
        group_advantages(a * r + b, g, eps=1e-12), group_advantages(r, g, eps=1e-12)
    )
