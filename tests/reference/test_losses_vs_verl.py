"""Policy losses and advantage estimators against verl 0.9.1's core_algos, whose functions are
taken out of .venv-verl's source file (see conftest.py for how). `make test-reference`.

For each loss mode verl registers (vanilla, gspo, cispo, clip_cov, kl_cov, geo_mean, sapo,
dppo_tv, dppo_kl, dro, gpg) and each aggregation both sides implement, over seeded random batches
(ragged masks, all-masked rows, single-token responses, ratios from inside the clip range to
e^±16, rollout-correction weights or none): the loss value, its gradient w.r.t. the log-probs,
and the statistics verl reports must be verl's. Where verl fixes its aggregation (GSPO's default,
SAPO's forced sequence mean, GMPO's plain mean over rows) the comparison uses that one.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
import torch

from dapo_core.algo.advantages import group_advantages
from dapo_core.algo.losses import AGG_MODES, LossMetrics, LossParams, policy_loss

pytestmark = pytest.mark.reference

F64 = torch.float64
CASES = 150
MODES = {
    "vanilla": "compute_policy_loss_vanilla",
    "gspo": "compute_policy_loss_gspo",
    "cispo": "compute_policy_loss_cispo",
    "clip_cov": "compute_policy_loss_clip_cov",
    "kl_cov": "compute_policy_loss_kl_cov",
    "dppo_tv": "compute_policy_loss_dppo_tv",
    "dppo_kl": "compute_policy_loss_dppo_kl",
    "dro": "compute_policy_loss_dro",
    "gpg": "compute_policy_loss_gpg",
}
# verl's aggregation modes, all of which we implement under the same names.
AGGS = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "token-sum",
    "seq-mean-token-sum",
)
# Knobs away from their defaults so that they matter: a covariance band and shares that pick
# several tokens of these small batches.
PARAMS = LossParams(
    clip_cov_ratio=0.2,
    clip_cov_lb=-0.5,
    clip_cov_ub=2.0,
    kl_cov_ratio=0.15,
    ppo_kl_coef=0.3,
    tau_pos=1.0,
    tau_neg=1.05,
    dro_beta=0.7,
)


def _batch(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, 7, (1,), generator=g))
    T = int(torch.randint(1, 13, (1,), generator=g))
    if seed % 7 == 0:
        T = 1  # single-token responses
    lp = -3.0 * torch.rand(B, T, generator=g, dtype=F64)
    # From inside the clip range to far outside it (|log r| up to ~16 in the last).
    spread = [0.05, 0.3, 1.5, 4.0][seed % 4]
    # Old log-probs are log-probabilities too (≤ 0): DPPO reads the probabilities themselves.
    old = (lp + spread * torch.randn(B, T, generator=g, dtype=F64)).clamp(max=-1e-4)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = max(int(lengths[0]), 1)  # at least one token in the batch
    if B > 1 and seed % 5 == 0:
        lengths[-1] = 0  # an all-masked row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    adv = torch.randn(B, generator=g, dtype=F64)
    adv[torch.rand(B, generator=g) < 0.2] = 0.0
    weights = None
    if seed % 2:
        weights = 2.0 * torch.rand(B, T, generator=g, dtype=F64)
    return {
        "lp": lp,
        "old": old,
        "mask": mask,
        "adv": adv,
        "weights": weights,
        "clip_low": [0.2, 0.1, 0.3, 0.5][seed % 4],
        "clip_high": [0.28, 0.2, 0.4][seed % 3],
        "clip_c": [3.0, None][seed % 2],
    }


def _config(core: dict[str, Any], b: dict[str, Any]) -> Any:
    """verl's ActorConfig stand-in with the variant knobs of PARAMS."""
    clip_c = b["clip_c"] if b["clip_c"] is not None else 20.0  # DPPO's fallback when unset
    config = core["ActorConfig"](b["clip_low"], b["clip_high"], clip_c=clip_c)
    config.policy_loss = types.SimpleNamespace(
        clip_cov_ratio=PARAMS.clip_cov_ratio,
        clip_cov_lb=PARAMS.clip_cov_lb,
        clip_cov_ub=PARAMS.clip_cov_ub,
        kl_cov_ratio=PARAMS.kl_cov_ratio,
        ppo_kl_coef=PARAMS.ppo_kl_coef,
        dro_beta=PARAMS.dro_beta,
    )
    config.tau_pos, config.tau_neg = PARAMS.tau_pos, PARAMS.tau_neg
    return config


