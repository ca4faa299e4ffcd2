"""Policy losses (vanilla, GSPO, CISPO), aggregation modes and KL estimators: hand-computed
cases and invariants. The differential tests against verl's own code are in tests/reference/.

The central property is exact gradient accumulation: with the mini-batch's global counts, the
sum of micro-batch losses is the one-batch loss, in every aggregation mode, and its gradient is
the one-batch gradient. The naive scheme (each micro-batch averaged on its own) is shown to fail.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_common import metric_names as M
from dapo_core.algo.losses import (
    AGG_MODES,
    AGGREGATIONS,
    POLICY_LOSSES,
    LossCounts,
    LossMetrics,
    LossParams,
    aggregate,
    batch_selection,
    clipped_surrogate,
    entropy_bonus,
    get_aggregation,
    kl_penalty,
    masked_mean,
    policy_loss,
)
from dapo_core.setup.config import LOSS_AGGS, LOSS_MODES

FAST = settings(max_examples=40, deadline=None)
F64 = torch.float64
# Knobs that make every mode act on small batches: dro needs its β; the covariance modes pick a
# good share of the tokens from a wide band.
PARAMS = LossParams(
    dro_beta=0.5, clip_cov_ratio=0.3, clip_cov_lb=-1.0, clip_cov_ub=1.0, kl_cov_ratio=0.3
)
# The modes that fold the rollout-correction weights into a sequence weight (GMPO's geometric
# mean, VESPO's Gamma weight) rather than scale each token's loss.
SEQUENCE_WEIGHTED = ("geo_mean", "vespo")


def _selected(
    loss_mode: str, lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor | None:
    """A covariance mode's tokens, chosen once over the whole batch (as the trainer does)."""
    return batch_selection(
        loss_mode,
        lp,
        old,
        adv,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        params=PARAMS,
        generator=torch.Generator().manual_seed(0),
    )


def _t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# --- the per-token surrogate -----------------------------------------------------------------


