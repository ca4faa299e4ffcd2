"""Group-relative advantages: GRPO (DAPO Eq. 9), RLOO and Lite PPO's batch std; hand-computed
cases, invariants, loop vs vectorized. verl's own GRPO and RLOO: tests/reference/."""

from __future__ import annotations

import random
import statistics

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dapo_core.algo.advantages import ADVANTAGE_ESTIMATORS, group_advantages
from dapo_core.setup.config import ADV_ESTIMATORS

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


# --- the estimators registry: RLOO and Lite PPO's batch std ------------------------------------

ESTIMATORS = list(ADVANTAGE_ESTIMATORS)


def test_registry_matches_the_config_and_names_its_entries() -> None:
    assert tuple(ADVANTAGE_ESTIMATORS) == ADV_ESTIMATORS
    with pytest.raises(ValueError, match="estimator='ppo': use one of grpo, rloo, grpo_batch_std"):
        group_advantages(torch.zeros(4), 2, estimator="ppo")


def test_rloo_hand_computed() -> None:
    # [3, 1, 2]: the others' means are 1.5, 2.5, 2 → Â = [1.5, −1.5, 0]
    # [1, −1, −1]: others' means −1, 0, 0 → Â = [2, −1, −1]
    adv = group_advantages(torch.tensor([3.0, 1.0, 2.0, 1.0, -1.0, -1.0]), 3, estimator="rloo")
    torch.testing.assert_close(adv, torch.tensor([1.5, -1.5, 0.0, 2.0, -1.0, -1.0]))


def test_grpo_batch_std_hand_computed() -> None:
    # groups [1, 0] and [1, 1]: group means 0.5 and 1 → deviations [0.5, −0.5, 0, 0].
    # batch [1, 0, 1, 1]: mean 0.75, unbiased var = (3·0.0625 + 0.5625)/3 = 0.25, std 0.5
    # → Â = [0.5, −0.5, 0, 0] / (0.5 + 1e-6)   (GRPO would divide by the group std 0.707107)
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2, estimator="grpo_batch_std")
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]) / (0.5 + 1e-6))
    grpo = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)
    torch.testing.assert_close(grpo, torch.tensor([0.5, -0.5, 0.0, 0.0]) / (0.707107 + 1e-6))


def _loop_rloo(rewards: list[float], g: int) -> list[float]:
    out: list[float] = []
    for start in range(0, len(rewards), g):
        group = rewards[start : start + g]
        for i, r in enumerate(group):
            others = group[:i] + group[i + 1 :]
            out.append(r - statistics.fmean(others) if len(set(group)) > 1 else 0.0)
    return out


def test_rloo_loop_matches_vectorized_over_many_seeds() -> None:
    for seed in range(100):
        rng = random.Random(seed)
        g, p = rng.randint(2, 8), rng.randint(1, 6)
        rewards = [
            rng.choice([-1.0, 1.0]) - rng.random() * rng.choice([0, 1]) for _ in range(p * g)
        ]
        got = group_advantages(torch.tensor(rewards, dtype=torch.float64), g, estimator="rloo")
        want = torch.tensor(_loop_rloo(rewards, g), dtype=torch.float64)
        torch.testing.assert_close(got, want, msg=f"seed {seed}")


@FAST
@given(rewards_and_g)
def test_rloo_is_dr_grpo_scaled_by_g_over_g_minus_one(data: tuple[list[float], int]) -> None:
    # R_i − mean_{j≠i} R_j = G/(G−1)·(R_i − mean_j R_j)
    rewards, g = data
    r = torch.tensor(rewards, dtype=torch.float64)
    rloo = group_advantages(r, g, estimator="rloo")
    dr_grpo = group_advantages(r, g, scale_by_std=False)
    torch.testing.assert_close(rloo, dr_grpo * g / (g - 1))


@FAST
@given(rewards_and_g, st.booleans())
def test_batch_std_with_one_group_is_grpo(data: tuple[list[float], int], scale: bool) -> None:
    rewards, g = data
    r = torch.tensor(rewards[:g], dtype=torch.float64)  # one prompt: the batch is the group
    torch.testing.assert_close(
        group_advantages(r, g, scale_by_std=scale, estimator="grpo_batch_std"),
        group_advantages(r, g, scale_by_std=scale),
    )


@FAST
@given(rewards_and_g, st.floats(min_value=0.5, max_value=4))
def test_batch_std_shares_one_scale_across_groups(data: tuple[list[float], int], a: float) -> None:
    # Every group is divided by the same number: the ratio to Dr.GRPO's r − mean is one
    # constant over the whole batch (where the deviation is not 0).
    rewards, g = data
    r = torch.tensor(rewards, dtype=torch.float64) * a
    adv = group_advantages(r, g, estimator="grpo_batch_std")
    centred = group_advantages(r, g, scale_by_std=False)
    nonzero = centred.abs() > 1e-9
    assume(bool(nonzero.any()))
    scale = centred[nonzero] / adv[nonzero]
    torch.testing.assert_close(scale, torch.full_like(scale, r.std().item() + 1e-6))


@pytest.mark.parametrize("estimator", ESTIMATORS)
@FAST
@given(data=rewards_and_g, scale=st.booleans())
def test_every_estimator_has_zero_mean_per_group(
    estimator: str, data: tuple[list[float], int], scale: bool
) -> None:
    rewards, g = data
    r = torch.tensor(rewards, dtype=torch.float64)
    adv = group_advantages(r, g, scale_by_std=scale, estimator=estimator)
    means = adv.view(-1, g).mean(dim=1)
    torch.testing.assert_close(means, torch.zeros_like(means), atol=1e-9, rtol=0)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimator_gives_zero_to_constant_groups_and_groups_of_one(estimator: str) -> None:
    # A group of three 0.1s (mean ≠ 0.1 in floats) next to a mixed group: exactly 0 for it.
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, -1.0, 0.0])
    adv = group_advantages(r, 3, estimator=estimator)
    assert torch.equal(adv[:3], torch.zeros(3))
    assert bool((adv[3:] != 0).any())
    assert torch.equal(group_advantages(r, 1, estimator=estimator), torch.zeros(6))
    assert group_advantages(torch.zeros(0), 4, estimator=estimator).numel() == 0
