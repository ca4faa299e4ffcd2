"""Advantage estimators against verl 0.9.1's own functions (core_algos.py, taken out of
.venv-verl's source file: see conftest.py). `make test-reference`.

Over seeded random batches: P groups of G responses with ragged lengths (empty responses
included where verl accepts them), rewards from {−1, 0, 1} (so constant groups come up) with an
overlong-style shaping on some, single-token responses, and for the per-token estimators random
log-probs, Σπ² and rollout-IS weights. verl's outcome reward sits on each response's last token
(`token_level_rewards`, `[B, T]`); its advantages are `[B, T]`, ours `[P, G]` broadcast over
each response's tokens or `[P, G, T]`.

Where the two differ by design, the cases leave it out and say so:
  * a group of one response: ours gives a group-relative estimator 0, verl R / (1 + ε) (GRPO)
    or R (RLOO, OPO, GPG's mean 0), and raises for pass@k; G >= 2 here for those;
  * a batch with one response token in all: verl's whitening raises (division by zero), ours
    gives 0; checked on its own.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
import torch

from dapo_core.algo.advantages import AdvantageInputs, advantages, group_advantages

pytestmark = pytest.mark.reference

F64 = torch.float64
CASES = 200
TOL = {"rtol": 1e-6, "atol": 1e-9}
F32_TOL = {"rtol": 1e-5, "atol": 1e-6}


def _batch(seed: int, *, min_g: int = 2, empty: bool = True) -> dict[str, Any]:
    """A random batch: rewards [P, G], lengths [P, G], verl's token rewards / mask [B, T]."""
    g = torch.Generator().manual_seed(seed)
    G = int(torch.randint(min_g, 7, (1,), generator=g))
    P = int(torch.randint(1, 5, (1,), generator=g))
    T = int(torch.randint(1, 9, (1,), generator=g))  # T = 1: every response one token
    rewards = torch.randint(-1, 2, (P, G), generator=g).to(F64)
    if seed % 3 == 1:  # shaped: a soft overlong penalty on some responses
        rewards -= torch.rand(P, G, generator=g, dtype=F64) * (torch.rand(P, G, generator=g) < 0.3)
    if seed % 5 == 0:
        rewards[0] = rewards[0, 0]  # one constant group at least
    low = 0 if empty and seed % 4 == 0 else 1
    lengths = torch.randint(low, T + 1, (P, G), generator=g)
    lengths.view(-1)[0] = T  # the batch is T wide
    mask = (torch.arange(T)[None, :] < lengths.reshape(-1, 1)).to(F64)  # [B, T]
    token_rewards = torch.zeros(P * G, T, dtype=F64)
    last = (lengths.reshape(-1) - 1).clamp(min=0)
    token_rewards[torch.arange(P * G), last] = rewards.reshape(-1)
    return {
        "gen": g,
        "P": P,
        "G": G,
        "T": T,
        "rewards": rewards,
        "lengths": lengths,
        "mask": mask,
        "token_rewards": token_rewards,
        "index": np.repeat(np.arange(P), G),
    }


def _per_seq(b: dict[str, Any], v_adv: torch.Tensor) -> torch.Tensor:
    """verl's [B, T] advantages of a per-sequence estimator as [P, G]: each response's value,
    after checking that it is one value on all of its tokens and 0 past its end."""
    mask = b["mask"].bool()
    first = v_adv[:, :1].expand_as(v_adv)
    torch.testing.assert_close(torch.where(mask, v_adv, first), first, rtol=0, atol=1e-12)
    assert bool((v_adv[~mask] == 0).all())
    return v_adv[:, 0].reshape(b["P"], b["G"]) * (b["lengths"] > 0)


def _close_whitened(
    ours: torch.Tensor, verl: torch.Tensor, msg: str, tol: dict[str, float] = TOL
) -> None:
    """Whitened advantages equal verl's; where every whitened value was the same, ours are
    exactly 0 and verl's are the 1e-8 it adds to the token count, amplified by 1/sqrt(1e-8):
    (v − v·N/(N + 1e-8)) / 1e-4, at most |v|·1e-4 / N."""
    if bool((ours == 0).all()):
        assert float(verl.abs().max()) < 1e-4, msg
        return
    torch.testing.assert_close(ours, verl, **tol, msg=msg)


def _inputs(b: dict[str, Any], **kw: Any) -> AdvantageInputs:
    return AdvantageInputs(**{"rewards": b["rewards"], "lengths": b["lengths"], **kw})


@pytest.mark.parametrize("scale", [True, False])
def test_grpo_passk_equals_verls(verl_core: dict[str, Any], scale: bool) -> None:
    fn = verl_core["compute_grpo_passk_outcome_advantage"]
    for seed in range(CASES):
        b = _batch(seed)
        config = {"norm_adv_by_std_in_grpo": scale}
        v_adv, _ = fn(b["token_rewards"], b["mask"], b["index"], config=config)
        ours = advantages(_inputs(b, scale_by_std=scale), "grpo_passk")
        torch.testing.assert_close(ours, _per_seq(b, v_adv), **TOL, msg=f"seed {seed}")