def test_clipped_surrogate_hand_computed() -> None:
    # ε_low = 0.2, ε_high = 0.28 → clip range [0.8, 1.28]; ℓ = max(−A·r, −A·clip(r))
    ratio = _t([[1.5, 1.1, 0.5, 0.9, 0.5, 1.5]])
    adv = _t([[1.0, 1.0, -1.0, -1.0, 1.0, -1.0]])
    expected = _t(
        [
            [
                -1.28,  # A=+1, r=1.5: max(−1.5, −1.28) = −1.28 (clipped high)
                -1.10,  # A=+1, r=1.1: inside the range
                0.80,  # A=−1, r=0.5: max(0.5, 0.8) = 0.8 (clipped low)
                0.90,  # A=−1, r=0.9: inside the range
                -0.50,  # A=+1, r=0.5: max(−0.5, −0.8) = −0.5 (pessimistic: no clip below for A>0)
                1.50,  # A=−1, r=1.5: max(1.5, 1.28) = 1.5 (no clip above for A<0)
            ]
        ]
    )
    got = clipped_surrogate(ratio, adv, clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(got, expected)


def test_dual_clip_hand_computed() -> None:
    # c = 3, clip range [0.8, 1.28].
    # A=−2, r=4: max(8, 2.56) = 8, then min(8, −A·c = 6) = 6.
    # A=+2, r=4: max(−8, −2.56) = −2.56; the dual clip does not apply to A > 0.
    # A=−2, r=2: max(4, 2.56) = 4 < 6: dual bound not active.
    got = clipped_surrogate(
        _t([[4.0, 4.0, 2.0]]), _t([[-2.0, 2.0, -2.0]]), clip_low=0.2, clip_high=0.28, clip_c=3.0
    )
    torch.testing.assert_close(got, _t([[6.0, -2.56, 4.0]]))


def test_policy_loss_value_gradient_and_metrics_hand_computed() -> None:
    ratios = [1.5, 1.1, 0.5, 0.9, 0.5, 1.5]
    lp = torch.log(_t([ratios])).requires_grad_(True)  # old = 0 → r = exp(lp)
    old = torch.zeros(1, 6, dtype=F64)
    adv = _t([[1.0, 1.0, -1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 6)
    loss, metrics = policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    counts = metrics.counts
    # per token (see the test above): −1.28 −1.1 +0.8 +0.9 −0.5 +1.5 = 0.32; token-mean 0.32/6
    assert loss.item() == pytest.approx(0.32 / 6)
    loss.backward()
    # dℓ/dlp = −A·r where the unclipped branch is active, 0 where the clip is:
    # [0, −1.1, 0, +0.9, −0.5, +1.5] / 6
    torch.testing.assert_close(lp.grad, _t([[0.0, -1.1, 0.0, 0.9, -0.5, 1.5]]) / 6)
    assert metrics[M.CLIP_RATIO_HIGH] == pytest.approx(1 / 6)  # token 0 only
    assert metrics[M.CLIP_RATIO_LOW] == pytest.approx(1 / 6)  # token 2 only
    assert metrics[M.CLIP_RATIO_DUAL] == 0.0
    # k1: mean(old − lp) = −(0.405465 + 0.095310 − 0.693147 − 0.105361 − 0.693147 + 0.405465)/6
    #                    = 0.585415 / 6 = 0.097569
    assert metrics[M.APPROX_KL] == pytest.approx(0.097569, abs=1e-6)
    assert metrics[M.POLICY_LOSS] == pytest.approx(0.32 / 6)
    assert counts.tokens == 6
    assert counts.clip_high == 1 and counts.clip_low == 1


def test_dual_clip_metric_counts_only_negative_advantages() -> None:
    # r = [4, 4, 2], A = [−1, +1, −1], c = 3: only token 0 has A < 0 and r > c.
    lp = torch.log(_t([[4.0, 4.0, 2.0]]))
    _, metrics = policy_loss(
        lp,
        torch.zeros_like(lp),
        _t([[-1.0, 1.0, -1.0]]),
        torch.ones(1, 3),
        clip_low=0.2,
        clip_high=0.28,
        clip_c=3.0,
    )
    assert metrics[M.CLIP_RATIO_DUAL] == pytest.approx(1 / 3)
    assert metrics[M.CLIP_RATIO_HIGH] == pytest.approx(1 / 3)  # token 1: A>0, r=4 > 1.28


def test_clip_higher_keeps_the_gradient_of_a_rising_token() -> None:
    # One token, A = +1, r = 1.25. PPO (ε = 0.2) clips at 1.2: gradient 0.
    # Clip-Higher (ε_high = 0.28) lets it through: dℓ/dlp = −A·r = −1.25.
    grads = {}
    for eps_high in (0.2, 0.28):
        lp = torch.log(_t([[1.25]])).requires_grad_(True)
        loss, _ = policy_loss(
            lp,
            torch.zeros(1, 1, dtype=F64),
            _t([1.0]),
            torch.ones(1, 1),
            clip_low=0.2,
            clip_high=eps_high,
        )
        loss.backward()
        grads[eps_high] = lp.grad.item()
    assert grads[0.2] == 0.0
    assert grads[0.28] == pytest.approx(-1.25)


def test_advantages_per_sequence_broadcast_over_tokens() -> None:
    lp = torch.randn(3, 4, dtype=F64, generator=torch.Generator().manual_seed(0))
    old = lp.detach() + 0.1
    adv = _t([0.5, -1.0, 2.0])
    mask = torch.ones(3, 4)
    a, _ = policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    b, _ = policy_loss(lp, old, adv[:, None].expand(3, 4), mask, clip_low=0.2, clip_high=0.28)
    assert a.item() == b.item()


# --- aggregation -------------------------------------------------------------------------------


LOSS = _t([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_token_mean_hand_computed() -> None:
    # (1 + 2 + 3 + 4) / 4 tokens = 2.5
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(2.5)
    # with a global count of 10 tokens: 10 / 10 = 1
    assert aggregate(LOSS, MASK, "token-mean", num_tokens=10).item() == pytest.approx(1.0)


def test_seq_mean_token_mean_hand_computed() -> None:
    # row means 6/3 = 2 and 4/1 = 4; (2 + 4) / 2 sequences = 3
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(3.0)
    # with a global count of 4 sequences: 6 / 4 = 1.5
    assert aggregate(LOSS, MASK, "seq-mean-token-mean", num_seqs=4).item() == pytest.approx(1.5)


def test_dr_grpo_hand_computed() -> None:
    # sum 10 / (2 sequences · max_len 5) = 1
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_len=5).item() == pytest.approx(1.0)
    # 10 / (4 · 5) = 0.5
    got = aggregate(LOSS, MASK, "seq-mean-token-sum-norm", num_seqs=4, max_len=5)
    assert got.item() == pytest.approx(0.5)


def test_empty_row_leaves_the_defaulted_sequence_count() -> None:
    loss = _t([[2.0, 4.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # row 0 mean (2 + 4)/2 = 3; row 1 has no token: contributes 0 and is not counted → 3 / 1
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    # a num_seqs passed in is the caller's: 3 / 2 = 1.5
    assert aggregate(loss, mask, "seq-mean-token-mean", num_seqs=2).item() == pytest.approx(1.5)
    # token-mean: (2 + 4) / 2 tokens = 3
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(3.0)
    # Dr.GRPO's constant normaliser counts every row: 6 / (2 · 3) = 1
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=3).item() == pytest.approx(1.0)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_no_valid_token_gives_zero_with_a_zero_gradient(agg: str) -> None:
    loss = torch.ones(2, 3, dtype=F64, requires_grad=True)
    out = aggregate(loss, torch.zeros(2, 3), agg, max_len=3)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(2, 3, dtype=F64))


@pytest.mark.parametrize("loss_mode", LOSS_MODES)
@pytest.mark.parametrize("agg", AGG_MODES)
def test_garbage_in_padding_stays_out_of_loss_and_gradient(agg: str, loss_mode: str) -> None:
    # Padded positions hold −inf log-probs (as a model may) and +inf old log-probs.
    lp = _t([[-0.5, -1.0, float("-inf")], [-0.2, float("-inf"), float("-inf")]])
    lp.requires_grad_(True)
    old = _t([[-0.6, -0.9, float("inf")], [-0.3, 0.0, float("nan")]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    weights = _t([[1.0, 0.5, float("nan")], [2.0, float("inf"), 0.0]])
    loss, metrics = policy_loss(
        lp,
        old,
        _t([1.0, -1.0]),
        mask,
        clip_low=0.2,
        clip_high=0.28,
        agg=agg,
        max_len=3,
        loss_mode=loss_mode,
        token_weights=weights,
        params=PARAMS,
    )
    loss.backward()
    assert math.isfinite(loss.item())
    assert torch.isfinite(lp.grad).all()
    assert torch.equal(lp.grad[~mask], torch.zeros(3, dtype=F64))
    assert metrics.counts.clip_eligible == 2  # row 0's tokens: A > 0, p_old < 1/1.28
    assert all(math.isfinite(v) for v in metrics.values())


@FAST
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(1, 5),
    T=st.integers(1, 6),
    agg=st.sampled_from(AGG_MODES),
    loss_mode=st.sampled_from(LOSS_MODES),
    junk=st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e30]),
)
def test_what_padding_holds_never_reaches_loss_choice_or_gradient(
    seed: int, B: int, T: int, agg: str, loss_mode: str, junk: float
) -> None:
    # The same batch twice, its masked positions clean or holding junk (in the log-probs, the
    # old log-probs and the weights): the same covariance choice, loss, gradient and counts.
    lp, old, adv, mask = _batch(seed, B, T)
    w = 2 * torch.rand(B, T, dtype=F64, generator=torch.Generator().manual_seed(seed))
    dirty_lp = torch.where(mask, lp.detach(), junk).requires_grad_(True)
    dirty_old, dirty_w = torch.where(mask, old, junk), torch.where(mask, w, junk)
    clean_sel = _selected(loss_mode, lp, old, adv, mask)
    dirty_sel = _selected(loss_mode, dirty_lp, dirty_old, adv, mask)
    assert (clean_sel is None and dirty_sel is None) or torch.equal(clean_sel, dirty_sel)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0, "agg": agg, "max_len": T}
    kw.update(loss_mode=loss_mode, params=PARAMS, selected=clean_sel)
    clean, clean_m = policy_loss(lp, old, adv, mask, token_weights=w, **kw)
    dirty, dirty_m = policy_loss(dirty_lp, dirty_old, adv, mask, token_weights=dirty_w, **kw)
    torch.testing.assert_close(dirty, clean)
    (g_clean,) = torch.autograd.grad(clean, lp)
    (g_dirty,) = torch.autograd.grad(dirty, dirty_lp)
    torch.testing.assert_close(g_dirty, g_clean)
    assert dirty_m.counts == clean_m.counts


def test_masked_mean() -> None:
    x = _t([[1.0, 2.0], [3.0, float("nan")]])
    m = torch.tensor([[1, 0], [1, 0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)  # (1 + 3) / 2
    assert masked_mean(x, torch.zeros(2, 2)).item() == 0.0


def test_aggregation_registry_matches_the_config() -> None:
    assert tuple(AGGREGATIONS) == AGG_MODES == LOSS_AGGS
    assert all(get_aggregation(name).name == name for name in AGGREGATIONS)
    with pytest.raises(ValueError, match="use one of token-mean, seq-mean-token-mean"):
        get_aggregation("seq-sum")


@pytest.mark.parametrize(
    ("agg", "expected"),
    [
        # rows with 3, 0 and 2 loss tokens, in a mini-batch of 4 rows (one filtered out before)
        ("token-mean", (5, 2)),  # 3 + 0 + 2 tokens; rows with a token: 2
        ("seq-mean-token-mean", (5, 2)),  # the empty row is no sequence of the mean
        ("seq-mean-token-sum-norm", (5, 4)),  # Dr.GRPO: every row of the mini-batch, filtered too
        ("token-sum", (5, 2)),  # no normaliser: the counts go unused
        ("seq-mean-token-sum", (5, 2)),  # the rows with a token, as seq-mean-token-mean
    ],
)
def test_aggregation_counts_hand_computed(agg: str, expected: tuple[int, int]) -> None:
    assert AGGREGATIONS[agg].counts([3, 0, 2], all_rows=4) == expected


def test_aggregation_counts_of_an_empty_mini_batch() -> None:
    assert AGGREGATIONS["token-mean"].counts([], all_rows=0) == (0, 0)
    assert AGGREGATIONS["seq-mean-token-sum-norm"].counts([0, 0], all_rows=2) == (0, 2)


@FAST
@given(seed=st.integers(0, 10_000), B=st.integers(1, 6), T=st.integers(1, 6))
def test_aggregation_counts_are_the_one_batch_defaults(seed: int, B: int, T: int) -> None:
    # A trainer passes the counts to every micro-batch; on one batch they must be exactly the
    # normaliser the mode would have used by default.
    _, _, _, mask = _batch(seed, B, T)
    loss = torch.randn(B, T, dtype=F64, generator=torch.Generator().manual_seed(seed))
    for name, agg in AGGREGATIONS.items():
        num_tokens, num_seqs = agg.counts(mask.sum(-1).tolist(), all_rows=B)
        got = aggregate(loss, mask, name, num_tokens=num_tokens, num_seqs=num_seqs, max_len=T)
        torch.testing.assert_close(got, aggregate(loss, mask, name, max_len=T))


# --- exact gradient accumulation ---------------------------------------------------------------


def _batch(seed: int, B: int, T: int) -> tuple[torch.Tensor, ...]:
    """Random leaf log-probs, old log-probs, advantages [B] and a right-padded mask (row 0 ≥ 1)."""
    g = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(B, T, generator=g, dtype=F64) * 2).requires_grad_(True)
    old = lp.detach() + 0.4 * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, generator=g, dtype=F64)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = max(int(lengths[0]), 1)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # [B, T] bool
    return lp, old, adv, mask


def _global_counts(agg: str, mask: torch.Tensor) -> dict[str, int]:
    """What a trainer passes to every micro-batch of the mini-batch."""
    if agg == "token-mean":
        return {"num_tokens": int(mask.sum())}
    if agg in ("seq-mean-token-mean", "seq-mean-token-sum"):
        return {"num_seqs": int((mask.sum(-1) > 0).sum())}
    if agg == "token-sum":
        return {}
    return {"num_seqs": mask.shape[0]}


def _splits(B: int, cuts: list[int]) -> list[tuple[int, int]]:
    """Contiguous micro-batches of rows; at least two when B ≥ 2 and cuts is not empty."""
    points = sorted({1 + c % (B - 1) for c in cuts})
    edges = [0, *points, B]
    return list(itertools.pairwise(edges))


@FAST
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(2, 7),
    T=st.integers(1, 6),
    cuts=st.lists(st.integers(0, 50), min_size=1, max_size=4),
    agg=st.sampled_from(AGG_MODES),
    clip_c=st.sampled_from([None, 3.0]),
    loss_mode=st.sampled_from(LOSS_MODES),
    weighted=st.booleans(),
)
def test_micro_batches_with_global_counts_give_the_one_batch_gradient(
    seed: int,
    B: int,
    T: int,
    cuts: list[int],
    agg: str,
    clip_c: float | None,
    loss_mode: str,
    weighted: bool,
) -> None:
    lp, old, adv, mask = _batch(seed, B, T)
    w = torch.rand(B, T, dtype=F64, generator=torch.Generator().manual_seed(seed)) * 2
    kw = {"clip_low": 0.2, "clip_high": 0.28, "clip_c": clip_c, "agg": agg, "max_len": T + 2}
    kw["loss_mode"], kw["params"] = loss_mode, PARAMS
    # The covariance modes choose over the whole mini-batch once; each micro-batch its rows.
    chosen = _selected(loss_mode, lp, old, adv, mask)

    full, _ = policy_loss(
        lp, old, adv, mask, token_weights=w if weighted else None, selected=chosen, **kw
    )
    (full_grad,) = torch.autograd.grad(full, lp)

    counts = _global_counts(agg, mask)
    total = torch.zeros((), dtype=F64)
    for a, b in _splits(B, cuts):
        part_w = w[a:b] if weighted else None
        part_sel = chosen[a:b] if chosen is not None else None
        part, _ = policy_loss(
            lp[a:b],
            old[a:b],
            adv[a:b],
            mask[a:b],
            token_weights=part_w,
            selected=part_sel,
            **kw,
            **counts,
        )
        total = total + part
    (micro_grad,) = torch.autograd.grad(total, lp)

    torch.testing.assert_close(total, full)
    torch.testing.assert_close(micro_grad, full_grad)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batches_on_a_linear_policy_give_the_one_batch_parameter_gradient(agg: str) -> None:
    # A tiny "policy": logits = x @ W over a vocabulary of 5; the gradient lands on W.
    g = torch.Generator().manual_seed(7)
    B, T, D, V = 6, 5, 3, 5
    x = torch.randn(B, T, D, generator=g, dtype=F64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    W = torch.randn(D, V, generator=g, dtype=F64, requires_grad=True)
    lengths = torch.tensor([5, 1, 3, 0, 4, 2])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=g, dtype=F64)

    def logprobs(rows: slice) -> torch.Tensor:
        logits = x[rows] @ W  # [b, T, V]
        return torch.log_softmax(logits, -1).gather(-1, tokens[rows, :, None]).squeeze(-1)

    old = (logprobs(slice(None)) + 0.3 * torch.randn(B, T, generator=g, dtype=F64)).detach()
    kw = {"clip_low": 0.2, "clip_high": 0.28, "agg": agg, "max_len": T}

    full, _ = policy_loss(logprobs(slice(None)), old, adv, mask, **kw)
    (full_grad,) = torch.autograd.grad(full, W)

    counts = _global_counts(agg, mask)
    for a, b in [(0, 2), (2, 3), (3, 6)]:
        part, _ = policy_loss(logprobs(slice(a, b)), old[a:b], adv[a:b], mask[a:b], **kw, **counts)
        part.backward()  # gradients accumulate in W.grad, as in a trainer
    torch.testing.assert_close(W.grad, full_grad)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_naive_per_micro_batch_mean_is_not_the_one_batch_gradient(agg: str) -> None:
    # Micro-batch 1 is one short sequence, micro-batch 2 two long ones; each averaged on its own
    # and the results averaged (the usual loss / n_micro accumulation) weighs micro-batch 1's
    # tokens and sequence too much. The same split with global counts is exact.
    lp = (-torch.rand(3, 4, dtype=F64, generator=torch.Generator().manual_seed(1))).requires_grad_(
        True
    )
    old = lp.detach() - 0.05  # r ≈ 1.05: inside the clip range, every token has a gradient
    adv = _t([1.0, -0.5, 2.0])
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    kw = {"clip_low": 0.2, "clip_high": 0.28, "agg": agg}
    full, _ = policy_loss(lp, old, adv, mask, **kw)
    (full_grad,) = torch.autograd.grad(full, lp)

    splits = [(0, 1), (1, 3)]
    naive = sum(policy_loss(lp[a:b], old[a:b], adv[a:b], mask[a:b], **kw)[0] for a, b in splits)
    (naive_grad,) = torch.autograd.grad(naive / len(splits), lp)
    assert not torch.allclose(naive_grad, full_grad)

    counts = _global_counts(agg, mask)
    exact = sum(
        policy_loss(lp[a:b], old[a:b], adv[a:b], mask[a:b], **kw, **counts)[0] for a, b in splits
    )
    (exact_grad,) = torch.autograd.grad(exact, lp)
    torch.testing.assert_close(exact_grad, full_grad)


@FAST
@given(seed=st.integers(0, 10_000), B=st.integers(1, 6), T=st.integers(1, 6), data=st.data())
def test_token_mean_equals_seq_mean_when_all_lengths_are_equal(
    seed: int, B: int, T: int, data: st.DataObject
) -> None:
    L = data.draw(st.integers(1, T))
    lp, old, adv, _ = _batch(seed, B, T)
    mask = (torch.arange(T) < L)[None, :].expand(B, T)
    kw = {"clip_low": 0.2, "clip_high": 0.28}
    a, _ = policy_loss(lp, old, adv, mask, agg="token-mean", **kw)
    b, _ = policy_loss(lp, old, adv, mask, agg="seq-mean-token-mean", **kw)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(torch.autograd.grad(a, lp)[0], torch.autograd.grad(b, lp)[0])


def test_token_mean_differs_from_seq_mean_when_lengths_differ() -> None:
    # LOSS/MASK above: token-mean 2.5, seq-mean-token-mean 3.0
    assert (
        aggregate(LOSS, MASK, "token-mean").item()
        != aggregate(LOSS, MASK, "seq-mean-token-mean").item()
    )


@FAST
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(2, 6),
    T=st.integers(1, 6),
    cut=st.integers(1, 5),
    loss_mode=st.sampled_from(LOSS_MODES),
)
def test_raw_sums_combine_into_the_one_batch_fractions(
    seed: int, B: int, T: int, cut: int, loss_mode: str
) -> None:
    lp, old, adv, mask = _batch(seed, B, T)
    old = lp.detach() + torch.randn(B, T, dtype=F64, generator=torch.Generator().manual_seed(seed))
    kw = {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 2.0, "loss_mode": loss_mode}
    kw["params"] = PARAMS
    chosen = _selected(loss_mode, lp, old, adv, mask)
    _, full = policy_loss(lp, old, adv, mask, selected=chosen, **kw)
    c = min(cut, B - 1)
    parts = [
        policy_loss(
            lp[a:b],
            old[a:b],
            adv[a:b],
            mask[a:b],
            selected=chosen[a:b] if chosen is not None else None,
            **kw,
        )[1].counts
        for a, b in [(0, c), (c, B)]
    ]
    combined = LossMetrics(LossCounts.combine(parts), full[M.POLICY_LOSS])
    assert combined.counts.tokens == full.counts.tokens
    assert combined.counts.ratio_max == full.counts.ratio_max  # a max, not a sum
    for key in full:
        assert combined[key] == pytest.approx(full[key], abs=1e-12, nan_ok=True), key


# --- PPO as the special case ε_low = ε_high, and the dual clip ---------------------------------


def _ppo_clip_reference(
    lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, eps: float
) -> torch.Tensor:
    """PPO's clipped objective (Schulman et al. 2017), written the textbook way: −min(...)."""
    ratio = torch.exp(lp - old)
    surr1 = ratio * adv[:, None]
    surr2 = torch.clamp(ratio, 1 - eps, 1 + eps) * adv[:, None]
    objective = torch.min(surr1, surr2)
    m = mask.to(lp.dtype)
    return -(objective * m).sum() / m.sum()


@FAST
@given(
    seed=st.integers(0, 10_000), B=st.integers(1, 6), T=st.integers(1, 6), eps=st.floats(0.05, 0.5)
)
def test_equal_clip_bounds_give_ppo(seed: int, B: int, T: int, eps: float) -> None:
    lp, old, adv, mask = _batch(seed, B, T)
    ours, _ = policy_loss(lp, old, adv, mask, clip_low=eps, clip_high=eps, agg="token-mean")
    ref = _ppo_clip_reference(lp, old, adv, mask, eps)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(torch.autograd.grad(ours, lp)[0], torch.autograd.grad(ref, lp)[0])


@FAST
@given(
    ratio=st.lists(st.floats(0.01, 20.0), min_size=1, max_size=12),
    data=st.data(),
    c=st.floats(1.01, 10.0),
)
def test_dual_clip_changes_only_negative_advantage_tokens(
    ratio: list[float], data: st.DataObject, c: float
) -> None:
    adv_list = data.draw(st.lists(st.floats(-3.0, 3.0), min_size=len(ratio), max_size=len(ratio)))
    r, a = _t([ratio]), _t([adv_list])
    plain = clipped_surrogate(r, a, clip_low=0.2, clip_high=0.28)
    dual = clipped_surrogate(r, a, clip_low=0.2, clip_high=0.28, clip_c=c)
    nonneg = a >= 0
    assert torch.equal(dual[nonneg], plain[nonneg])
    neg = ~nonneg
    torch.testing.assert_close(dual[neg], torch.minimum(plain[neg], -a[neg] * c))
    assert bool((dual <= plain).all())


# --- loss modes: GSPO and CISPO, and the rollout-correction weights ----------------------------


def test_loss_mode_registry_matches_the_config() -> None:
    assert tuple(POLICY_LOSSES) == LOSS_MODES
    lp = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="loss_mode='ppo': use one of vanilla, gspo, cispo"):
        policy_loss(lp, lp, _t([1.0]), lp, clip_low=0.2, clip_high=0.2, loss_mode="ppo")
    with pytest.raises(ValueError, match=r"token_weights \(2,\) must be \[B, T\]"):
        policy_loss(lp, lp, _t([1.0]), lp, clip_low=0.2, clip_high=0.2, token_weights=torch.ones(2))


