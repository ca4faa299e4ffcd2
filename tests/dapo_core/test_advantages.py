"""Advantage estimators: GRPO (DAPO Eq. 9), RLOO, Lite PPO's batch std, and verl 0.9.1's
REINFORCE++ (and its baseline form), ReMax, OPO, pass@k, GPG, GDPO and optimal token baselines:
hand-computed cases (the arithmetic in comments), invariants (hypothesis), loop vs vectorized.
Each against verl's own function: tests/reference/test_advantages_vs_verl.py."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dapo_core.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    Estimator,
    advantages,
    group_advantages,
    masked_whiten,
)
from dapo_core.setup.config import ADV_ESTIMATORS, ADV_ESTIMATORS_WITHOUT_TRAINER

FAST = settings(max_examples=60, deadline=None)
F64 = torch.float64


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


# --- the estimators registry ------------------------------------------------------------------

ESTIMATORS = list(ADVANTAGE_ESTIMATORS)
GROUP_RELATIVE = [n for n, e in ADVANTAGE_ESTIMATORS.items() if e.group_relative]
# R_i − the group's plain mean, times a constant: advantages sum to 0 within each group.
ZERO_MEAN = ["grpo", "rloo", "grpo_batch_std", "gpg"]


def test_registry_matches_the_config_and_names_its_entries() -> None:
    assert set(ADVANTAGE_ESTIMATORS) == set(ADV_ESTIMATORS) | set(ADV_ESTIMATORS_WITHOUT_TRAINER)
    assert not set(ADV_ESTIMATORS) & set(ADV_ESTIMATORS_WITHOUT_TRAINER)
    assert GROUP_RELATIVE == ["grpo", "rloo", "grpo_batch_std", "opo", "grpo_passk", "gpg"]
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


@pytest.mark.parametrize("estimator", ZERO_MEAN)
@FAST
@given(data=rewards_and_g, scale=st.booleans())
def test_group_mean_estimators_have_zero_mean_per_group(
    estimator: str, data: tuple[list[float], int], scale: bool
) -> None:
    rewards, g = data
    r = torch.tensor(rewards, dtype=torch.float64)
    adv = group_advantages(r, g, scale_by_std=scale, estimator=estimator)
    means = adv.view(-1, g).mean(dim=1)
    torch.testing.assert_close(means, torch.zeros_like(means), atol=1e-9, rtol=0)


def _inputs_for(rewards: torch.Tensor, lengths: torch.Tensor, **kw: object) -> AdvantageInputs:
    """Inputs that every estimator accepts: lengths, a greedy baseline, per-token statistics."""
    P, G = rewards.shape
    T = max(int(lengths.max()), 1)
    g = torch.Generator().manual_seed(int(lengths.sum()))
    old = torch.log(torch.rand(P, G, T, generator=g, dtype=rewards.dtype).clamp(min=1e-6))
    kw.setdefault("baseline_rewards", torch.zeros(P, dtype=rewards.dtype))
    return AdvantageInputs(
        rewards=rewards,
        lengths=lengths,
        old_logprobs=old,
        sum_pi_squared=old.exp() ** 2,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("estimator", GROUP_RELATIVE)
def test_group_relative_estimators_give_zero_to_constant_groups_and_groups_of_one(
    estimator: str,
) -> None:
    # A group of three 0.1s (mean ≠ 0.1 in floats) next to a mixed group: exactly 0 for it.
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, -1.0, 0.0])
    lengths = torch.tensor([3, 1, 2, 2, 5, 1])
    adv = group_advantages(r, 3, estimator=estimator, lengths=lengths)
    assert torch.equal(adv[:3], torch.zeros(3))
    assert bool((adv[3:] != 0).any())
    assert torch.equal(group_advantages(r, 1, estimator=estimator, lengths=lengths), torch.zeros(6))
    none = torch.zeros(0, dtype=torch.long)
    assert group_advantages(torch.zeros(0), 4, estimator=estimator, lengths=none).numel() == 0


# --- estimators beyond the group mean: hand-computed -------------------------------------------


def test_opo_hand_computed() -> None:
    # [1, −1, −1] with lengths [2, 4, 2]: b = (2·1 + 4·(−1) + 2·(−1)) / 8 = −0.5 (the plain
    # mean would be −1/3) → Â = [1.5, −0.5, −0.5]; scale_by_std plays no part.
    r, lengths = torch.tensor([1.0, -1.0, -1.0]), torch.tensor([2, 4, 2])
    for scale in (True, False):
        adv = group_advantages(r, 3, scale_by_std=scale, estimator="opo", lengths=lengths)
        torch.testing.assert_close(adv, torch.tensor([1.5, -0.5, -0.5]))


def test_grpo_passk_hand_computed() -> None:
    # [0.5, 1, −1, 0]: best 1, runner-up 0.5, margin 0.5; mean 0.125, deviations
    # [0.375, 0.875, −1.125, −0.125], unbiased var = (0.140625 + 0.765625 + 1.265625 + 0.015625)/3
    # = 0.729167, std 0.853913 → Â_best = 0.5 / (0.853913 + 1e-6) = 0.585540, the others 0.
    # [1, 1, −1, 0]: two best tie: margin 0 → all 0.
    r = torch.tensor([0.5, 1.0, -1.0, 0.0, 1.0, 1.0, -1.0, 0.0], dtype=F64)
    adv = group_advantages(r, 4, estimator="grpo_passk")
    want = torch.tensor([0, 0.585540, 0, 0, 0, 0, 0, 0], dtype=F64)
    torch.testing.assert_close(adv, want, atol=1e-6, rtol=0)
    adv = group_advantages(r, 4, scale_by_std=False, estimator="grpo_passk")
    assert adv.tolist() == [0, 0.5, 0, 0, 0, 0, 0, 0]


def test_gpg_hand_computed() -> None:
    # [1, 0 | 0, 1]: B = 4 responses, 2 with a nonzero reward → α = 4/2 = 2;
    # R − group mean = [0.5, −0.5, −0.5, 0.5] → Â = [1, −1, −1, 1] (no std).
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2, estimator="gpg")
    assert adv.tolist() == [1.0, -1.0, -1.0, 1.0]
    # ±1 rewards: no zero, α = 1: Dr.GRPO's R − mean.
    r = torch.tensor([1.0, -1.0, -1.0, -1.0])
    torch.testing.assert_close(
        group_advantages(r, 4, estimator="gpg"), group_advantages(r, 4, scale_by_std=False)
    )


def test_remax_hand_computed() -> None:
    # Prompt 0: [1, −1, 1], its greedy response scored −1 → [2, 0, 2].
    # Prompt 1: [−1, −1, −1], greedy 1 → [−2, −2, −2]: a constant group still learns (the
    # baseline is not the group's).
    r = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, -1.0])
    adv = group_advantages(r, 3, estimator="remax", baseline_rewards=torch.tensor([-1.0, 1.0]))
    assert adv.tolist() == [2.0, 0.0, 2.0, -2.0, -2.0, -2.0]
    # ReMax's own setting, one sample per prompt: R − R_greedy.
    one = group_advantages(r[:2], 1, estimator="remax", baseline_rewards=torch.tensor([0.5, 0]))
    assert one.tolist() == [0.5, -1.0]


def test_reinforce_plus_plus_hand_computed() -> None:
    # One group [1, −1] of lengths [1, 3]; the return of each token is R (γ = 1), so the
    # tokens are [1 | −1, −1, −1]: N = 4, mean = −2/4 = −0.5, unbiased var =
    # (1.5² + 3·0.5²)/3 = 3/3 = 1 → Â = [1.5, −0.5] (÷ sqrt(1 + 1e-8)).
    r, lengths = torch.tensor([[1.0, -1.0]], dtype=F64), torch.tensor([[1, 3]])
    tok = advantages(AdvantageInputs(r, lengths=lengths), "reinforce_plus_plus")
    want = torch.tensor([[[1.5, 0, 0], [-0.5, -0.5, -0.5]]], dtype=F64)
    torch.testing.assert_close(tok, want)
    flat = group_advantages(r.view(-1), 2, estimator="reinforce_plus_plus", lengths=lengths[0])
    torch.testing.assert_close(flat, torch.tensor([1.5, -0.5], dtype=F64))
    # γ = 0.5: the second response's returns are γ^(2−t)·(−1) = [−0.25, −0.5, −1]; tokens
    # [1, −0.25, −0.5, −1]: mean −0.1875, deviations [1.1875, −0.0625, −0.3125, −0.8125],
    # Σ squares 2.171875, unbiased var 0.723958, std 0.850858 →
    # [1.395653 | −0.073456, −0.367274, −0.954916].
    x = AdvantageInputs(r, lengths=lengths, gamma=0.5)
    tok = advantages(x, "reinforce_plus_plus")
    want = torch.tensor([[[1.395653, 0, 0], [-0.073456, -0.367274, -0.954916]]], dtype=F64)
    torch.testing.assert_close(tok, want, atol=1e-5, rtol=0)


def test_group_advantages_refuses_advantages_that_vary_along_a_response(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # group_advantages returns one value per response: a per-token estimator whose values
    # vary (REINFORCE++ at γ = 0.5, registered under a name of its own) is refused, not cut.
    spec = ADVANTAGE_ESTIMATORS["reinforce_plus_plus"]
    discounted = Estimator(
        lambda x: spec.fn(dataclasses.replace(x, gamma=0.5)),
        spec.needs,
        per_token=True,
        group_relative=False,
    )
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "discounted", discounted)
    with pytest.raises(ValueError, match="vary along a response"):
        group_advantages(
            torch.tensor([1.0, -1.0]), 2, estimator="discounted", lengths=torch.tensor([1, 3])
        )


def test_reinforce_plus_plus_baseline_hand_computed() -> None:
    # Groups [1, −1] (lengths [1, 3]) and [1, 1] (lengths [2, 2]): R − group mean = [1, −1, 0, 0].
    # Over the 8 tokens: mean = (1·1 + 3·(−1))/8 = −0.25; Σ L (a − mean)² = 1.5625 + 3·0.5625 +
    # 4·0.0625 = 3.5, unbiased var = 3.5/7 = 0.5, 1/std = 1.414214 →
    # Â = [1.25, −0.75, 0.25, 0.25]·1.414214 = [1.767767, −1.060660, 0.353553, 0.353553]:
    # the constant group gets the batch's shift, not 0.
    adv = group_advantages(
        torch.tensor([1.0, -1.0, 1.0, 1.0], dtype=F64),
        2,
        estimator="reinforce_plus_plus_baseline",
        lengths=torch.tensor([1, 3, 2, 2]),
    )
    torch.testing.assert_close(
        adv, torch.tensor([1.767767, -1.060660, 0.353553, 0.353553], dtype=F64), atol=1e-6, rtol=0
    )


def test_gdpo_hand_computed() -> None:
    # One group of three, two tokens each. Correctness [1, 1, −1] → GRPO [0.57735, 0.57735,
    # −1.154701]; overlong penalty [0, −0.3, 0] → GRPO [0.57735, −1.154701, 0.57735] (each
    # component on its own scale). Sum [1.154701, −0.57735, −0.57735]: mean 0, unbiased var over
    # the 6 tokens 2·(1.333333 + 0.333333 + 0.333333)/5 = 0.8, std 0.894427 →
    # Â = [1.290994, −0.645497, −0.645497]. GRPO of the summed reward [1, 0.7, −1] gives the
    # second response +0.43: there the 0.3 penalty is drowned by the ±1 correctness.
    r = torch.tensor([1.0, 0.7, -1.0], dtype=F64)
    comps = torch.tensor([[1.0, 0.0], [1.0, -0.3], [-1.0, 0.0]], dtype=F64)
    adv = group_advantages(
        r, 3, estimator="gdpo", lengths=torch.tensor([2, 2, 2]), components=comps
    )
    torch.testing.assert_close(
        adv, torch.tensor([1.290994, -0.645497, -0.645497], dtype=F64), atol=1e-5, rtol=0
    )
    assert float(group_advantages(r, 3)[1]) > 0.4
    # Weights: the penalty weighted 0 leaves whitened GRPO of correctness alone.
    only_score = group_advantages(
        r,
        3,
        estimator="gdpo",
        lengths=torch.tensor([2, 2, 2]),
        components=comps,
        component_weights=(1.0, 0.0),
    )
    torch.testing.assert_close(only_score[0], only_score[1])


def test_optimal_token_baseline_hand_computed() -> None:
    # One group, R = [1, −1, 1], lengths [2, 2, 1]; π(y_t) = 0.5 and Σπ² = 0.5 (w = 1 − 1 + 0.5
    # = 0.5) except response 1's second token: π = 0.9, Σπ² = 0.82 (w = 1 − 1.8 + 0.82 = 0.02).
    # W (cumulative): [0.5, 1.0], [0.5, 0.52], [0.5].
    # t = 0: B = (0.5 − 0.5 + 0.5) / 1.5 = 1/3; t = 1: B = (1.0 − 0.52) / 1.52 = 0.315789.
    # Two responses share the longest length: no tail without a baseline.
    # Â = [0.666667, 0.684211], [−1.333333, −1.315789], [0.666667].
    x = AdvantageInputs(
        torch.tensor([[1.0, -1.0, 1.0]], dtype=F64),
        lengths=torch.tensor([[2, 2, 1]]),
        old_logprobs=torch.log(torch.tensor([[[0.5, 0.5], [0.5, 0.9], [0.5, 0.5]]], dtype=F64)),
        sum_pi_squared=torch.tensor([[[0.5, 0.5], [0.5, 0.82], [0.5, 0.5]]], dtype=F64),
    )
    want = torch.tensor([[[0.666667, 0.684211], [-1.333333, -1.315789], [0.666667, 0.0]]])
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        torch.testing.assert_close(advantages(x, name), want.to(F64), atol=1e-6, rtol=0)
    # Response 2 alone the longest (length 2 vs 1, 1): its second token has no baseline.
    y = AdvantageInputs(
        torch.tensor([[1.0, -1.0, 1.0]], dtype=F64),
        lengths=torch.tensor([[1, 1, 2]]),
        old_logprobs=torch.full((1, 3, 2), math.log(0.5), dtype=F64),
        sum_pi_squared=torch.full((1, 3, 2), 0.5, dtype=F64),
    )
    # t = 0: equal W → B = mean = 1/3 → [2/3 | −4/3 | 2/3, 1 − 0]
    torch.testing.assert_close(
        advantages(y, "optimal_token_baseline"),
        torch.tensor([[[2 / 3, 0], [-4 / 3, 0], [2 / 3, 1.0]]], dtype=F64),
    )
    with pytest.raises(ValueError, match="needs per-token statistics"):
        group_advantages(torch.zeros(4), 2, estimator="optimal_token_baseline")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"estimator": "remax"}, "needs baseline_rewards: \\[P\\] the reward of each prompt"),
        ({"estimator": "opo"}, "needs lengths"),
        (
            {"estimator": "remax", "baseline_rewards": torch.zeros(3)},
            r"baseline_rewards has shape \(3,\): expected \[2\]",
        ),
        ({"estimator": "opo", "lengths": torch.ones(3)}, "lengths has 3 rows for 4 rewards"),
        (
            {
                "estimator": "gdpo",
                "lengths": torch.ones(4),
                "components": torch.zeros(4, 2),
                "component_weights": (1.0,),
            },
            "component_weights has 1 entries for 2 components",
        ),
        ({"estimator": "opo", "lengths": -torch.ones(4)}, "lengths must be >= 0"),
    ],
)
def test_missing_or_misshapen_inputs_are_clear_value_errors(
    kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2, **kwargs)  # type: ignore[arg-type]


# --- properties of every estimator --------------------------------------------------------------

batches = st.tuples(
    st.integers(min_value=1, max_value=4),  # P
    st.integers(min_value=1, max_value=5),  # G
    st.integers(min_value=0, max_value=2**31 - 1),  # seed
    st.sampled_from(["pm1", "shaped", "constant", "wide"]),
)


def _random_batch(p: int, g: int, seed: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 2, (p, g), generator=gen).to(F64) * 2 - 1
    if kind == "shaped":
        r = r - torch.rand(p, g, generator=gen, dtype=F64) * (torch.rand(p, g, generator=gen) < 0.5)
    elif kind == "constant":
        r = torch.full((p, g), 0.1, dtype=F64)
    elif kind == "wide":
        r = 1e3 * torch.randn(p, g, generator=gen, dtype=F64)
    lengths = torch.randint(0, 4, (p, g), generator=gen)  # empty and single-token responses
    return r, lengths


@pytest.mark.parametrize("estimator", ESTIMATORS)
@FAST
@given(batch=batches, scale=st.booleans())
def test_every_estimator_is_finite_and_zero_on_empty_responses(
    estimator: str, batch: tuple[int, int, int, str], scale: bool
) -> None:
    r, lengths = _random_batch(*batch)
    comps = torch.stack([r, torch.zeros_like(r)], dim=-1)
    x = _inputs_for(r, lengths, scale_by_std=scale, components=comps)
    adv = advantages(x, estimator)
    assert bool(torch.isfinite(adv).all())
    empty = lengths == 0
    assert bool((adv[empty] == 0).all())
    # No spread in the rewards: nothing to learn. Not for ReMax (its baseline is another
    # rollout's reward), nor the optimal token baselines: a response alone in its group, or
    # alone past the others' length, has no baseline there and keeps its R (verl's rule).
    learns_from_rewards_alone = estimator != "remax" and "optimal_token" not in estimator
    if batch[3] == "constant" and learns_from_rewards_alone:
        assert bool((adv == 0).all())


def _whiten_tol(
    values: torch.Tensor, lengths: torch.Tensor, a: float, b: float
) -> dict[str, float]:
    """How far whitening a·v + b can be from whitening v, from the ε = 1e-8 that verl's
    whitening adds to the variance s² and to the token count n of the mean: relatively
    sqrt((s² + ε) / (s² + ε / a²)), at most ε·|1/a² − 1| / (2 s²) from 1; absolutely the
    mean's ε/n error, at most ε·(|a·v| + |b|) / (a·s), for either batch. (s² biased here: a
    smaller s², a looser bound.) A fixed 1e-4 failed on a batch of s² ≈ 9e-4 at a = 1/8."""
    tokens = torch.repeat_interleave(values.flatten(), lengths.flatten())
    spread = float(tokens.var(unbiased=False)) if tokens.numel() > 1 else 0.0
    if spread == 0:
        return {"atol": 1e-9, "rtol": 1e-9}
    top = float(tokens.abs().max())
    mean_error = 1e-8 * ((a + 1) * top + abs(b)) / (min(a, 1.0) * spread**0.5)
    return {"atol": mean_error + 1e-9, "rtol": 1e-8 * abs(1 / a**2 - 1) / spread + 1e-9}


@FAST
@given(batch=batches, a=st.floats(min_value=0.1, max_value=10), b=st.floats(-5, 5))
def test_reinforce_plus_plus_is_invariant_to_an_affine_change_of_all_rewards(
    batch: tuple[int, int, int, str], a: float, b: float
) -> None:
    # Whitening over the batch's tokens removes any a·R + b with a > 0 (γ = 1).
    r, lengths = _random_batch(*batch)
    assume(batch[3] != "constant")
    base = advantages(AdvantageInputs(r, lengths=lengths), "reinforce_plus_plus")
    moved = advantages(AdvantageInputs(a * r + b, lengths=lengths), "reinforce_plus_plus")
    torch.testing.assert_close(moved, base, **_whiten_tol(r, lengths, a, b))


@FAST
@given(batch=batches, a=st.floats(min_value=0.1, max_value=10), b=st.floats(-5, 5))
def test_reinforce_plus_plus_baseline_is_whitened_and_ignores_each_groups_offset(
    batch: tuple[int, int, int, str], a: float, b: float
) -> None:
    r, lengths = _random_batch(*batch)
    x = AdvantageInputs(r, lengths=lengths)
    adv = advantages(x, "reinforce_plus_plus_baseline")
    # A different offset per group and one common positive scale change nothing.
    offsets = b * torch.arange(r.shape[0], dtype=F64)[:, None]
    moved = advantages(
        AdvantageInputs(a * r + offsets, lengths=lengths), "reinforce_plus_plus_baseline"
    )
    centred = r - r.mean(dim=1, keepdim=True)
    torch.testing.assert_close(moved, adv, **_whiten_tol(centred, lengths, a, 0.0))
    n = float(lengths.sum())
    if bool((adv != 0).any()):  # whitened over the tokens: mean 0, unbiased variance 1
        mean = float((adv * lengths).sum()) / n
        var = float((adv**2 * lengths).sum()) / (n - 1)
        assert abs(mean) < 1e-6 and var == pytest.approx(1.0, abs=1e-4)


@FAST
@given(batch=batches, scale=st.booleans())
def test_gdpo_without_a_second_component_and_unscaled_is_reinforce_plus_plus_baseline(
    batch: tuple[int, int, int, str], scale: bool
) -> None:
    # whiten(Σ_k w_k GRPO(R^k)) with one component and no std: whiten(R − group mean).
    r, lengths = _random_batch(*batch)
    gdpo = advantages(AdvantageInputs(r, scale_by_std=False, lengths=lengths), "gdpo")
    rpp = advantages(AdvantageInputs(r, lengths=lengths), "reinforce_plus_plus_baseline")
    torch.testing.assert_close(gdpo, rpp)
    # A component that is 0 everywhere adds nothing.
    zero = torch.stack([r, torch.zeros_like(r)], dim=-1)
    both = AdvantageInputs(r, scale_by_std=scale, lengths=lengths, components=zero)
    alone = AdvantageInputs(r, scale_by_std=scale, lengths=lengths)
    torch.testing.assert_close(advantages(both, "gdpo"), advantages(alone, "gdpo"))


@FAST
@given(batch=batches)
def test_opo_is_dr_grpo_when_lengths_are_equal_and_length_weighted_mean_zero(
    batch: tuple[int, int, int, str],
) -> None:
    r, lengths = _random_batch(*batch)
    assume(r.shape[1] > 1)
    same = torch.full_like(lengths, 3)
    opo = advantages(AdvantageInputs(r, lengths=same), "opo")
    torch.testing.assert_close(opo, advantages(AdvantageInputs(r, scale_by_std=False), "grpo"))
    adv = advantages(AdvantageInputs(r, lengths=lengths), "opo")
    weighted = (adv * lengths).sum(dim=1)
    torch.testing.assert_close(weighted, torch.zeros_like(weighted), atol=1e-9, rtol=0)


@FAST
@given(batch=batches, scale=st.booleans())
def test_grpo_passk_credits_one_best_response_per_group(
    batch: tuple[int, int, int, str], scale: bool
) -> None:
    r, _ = _random_batch(*batch)
    adv = advantages(AdvantageInputs(r, scale_by_std=scale), "grpo_passk")
    assert bool(((adv != 0).sum(dim=1) <= 1).all())
    assert bool((adv >= 0).all())
    hit = adv != 0
    assert bool((r[hit] == r.max(dim=1).values[hit.any(dim=1)]).all())


@FAST
@given(batch=batches, c=st.floats(-5, 5))
def test_remax_moves_with_the_baseline_only(batch: tuple[int, int, int, str], c: float) -> None:
    r, _ = _random_batch(*batch)
    base = torch.linspace(-1, 1, r.shape[0], dtype=F64)
    adv = advantages(AdvantageInputs(r, baseline_rewards=base), "remax")
    shifted = advantages(AdvantageInputs(r + c, baseline_rewards=base + c), "remax")
    torch.testing.assert_close(shifted, adv)
    same = advantages(AdvantageInputs(r, baseline_rewards=r[:, 0]), "remax")
    assert bool((same[:, 0] == 0).all())


@FAST
@given(batch=batches)
def test_optimal_token_baseline_with_equal_statistics_is_the_group_mean(
    batch: tuple[int, int, int, str],
) -> None:
    # Equal lengths and equal per-token statistics: every W_{j,t} is the same, so B_t is the
    # group's mean reward and Â_{i,t} = R_i − mean (Dr.GRPO) on every token.
    r, _ = _random_batch(*batch)
    P, G = r.shape
    assume(G > 1)
    T = 3
    x = AdvantageInputs(
        r,
        lengths=torch.full((P, G), T),
        old_logprobs=torch.full((P, G, T), math.log(0.3), dtype=F64),
        sum_pi_squared=torch.full((P, G, T), 0.2, dtype=F64),
    )
    want = advantages(AdvantageInputs(r, scale_by_std=False), "grpo")[..., None].expand(P, G, T)
    # (up to the 1e-8 verl adds to the denominator, relative to the rewards' size)
    atol = 1e-7 * max(float(r.abs().max()), 1.0)
    torch.testing.assert_close(advantages(x, "optimal_token_baseline"), want, atol=atol, rtol=0)


def test_masked_whiten_hand_computed_and_degenerate_cases() -> None:
    # Values [1, 3] with counts [1, 3]: N = 4 tokens, mean = 10/4 = 2.5, unbiased var =
    # (1.5² + 3·0.5²)/3 = 1 → [−1.5, 0.5]
    out = masked_whiten(torch.tensor([1.0, 3.0], dtype=F64), torch.tensor([1, 3]))
    torch.testing.assert_close(out, torch.tensor([-1.5, 0.5], dtype=F64))
    assert masked_whiten(torch.tensor([2.0]), torch.tensor([1])).tolist() == [0.0]  # one token
    assert masked_whiten(torch.tensor([2.0, 2.0]), torch.tensor([3, 0])).tolist() == [0.0, 0.0]
    assert masked_whiten(torch.tensor([0.1, 0.1]), torch.tensor([2, 5])).tolist() == [0.0, 0.0]