@pytest.mark.parametrize(
    ("estimator", "verl_name"),
    [("opo", "compute_opo_outcome_advantage"), ("gpg", "compute_gpg_outcome_advantage")],
)
def test_group_baselines_equal_verls(
    verl_core: dict[str, Any], estimator: str, verl_name: str
) -> None:
    for seed in range(CASES):
        b = _batch(seed, empty=estimator == "gpg")  # verl's OPO divides by 0 on an empty group
        v_adv, _ = verl_core[verl_name](b["token_rewards"], b["mask"], b["index"])
        ours = advantages(_inputs(b), estimator)
        torch.testing.assert_close(ours, _per_seq(b, v_adv), **TOL, msg=f"seed {seed}")


def test_opo_of_a_group_of_empty_responses_is_zero_where_verls_is_nan(
    verl_core: dict[str, Any],
) -> None:
    # Group 0's responses are all empty: its weights Σ_j L_j are 0, verl's baseline 0/0.
    b = _batch(3)
    G = b["G"]
    b["lengths"][0] = 0
    mask = (torch.arange(b["T"])[None, :] < b["lengths"].reshape(-1, 1)).to(F64)
    v_adv, _ = verl_core["compute_opo_outcome_advantage"](b["token_rewards"], mask, b["index"])
    assert bool(torch.isnan(v_adv[:G]).all())
    ours = advantages(_inputs(b), "opo")
    assert bool(torch.isfinite(ours).all()) and bool((ours[0] == 0).all())


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5])
def test_reinforce_plus_plus_equals_verls(verl_core: dict[str, Any], gamma: float) -> None:
    fn = verl_core["compute_reinforce_plus_plus_outcome_advantage"]
    checked = 0
    for seed in range(CASES):
        b = _batch(seed, min_g=1)  # no group baseline: G = 1 is an ordinary batch here
        ours = advantages(_inputs(b, gamma=gamma), "reinforce_plus_plus")  # [P, G, T]
        if b["mask"].sum() <= 1:  # verl's whitening raises; ours gives 0
            assert bool((ours == 0).all())
            continue
        v_adv, _ = fn(b["token_rewards"], b["mask"], config=types.SimpleNamespace(gamma=gamma))
        _close_whitened(ours.reshape(-1, b["T"]), v_adv, f"seed {seed}")
        checked += 1
        if gamma == 1.0:  # one value per response: group_advantages takes it
            flat = group_advantages(
                b["rewards"].reshape(-1),
                b["G"],
                estimator="reinforce_plus_plus",
                lengths=b["lengths"].reshape(-1),
            )
            _close_whitened(flat.view(b["P"], b["G"]), _per_seq(b, v_adv), f"seed {seed}")
    assert checked > CASES // 2


def test_reinforce_plus_plus_baseline_equals_verls(verl_core: dict[str, Any]) -> None:
    fn = verl_core["compute_reinforce_plus_plus_baseline_outcome_advantage"]
    for seed in range(CASES):
        b = _batch(seed)
        ours = advantages(_inputs(b), "reinforce_plus_plus_baseline")
        if b["mask"].sum() <= 1:
            assert bool((ours == 0).all())
            continue
        v_adv, _ = fn(b["token_rewards"], b["mask"], b["index"])
        _close_whitened(ours, _per_seq(b, v_adv), f"seed {seed}")


def test_remax_equals_verls(verl_core: dict[str, Any]) -> None:
    fn = verl_core["compute_remax_outcome_advantage"]
    for seed in range(CASES):
        b = _batch(seed, min_g=1)  # ReMax's paper samples one response per prompt
        greedy = torch.randint(-1, 2, (b["P"],), generator=b["gen"]).to(F64)
        greedy -= 0.5 * torch.rand(b["P"], generator=b["gen"], dtype=F64) * (seed % 2)
        v_adv, _ = fn(b["token_rewards"], greedy.repeat_interleave(b["G"]), b["mask"])
        ours = advantages(_inputs(b, baseline_rewards=greedy), "remax")
        torch.testing.assert_close(ours, _per_seq(b, v_adv), **TOL, msg=f"seed {seed}")


def _gdpo_verl_call(
    b: dict[str, Any], comps: torch.Tensor, weights: Any, scale: bool
) -> torch.Tensor:
    """verl's GDPO reads each component from the non-tensor batch and writes it on the token
    before the first padding of `attention_mask`'s response part (the last token)."""
    Lp = 2
    attention = torch.cat([torch.ones(b["P"] * b["G"], Lp), b["mask"]], dim=1).long()
    keys = [f"c{k}" for k in range(comps.shape[-1])]
    config: dict[str, Any] = {"gdpo_reward_keys": keys}
    if weights is not None:
        config["gdpo_reward_weights"] = list(weights)
    non_tensor = {k: comps[..., j].reshape(-1).numpy() for j, k in enumerate(keys)}
    batch = {"prompts": torch.zeros(b["P"] * b["G"], Lp), "attention_mask": attention}
    v_adv, _ = b["verl_gdpo"](
        b["token_rewards"],
        b["mask"],
        b["index"],
        config=config,
        non_tensor_batch=non_tensor,
        batch=batch,
        norm_adv_by_std_in_grpo=scale,
    )
    return v_adv