def test_gspo_hand_computed() -> None:
    # ε_low 0.2, ε_high 0.28; old = 0 so r = exp(lp); three sequences of two tokens.
    #   row 0: r = [2, 0.5], A = +1: log s = (ln 2 + ln 0.5)/2 = 0, s = 1 → ℓ = [−1, −1]
    #   row 1: r = [1.5, 1.5], A = −1: s = 1.5 → ℓ = max(1.5, 1.28) = 1.5 per token (no clip)
    #   row 2: r = [4, 1], A = +1: log s = (ln 4 + 0)/2 = ln 2, s = 2 > 1.28 → ℓ = −1.28 (clipped)
    # token-mean: (−2 + 3 − 2.56) / 6 = −0.26
    lp = torch.log(_t([[2.0, 0.5], [1.5, 1.5], [4.0, 1.0]])).requires_grad_(True)
    loss, metrics = policy_loss(
        lp,
        torch.zeros(3, 2, dtype=F64),
        _t([1.0, -1.0, 1.0]),
        torch.ones(3, 2),
        clip_low=0.2,
        clip_high=0.28,
        loss_mode="gspo",
    )
    counts = metrics.counts
    assert loss.item() == pytest.approx(-0.26)
    loss.backward()
    # dℓ_t/dlp_t = −A·s on the unclipped branch (s_t = sg[s]·π_t/sg[π_t]), 0 where clipped.
    torch.testing.assert_close(lp.grad, _t([[-1.0, -1.0], [1.5, 1.5], [0.0, 0.0]]) / 6)
    assert counts.clip_high == 2  # both tokens of row 2, by the sequence's ratio
    assert counts.clip_low == 0 and counts.clip_dual == 0
    # k1 is per token, as for vanilla: −(0 + 2 ln 1.5 + ln 4)/6 = −2.197225/6
    assert metrics[M.APPROX_KL] == pytest.approx(-0.366204, abs=1e-6)