def _ours(
    b: dict[str, Any], mode: str, agg: str, seed: int, **counts: int
) -> tuple[torch.Tensor, LossMetrics, torch.Tensor]:
    lp = b["lp"].clone().requires_grad_(True)
    nonempty = int((b["mask"].sum(-1) > 0).sum())
    if agg == "seq-mean-token-sum-norm":  # verl divides by the non-empty rows and the padded length
        counts = {"num_seqs": nonempty, **counts}
    torch.manual_seed(seed)  # clip_cov draws its tokens from torch's generator, as verl does
    loss, metrics = policy_loss(
        lp,
        b["old"],
        b["adv"],  # [B], broadcast over tokens
        b["mask"],
        clip_low=b["clip_low"],
        clip_high=b["clip_high"],
        clip_c=b["clip_c"] if mode in ("vanilla", "dppo_tv", "dppo_kl") else None,
        agg=agg,
        max_len=b["lp"].shape[1],
        loss_mode=mode,
        token_weights=b["weights"],
        params=PARAMS,
        **counts,
    )
    loss.backward()
    assert lp.grad is not None
    return loss.detach(), metrics, lp.grad


def _verl(
    core: dict[str, Any], b: dict[str, Any], mode: str, agg: str | None, seed: int
) -> tuple[torch.Tensor, dict, torch.Tensor]:
    lp = b["lp"].clone().requires_grad_(True)
    adv = b["adv"][:, None] * b["mask"]  # verl's advantages are [B, T], zero on padding
    config = _config(core, b)
    if mode == "vanilla" and b["clip_c"] is None:
        config.clip_ratio_c = 1e30  # our "no dual clip"
    kwargs = {} if agg is None else {"loss_agg_mode": agg}
    torch.manual_seed(seed)
    loss, metrics = core[f"compute_policy_loss_{mode}"](
        b["old"], lp, adv, b["mask"], config=config, rollout_is_weights=b["weights"], **kwargs
    )
    loss.backward()
    assert lp.grad is not None
    return loss.detach(), metrics, lp.grad


def _close(ours: torch.Tensor, theirs: torch.Tensor, where: str) -> None:
    # verl divides per-sequence sums by (count + 1e-8): agreement to ~1e-8 relative.
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-9, msg=where)


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode", list(MODES))
def test_policy_losses_equal_verls(verl_core: dict[str, Any], mode: str, agg: str) -> None:
    active = 0
    for seed in range(CASES):
        b = _batch(seed)
        loss, metrics, grad = _ours(b, mode, agg, seed)
        v_loss, v_metrics, v_grad = _verl(verl_core, b, mode, agg, seed)
        where = f"{mode}/{agg}, seed {seed}"
        _close(loss, v_loss, where)
        _close(grad, v_grad, where)
        c = metrics.counts
        n = c.tokens
        clip = (c.clip_high + c.clip_low) / n
        if mode in ("vanilla", "gspo", "cispo", "dppo_tv", "dppo_kl"):
            # verl's pg_clipfrac: clipped at either bound (DPPO: outside the trust region);
            # pg_clipfrac_lower: the dual clip (DPPO: the truncated IS weight).
            assert clip == pytest.approx(v_metrics["actor/pg_clipfrac"], abs=1e-6), where
            lower = v_metrics["actor/pg_clipfrac_lower"]
            assert c.clip_dual / n == pytest.approx(lower, abs=1e-6), where
            active += clip > 0
        if mode == "clip_cov":  # verl's pg_clipfrac is the share of detached tokens
            assert c.selected / n == pytest.approx(v_metrics["actor/pg_clipfrac"], abs=1e-6)
            active += c.selected > 0
        if mode == "kl_cov":
            assert c.selected == max(1, int(n * PARAMS.kl_cov_ratio)), where
            active += 1
        if mode in ("dro", "gpg"):
            active += 1
        if mode == "kl_cov":  # verl reports mean |log r| there
            abs_kl = float((b["old"] - b["lp"]).abs().mul(b["mask"]).sum() / n)
            assert abs_kl == pytest.approx(v_metrics["actor/ppo_kl"], abs=1e-6), where
        elif mode != "gpg":
            assert c.sum_kl / n == pytest.approx(v_metrics["actor/ppo_kl"], abs=1e-6), where
    assert active >= CASES // 4  # the mechanism acted in many of the batches compared


