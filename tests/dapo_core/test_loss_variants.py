"""The trust-region family beyond the clipped surrogate: clip_cov, kl_cov, geo_mean, sapo,
dppo_tv, dppo_kl, dro, gpg (verl 0.9.1), luspo and vespo (TRL 1.16). Hand-computed cases (the
arithmetic in the comments) and the invariants each paper states; the differential tests against
verl's and TRL's own code are in tests/reference/, the exactness over micro-batches for every
mode in tests/dapo_core/test_losses.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_common import metric_names as M
from dapo_core.algo.losses import (
    LossCounts,
    LossParams,
    batch_selection,
    clip_cov_selection,
    kl_cov_selection,
    policy_loss,
    vespo_weight,
)

FAST = settings(max_examples=40, deadline=None)
F64 = torch.float64


def _t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def _run(
    lp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mode: str,
    *,
    mask: torch.Tensor | None = None,
    agg: str = "token-mean",
    eps: tuple[float, float] = (0.2, 0.28),
    **kw: object,
) -> tuple[torch.Tensor, torch.Tensor, LossCounts]:
    """(loss, d loss / d lp, counts) of one policy_loss call."""
    leaf = lp.clone().requires_grad_(True)
    m = torch.ones(lp.shape, dtype=torch.bool) if mask is None else mask
    loss, metrics = policy_loss(
        leaf, old, adv, m, clip_low=eps[0], clip_high=eps[1], agg=agg, loss_mode=mode, **kw
    )  # type: ignore[arg-type]
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad, metrics.counts


def _batch(seed: int, B: int, T: int, spread: float = 0.5) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    lp = -2.0 * torch.rand(B, T, generator=g, dtype=F64) - 0.01
    old = (lp + spread * torch.randn(B, T, generator=g, dtype=F64)).clamp(max=-1e-3)
    adv = torch.randn(B, generator=g, dtype=F64)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = max(int(lengths[0]), 1)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return lp, old, adv, mask


# --- Clip-Cov and KL-Cov (Cui et al. 2025, arXiv 2505.22617) -----------------------------------

# Two sequences of two tokens, A = +1 and −1. The means over the 4 tokens: Ā = 0, mean log π =
# (−0.5 − 1.5 − 0.7 − 1.3)/4 = −1. Covariance terms (A − Ā)(log π − mean):
#   row 0: (+1)(+0.5) = 0.5,  (+1)(−0.5) = −0.5;   row 1: (−1)(+0.3) = −0.3,  (−1)(−0.3) = 0.3
COV_LP = _t([[-0.5, -1.5], [-0.7, -1.3]])
COV_ADV = _t([1.0, -1.0])


def test_clip_cov_detaches_the_band_tokens_hand_computed() -> None:
    # Band (0.2, 1.0) holds (0,0) cov 0.5 and (1,1) cov 0.3; clip_cov_ratio 0.5 → ⌊0.5·4⌋ = 2:
    # both. r = 1 (old = lp): the surrogate is −A per token, [−1, −1; +1, +1]; the two chosen
    # are zeroed → [0, −1; +1, 0], token-mean 0. Gradient −A·r / 4 on the others only.
    p = LossParams(clip_cov_ratio=0.5, clip_cov_lb=0.2, clip_cov_ub=1.0)
    loss, grad, counts = _run(COV_LP, COV_LP, COV_ADV, "clip_cov", params=p)
    assert loss.item() == pytest.approx(0.0)
    torch.testing.assert_close(grad, _t([[0.0, -0.25], [0.25, 0.0]]))
    assert counts.selected == 2


def test_clip_cov_draws_among_the_band_and_never_a_clipped_token() -> None:
    # clip_cov_ratio 0.25 → one token, drawn between the two band tokens; over seeds both come up.
    m = torch.ones(2, 2, dtype=torch.bool)
    adv = COV_ADV[:, None].expand(2, 2)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "clip_cov_lb": 0.2, "clip_cov_ub": 1.0}
    seen = set()
    for seed in range(30):
        g = torch.Generator().manual_seed(seed)
        chosen = clip_cov_selection(COV_LP, COV_LP, adv, m, clip_cov_ratio=0.25, generator=g, **kw)
        assert int(chosen.sum()) == 1
        seen.add(tuple(torch.nonzero(chosen)[0].tolist()))
    assert seen == {(0, 0), (1, 1)}
    # Token (0,0) with r = e^0.5 = 1.65 > 1.28 and A > 0 is already cut by the clip: only (1,1)
    # is left in the band, whatever the draw.
    old = COV_LP.clone()
    old[0, 0] -= 0.5
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        chosen = clip_cov_selection(COV_LP, old, adv, m, clip_cov_ratio=0.5, generator=g, **kw)
        assert torch.nonzero(chosen).tolist() == [[1, 1]]


def test_kl_cov_penalises_the_top_covariance_token_hand_computed() -> None:
    # kl_cov_ratio 0.25 → ⌊0.25·4⌋ = 1 token, the largest covariance: (0,0) (0.5).
    # old = lp except old(0,0) = lp − 0.2: log r = 0.2, r = e^0.2 = 1.221403.
    # ℓ(0,0) = −A·r + 0.3·|log r| = −1.221403 + 0.06 = −1.161403; the others −A·1: −1, +1, +1.
    # token-mean: (−1.161403 − 1 + 1 + 1)/4 = −0.040351.
    # ∇(0,0) = (−r + 0.3)/4 = −0.230351; the others −A·r/4: −0.25, +0.25, +0.25.
    old = COV_LP.clone()
    old[0, 0] -= 0.2
    p = LossParams(kl_cov_ratio=0.25, ppo_kl_coef=0.3)
    loss, grad, counts = _run(COV_LP, old, COV_ADV, "kl_cov", params=p)
    assert loss.item() == pytest.approx(-0.040351, abs=1e-6)
    torch.testing.assert_close(grad, _t([[-0.230351, -0.25], [0.25, 0.25]]), atol=1e-6, rtol=0)
    assert counts.selected == 1 and counts.clip_high == counts.clip_low == 0


@FAST
@given(seed=st.integers(0, 10_000), B=st.integers(1, 6), T=st.integers(1, 8))
def test_kl_cov_picks_the_largest_covariance_terms(seed: int, B: int, T: int) -> None:
    lp, _, adv, mask = _batch(seed, B, T)
    a = adv[:, None].expand(B, T)
    chosen = kl_cov_selection(lp, a, mask, kl_cov_ratio=0.3)
    n = int(mask.sum())
    assert int(chosen.sum()) == max(1, int(0.3 * n))
    assert not bool((chosen & ~mask).any())
    m = mask.to(F64)
    cov = (a - (a * m).sum() / n) * (lp - (lp * m).sum() / n)
    if bool((mask & ~chosen).any()):
        assert cov[chosen].min() >= cov[mask & ~chosen].max() - 1e-12


@FAST
@given(seed=st.integers(0, 10_000), B=st.integers(1, 6), T=st.integers(1, 8))
def test_clip_cov_selection_stays_in_its_band(seed: int, B: int, T: int) -> None:
    lp, old, adv, mask = _batch(seed, B, T, spread=0.4)
    p = LossParams(clip_cov_ratio=0.4, clip_cov_lb=-0.1, clip_cov_ub=0.3)
    chosen = batch_selection(
        "clip_cov", lp, old, adv, mask, clip_low=0.2, clip_high=0.28, params=p,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    assert chosen is not None
    a = adv[:, None].expand(B, T)
    n = int(mask.sum())
    m = mask.to(F64)
    cov = (a - (a * m).sum() / n) * (lp - (lp * m).sum() / n)
    r = torch.exp(lp - old)
    cut = -a * r.clamp(0.8, 1.28) > -a * r
    band = mask & ~cut & (cov > -0.1) & (cov < 0.3)
    assert not bool((chosen & ~band).any())  # only band tokens the clip leaves alone
    assert int(chosen.sum()) == min(int(band.sum()), max(1, int(0.4 * n)))
    assert (
        batch_selection("vanilla", lp, old, adv, mask, clip_low=0.2, clip_high=0.2, params=p)
        is None
    )


# --- GMPO (arXiv 2507.20673) ------------------------------------------------------------------


def test_geo_mean_hand_computed() -> None:
    # ε 0.4 both sides (log space). Row 0, A = +1, log r = [0.6, −0.2]: clipped to [0.4, −0.2]
    # (A > 0 takes min(x, clip x)); mean 0.1 → L0 = −e^0.1 = −1.105171.
    # Row 1, A = −1, log r = [−0.6, 0.2]: max(x, clip x) → [−0.4, 0.2]; mean −0.1 →
    # L1 = +e^−0.1 = 0.904837. seq-mean-token-mean: (−1.105171 + 0.904837)/2 = −0.100167.
    # ∇: the clipped tokens none; the others −A·e^mean·(1/2 tokens)·(1/2 rows):
    # row 0 token 1: −1.105171/4 = −0.276293; row 1 token 1: 0.904837/4 = 0.226209.
    lp = _t([[0.6, -0.2], [-0.6, 0.2]]) - 1.0
    old = torch.full((2, 2), -1.0, dtype=F64)
    loss, grad, counts = _run(
        lp, old, _t([1.0, -1.0]), "geo_mean", agg="seq-mean-token-mean", eps=(0.4, 0.4)
    )
    assert loss.item() == pytest.approx(-0.100167, abs=1e-6)
    torch.testing.assert_close(grad, _t([[0.0, -0.276293], [0.0, 0.226209]]), atol=1e-6, rtol=0)
    assert (counts.clip_high, counts.clip_low) == (1, 1)


@FAST
@given(seed=st.integers(0, 10_000), B=st.integers(1, 5), T=st.integers(1, 6))
def test_geo_mean_inside_the_clip_is_the_geometric_mean_ratio(seed: int, B: int, T: int) -> None:
    # With every |log r| inside the range the sequence ratio is exp(mean log r): GMPO's value is
    # −A_i·(Π_t r_t)^(1/|o_i|), the geometric mean of the token ratios.
    lp, old, adv, mask = _batch(seed, B, T, spread=0.05)
    loss, _, _ = _run(
        lp, old, adv, "geo_mean", mask=mask, agg="seq-mean-token-mean", eps=(0.9, 0.9)
    )
    n = mask.sum(-1)
    geo = torch.exp(torch.where(mask, lp - old, 0.0).sum(-1) / n.clamp(min=1))
    rows = n > 0
    expected = (-adv * geo)[rows].sum() / rows.sum()
    torch.testing.assert_close(loss, expected)


# --- SAPO (arXiv 2511.20347) ----------------------------------------------------------------------


def test_sapo_hand_computed() -> None:
    # r = [1, 2], A = [+1, −1]; τ_pos 1, τ_neg 1.05.
    # f(1) = σ(0)·4/1 = 2 → ℓ = −2;  f(2) = σ(1.05)·4/1.05 = 0.740775·3.809524 = 2.822000 → ℓ = +2.822.
    # token-mean (−2 + 2.822)/2 = 0.411000.
    # ∇ = −A·f'(r)·r with f'(r) = 4σ(1 − σ): at r = 1, 1 → −1/2; at r = 2,
    # 4·0.740775·0.259225·2 = 1.536220 → 0.768110.
    lp = torch.log(_t([[1.0, 2.0]])) - 1.0
    old = torch.full((1, 2), -1.0, dtype=F64)
    loss, grad, counts = _run(lp, old, _t([[1.0, -1.0]]), "sapo")
    assert loss.item() == pytest.approx(0.411000, abs=1e-6)
    torch.testing.assert_close(grad, _t([[-0.5, 0.768110]]), atol=1e-6, rtol=0)
    assert counts.clip_high == counts.clip_low == 0


@FAST
@given(
    adv=st.lists(st.floats(-3, 3), min_size=1, max_size=6),
    tau=st.tuples(st.floats(0.1, 5.0), st.floats(0.1, 5.0)),
)
def test_sapo_at_ratio_one_is_the_policy_gradient(
    adv: list[float], tau: tuple[float, float]
) -> None:
    # f'(1) = 4·σ(0)·(1 − σ(0)) = 1 for any τ: on-policy, SAPO's gradient is −A per token.
    lp = torch.full((1, len(adv)), -1.0, dtype=F64)
    a = _t([adv])
    p = LossParams(tau_pos=tau[0], tau_neg=tau[1])
    _, grad, _ = _run(lp, lp, a, "sapo", agg="token-sum", params=p)
    torch.testing.assert_close(grad, -a)


# --- DPPO (arXiv 2602.04879) ------------------------------------------------------------------


def test_dppo_tv_hand_computed() -> None:
    # p_old 0.5 everywhere; A = [+1, +1, −1]; p = [0.8, 0.6, 0.2]; δ_low = 0.2, δ_high = 0.2.
    # p − p_old = [0.3, 0.1, −0.3]: token 0 past +δ_high (A > 0), token 2 past −δ_low (A < 0):
    # both masked. Token 1: r = 1.2, weight min(1.2, 20) = 1.2, ℓ = −1·1.2·ln 0.6 = 0.612991.
    # token-mean 0.612991/3 = 0.204330; ∇ on token 1: −A·w/3 = −0.4.
    lp, old = torch.log(_t([[0.8, 0.6, 0.2]])), torch.log(torch.full((1, 3), 0.5, dtype=F64))
    loss, grad, counts = _run(lp, old, _t([[1.0, 1.0, -1.0]]), "dppo_tv", eps=(0.2, 0.2))
    assert loss.item() == pytest.approx(0.612991 / 3, abs=1e-6)
    torch.testing.assert_close(grad, _t([[0.0, -0.4, 0.0]]))
    assert (counts.clip_high, counts.clip_low, counts.clip_dual) == (1, 1, 0)


def test_dppo_kl_hand_computed() -> None:
    # p_old 0.5; binary KL D = p_old·ln(p_old/p) + (1 − p_old)·ln((1 − p_old)/(1 − p)):
    #   p = 0.8: 0.5·ln(0.625) + 0.5·ln(2.5) = 0.223144 > 0.2 and p > p_old, A > 0: masked;
    #   p = 0.6: 0.020411 ≤ 0.2: kept, r = 1.2;
    #   p = 0.2, A = −1: D = 0.223144 > 0.2 and p < p_old: masked;
    #   p = 0.45, A = −1: D = 0.005025: kept, r = 0.9.
    # ℓ kept: −1·1.2·ln 0.6 = 0.612991 and +1·0.9·ln 0.45 = −0.718657; token-mean over 4:
    # (0.612991 − 0.718657)/4 = −0.026417. ∇: −A·w/4 = [0, −0.3, 0, 0.225].
    lp = torch.log(_t([[0.8, 0.6, 0.2, 0.45]]))
    old = torch.log(torch.full((1, 4), 0.5, dtype=F64))
    loss, grad, counts = _run(lp, old, _t([[1.0, 1.0, -1.0, -1.0]]), "dppo_kl", eps=(0.2, 0.2))
    assert loss.item() == pytest.approx(-0.026417, abs=1e-6)
    torch.testing.assert_close(grad, _t([[0.0, -0.3, 0.0, 0.225]]))
    assert (counts.clip_high, counts.clip_low) == (1, 1)


def test_dppo_truncates_its_weight_at_clip_c() -> None:
    # r = 4 inside a wide trust region (δ 0.9): weight min(4, c). c = 3 → ∇ = −A·3; unset → 20,
    # so the full 4. The truncated token is counted as `clip_dual`.
    lp, old = torch.log(_t([[0.8]])), torch.log(_t([[0.2]]))
    _, grad3, counts3 = _run(lp, old, _t([1.0]), "dppo_tv", eps=(0.9, 0.9), clip_c=3.0)
    _, grad20, counts20 = _run(lp, old, _t([1.0]), "dppo_tv", eps=(0.9, 0.9))
    assert grad3.item() == pytest.approx(-3.0) and counts3.clip_dual == 1
    assert grad20.item() == pytest.approx(-4.0) and counts20.clip_dual == 0


@FAST
@given(seed=st.integers(0, 10_000), B=st.integers(1, 5), T=st.integers(1, 6))
def test_dppo_with_an_open_trust_region_is_truncated_is_reinforce(
    seed: int, B: int, T: int
) -> None:
    # Bounds of about 1 mask nothing (here p ≥ 0.13 and p_old ≤ 0.999, so |p − p_old| < 0.87): with
    # c large, DPPO-TV's gradient is −A·r·∇log π per token, the unclipped surrogate's.
    lp, old, adv, mask = _batch(seed, B, T, spread=0.3)
    _, grad, counts = _run(lp, old, adv, "dppo_tv", mask=mask, eps=(0.99, 1.0), clip_c=1e6)
    r = torch.exp(lp - old)
    expected = torch.where(mask, -adv[:, None] * r, 0.0) / mask.sum()
    torch.testing.assert_close(grad, expected)
    assert counts.clip_high == counts.clip_low == 0


# --- DRO, GPG ---------------------------------------------------------------------------------


def test_dro_hand_computed() -> None:
    # π = 0.5, π_old = 0.25: log r = ln 2 = 0.693147; A = 2, β = 0.5.
    # ℓ = −(A·ln 0.5 − β/2·(ln 2)²) = 1.386294 + 0.120113 = 1.506408; ∇ = −(A − β·ln 2) = −1.653426
    lp, old = torch.log(_t([[0.5]])), torch.log(_t([[0.25]]))
    loss, grad, _ = _run(lp, old, _t([2.0]), "dro", params=LossParams(dro_beta=0.5))
    assert loss.item() == pytest.approx(1.506408, abs=1e-6)
    assert grad.item() == pytest.approx(-1.653426, abs=1e-6)
    with pytest.raises(ValueError, match="dro_beta > 0"):
        _run(lp, old, _t([2.0]), "dro")


def test_gpg_hand_computed() -> None:
    # ℓ = −A·log π: A = 2, π = 0.5 → 1.386294; A = −1, π = 0.25 → −1.386294; ∇ = −A per token.
    lp = torch.log(_t([[0.5], [0.25]]))
    loss, grad, _ = _run(lp, lp + 3.0, _t([2.0, -1.0]), "gpg", agg="token-sum")
    assert loss.item() == pytest.approx(0.0, abs=1e-12)
    torch.testing.assert_close(grad, _t([[-2.0], [1.0]]))  # no ratio: old does not matter


# --- LUSPO, VESPO (TRL 1.16) ------------------------------------------------------------------


def test_luspo_scales_gspo_by_length_hand_computed() -> None:
    # Row 0: r = [2, 0.5], A = +1 → s = 1, GSPO ℓ = −1 per token; LUSPO ×2 → −2 per token.
    # Row 1: one token (the second padded), r = 1.5, A = −1 → s = 1.5, ℓ = max(1.5, 1.28) = 1.5.
    # seq-mean-token-mean: GSPO (−1 + 1.5)/2 = 0.25; LUSPO (−2 + 1.5)/2 = −0.25.
    lp = torch.log(_t([[2.0, 0.5], [1.5, 7.0]]))
    old, mask = torch.zeros(2, 2, dtype=F64), torch.tensor([[True, True], [True, False]])
    kw = {"mask": mask, "agg": "seq-mean-token-mean"}
    gspo, _, _ = _run(lp, old, _t([1.0, -1.0]), "gspo", **kw)  # type: ignore[arg-type]
    luspo, _, _ = _run(lp, old, _t([1.0, -1.0]), "luspo", **kw)  # type: ignore[arg-type]
    assert gspo.item() == pytest.approx(0.25)
    assert luspo.item() == pytest.approx(-0.25)


@FAST
@given(seed=st.integers(0, 10_000), B=st.integers(1, 5), T=st.integers(1, 6))
def test_luspo_is_gspo_under_the_sequence_sum(seed: int, B: int, T: int) -> None:
    # Without weights: LUSPO under seq-mean-token-mean = GSPO under seq-mean-token-sum, value and
    # gradient (the sequence form's gradient, spread evenly, equals the token form's summed).
    lp, old, adv, mask = _batch(seed, B, T, spread=0.3)
    luspo = _run(lp, old, adv, "luspo", mask=mask, agg="seq-mean-token-mean")
    gspo = _run(lp, old, adv, "gspo", mask=mask, agg="seq-mean-token-sum")
    torch.testing.assert_close(luspo[0], gspo[0])
    torch.testing.assert_close(luspo[1], gspo[1])


def test_vespo_hand_computed() -> None:
    # One sequence, A = +1, log r = [0.2, 0.1]: log w = 0.3, w = 1.349859; k 2, λ 3:
    # log φ = 3 + 2·0.3 − 3·1.349859 = −0.449576, φ = 0.637898. ℓ_t = −φ·A·log π_t, φ a constant:
    # ∇ = −φ·A per token, token-mean → −0.318949 each.
    lp = torch.log(_t([[0.5, 0.25]]))
    old = lp - _t([[0.2, 0.1]])
    loss, grad, _ = _run(lp, old, _t([1.0]), "vespo")
    expected = -0.637898 * (math.log(0.5) + math.log(0.25)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    torch.testing.assert_close(
        grad, torch.full((1, 2), -0.637898 / 2, dtype=F64), atol=1e-6, rtol=0
    )


@FAST
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(1, 5),
    T=st.integers(1, 6),
    k=st.floats(0.0, 4.0),
    lam=st.floats(0.1, 5.0),
)
def test_vespo_weight_is_one_on_policy_and_at_most_one(
    seed: int, B: int, T: int, k: float, lam: float
) -> None:
    # φ(w) = e^λ w^k e^{−λw} peaks at w = k/λ; φ(1) = 1. On policy VESPO is GPG.
    lp, old, adv, mask = _batch(seed, B, T)
    kw = {"k_pos": k, "lambda_pos": lam, "k_neg": k, "lambda_neg": lam}
    on = vespo_weight(lp, lp, adv[:, None].expand(B, T), mask, **kw)
    torch.testing.assert_close(on, torch.ones_like(on))
    off = vespo_weight(lp, old, adv[:, None].expand(B, T), mask, **kw)
    w = k / lam  # the maximum: φ(k/λ) = e^{λ − k}·(k/λ)^k
    peak = math.exp(lam - k) * (w**k if w > 0 else 1.0)
    assert bool((off <= max(peak, 1.0) * (1 + 1e-9)).all()) and bool((off >= 0).all())
    p = LossParams(vespo_k_pos=k, vespo_lambda_pos=lam, vespo_k_neg=k, vespo_lambda_neg=lam)
    vespo = _run(lp, lp, adv, "vespo", mask=mask, params=p)
    gpg = _run(lp, lp, adv, "gpg", mask=mask)
    torch.testing.assert_close(vespo[1], gpg[1])


# --- the natural upper tail and the largest ratio (issue 38's metrics) --------------------------


def test_natural_tail_and_ratio_max_hand_computed() -> None:
    # p_old = [0.5, 0.5, 0.9, 0.5], A = [+1, +1, +1, −1]; ε_high 0.28 → eligible: A > 0 and
    # p_old < 1/1.28 = 0.78125 → tokens 0, 1. Ratios r = [1.5, 1.1, 1.05, 1.9]: of the eligible,
    # token 0 passed 1.28 → natural 1/2. The largest ratio is token 3's, 1.9, whatever its A.
    # Under SAPO (no clip at all) the same: the tail is about the ratios, not the mode.
    old = torch.log(_t([[0.5, 0.5, 0.9, 0.5]]))
    lp = old + torch.log(_t([[1.5, 1.1, 1.05, 1.9]]))
    adv = _t([[1.0, 1.0, 1.0, -1.0]])
    for mode in ("vanilla", "sapo", "cispo"):
        _, metrics = policy_loss(
            lp, old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.28, loss_mode=mode
        )
        assert metrics.counts.clip_eligible == 2 and metrics.counts.natural_high == 1, mode
        assert metrics[M.CLIP_RATIO_HIGH_NATURAL] == pytest.approx(0.5), mode
        assert metrics[M.RATIO_MAX] == pytest.approx(1.9), mode


# --- the mechanism table -------------------------------------------------------------------------


def test_the_mechanism_table_shows_what_each_variant_is_about() -> None:
    import dataclasses

    from dapo_core.setup.config import ExperimentConfig
    from db import mechanisms

    config = ExperimentConfig()
    fields = {
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(config)
        if dataclasses.is_dataclass(getattr(config, section.name))
        for f in dataclasses.fields(getattr(config, section.name))
    }
    assert set(mechanisms.FOCUS) <= fields  # every key a config field, spelled as stored
    assert mechanisms.focus_metrics(["algo.loss_mode"])[0] == M.COV_SELECTED
    assert mechanisms.focus_metrics(["algo.top_entropy_quantile"])[0] == M.ENTROPY_KEPT
    assert mechanisms.focus_metrics(["algo.off_policy_mask_threshold"]) == (M.OFF_POLICY_MASKED,)
    # Shown when the runs logged them, in percent.
    logged = [M.COV_SELECTED, M.ENTROPY_KEPT, M.OFF_POLICY_MASKED, M.CLIP_RATIO_HIGH_NATURAL]
    shown = mechanisms.default_metrics(logged)
    assert set(logged) <= set(shown)
    assert all(mechanisms.unit(m) == "%" for m in logged)