def test_gspo_sequence_length_counts_only_the_loss_tokens() -> None:
    # One row, r = [4, e^5 (padding)], mask [1, 0], A = −1: s = 4 (length 1, not 2), so
    # ℓ = max(−A·4, −A·1.28) = 4, and the dual clip does not exist in GSPO (clip_c ignored).
    lp = torch.log(_t([[4.0, math.exp(5.0)]]))
    loss, metrics = policy_loss(
        lp,
        torch.zeros(1, 2, dtype=F64),
        _t([-1.0]),
        torch.tensor([[1, 0]]),
        clip_low=0.2,
        clip_high=0.28,
        clip_c=3.0,
        loss_mode="gspo",
    )
    counts = metrics.counts
    assert loss.item() == pytest.approx(4.0)
    assert counts.clip_dual == 0


def test_cispo_hand_computed() -> None:
    # ε_low 0.2, ε_high 0.28; r = [1.5, 1.1, 0.5, 0.9], A = [+1, +1, −1, −1]
    # w = sg[clip(r, 0.8, 1.28)] = [1.28, 1.1, 0.8, 0.9]; lp = ln r = [0.405465, 0.095310,
    # −0.693147, −0.105361]; ℓ = −w·A·lp = [−0.518995, −0.104841, −0.554518, −0.094825]
    # token-mean: −1.273179 / 4 = −0.318295
    lp = torch.log(_t([[1.5, 1.1, 0.5, 0.9]])).requires_grad_(True)
    loss, metrics = policy_loss(
        lp,
        torch.zeros(1, 4, dtype=F64),
        _t([[1.0, 1.0, -1.0, -1.0]]),
        torch.ones(1, 4),
        clip_low=0.2,
        clip_high=0.28,
        loss_mode="cispo",
    )
    counts = metrics.counts
    assert loss.item() == pytest.approx(-0.318295, abs=1e-6)
    loss.backward()
    # ∇ = −w·A / 4: every token keeps a gradient, the clipped ones too (vanilla gives token 0
    # and token 2 none).
    torch.testing.assert_close(lp.grad, _t([[-1.28, -1.1, 0.8, 0.9]]) / 4)
    assert counts.clip_high == 1  # r = 1.5 > 1.28
    assert counts.clip_low == 1  # r = 0.5 < 0.8
    assert counts.clip_dual == 0