def test_clip_cov_selection_chose_tokens_and_they_differ_from_vanilla(
    verl_core: dict[str, Any],
) -> None:
    # The band of PARAMS selects tokens in many batches, so the comparison above was not
    # between two vanilla losses: where tokens were detached the loss moved.
    moved = 0
    for seed in range(CASES):
        b = _batch(seed)
        cov, metrics, _ = _ours(b, "clip_cov", "token-mean", seed)
        vanilla, _, _ = _ours({**b, "clip_c": None}, "vanilla", "token-mean", seed)
        if metrics.counts.selected > 0:
            moved += not torch.allclose(cov, vanilla)
    assert moved >= CASES // 4


def test_sapo_under_verls_forced_sequence_mean(verl_core: dict[str, Any]) -> None:
    # verl's SAPO aggregates by "seq-mean-token-mean" whatever mode it is given.
    for seed in range(CASES):
        b = _batch(seed)
        loss, metrics, grad = _ours(b, "sapo", "seq-mean-token-mean", seed)
        v_loss, v_metrics, v_grad = _verl(verl_core, b, "sapo", "token-mean", seed)
        _close(loss, v_loss, f"seed {seed}")
        _close(grad, v_grad, f"seed {seed}")
        n = metrics.counts.tokens
        assert v_metrics["actor/pg_clipfrac"] == 0.0 == metrics.counts.clip_high
        assert metrics.counts.sum_kl / n == pytest.approx(v_metrics["actor/ppo_kl"], abs=1e-6)


def test_geo_mean_under_verls_mean_over_rows(verl_core: dict[str, Any]) -> None:
    # verl's GMPO ignores its aggregation mode: the mean of the sequence losses over every row
    # of the batch, ours under "seq-mean-token-mean" with num_seqs = B.
    clipped = 0
    for seed in range(CASES):
        b = _batch(seed)
        B = b["lp"].shape[0]
        loss, metrics, grad = _ours(b, "geo_mean", "seq-mean-token-mean", seed, num_seqs=B)
        v_loss, v_metrics, v_grad = _verl(verl_core, b, "geo_mean", None, seed)
        _close(loss, v_loss, f"seed {seed}")
        _close(grad, v_grad, f"seed {seed}")
        n = metrics.counts.tokens
        assert metrics.counts.sum_kl / n == pytest.approx(v_metrics["actor/ppo_kl"], abs=1e-6)
        # verl's clip fractions count every clamped log-ratio by the sign of A; ours only those
        # where the clip binds (x > ε_high for A > 0, x < −ε_low for A < 0): never more (verl
        # divides by count + 1e-8).
        assert metrics.counts.clip_high / n <= v_metrics["actor/pg_clipfrac"] + 1e-6
        assert metrics.counts.clip_low / n <= v_metrics["actor/pg_clipfrac_lower"] + 1e-6
        clipped += metrics.counts.clip_high + metrics.counts.clip_low > 0
    assert clipped >= CASES // 4


def test_gspo_under_verls_default_aggregation(verl_core: dict[str, Any]) -> None:
    # verl's compute_policy_loss_gspo defaults to the paper's sequence-level aggregation.
    default = verl_core["compute_policy_loss_gspo"].__defaults__[0]
    assert default == "seq-mean-token-mean"
    for seed in range(CASES):
        b = _batch(seed)
        v_loss, _, _ = _verl(verl_core, b, "gspo", None, seed)
        loss, _, _ = _ours(b, "gspo", default, seed)
        _close(loss, v_loss, f"seed {seed}")


@pytest.mark.parametrize("agg", AGGS)
def test_aggregations_equal_verls_agg_loss(verl_core: dict[str, Any], agg: str) -> None:
    from dapo_core.algo.losses import aggregate

    assert set(AGGS) <= set(AGG_MODES)
    for seed in range(CASES):
        b = _batch(seed)
        g = torch.Generator().manual_seed(seed)
        loss_mat = torch.randn(b["lp"].shape, generator=g, dtype=F64)
        theirs = verl_core["agg_loss"](loss_mat, b["mask"], agg)
        nonempty = int((b["mask"].sum(-1) > 0).sum())
        counts = {"num_seqs": nonempty} if agg == "seq-mean-token-sum-norm" else {}
        ours = aggregate(loss_mat, b["mask"], agg, max_len=b["lp"].shape[1], **counts)
        _close(ours, theirs, f"{agg}, seed {seed}")


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
