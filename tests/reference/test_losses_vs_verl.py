"""Policy losses and advantage estimators against verl 0.9.1's core_algos, whose functions are
taken out of .venv-verl's source file (see conftest.py for how). `make test-reference`.

For each loss mode (vanilla, gspo, cispo) and each aggregation both sides implement, over seeded
random batches (ragged masks, empty rows, ratios far outside the clip range, rollout-correction
weights or none): the loss value, its gradient w.r.t. the log-probs, and the clip and KL
statistics must be verl's. GSPO is compared under verl's default aggregation for it
("seq-mean-token-mean", the paper's) and under "token-mean".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from dapo_core.algo.advantages import group_advantages
from dapo_core.algo.losses import LossCounts, policy_loss

pytestmark = pytest.mark.reference

F64 = torch.float64
CASES = 150
MODES = {
    "vanilla": "compute_policy_loss_vanilla",
    "gspo": "compute_policy_loss_gspo",
    "cispo": "compute_policy_loss_cispo",
}
AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _batch(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, 7, (1,), generator=g))
    T = int(torch.randint(1, 13, (1,), generator=g))
    lp = -3.0 * torch.rand(B, T, generator=g, dtype=F64)
    spread = [0.05, 0.3, 1.5][seed % 3]  # from inside the clip range to far outside it
    old = lp + spread * torch.randn(B, T, generator=g, dtype=F64)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = max(int(lengths[0]), 1)  # at least one token in the batch
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    adv = torch.randn(B, generator=g, dtype=F64)
    adv[torch.rand(B, generator=g) < 0.2] = 0.0
    weights = None
    if seed % 2:
        weights = 2.0 * torch.rand(B, T, generator=g, dtype=F64)
    clip_low = [0.2, 0.1, 0.3, 0.5][seed % 4]
    clip_high = [0.28, 0.2, 0.4][seed % 3]
    return {
        "lp": lp,
        "old": old,
        "mask": mask,
        "adv": adv,
        "weights": weights,
        "clip_low": clip_low,
        "clip_high": clip_high,
    }


def _ours(b: dict[str, Any], mode: str, agg: str) -> tuple[torch.Tensor, LossCounts, torch.Tensor]:
    lp = b["lp"].clone().requires_grad_(True)
    nonempty = int((b["mask"].sum(-1) > 0).sum())
    loss, _, counts = policy_loss(
        lp,
        b["old"],
        b["adv"],  # [B], broadcast over tokens
        b["mask"],
        clip_low=b["clip_low"],
        clip_high=b["clip_high"],
        clip_c=3.0 if mode == "vanilla" else None,
        agg=agg,
        # verl's seq-mean-token-sum-norm divides by the non-empty rows and the padded length.
        num_seqs=nonempty if agg == "seq-mean-token-sum-norm" else None,
        max_len=b["lp"].shape[1],
        loss_mode=mode,
        token_weights=b["weights"],
    )
    loss.backward()
    assert lp.grad is not None
    return loss.detach(), counts, lp.grad


def _verl(
    core: dict[str, Any], b: dict[str, Any], mode: str, agg: str
) -> tuple[torch.Tensor, dict, torch.Tensor]:
    lp = b["lp"].clone().requires_grad_(True)
    adv = b["adv"][:, None] * b["mask"]  # verl's advantages are [B, T], zero on padding
    loss, metrics = core[MODES[mode]](
        b["old"],
        lp,
        adv,
        b["mask"],
        loss_agg_mode=agg,
        config=core["ActorConfig"](b["clip_low"], b["clip_high"], clip_c=3.0),
        rollout_is_weights=b["weights"],
    )
    loss.backward()
    assert lp.grad is not None
    return loss.detach(), metrics, lp.grad


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode", list(MODES))
def test_policy_losses_equal_verls(verl_core: dict[str, Any], mode: str, agg: str) -> None:
    clipped = 0
    for seed in range(CASES):
        b = _batch(seed)
        loss, counts, grad = _ours(b, mode, agg)
        v_loss, v_metrics, v_grad = _verl(verl_core, b, mode, agg)
        where = f"{mode}/{agg}, seed {seed}"
        # verl divides per-sequence sums by (count + 1e-8): agreement to ~1e-8 relative.
        torch.testing.assert_close(loss, v_loss, rtol=1e-6, atol=1e-9, msg=where)
        torch.testing.assert_close(grad, v_grad, rtol=1e-6, atol=1e-9, msg=where)
        n = counts.tokens
        # verl's pg_clipfrac counts clipping at either bound; pg_clipfrac_lower is the dual clip.
        clip = (counts.clip_high + counts.clip_low) / n
        assert clip == pytest.approx(v_metrics["actor/pg_clipfrac"], abs=1e-6), where
        dual = counts.clip_dual / n
        assert dual == pytest.approx(v_metrics["actor/pg_clipfrac_lower"], abs=1e-6), where
        assert counts.sum_kl / n == pytest.approx(v_metrics["actor/ppo_kl"], abs=1e-6), where
        clipped += clip > 0
    assert clipped >= CASES // 4  # the clip was active in many of the batches compared


def test_gspo_under_verls_default_aggregation(verl_core: dict[str, Any]) -> None:
    # verl's compute_policy_loss_gspo defaults to the paper's sequence-level aggregation.
    default = verl_core["compute_policy_loss_gspo"].__defaults__[0]
    assert default == "seq-mean-token-mean"
    for seed in range(CASES):
        b = _batch(seed)
        lp = b["lp"].clone().requires_grad_(True)
        v_loss, _ = verl_core["compute_policy_loss_gspo"](
            b["old"],
            lp,
            b["adv"][:, None] * b["mask"],
            b["mask"],
            config=verl_core["ActorConfig"](b["clip_low"], b["clip_high"]),
            rollout_is_weights=b["weights"],
        )
        loss, _, _ = _ours(b, "gspo", default)
        torch.testing.assert_close(loss, v_loss.detach(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    ("estimator", "verl_name"),
    [("grpo", "compute_grpo_outcome_advantage"), ("rloo", "compute_rloo_outcome_advantage")],
)
def test_advantages_equal_verls(verl_core: dict[str, Any], estimator: str, verl_name: str) -> None:
    for seed in range(CASES):
        g = torch.Generator().manual_seed(seed)
        G = int(torch.randint(2, 9, (1,), generator=g))  # verl's RLOO keeps R_i when G = 1
        P = int(torch.randint(1, 6, (1,), generator=g))
        rewards = torch.randint(-1, 2, (P * G,), generator=g).to(F64)  # ±1, 0: constant groups too
        rewards += 0.3 * torch.rand(P * G, generator=g, dtype=F64) * (seed % 2)
        index = np.repeat(np.arange(P), G)
        T = 3
        token_rewards = torch.zeros(P * G, T, dtype=F64)
        token_rewards[:, -1] = rewards  # outcome reward on the last token
        v_adv, _ = verl_core[verl_name](token_rewards, torch.ones(P * G, T, dtype=F64), index)
        ours = group_advantages(rewards, G, estimator=estimator)
        torch.testing.assert_close(ours, v_adv[:, 0], rtol=1e-6, atol=1e-9, msg=f"seed {seed}")