def test_cispo_clip_counts_ignore_the_sign_of_the_advantage() -> None:
    # The clip bounds CISPO's weight whatever A is: r = [1.5, 0.5] with A = [−1, +1] are both
    # clipped (vanilla would count neither: there the clip only binds for A > 0 above, A < 0 below).
    lp = torch.log(_t([[1.5, 0.5]]))
    kw = {"clip_low": 0.2, "clip_high": 0.28}
    old, adv, mask = torch.zeros(1, 2, dtype=F64), _t([[-1.0, 1.0]]), torch.ones(1, 2)
    cispo = policy_loss(lp, old, adv, mask, loss_mode="cispo", **kw)[1].counts
    vanilla = policy_loss(lp, old, adv, mask, loss_mode="vanilla", **kw)[1].counts
    assert (cispo.clip_high, cispo.clip_low) == (1, 1)
    assert (vanilla.clip_high, vanilla.clip_low) == (0, 0)


@FAST
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(1, 5),
    T=st.integers(1, 6),
    agg=st.sampled_from(AGG_MODES),
    eps=st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]),
)
def test_gspo_with_equal_ratios_in_a_sequence_is_the_vanilla_surrogate(
    seed: int, B: int, T: int, agg: str, eps: tuple[float, float]
) -> None:
    # Every token of row i has the same ratio r_i: the geometric mean s_i is r_i, and the
    # gradient of s_{i,t} = sg[s_i]·π_t/sg[π_t] is s_i·∇log π_t, vanilla's r_t·∇log π_t.
    lp, _, adv, mask = _batch(seed, B, T)
    g = torch.Generator().manual_seed(seed + 1)
    row_log_ratio = 0.6 * torch.randn(B, 1, generator=g, dtype=F64)
    old = lp.detach() - row_log_ratio
    kw = {"clip_low": eps[0], "clip_high": eps[1], "agg": agg, "max_len": T}
    gspo, gm = policy_loss(lp, old, adv, mask, loss_mode="gspo", **kw)
    vanilla, vm = policy_loss(lp, old, adv, mask, loss_mode="vanilla", **kw)
    torch.testing.assert_close(gspo, vanilla)
    torch.testing.assert_close(
        torch.autograd.grad(gspo, lp)[0], torch.autograd.grad(vanilla, lp)[0]
    )
    assert (gm.counts.clip_high, gm.counts.clip_low) == (vm.counts.clip_high, vm.counts.clip_low)