@pytest.mark.parametrize("scale", [True, False])
def test_gdpo_equals_verls(verl_core: dict[str, Any], scale: bool) -> None:
    fn = verl_core["compute_gdpo_outcome_advantage"]
    checked = 0
    for seed in range(CASES):
        b = _batch(seed, empty=False)  # verl writes an empty response's score off its row
        b["verl_gdpo"] = fn
        if b["mask"].sum() <= 1:
            continue
        # Two components like the trainer's: correctness ±1 and an overlong penalty ≤ 0
        # (all 0 in some batches: that component is then constant in every group).
        score = torch.randint(0, 2, (b["P"], b["G"]), generator=b["gen"]).to(F64) * 2 - 1
        penalty = -torch.rand(b["P"], b["G"], generator=b["gen"], dtype=F64) * (seed % 3 != 0)
        comps = torch.stack([score, penalty], dim=-1).to(torch.float32).to(F64)  # verl: float32
        weights = None if seed % 2 else (1.0, [0.5, 2.0, 0.0][seed % 3])
        v_adv = _gdpo_verl_call(b, comps, weights, scale)
        # verl turns each component into float32 (np.float32) before it normalises it: so do
        # we here, or its rounding, blown up by whitening where the components nearly cancel,
        # is all that differs.
        x = _inputs(
            b,
            rewards=b["rewards"].float(),
            components=comps.float(),
            component_weights=weights,
            scale_by_std=scale,
        )
        ours = advantages(x, "gdpo").double()
        _close_whitened(ours, _per_seq(b, v_adv.to(F64)), f"seed {seed}", F32_TOL)
        checked += 1
    assert checked > CASES // 2


def test_gdpo_without_components_is_whitened_grpo_like_verls(verl_core: dict[str, Any]) -> None:
    fn = verl_core["compute_gdpo_outcome_advantage"]
    for seed in range(CASES):
        b = _batch(seed)
        if b["mask"].sum() <= 1:
            continue
        v_adv, _ = fn(b["token_rewards"], b["mask"], b["index"])
        ours = advantages(_inputs(b), "gdpo")
        _close_whitened(ours, _per_seq(b, v_adv), f"seed {seed}")


@pytest.mark.parametrize(
    ("estimator", "verl_name"),
    [
        ("optimal_token_baseline", "compute_optimal_token_baseline_advantage"),
        ("tir_optimal_token_baseline", "compute_multi_turn_optimal_token_baseline_advantage"),
    ],
)
def test_optimal_token_baselines_equal_verls(
    verl_core: dict[str, Any], estimator: str, verl_name: str
) -> None:
    for seed in range(CASES):
        b = _batch(seed, min_g=1)
        g, shape = b["gen"], (b["P"] * b["G"], b["T"])
        # π of the sampled token spread from near 0 to near 1; Σπ² between π² and π² + (1−π)²
        old = torch.log(torch.rand(shape, generator=g, dtype=F64).clamp(min=1e-6))
        pi = old.exp()
        sum_pi2 = pi**2 + torch.rand(shape, generator=g, dtype=F64) * (1 - pi) ** 2
        is_w = 2.0 * torch.rand(shape, generator=g, dtype=F64) if seed % 2 else None
        v_adv, _ = verl_core[verl_name](
            b["token_rewards"], b["mask"], b["index"], old, sum_pi2, rollout_is_weights=is_w
        )
        P, G = b["P"], b["G"]
        x = _inputs(
            b,
            old_logprobs=old.reshape(P, G, -1),
            sum_pi_squared=sum_pi2.reshape(P, G, -1),
            is_weights=None if is_w is None else is_w.reshape(P, G, -1),
        )
        ours = advantages(x, estimator)
        torch.testing.assert_close(ours.reshape(shape), v_adv, **TOL, msg=f"seed {seed}")


def test_whitening_a_single_token_batch_is_zero_where_verl_raises(
    verl_core: dict[str, Any],
) -> None:
    token_rewards = torch.tensor([[1.0]], dtype=F64)
    mask = torch.ones(1, 1, dtype=F64)
    with pytest.raises(ValueError, match="sum of the mask is one"):
        verl_core["compute_reinforce_plus_plus_outcome_advantage"](
            token_rewards, mask, config=types.SimpleNamespace(gamma=1.0)
        )
    x = AdvantageInputs(rewards=torch.tensor([[1.0]], dtype=F64), lengths=torch.tensor([[1]]))
    assert torch.equal(advantages(x, "reinforce_plus_plus"), torch.zeros(1, 1, 1, dtype=F64))