@FAST
@given(seed=st.integers(0, 10_000), B=st.integers(1, 5), T=st.integers(1, 6))
def test_cispo_gradient_is_the_clipped_weight_times_the_score(seed: int, B: int, T: int) -> None:
    # ∇_lp Σ ℓ / N = −A·clip(r, 1 − ε_low, 1 + ε_high) / N on loss tokens, 0 elsewhere.
    lp, old, adv, mask = _batch(seed, B, T)
    loss, _ = policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, loss_mode="cispo")
    (grad,) = torch.autograd.grad(loss, lp)
    w = torch.exp(lp.detach() - old).clamp(0.8, 1.28)
    expected = torch.where(mask, -adv[:, None] * w, torch.zeros_like(w)) / mask.sum()
    torch.testing.assert_close(grad, expected)


@FAST
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(1, 5),
    T=st.integers(1, 6),
    agg=st.sampled_from(AGG_MODES),
    loss_mode=st.sampled_from(LOSS_MODES),
)
def test_token_weights_scale_each_tokens_loss(
    seed: int, B: int, T: int, agg: str, loss_mode: str
) -> None:
    # Rollout correction: ℓ_t → w_t·ℓ_t before the aggregation. Ones change nothing, in every
    # mode; zeros remove a token's gradient (its count stays in the normaliser) where a token's
    # loss moves only its own log-prob (not GMPO's and LUSPO's sequence ratio, whose gradient
    # reaches every token, nor VESPO's, which folds the weights into its sequence weight).
    lp, old, adv, mask = _batch(seed, B, T)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "agg": agg, "max_len": T, "loss_mode": loss_mode}
    kw["params"], kw["selected"] = PARAMS, _selected(loss_mode, lp, old, adv, mask)
    plain, plain_metrics = policy_loss(lp, old, adv, mask, **kw)
    ones, ones_metrics = policy_loss(lp, old, adv, mask, token_weights=torch.ones(B, T), **kw)
    torch.testing.assert_close(ones, plain)  # GMPO's geometric mean of ones: 1 + 1e-10
    assert ones_metrics.counts == plain_metrics.counts
    w = torch.rand(B, T, generator=torch.Generator().manual_seed(seed), dtype=F64)
    w[:, 0] = 0.0
    weighted, _ = policy_loss(lp, old, adv, mask, token_weights=w, **kw)
    (grad,) = torch.autograd.grad(weighted, lp)
    if loss_mode not in ("geo_mean", "luspo", "vespo"):
        assert bool((grad[:, 0] == 0).all())
    if loss_mode != "vespo":  # linear in the weights: doubling them doubles the loss
        # GMPO's geometric mean is homogeneous of degree 1 in positive weights only: a zero
        # weight enters as the 1e-10 floor (verl's), which doubling leaves where it is.
        base = w + 0.1 if loss_mode == "geo_mean" else w
        once, _ = policy_loss(lp, old, adv, mask, token_weights=base, **kw)
        doubled, _ = policy_loss(lp, old, adv, mask, token_weights=2 * base, **kw)
        torch.testing.assert_close(doubled, 2 * once)


# --- KL estimators -----------------------------------------------------------------------------


def test_kl_estimators_hand_computed() -> None:
    # π_θ = 0.5, π_ref = 0.25: log ρ = ln(0.25/0.5) = −0.693147, ρ = 0.5
    lp, ref = torch.log(_t([[0.5]])), torch.log(_t([[0.25]]))
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(0.693147, abs=1e-6)  # −log ρ
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.240227, abs=1e-6)  # ½·0.480453
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(0.193147, abs=1e-6)  # 0.5+0.693147−1


# log-probs on a 0.01 grid: a subnormal difference would square to exactly 0.
_LOGP = st.integers(-800, 0).map(lambda i: i / 100)


@FAST
@given(st.lists(st.tuples(_LOGP, _LOGP), min_size=1, max_size=10))
def test_k2_k3_are_nonnegative_and_zero_only_at_equality(pairs: list[tuple[float, float]]) -> None:
    lp = _t([[p for p, _ in pairs]])
    ref = _t([[q for _, q in pairs]])
    k2, k3 = kl_penalty(lp, ref, "k2"), kl_penalty(lp, ref, "k3")
    assert bool((k2 >= 0).all()) and bool((k3 >= 0).all())
    assert torch.equal(k2 == 0, lp == ref)
    assert torch.equal(kl_penalty(ref, ref, "k3"), torch.zeros_like(ref))


def test_k3_stays_finite_where_padding_holds_extreme_values() -> None:
    lp = _t([[-0.5, -1000.0]]).requires_grad_(True)
    ref = _t([[-0.7, 0.0]])
    kl = aggregate(kl_penalty(lp, ref), torch.tensor([[1, 0]]), "token-mean")
    kl.backward()
    assert math.isfinite(kl.item())
    assert torch.isfinite(lp.grad).all()


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"agg": "sum"}, "agg='sum'"),
        ({"agg": "seq-mean-token-sum-norm"}, "needs max_len"),
        ({"clip_c": 1.0}, "dual-clip bound must be > 1"),
        ({"clip_low": 1.0}, "ε_low must be in"),
        ({"num_tokens": 0}, "must be > 0"),
    ],
)
def test_bad_arguments_are_clear_value_errors(kwargs: dict, match: str) -> None:
    lp = torch.zeros(2, 3)
    args = {"clip_low": 0.2, "clip_high": 0.28, **kwargs}
    with pytest.raises(ValueError, match=match):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), **args)


def test_shape_mismatches_are_value_errors() -> None:
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"must be \[B\] or \[B, T\]"):
        policy_loss(lp, lp, torch.zeros(3), torch.ones(2, 3), clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match=r"must all be \[B, T\]"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 4), clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="kind='k4'"):
        kl_penalty(lp, lp, "k4")


def test_row_weights_and_the_long_share_of_each_aggregation() -> None:
    """The token-level loss's signature (§3.3): how much of a mini-batch's loss weight the
    longer responses carry. Lengths 10, 10, 30, 50 (median 20):
      token-mean:              weights 10, 10, 30, 50 → (30 + 50) / 100 = 0.8
      seq-mean-token-mean:     weights 1, 1, 1, 1     → 2 / 4 = 0.5
      seq-mean-token-sum-norm: weights as token-mean  → 0.8
    A row the filter emptied (0 tokens) weighs nothing under the sample-level mean."""
    from dapo_core.algo.losses import get_aggregation
    from dapo_core.train.update import long_share

    lengths = [10, 10, 30, 50]
    assert get_aggregation("token-mean").row_weights(lengths) == [10.0, 10.0, 30.0, 50.0]
    assert get_aggregation("seq-mean-token-mean").row_weights([0, 7]) == [0.0, 1.0]
    assert long_share(get_aggregation("token-mean"), lengths) == pytest.approx(0.8)
    assert long_share(get_aggregation("seq-mean-token-mean"), lengths) == pytest.approx(0.5)
    assert long_share(get_aggregation("seq-mean-token-sum-norm"), lengths) == pytest.approx(0.8)
    # All lengths equal: no response is longer than the median, nothing is "long".
    assert long_share(get_aggregation("token-mean"), [5, 5, 5]) == 0.0


def test_weight_share_of_chosen_rows() -> None:
    """The overlong filter's signature (§3.4) is the truncated rows' share of the loss weight.
    Lengths 10, 20, 40 with the 40-token row truncated: token-mean 40 / 70; the sample-level
    mean 1 / 3; a row emptied to 0 tokens weighs nothing; nothing weighing at all is NaN."""
    from dapo_core.algo.losses import get_aggregation
    from dapo_core.train.update import weight_share

    tok, seq = get_aggregation("token-mean"), get_aggregation("seq-mean-token-mean")
    chosen = [False, False, True]
    assert weight_share(tok, [10, 20, 40], chosen) == pytest.approx(40 / 70)
    assert weight_share(seq, [10, 20, 40], chosen) == pytest.approx(1 / 3)
    assert weight_share(seq, [10, 20, 0], chosen) == 0.0
    assert weight_share(tok, [10, 20, 40], [False] * 3) == 0.0
    assert math.isnan(weight_share(tok, [0, 0], [True, False]))
    with pytest.raises(ValueError):
        weight_share(tok, [10, 20], [True])  # one flag per row


# --- the entropy bonus (PPO Eq. 9) ---------------------------------------------------------------
def test_entropy_bonus_hand_computed_in_each_aggregation() -> None:
    # Entropies of two responses, the second with one padded position:
    #   row 0: 1, 2   row 1: 3, (pad)
    ent, mask = _t([[1.0, 2.0], [3.0, 9.0]]), _t([[1, 1], [1, 0]])
    # token-mean: (1 + 2 + 3) / 3 = 2          → −0.1 · 2 = −0.2
    # seq-mean-token-mean: (1.5 + 3) / 2 = 2.25 → −0.225
    # Dr.GRPO, L_max 4: (1 + 2 + 3) / (2 · 4)   → −0.1 · 0.75 = −0.075
    expected = {
        "token-mean": -0.2,
        "seq-mean-token-mean": -0.225,
        "seq-mean-token-sum-norm": -0.075,
    }
    for agg, value in expected.items():
        got = entropy_bonus(ent, mask, coef=0.1, agg=agg, max_len=4)
        assert float(got) == pytest.approx(value, abs=1e-12), agg
    assert float(entropy_bonus(ent, mask, coef=0.0)) == 0.0
    with pytest.raises(ValueError, match="coef"):
        entropy_bonus(ent, mask, coef=-0.1)


@FAST
@given(st.integers(0, 2**31 - 1), st.sampled_from(AGG_MODES))
def test_entropy_bonus_gradient_raises_the_entropy_and_accumulates_exactly(
    seed: int, agg: str
) -> None:
    """A gradient step on the bonus raises the aggregated entropy of softmax policies; split
    into micro-batches with the global counts, it adds up to the one-batch bonus."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 5, 6, generator=g, dtype=F64, requires_grad=True)  # [B, T, V]
    mask = (torch.rand(4, 5, generator=g) > 0.3).to(F64)
    mask[:, 0] = 1.0

    def entropy(z: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(z, dim=-1)
        return -(logp.exp() * logp).sum(-1)  # [B, T]

    counts = {"num_tokens": mask.sum(), "num_seqs": (mask.sum(-1) > 0).sum()}
    if agg == "seq-mean-token-sum-norm":
        counts["num_seqs"] = torch.tensor(4)
    whole = entropy_bonus(entropy(logits), mask, coef=0.5, agg=agg, max_len=5, **counts)
    parts = sum(
        entropy_bonus(
            entropy(logits[i : i + 2]), mask[i : i + 2], coef=0.5, agg=agg, max_len=5, **counts
        )
        for i in (0, 2)
    )
    assert float(parts) == pytest.approx(float(whole), rel=1e-12, abs=1e-12)
    (grad,) = torch.autograd.grad(whole, logits)
    stepped = (logits - 0.01 * grad).detach()
    before = aggregate(entropy(logits.detach()), mask, agg, max_len=5, **counts)
    after = aggregate(entropy(stepped), mask, agg, max_len=5, **counts)
    assert float(after) > float(before)
