"""Policy losses: a per-token loss found by name, then one of five aggregations.

The decomposition follows verl's core_algos: a per-token loss `[B, T]` times the response mask,
then an aggregation mode that decides how tokens and sequences are weighted. The ablation ladder
switches the mode (sample-level GRPO → token-level DAPO), the clip bounds and the loss.
`POLICY_LOSSES` holds, under verl 0.9.1's and TRL 1.16's names, one pure function per loss,
`[B, T]` → `TokenLoss`, each taking its knobs as named scalars:

  * `vanilla`: DAPO's decoupled-clip surrogate (+ the dual clip);
  * `gspo`: a length-normalised sequence ratio (Zheng et al. 2025, arXiv 2507.18071);
  * `cispo`: a clipped, stop-gradient weight on log π (MiniMax-M1, arXiv 2506.13585);
  * `clip_cov`, `kl_cov`: the surrogate with the few tokens of highest Cov(log π, A) detached
    or KL-penalised (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs",
    arXiv 2505.22617);
  * `geo_mean`: the geometric mean of the clipped token ratios (GMPO, Zhao et al. 2025,
    arXiv 2507.20673);
  * `sapo`: a soft sigmoid gate instead of the clip (SAPO, arXiv 2511.20347);
  * `dppo_tv`, `dppo_kl`: REINFORCE with truncated IS, tokens whose probability moved past a
    total-variation / binary-KL trust region masked (DPPO, arXiv 2602.04879);
  * `dro`: log π · A with a quadratic log-ratio penalty (Direct Reward Optimization, verl);
  * `gpg`: plain −log π · A (GPG, Chu et al. 2025, arXiv 2504.02546);
  * `luspo`: GSPO's sequence ratio, each sequence's loss scaled by its length (LUSPO, arXiv
    2602.05261; TRL);
  * `vespo`: REINFORCE weighted by a Gamma function of the sequence IS ratio (VESPO, arXiv
    2602.10693; TRL).

Paper references are to DAPO (arXiv 2503.14476) unless named otherwise:
  * clipped surrogate with ratio r_{i,t} = π_θ / π_θ_old (Eq. 8) and the decoupled clip range
    [1 − ε_low, 1 + ε_high] of Clip-Higher (§3.1, Eq. 10);
  * sample-level aggregation of GRPO, 1/G Σ_i 1/|o_i| Σ_t (the form written in Eq. 10);
  * token-level aggregation, 1/Σ_i|o_i| Σ_i Σ_t (Eq. 12);
  * Dr.GRPO's constant normaliser 1/(G·L_max) (Liu et al. 2025);
  * dual clip for A < 0 (Ye et al. 2020, "Mastering Complex Control in MOBA Games");
  * k1 / k2 / k3 KL estimators (Schulman 2020, "Approximating KL Divergence");
  * the entropy bonus c·H of PPO (Schulman et al. 2017, Eq. 9), off by default.

Exact gradient accumulation: every mode is a sum over sequences and tokens divided by a
normaliser. Pass the normaliser's counts of the whole mini-batch (`num_tokens`, `num_seqs`) to
each micro-batch and the micro-batch losses add up to the mini-batch loss, so their gradients
add up to its gradient. Defaulted counts are those of the tensors passed in, which is right only
when the micro-batch is the whole mini-batch. The two covariance losses choose their tokens
from statistics of the whole batch: `batch_selection` makes that choice once over the
mini-batch, and every micro-batch is given its rows of it (`selected`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dapo_common import metric_names as M
from dapo_core.algo.loss_params import LossParams  # re-exported: the losses take it

Count = int | float | Tensor


def _token_sum(loss: Tensor, mask: Tensor) -> Tensor:
    """Σ_{i,t} ℓ_{i,t}: every token weighs the same (Eq. 12, Dr.GRPO)."""
    return loss.sum()


def _seq_mean_sum(loss: Tensor, mask: Tensor) -> Tensor:
    """Σ_i (Σ_t ℓ_{i,t} / |o_i|): every sequence weighs the same (Eq. 10); an empty row gives 0."""
    return (loss.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)).sum()


def _by_tokens(
    mask: Tensor, num_tokens: Count | None, num_seqs: Count | None, max_len: int | None
) -> Count:
    """num_tokens, default the valid tokens of `mask` (at least 1)."""
    return mask.sum().clamp(min=1) if num_tokens is None else num_tokens


def _by_seqs(
    mask: Tensor, num_tokens: Count | None, num_seqs: Count | None, max_len: int | None
) -> Count:
    """num_seqs, default the rows with a valid token (at least 1): a row the overlong filter
    emptied leaves the normaliser as it leaves the loss."""
    return (mask.sum(dim=-1) > 0).sum().clamp(min=1) if num_seqs is None else num_seqs


def _by_budget(
    mask: Tensor, num_tokens: Count | None, num_seqs: Count | None, max_len: int | None
) -> Count:
    """num_seqs · max_len, num_seqs default every row: Dr.GRPO's constant, which does not
    depend on which tokens are valid."""
    if max_len is None or max_len <= 0:
        raise ValueError(
            f"agg='seq-mean-token-sum-norm' needs max_len > 0 (the generation budget), got {max_len}"
        )
    seqs = mask.shape[0] if num_seqs is None else num_seqs
    return seqs * max_len


def _by_one(
    mask: Tensor, num_tokens: Count | None, num_seqs: Count | None, max_len: int | None
) -> Count:
    """No normaliser: the loss is the plain sum (verl's token-sum)."""
    return 1


class Reduce(Protocol):
    """The numerator of an aggregation: masked per-token loss `[B, T]` (zeros off the mask) and
    the bool mask `[B, T]` → a scalar sum over sequences and tokens."""

    def __call__(self, loss: Tensor, mask: Tensor) -> Tensor: ...


class Normaliser(Protocol):
    """The divisor of an aggregation from the mask `[B, T]` and the global counts passed in
    (None: those of `mask`)."""

    def __call__(
        self, mask: Tensor, num_tokens: Count | None, num_seqs: Count | None, max_len: int | None
    ) -> Count: ...


@dataclass(frozen=True)
class Aggregation:
    """An aggregation mode: its numerator (`reduce`), its divisor (`normaliser`), and how a
    trainer counts that divisor over a whole mini-batch (all micro-batches, all ranks) without
    knowing the mode (`counts`). `aggregate` is reduce / normaliser for every mode."""

    name: str
    reduce: Reduce
    normaliser: Normaliser
    per_sequence: bool
    """Every sequence weighs the same (Eq. 10); False: every token does (Eq. 12, Dr.GRPO)."""
    every_row: bool
    """Its sequence count includes rows with no loss token, filtered ones too (Dr.GRPO)."""

    def counts(self, token_counts: Sequence[int], all_rows: int) -> tuple[int, int]:
        """(num_tokens, num_seqs) for `aggregate` from the loss rows' token counts and the
        number of rows in the mini-batch before any filter."""
        num_seqs = int(all_rows) if self.every_row else sum(1 for n in token_counts if n > 0)
        return int(sum(token_counts)), num_seqs

    def row_weights(self, token_counts: Sequence[int]) -> list[float]:
        """Each row's total weight in the loss, up to the common normaliser: its token count
        when every token weighs the same, 1 when every sequence does. What the token-level
        loss changes (§3.3): under it a long response weighs in proportion to its length,
        under the sample-level loss like any other response."""
        if self.per_sequence:
            return [1.0 if n > 0 else 0.0 for n in token_counts]
        return [float(n) for n in token_counts]


AGGREGATIONS: dict[str, Aggregation] = {
    "token-mean": Aggregation(
        "token-mean", _token_sum, _by_tokens, per_sequence=False, every_row=False
    ),
    "seq-mean-token-mean": Aggregation(
        "seq-mean-token-mean", _seq_mean_sum, _by_seqs, per_sequence=True, every_row=False
    ),
    "seq-mean-token-sum-norm": Aggregation(
        "seq-mean-token-sum-norm", _token_sum, _by_budget, per_sequence=False, every_row=True
    ),
    # verl's agg_loss modes without a length normaliser: the plain token sum, and each
    # sequence's token sum averaged over the sequences (LUSPO's length scaling, for GSPO).
    "token-sum": Aggregation("token-sum", _token_sum, _by_one, per_sequence=False, every_row=False),
    "seq-mean-token-sum": Aggregation(
        "seq-mean-token-sum", _token_sum, _by_seqs, per_sequence=False, every_row=False
    ),
}


AGG_MODES: tuple[str, ...] = tuple(AGGREGATIONS)


def get_aggregation(name: str) -> Aggregation:
    try:
        return AGGREGATIONS[name]
    except KeyError:
        raise ValueError(f"agg={name!r}: use one of {', '.join(AGGREGATIONS)}") from None


# |log r| beyond this is a policy e^20 ≈ 5e8 times off its sampler; clamping keeps exp() finite,
# since an inf there turns into a NaN gradient even where the clip selects the other branch.
# (verl clamps at the same bound.)
MAX_LOG_RATIO = 20.0


def k3(log_rho: Tensor) -> Tensor:
    """Schulman's k3 estimate of a KL divergence per token, ρ − log ρ − 1 ≥ 0, from log ρ.

    Computed as expm1(log ρ) − log ρ: expm1(x) rounds to no less than x, so the estimate stays
    ≥ 0 in floating point too, where exp(x) − x − 1 can come out a rounding error below 0."""
    return torch.expm1(log_rho) - log_rho


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of `x` over the positions where `mask` is set; 0 (not NaN) when none is.

    Shapes: x and mask broadcastable to a common shape (typically both `[B, T]`).
    Masked-out positions may hold anything, even inf or NaN.
    """
    m = mask.bool()
    total = torch.where(m, x, torch.zeros_like(x)).sum()
    return total / m.sum().clamp(min=1)


def _check_count(name: str, value: Count | None) -> None:
    if value is not None and float(value) <= 0:
        raise ValueError(f"{name}={float(value)}: a global count must be > 0 (or left unset)")


def aggregate(
    per_token_loss: Tensor,
    mask: Tensor,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a per-token loss `[B, T]` to a scalar over the valid tokens of `mask` `[B, T]`.

    Modes (the numerator is always a sum, so micro-batches with global counts add up exactly):
      * ``"token-mean"`` (DAPO Eq. 12): Σ_{i,t} ℓ_{i,t} / num_tokens. num_tokens defaults to
        mask.sum(); pass the token count of the whole mini-batch when this is a micro-batch.
        Every token weighs the same, so long responses count in proportion to their length.
      * ``"seq-mean-token-mean"`` (GRPO's sample-level loss, the 1/G Σ_i 1/|o_i| Σ_t of DAPO
        Eq. 10): Σ_i (Σ_t ℓ_{i,t} / |o_i|) / num_seqs. Every sequence weighs the same.
        A sequence with no valid token (e.g. removed by the overlong filter) contributes 0, and
        when num_seqs is defaulted it is not counted either: the default is the number of rows
        with at least one valid token, so a filtered row leaves the normaliser as it leaves the
        loss. A num_seqs passed in is used as is; the caller owns it.
      * ``"seq-mean-token-sum-norm"`` (Dr.GRPO): Σ_{i,t} ℓ_{i,t} / (num_seqs · max_len) with a
        constant max_len (the generation budget), required here. num_seqs defaults to B, every
        row included: the normaliser of Dr.GRPO does not depend on which tokens are valid.
      * ``"token-sum"`` (verl): Σ_{i,t} ℓ_{i,t}, no normaliser; the loss grows with the batch.
      * ``"seq-mean-token-sum"`` (verl): Σ_{i,t} ℓ_{i,t} / num_seqs (rows with a valid token,
        as for seq-mean-token-mean): each sequence's token sum, averaged over sequences.

    With every count defaulted and no valid token at all the result is 0, still attached to the
    graph (a zero gradient), never NaN. Masked-out positions of `per_token_loss` may hold
    anything, even inf or NaN: they are selected away, not multiplied by zero.
    """
    if per_token_loss.dim() != 2 or per_token_loss.shape != mask.shape:
        raise ValueError(
            f"per_token_loss {tuple(per_token_loss.shape)} and mask {tuple(mask.shape)} "
            "must both be [B, T]"
        )
    mode = get_aggregation(agg)
    _check_count("num_tokens", num_tokens)
    _check_count("num_seqs", num_seqs)

    m = mask.bool()
    denom = mode.normaliser(m, num_tokens, num_seqs, max_len)
    loss = torch.where(m, per_token_loss, torch.zeros_like(per_token_loss))  # [B, T]
    return mode.reduce(loss, m) / denom


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None = None,
) -> Tensor:
    """Per-token clipped surrogate as a loss, `[B, T]` (DAPO Eq. 8 with Eq. 10's clip range).

        ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))
        and where A < 0, with the dual clip: ℓ = min(ℓ, −A·c)

    `ratio` and `advantages` are `[B, T]` (or any common shape). The max is the pessimistic
    bound: for A > 0 the gain stops growing once r > 1 + ε_high, for A < 0 once r < 1 − ε_low.
    Raising ε_high alone (Clip-Higher) leaves more room to raise unlikely tokens' probabilities.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * clip_c), loss)
    return loss


# --- the registry's contract ---------------------------------------------------------------------


@dataclass(frozen=True)
class TokenLoss:
    """A policy loss per token and where its clip is active, all `[B, T]`.

    The masks carry the same meaning in every mode, so the trainer sums them blindly:
    `clip_high` / `clip_low` mark tokens whose loss the upper / lower clip bound (or the mode's
    trust region) changes, `clip_dual` those bounded by the dual clip (DPPO: the truncation of
    its IS weight), and `selected` the tokens the covariance losses picked (None: the mode
    picks none). Positions outside the loss mask may hold anything; the caller selects them
    away.
    """

    loss: Tensor  # [B, T] ℓ_{i,t}, differentiable w.r.t. logprobs
    clip_high: Tensor  # [B, T] bool
    clip_low: Tensor  # [B, T] bool
    clip_dual: Tensor  # [B, T] bool
    selected: Tensor | None = None  # [B, T] bool
    weighted: bool = False
    """The loss already holds the rollout-correction weights (`geo_mean`, `vespo` fold them in
    as their papers do); False: `policy_loss` multiplies each token's loss by its weight."""


@dataclass(frozen=True)
class LossInputs:
    """One call of a registered loss: the batch, all `[B, T]`, and the clip range every mode may
    read (some read it as another trust region: DPPO's divergence bounds, GMPO's log-space
    range)."""

    logprobs: Tensor  # log π_θ, requires grad
    old: Tensor  # log π_θold, detached
    adv: Tensor  # advantages, detached
    mask: Tensor  # bool: the tokens in the loss
    clip_low: float  # ε_low
    clip_high: float  # ε_high
    clip_c: float | None  # dual-clip bound c (DPPO: the IS truncation; None → 20)
    weights: Tensor | None = None  # constant rollout-correction weights, or None
    selected: Tensor | None = None  # bool, covariance-selected tokens (see batch_selection)


class PolicyLoss(Protocol):
    """A registered loss: one call's inputs and the variant knobs → `TokenLoss`."""

    def __call__(self, x: LossInputs, p: LossParams) -> TokenLoss: ...


def _token_log_ratio(logprobs: Tensor, old: Tensor, mask: Tensor) -> Tensor:
    # Padded positions get log r = 0 so that whatever they hold cannot reach exp().
    return torch.where(mask, logprobs - old, torch.zeros_like(logprobs))


def _token_ratio(logprobs: Tensor, old: Tensor, mask: Tensor) -> Tensor:
    """r = exp(log π_θ − log π_θold), log r clamped to ±MAX_LOG_RATIO, 1 off the mask."""
    return torch.exp(_token_log_ratio(logprobs, old, mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    """x on the mask, 0 elsewhere (whatever x holds there)."""
    return torch.where(mask, x, torch.zeros_like(x))


def _none(mask: Tensor) -> Tensor:
    return torch.zeros_like(mask, dtype=torch.bool)


def clip_eligible(old_logprobs: Tensor, advantages: Tensor, *, clip_high: float) -> Tensor:
    """Tokens that could ever reach the upper clip bound, `[B, T]` bool: A > 0 and an old
    probability p below 1 / (1 + ε_high).

    Why: the ratio r = π_θ / π_θold of a token sampled at old probability p is at most 1 / p
    (π_θ ≤ 1), so r > 1 + ε_high needs p < 1 / (1 + ε_high): 0.83 at ε_high = 0.2, 0.78 at
    0.28. Only these tokens, and only with a positive advantage (the upper bound binds the
    surrogate only where A > 0, Eq. 10), can Clip-Higher act on; a task where nearly every
    rewarded token is likely gives it nothing to do, whatever ε_high (DAPO §3.1, Fig. 3a: the
    up-clipped tokens have π < 0.2). The share of such tokens is the room the upper bound has;
    `clip_ratio/high` is how much of that room the update used.

    `old_logprobs` and `advantages` `[B, T]` (or any common shape); compared in log space,
    log p < −log(1 + ε_high), so no probability underflows.
    """
    return (advantages > 0) & (old_logprobs < -math.log1p(clip_high))


def _clipped(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """Where the surrogate's clip acts, `[B, T]` bool: the upper bound (A > 0, r > 1 + ε_high)
    and the lower (A < 0, r < 1 − ε_low)."""
    return (adv > 0) & (ratio > 1.0 + clip_high), (adv < 0) & (ratio < 1.0 - clip_low)


# --- the losses ----------------------------------------------------------------------------------


def vanilla_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
) -> TokenLoss:
    """DAPO's decoupled-clip surrogate (Eq. 8 with Eq. 10's range) and the optional dual clip.

        r_{i,t} = π_θ(o_{i,t}) / π_θold(o_{i,t}),  ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))
        and where A < 0 with a dual clip c: ℓ = min(ℓ, −A·c)

    As verl's `compute_policy_loss_vanilla` (log r clamped to ±20). Shapes `[B, T]`.
    """
    ratio = _token_ratio(logprobs, old, mask)
    loss = clipped_surrogate(ratio, adv, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)
    r = ratio.detach()
    dual = (adv < 0) & (r > clip_c) if clip_c is not None else _none(mask)
    return TokenLoss(loss, *_clipped(r, adv, clip_low, clip_high), dual)


# verl clamps the GSPO log-ratio from above only, at this bound.
_MAX_LOG_SEQ_RATIO = 10.0


def gspo_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> TokenLoss:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071; its GSPO-token form): the ratio is
    the sequence's length-normalised likelihood ratio, clipped once per sequence,

        s_i = exp(1/|o_i| Σ_t log r_{i,t}),   s_{i,t} = sg[s_i] · π_θ(o_{i,t}) / sg[π_θ(o_{i,t})]
        ℓ_{i,t} = max(−A·s_{i,t}, −A·clip(s_{i,t}, 1 − ε_low, 1 + ε_high))

    so every token of a sequence has the value s_i and its own gradient s_i·∇log π_θ(o_{i,t}).
    As verl's `compute_policy_loss_gspo`: |o_i| counts the tokens of `mask` (at least 1), log s
    is clamped to ≤ 10 (no lower bound), and there is no dual clip.
    The paper (and verl's default) aggregates by "seq-mean-token-mean"; here `agg` stays the
    caller's choice. Shapes `[B, T]`; a row is one sequence.
    """
    log_ratio = _token_log_ratio(logprobs, old, mask)  # [B, T]
    lengths = mask.sum(dim=-1).clamp(min=1)  # [B]
    log_seq = (log_ratio.sum(dim=-1) / lengths).detach()  # [B] log s_i, a constant
    lp = _masked(logprobs, mask)
    log_s = (lp - lp.detach() + log_seq[:, None]).clamp(max=_MAX_LOG_SEQ_RATIO)  # [B, T]
    s = torch.exp(log_s)
    loss = clipped_surrogate(s, adv, clip_low=clip_low, clip_high=clip_high)
    return TokenLoss(loss, *_clipped(s.detach(), adv, clip_low, clip_high), _none(mask))


def luspo_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> TokenLoss:
    """LUSPO (Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261; TRL 1.16's
    `loss_type="luspo"`): GSPO's clipped sequence-ratio loss with each sequence's loss scaled
    by its length, which removes GSPO's preference for short sequences,

        s_i = exp(1/|o_i| Σ_t log r_{i,t}),   L_i = max(−A·s_i, −A·clip(s_i, 1 − ε_low, 1 + ε_high))
        ℓ_{i,t} = |o_i| · L_i on every token of sequence i

    In GSPO's sequence form (TRL's `importance_sampling_level="sequence"`, which LUSPO
    requires): the gradient of s_i reaches every token through the mean of its log-ratios, so a
    rollout-correction weight w_t scales the sequence's gradient (Σ_t w_t · ∇L_i), not its own
    token's as in GSPO-token (`gspo_loss`). Under "seq-mean-token-mean" the loss is
    1/num_seqs Σ_i Σ_t w_t·L_i, TRL's `(per_token_loss * mask).sum(-1).mean()` (TRL's mean runs
    over every row of the batch: pass num_seqs = B for that); without weights it is `gspo`
    under "seq-mean-token-sum". log s is clamped to ±20 (TRL does not clamp); TRL's two-sided
    `delta` clip is not offered. Shapes `[B, T]`; |o_i| counts the tokens of `mask`.
    """
    log_ratio = _token_log_ratio(logprobs, old, mask)  # [B, T]
    lengths = mask.sum(dim=-1).clamp(min=1).to(log_ratio.dtype)  # [B]
    log_s = (log_ratio.sum(dim=-1) / lengths).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B]
    s = torch.exp(log_s)[:, None].expand_as(log_ratio)  # [B, T], each row's s_i
    loss = clipped_surrogate(s, adv, clip_low=clip_low, clip_high=clip_high) * lengths[:, None]
    return TokenLoss(loss, *_clipped(s.detach(), adv, clip_low, clip_high), _none(mask))


def cispo_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> TokenLoss:
    """CISPO (MiniMax-M1, arXiv 2506.13585, the CISPO objective): REINFORCE weighted by the clipped
    importance ratio, the weight a constant, so no token's gradient is ever dropped,

        w_{i,t} = sg[clip(r_{i,t}, 1 − ε_low, 1 + ε_high)],   ℓ_{i,t} = −w_{i,t} · A · log π_θ(o_{i,t})
        ∇ℓ_{i,t} = −w_{i,t} · A · ∇log π_θ(o_{i,t})

    As verl's `compute_policy_loss_cispo` (log r clamped to ±20, no dual clip). The loss VALUE
    is on the scale of log π, not of r. The clip bounds the weight whatever the sign of A, so
    `clip_high` / `clip_low` mark r > 1 + ε_high / r < 1 − ε_low on every token (verl's clip
    fraction counts r ≠ clip(r)). Shapes `[B, T]`.
    """
    ratio = _token_ratio(logprobs, old, mask)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    loss = -weight * adv * logprobs
    r = ratio.detach()
    return TokenLoss(loss, r > 1.0 + clip_high, r < 1.0 - clip_low, _none(mask))


def _covariance(logprobs: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """Each loss token's term of Cov(log π_θ, A) over the loss tokens, `[B, T]` (Cui et al.
    2025, arXiv 2505.22617, Eq. 11): (A − mean A)·(log π − mean log π), the means over `mask`;
    computed without gradient, 0 off the mask."""
    with torch.no_grad():
        m = mask.bool()
        lp, a = _masked(logprobs.detach(), m), _masked(adv.detach(), m)
        n = m.sum().clamp(min=1)
        return _masked((a - a.sum() / n) * (lp - lp.sum() / n), m)


def clip_cov_selection(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_cov_ratio: float,
    clip_cov_lb: float,
    clip_cov_ub: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Clip-Cov's tokens (Cui et al. 2025, arXiv 2505.22617, §4, "Clip-Cov"), `[B, T]` bool:
    max(1, ⌊clip_cov_ratio · N⌋) of the N loss tokens, drawn uniformly (`generator`; None: torch's
    global one) among the tokens whose covariance term (see `_covariance`) lies in
    (clip_cov_lb, clip_cov_ub) and that the surrogate's own clip does not already cut
    (−A·clip(r) > −A·r). All of them when fewer qualify.

    As verl's `compute_policy_loss_clip_cov`: candidates in row-major order, a random
    permutation of them, the first ones taken; with the same generator state the same tokens.
    The means behind the covariance are the call's: pass the whole mini-batch for a choice
    that does not depend on how it is split. Shapes `[B, T]`.
    """
    m = mask.bool()
    with torch.no_grad():
        ratio = _token_ratio(logprobs.detach(), old, m)
        cut = m & (-adv * ratio.clamp(1 - clip_low, 1 + clip_high) > -adv * ratio)
        cov = _covariance(logprobs, adv, m)
        band = m & ~cut & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        candidates = torch.nonzero(band)  # [K, 2], row-major
        take = max(int(clip_cov_ratio * int(m.sum())), 1)
        chosen = torch.zeros_like(m)
        if len(candidates) > 0:
            perm = torch.randperm(len(candidates), generator=generator)
            picked = candidates[perm[:take].to(candidates.device)]
            chosen[picked[:, 0], picked[:, 1]] = True
    return chosen


def kl_cov_selection(logprobs: Tensor, adv: Tensor, mask: Tensor, *, kl_cov_ratio: float) -> Tensor:
    """KL-Cov's tokens (Cui et al. 2025, arXiv 2505.22617, §4, "KL-Cov"), `[B, T]` bool: the
    max(1, ⌊kl_cov_ratio · N⌋) loss tokens of largest covariance term (see `_covariance`).

    As verl's `compute_policy_loss_kl_cov` (torch.topk over the loss tokens in row-major order;
    none when there is no loss token). The call's means: pass the whole mini-batch for a choice
    that does not depend on how it is split. Shapes `[B, T]`.
    """
    m = mask.bool()
    chosen = torch.zeros_like(m)
    n = int(m.sum())
    if n == 0:
        return chosen
    with torch.no_grad():
        a = adv.detach()[m]
        lp = logprobs.detach()[m]
        cov = (a - a.mean()) * (lp - lp.mean())  # [N]
        top = torch.topk(cov, max(1, int(n * kl_cov_ratio)), largest=True).indices
        flat = torch.nonzero(m.reshape(-1), as_tuple=True)[0][top]
        chosen.view(-1)[flat] = True
    return chosen


def clip_cov_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    selected: Tensor,
) -> TokenLoss:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617, §4): the decoupled-clip surrogate with the
    gradient of a few high-covariance tokens removed, which keeps the policy's entropy from
    collapsing (the entropy change is driven by Cov(log π, A), their Eq. 11-12):

        ℓ_{i,t} = 0 where selected (`clip_cov_selection`), else max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))

    As verl's `compute_policy_loss_clip_cov` (its loss times a 0/1 correction), log r clamped to
    ±20 here (verl does not clamp; equal for |log r| ≤ 20), no dual clip. Shapes `[B, T]`.
    """
    ratio = _token_ratio(logprobs, old, mask)
    surrogate = clipped_surrogate(ratio, adv, clip_low=clip_low, clip_high=clip_high)
    loss = torch.where(selected, torch.zeros_like(surrogate), surrogate)
    r = ratio.detach()
    return TokenLoss(loss, *_clipped(r, adv, clip_low, clip_high), _none(mask), selected)


def kl_cov_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    ppo_kl_coef: float,
    selected: Tensor,
) -> TokenLoss:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617, §4): the unclipped surrogate, with a KL
    penalty on the few tokens of highest covariance,

        ℓ_{i,t} = −A·r + [selected] · ppo_kl_coef · |log r|      (`kl_cov_selection`)

    As verl's `compute_policy_loss_kl_cov` (no clip at all), log r clamped to ±20 here (verl does
    not clamp; equal for |log r| ≤ 20). No clip flags. Shapes `[B, T]`.
    """
    log_ratio = _token_log_ratio(logprobs, old, mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    loss = -adv * torch.exp(log_ratio)
    loss = loss + torch.where(selected, ppo_kl_coef * log_ratio.abs(), torch.zeros_like(loss))
    none = _none(mask)
    return TokenLoss(loss, none, none, none, selected)


def geo_mean_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    weights: Tensor | None,
) -> TokenLoss:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673, Eq. 4):
    the geometric mean of the token ratios, each clipped in log space, as one sequence-level
    ratio,

        x_{i,t} = log r_{i,t},   x̃ = sgn(A)·min(sgn(A)·x, sgn(A)·clip(x, −ε_low, ε_high))
        L_i = −Ā_i · exp(1/|o_i| Σ_t x̃_{i,t}),   Ā_i the mean of A over the sequence's tokens
        ℓ_{i,t} = L_i on every token of sequence i

    The clip range is in log space (the paper: ε = 0.4 both sides). Under "seq-mean-token-mean"
    the loss is 1/num_seqs Σ_i L_i, verl's `compute_policy_loss_geo_mean`, which ignores its
    aggregation mode and takes the mean over every row (pass num_seqs = B for that). With
    rollout-correction weights w each L_i is scaled by their geometric mean over the sequence,
    exp(1/|o_i| Σ_t log(w_t + 1e-10)), as verl does. log r clamped to ±20 (verl does not clamp).
    Clip flags: A > 0 and x > ε_high, A < 0 and x < −ε_low (where the clip binds). Shapes
    `[B, T]`.
    """
    x = _token_log_ratio(logprobs, old, mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B, T]
    sgn = torch.sign(adv)
    x_min = sgn * torch.minimum(sgn * x, sgn * x.clamp(-clip_low, clip_high))
    lengths = mask.sum(dim=-1).clamp(min=1).to(x.dtype)  # [B]
    seq_ratio = torch.exp(_masked(x_min, mask).sum(dim=-1) / lengths)  # [B]
    seq_adv = _masked(adv, mask).sum(dim=-1) / lengths  # [B]
    seq_loss = -seq_adv * seq_ratio  # [B]
    if weights is not None:
        log_w = _masked(torch.log(weights.detach() + 1e-10), mask).sum(dim=-1) / lengths
        seq_loss = seq_loss * torch.exp(log_w)
    loss = seq_loss[:, None].expand_as(x)
    xd = x.detach()
    clip_high_ = (adv > 0) & (xd > clip_high)
    clip_low_ = (adv < 0) & (xd < -clip_low)
    return TokenLoss(loss, clip_high_, clip_low_, _none(mask), weighted=True)


def sapo_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    tau_pos: float,
    tau_neg: float,
) -> TokenLoss:
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347): a smooth gate on the ratio in
    place of the hard clip,

        f_τ(r) = σ(τ·(r − 1)) · 4/τ,   τ = τ_pos where A > 0, τ_neg where A ≤ 0
        ℓ_{i,t} = −f_τ(r_{i,t}) · A

    f'(1) = 1, so at r = 1 the gradient is the policy gradient's; away from 1 it fades (faster
    for negative tokens, τ_neg > τ_pos). As verl's `compute_policy_loss_sapo` and TRL's `sapo`
    (log r clamped to ±20). verl forces "seq-mean-token-mean" (the paper's); here `agg` stays
    the caller's. No clip flags. Shapes `[B, T]`.
    """
    ratio = _token_ratio(logprobs, old, mask)
    tau = torch.where(adv > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    none = _none(mask)
    return TokenLoss(-gate * adv, none, none, none)


# DPPO's default IS truncation when no clip_c is set: verl reads clip_ratio_c with this fallback
# (DPPO §5.4 recommends a large threshold).
DPPO_TRUNCATION = 20.0


def _dppo(
    logprobs: Tensor, old: Tensor, adv: Tensor, mask: Tensor, valid: Tensor, truncation: float
) -> TokenLoss:
    """DPPO's shared loss: −A · sg[min(r, c)] · log π_θ on the tokens inside the trust region."""
    ratio = _token_ratio(logprobs, old, mask)
    weight = ratio.clamp(max=truncation).detach()
    loss = -adv * weight * logprobs * valid.to(logprobs.dtype)
    r = ratio.detach()
    return TokenLoss(loss, (adv > 0) & ~valid, (adv <= 0) & ~valid, (r > truncation) & valid)


def dppo_tv_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
) -> TokenLoss:
    """DPPO-Binary-TV (arXiv 2602.04879): REINFORCE with a truncated, stop-gradient IS weight on
    the tokens whose probability stayed inside a total-variation trust region,

        valid = p − p_old ≤ δ_high  where A > 0,   p − p_old ≥ −δ_low  where A ≤ 0
        ℓ_{i,t} = −A · sg[min(r, c)] · log π_θ(o_{i,t}) · valid

    δ_low, δ_high are `clip_low`, `clip_high` (verl reads the divergence bounds from its clip
    ratios) and c is `clip_c`, 20 when unset (verl: clip_ratio_c, default 20 in this loss).
    As verl's `compute_policy_loss_dppo_tv` (log r clamped to ±20). Flags: `clip_high` /
    `clip_low` the masked tokens (A > 0 / A ≤ 0; together verl's pg_clipfrac), `clip_dual`
    valid tokens whose weight was truncated (verl's pg_clipfrac_lower). Shapes `[B, T]`.
    """
    lp, lp_old = _masked(logprobs.detach(), mask), _masked(old, mask)
    moved = torch.exp(lp) - torch.exp(lp_old)  # p − p_old
    valid = torch.where(adv > 0, moved <= clip_high, moved >= -clip_low)
    return _dppo(logprobs, old, adv, mask, valid, DPPO_TRUNCATION if clip_c is None else clip_c)


def dppo_kl_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
) -> TokenLoss:
    """DPPO-Binary-KL (arXiv 2602.04879): as `dppo_tv_loss`, the trust region a bound on the
    KL divergence between the two Bernoulli distributions (sampled token or not),

        D = p_old·log(p_old/p) + (1 − p_old)·log((1 − p_old + 1e-8)/(1 − p + 1e-8))
        valid = D ≤ δ_high or p ≤ p_old  where A > 0,   D ≤ δ_low or p ≥ p_old  where A ≤ 0

    (a token moving the way its advantage does not push it is never masked). As verl's
    `compute_policy_loss_dppo_kl`; flags as `dppo_tv_loss`. Shapes `[B, T]`.
    """
    lp, lp_old = _masked(logprobs.detach(), mask), _masked(old, mask)
    p, p_old = torch.exp(lp), torch.exp(lp_old)
    divergence = p_old * (lp_old - lp) + (1 - p_old) * torch.log(
        (1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)
    )
    valid = torch.where(
        adv > 0, (divergence <= clip_high) | (p <= p_old), (divergence <= clip_low) | (p >= p_old)
    )
    return _dppo(logprobs, old, adv, mask, valid, DPPO_TRUNCATION if clip_c is None else clip_c)


def dro_loss(
    logprobs: Tensor, old: Tensor, adv: Tensor, mask: Tensor, *, dro_beta: float | None
) -> TokenLoss:
    """DRO (Direct Reward Optimization, as verl registers it): the policy gradient with a
    quadratic penalty on the log-ratio to the old policy, a soft trust region,

        ℓ_{i,t} = −(A · log π_θ(o_{i,t}) − β/2 · (log r_{i,t})²)

    As verl's `compute_policy_loss_dro`; β must be > 0 (verl has no default). No clip flags.
    Shapes `[B, T]`.
    """
    if dro_beta is None or dro_beta <= 0:
        raise ValueError(
            f"loss_mode='dro' needs dro_beta > 0 (the quadratic log-ratio penalty), got {dro_beta}"
        )
    log_ratio = _token_log_ratio(logprobs, old, mask)
    loss = -(logprobs * adv - 0.5 * dro_beta * log_ratio.square())
    none = _none(mask)
    return TokenLoss(loss, none, none, none)


def gpg_loss(logprobs: Tensor, adv: Tensor, mask: Tensor) -> TokenLoss:
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline",
    arXiv 2504.02546, Eq. 5): the plain policy gradient, no ratio, no clip,

        ℓ_{i,t} = −A · log π_θ(o_{i,t})

    As verl's `compute_policy_loss_gpg`. Shapes `[B, T]`.
    """
    none = _none(mask)
    return TokenLoss(-logprobs * adv, none, none, none)


def vespo_weight(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    k_pos: float,
    lambda_pos: float,
    k_neg: float,
    lambda_neg: float,
    weights: Tensor | None = None,
) -> Tensor:
    """VESPO's Gamma weight of each sequence's IS ratio, `[B, T]` (the row's value on each of its
    tokens), without gradient (VESPO, arXiv 2602.10693; TRL's `get_gamma_weights`):

        log w_i = clamp(Σ_t clamp(log r_{i,t}, ±20) [+ Σ_t log ρ_{i,t}], log 1e-8, 20)
        φ(w) = exp(λ + k·log w − λ·w)          (φ(1) = 1; k, λ by the sign of A: A ≥ 0 "pos")

    ρ are the rollout-correction weights π_old / π_sampler (their logs clamped to
    [log 1e-8, 20]), which VESPO folds into the sequence ratio. A non-finite φ is 0. Sums run
    over the tokens of `mask`. Shapes `[B, T]`.
    """
    with torch.no_grad():
        floor = math.log(1e-8)
        log_r = _token_log_ratio(logprobs.detach(), old, mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        seq = log_r.sum(dim=-1, keepdim=True)  # [B, 1]
        if weights is not None:
            log_rho = torch.log(weights.detach()).clamp(floor, MAX_LOG_RATIO)
            seq = seq + _masked(log_rho, mask).sum(dim=-1, keepdim=True)
        log_w = seq.clamp(floor, MAX_LOG_RATIO)
        w = torch.exp(log_w)
        nonneg = adv >= 0
        k = torch.where(nonneg, torch.full_like(adv, k_pos), torch.full_like(adv, k_neg))
        lam = torch.where(
            nonneg, torch.full_like(adv, lambda_pos), torch.full_like(adv, lambda_neg)
        )
        lam = lam.clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * w)
        return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    k_pos: float,
    lambda_pos: float,
    k_neg: float,
    lambda_neg: float,
    weights: Tensor | None,
) -> TokenLoss:
    """VESPO (Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693; TRL 1.16's
    `loss_type="vespo"`): REINFORCE weighted by a smooth, asymmetric Gamma function of the
    sequence's IS ratio instead of a hard clip,

        ℓ_{i,t} = −φ(w_i) · A · log π_θ(o_{i,t})      (φ, w_i: see `vespo_weight`, detached)

    The rollout-correction weights enter φ (TRL does not multiply VESPO's loss by them again).
    TRL normalises by the token count ("token-mean"). No clip flags. Shapes `[B, T]`.
    """
    phi = vespo_weight(
        logprobs,
        old,
        adv,
        mask,
        k_pos=k_pos,
        lambda_pos=lambda_pos,
        k_neg=k_neg,
        lambda_neg=lambda_neg,
        weights=weights,
    )
    none = _none(mask)
    return TokenLoss(-phi * adv * logprobs, none, none, none, weighted=True)


# --- the registry: each entry passes one call's inputs and its own knobs, by name --------------


def _vanilla(x: LossInputs, p: LossParams) -> TokenLoss:
    return vanilla_loss(
        x.logprobs,
        x.old,
        x.adv,
        x.mask,
        clip_low=x.clip_low,
        clip_high=x.clip_high,
        clip_c=x.clip_c,
    )


def _gspo(x: LossInputs, p: LossParams) -> TokenLoss:
    return gspo_loss(x.logprobs, x.old, x.adv, x.mask, clip_low=x.clip_low, clip_high=x.clip_high)


def _cispo(x: LossInputs, p: LossParams) -> TokenLoss:
    return cispo_loss(x.logprobs, x.old, x.adv, x.mask, clip_low=x.clip_low, clip_high=x.clip_high)


def _selection(name: str, x: LossInputs, p: LossParams) -> Tensor:
    """The covariance tokens the caller chose over the whole batch, else this call's own
    (verl's choice, per micro-batch)."""
    if x.selected is not None:
        return x.selected.bool() & x.mask
    chosen = batch_selection(
        name, x.logprobs, x.old, x.adv, x.mask, clip_low=x.clip_low, clip_high=x.clip_high, params=p
    )
    assert chosen is not None
    return chosen


def _clip_cov(x: LossInputs, p: LossParams) -> TokenLoss:
    selected = _selection("clip_cov", x, p)
    return clip_cov_loss(
        x.logprobs,
        x.old,
        x.adv,
        x.mask,
        clip_low=x.clip_low,
        clip_high=x.clip_high,
        selected=selected,
    )


def _kl_cov(x: LossInputs, p: LossParams) -> TokenLoss:
    selected = _selection("kl_cov", x, p)
    return kl_cov_loss(
        x.logprobs, x.old, x.adv, x.mask, ppo_kl_coef=p.ppo_kl_coef, selected=selected
    )


def _geo_mean(x: LossInputs, p: LossParams) -> TokenLoss:
    return geo_mean_loss(
        x.logprobs,
        x.old,
        x.adv,
        x.mask,
        clip_low=x.clip_low,
        clip_high=x.clip_high,
        weights=x.weights,
    )


def _sapo(x: LossInputs, p: LossParams) -> TokenLoss:
    return sapo_loss(x.logprobs, x.old, x.adv, x.mask, tau_pos=p.tau_pos, tau_neg=p.tau_neg)


def _dppo_tv(x: LossInputs, p: LossParams) -> TokenLoss:
    return dppo_tv_loss(
        x.logprobs,
        x.old,
        x.adv,
        x.mask,
        clip_low=x.clip_low,
        clip_high=x.clip_high,
        clip_c=x.clip_c,
    )


def _dppo_kl(x: LossInputs, p: LossParams) -> TokenLoss:
    return dppo_kl_loss(
        x.logprobs,
        x.old,
        x.adv,
        x.mask,
        clip_low=x.clip_low,
        clip_high=x.clip_high,
        clip_c=x.clip_c,
    )


def _dro(x: LossInputs, p: LossParams) -> TokenLoss:
    return dro_loss(x.logprobs, x.old, x.adv, x.mask, dro_beta=p.dro_beta)


def _gpg(x: LossInputs, p: LossParams) -> TokenLoss:
    return gpg_loss(x.logprobs, x.adv, x.mask)


def _luspo(x: LossInputs, p: LossParams) -> TokenLoss:
    return luspo_loss(x.logprobs, x.old, x.adv, x.mask, clip_low=x.clip_low, clip_high=x.clip_high)


def _vespo(x: LossInputs, p: LossParams) -> TokenLoss:
    return vespo_loss(
        x.logprobs,
        x.old,
        x.adv,
        x.mask,
        k_pos=p.vespo_k_pos,
        lambda_pos=p.vespo_lambda_pos,
        k_neg=p.vespo_k_neg,
        lambda_neg=p.vespo_lambda_neg,
        weights=x.weights,
    )


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "vanilla": _vanilla,
    "gspo": _gspo,
    "cispo": _cispo,
    "clip_cov": _clip_cov,
    "kl_cov": _kl_cov,
    "geo_mean": _geo_mean,
    "sapo": _sapo,
    "dppo_tv": _dppo_tv,
    "dppo_kl": _dppo_kl,
    "dro": _dro,
    "gpg": _gpg,
    "luspo": _luspo,
    "vespo": _vespo,
}
# The modes whose tokens are chosen from statistics of the whole batch (`batch_selection`).
COVARIANCE_MODES: tuple[str, ...] = ("clip_cov", "kl_cov")


def get_policy_loss(name: str) -> PolicyLoss:
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"loss_mode={name!r}: use one of {', '.join(POLICY_LOSSES)}") from None


def batch_selection(
    loss_mode: str,
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    params: LossParams,
    generator: torch.Generator | None = None,
) -> Tensor | None:
    """The tokens a covariance mode chooses over a batch, `[B, T]` bool (None for the other
    modes): `clip_cov_selection` or `kl_cov_selection` with the mode's knobs. Called once over a
    whole mini-batch (log-probs of the current policy, all ranks' rows) and each micro-batch
    given its rows as `selected`, the choice and so the gradient do not depend on the split.
    `advantages` `[B]` or `[B, T]`; the others `[B, T]`."""
    if loss_mode not in COVARIANCE_MODES:
        get_policy_loss(loss_mode)  # an unknown name is still an error
        return None
    m = mask.bool()
    a = adv[:, None].expand_as(logprobs) if adv.dim() == 1 else adv
    if loss_mode == "clip_cov":
        return clip_cov_selection(
            logprobs,
            old,
            a,
            m,
            clip_low=clip_low,
            clip_high=clip_high,
            clip_cov_ratio=params.clip_cov_ratio,
            clip_cov_lb=params.clip_cov_lb,
            clip_cov_ub=params.clip_cov_ub,
            generator=generator,
        )
    return kl_cov_selection(logprobs, a, m, kl_cov_ratio=params.kl_cov_ratio)


# --- what one call did -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LossCounts:
    """Raw sums of one `policy_loss` call over its valid tokens, so that a trainer can combine
    exact fractions over micro-batches and ranks (fraction = Σ numerator / Σ denominator):
    `LossCounts.combine` adds them (and takes the largest ratio)."""

    tokens: float
    """Valid tokens (the mask's)."""
    clip_high: float
    """Tokens whose loss the upper clip bound changes."""
    clip_low: float
    """Tokens whose loss the lower clip bound changes."""
    clip_dual: float
    """Tokens bounded by the dual clip (DPPO: whose IS weight was truncated)."""
    sum_kl: float
    """Σ old_logprobs − logprobs (the k1 estimate's numerator)."""
    clip_eligible: float = 0.0
    """Tokens that could reach the upper clip bound: A > 0 and old p < 1 / (1 + ε_high)
    (`clip_eligible`)."""
    natural_high: float = 0.0
    """Of those, the tokens whose own (unclipped) ratio r passed 1 + ε_high, whatever the mode
    does with it: the pressure on the upper bound before any clip."""
    selected: float = 0.0
    """Tokens a covariance mode chose (clip_cov: detached; kl_cov: KL-penalised)."""
    ratio_max: float = 0.0
    """The largest token ratio r = π_θ / π_θold (0 with no valid token); combined by max."""

    @staticmethod
    def combine(parts: Iterable[LossCounts]) -> LossCounts:
        """The counts of several calls (micro-batches, ranks) as one: sums, and the max ratio."""
        items = list(parts)
        sums = {
            name: sum(getattr(c, name) for c in items)
            for name in LossCounts.__dataclass_fields__
            if name != "ratio_max"
        }
        return LossCounts(**sums, ratio_max=max((c.ratio_max for c in items), default=0.0))


@dataclass(frozen=True, eq=False)
class LossMetrics(Mapping[str, float]):
    """`policy_loss`'s metrics: a read-only mapping of metric name → value, like verl's dict,
    that carries the raw `counts` behind its fractions (so micro-batches and ranks combine
    exactly: `LossMetrics(LossCounts.combine(...), loss)`).

    Keys (fractions over the valid tokens, NaN with none):
      * ``clip_ratio/high``, ``clip_ratio/low``, ``clip_ratio/dual``: tokens whose loss the
        upper / lower / dual clip changes (see `TokenLoss`);
      * ``clip_ratio/high_eligible``: tokens that could reach the upper bound at all
        (`clip_eligible`; the same rule for every mode: it is about the tokens);
      * ``clip_ratio/high_natural``: of the eligible tokens, those whose unclipped token ratio
        passed 1 + ε_high (NaN with none eligible);
      * ``loss/cov_selected_share``: tokens a covariance mode chose;
      * ``losses/approx_kl``: mean of old_logprobs − logprobs, the k1 estimate of
        KL(π_old ‖ π_θ) on tokens sampled from π_old;
      * ``ratio/max``: the largest token ratio;
      * ``losses/policy_loss``: the loss value.
    """

    counts: LossCounts
    policy_loss: float

    @functools.cached_property
    def _values(self) -> dict[str, float]:
        c = self.counts

        def frac(x: float, n: float) -> float:
            return x / n if n > 0 else math.nan

        return {
            M.CLIP_RATIO_HIGH: frac(c.clip_high, c.tokens),
            M.CLIP_RATIO_LOW: frac(c.clip_low, c.tokens),
            M.CLIP_RATIO_DUAL: frac(c.clip_dual, c.tokens),
            M.CLIP_RATIO_HIGH_ELIGIBLE: frac(c.clip_eligible, c.tokens),
            M.CLIP_RATIO_HIGH_NATURAL: frac(c.natural_high, c.clip_eligible),
            M.COV_SELECTED: frac(c.selected, c.tokens),
            M.APPROX_KL: frac(c.sum_kl, c.tokens),
            M.RATIO_MAX: c.ratio_max if c.tokens > 0 else math.nan,
            M.POLICY_LOSS: self.policy_loss,
        }

    def __getitem__(self, key: str) -> float:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None = None,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    max_len: int | None = None,
    loss_mode: str = "vanilla",
    token_weights: Tensor | None = None,
    params: LossParams | None = None,
    selected: Tensor | None = None,
) -> tuple[Tensor, LossMetrics]:
    """Policy-gradient loss: the per-token loss named by `loss_mode`, aggregated by `agg`.

    Per token, with `loss_mode="vanilla"` (DAPO Eq. 8 with the decoupled clip of Eq. 10, as a
    loss to minimise):

        r = exp(logprobs − old_logprobs)
        ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))

    ε_low = ε_high is PPO's clip. With `clip_c` (dual clip, c > 1) and only where A < 0:
    ℓ = min(ℓ, −A·c), which bounds the loss of a negative-advantage token whose ratio has run
    far above 1 (see `clipped_surrogate`). The other modes replace ℓ (see POLICY_LOSSES and
    each `*_loss`). Then ℓ·token_weights (unless the mode folds the weights in itself), then
    `aggregate(ℓ, mask, agg, ...)`.

    Args:
        logprobs: `[B, T]` log π_θ of the sampled tokens (requires grad).
        old_logprobs: `[B, T]` log π_θ_old, treated as a constant (detached here).
        advantages: `[B]` one per sequence (broadcast over tokens) or `[B, T]`.
        mask: `[B, T]` bool or 0/1 float, 1 for response tokens that count in the loss.
        clip_low, clip_high: ε_low ∈ [0, 1) and ε_high ≥ 0.
        clip_c: dual-clip bound c > 1, or None.
        agg, num_tokens, num_seqs, max_len: see `aggregate`.
        loss_mode: the per-token loss, by name (see POLICY_LOSSES).
        token_weights: `[B, T]` constant weights on the per-token loss (e.g. the truncated
            importance weights of a rollout correction, or a token filter's 0/1), or None.
        params: the variant knobs (`LossParams`; None: the defaults).
        selected: `[B, T]` bool, the covariance tokens chosen over the whole mini-batch
            (`batch_selection`), for clip_cov / kl_cov; None: chosen over this call's tokens,
            as verl does per micro-batch.

    Returns:
        (loss, metrics): `metrics` is a `LossMetrics` mapping (names, values computed without
        grad over this call's valid tokens), whose `counts` are the raw sums behind it.
    """
    if logprobs.dim() != 2 or not (logprobs.shape == old_logprobs.shape == mask.shape):
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
            f"mask {tuple(mask.shape)} must all be [B, T]"
        )
    if not 0 <= clip_low < 1:
        raise ValueError(f"clip_low={clip_low}: ε_low must be in [0, 1)")
    if clip_high < 0:
        raise ValueError(f"clip_high={clip_high}: ε_high must be >= 0")
    if clip_c is not None and clip_c <= 1:
        raise ValueError(f"clip_c={clip_c}: the dual-clip bound must be > 1 (or None)")
    per_token_loss = get_policy_loss(loss_mode)
    if advantages.dim() == 1 and advantages.shape[0] == logprobs.shape[0]:
        adv = advantages[:, None].expand_as(logprobs)  # [B] → [B, T]
    elif advantages.shape == logprobs.shape:
        adv = advantages
    else:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must be [B] or [B, T] for logprobs "
            f"{tuple(logprobs.shape)}"
        )
    for name, extra in (("token_weights", token_weights), ("selected", selected)):
        if extra is not None and extra.shape != logprobs.shape:
            raise ValueError(
                f"{name} {tuple(extra.shape)} must be [B, T] like logprobs {tuple(logprobs.shape)}"
            )
    adv = adv.detach().to(logprobs.dtype)
    old = old_logprobs.detach()
    m = mask.bool()
    # Off the mask a weight may hold anything (NaN, inf): zeroed there, or its product with the
    # selected-away loss would still reach the gradient.
    weights = _masked(token_weights.detach(), m) if token_weights is not None else None

    x = LossInputs(logprobs, old, adv, m, clip_low, clip_high, clip_c, weights, selected)
    tl = per_token_loss(x, params or LossParams())
    per_token = tl.loss  # [B, T]
    if weights is not None and not tl.weighted:
        per_token = per_token * weights
    loss = aggregate(per_token, m, agg, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)

    with torch.no_grad():
        ratio = _token_ratio(logprobs.detach(), old, m)
        eligible = clip_eligible(old, adv, clip_high=clip_high) & m
        chosen = tl.selected if tl.selected is not None else _none(m)
        # One device-to-host copy for all of them: the update calls this per micro-batch.
        sums = torch.stack(
            [
                m.sum().double(),
                (tl.clip_high & m).sum().double(),
                (tl.clip_low & m).sum().double(),
                (tl.clip_dual & m).sum().double(),
                _masked(old - logprobs.detach(), m).sum().double(),
                loss.detach().double(),
                eligible.sum().double(),
                (eligible & (ratio > 1.0 + clip_high)).sum().double(),
                (chosen & m).sum().double(),
                _masked(ratio, m).max().double() if m.numel() else ratio.new_zeros(()).double(),
            ]
        )
        n, n_high, n_low, n_dual, sum_kl, value, n_elig, n_nat, n_sel, r_max = sums.tolist()

    counts = LossCounts(n, n_high, n_low, n_dual, sum_kl, n_elig, n_nat, n_sel, r_max)
    return loss, LossMetrics(counts, value)


def entropy_bonus(
    entropy: Tensor,
    mask: Tensor,
    *,
    coef: float,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    max_len: int | None = None,
) -> Tensor:
    """The entropy bonus as a term to add to the loss: −c · agg(H), a scalar.

    PPO's objective adds c₂·S[π_θ] to the clipped surrogate (Schulman et al. 2017, arXiv
    1707.06347, Eq. 9), after A3C (Mnih et al. 2016, arXiv 1602.01783); minimising the loss
    then raises the entropy. `entropy` `[B, T]` is the policy's per-token entropy H(π_θ(·|s_t))
    with its gradient, `mask` `[B, T]` the loss tokens; it is aggregated like the policy loss
    (same mode, same global counts), so micro-batches add up exactly and the bonus weighs
    tokens and sequences as the loss does (verl: agg_loss(entropy) · entropy_coeff).
    """
    if coef < 0:
        raise ValueError(f"coef={coef}: the entropy coefficient must be >= 0")
    agg_entropy = aggregate(entropy, mask, agg, num_tokens, num_seqs, max_len)
    return -coef * agg_entropy


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) on tokens sampled from the policy, `[B, T]`.

    With log ρ = ref_logprobs − logprobs (Schulman 2020):
      * ``"k1"``: −log ρ (unbiased, high variance, can be negative);
      * ``"k2"``: ½ (log ρ)² (biased, low variance, ≥ 0);
      * ``"k3"``: ρ − log ρ − 1 (unbiased, low variance, ≥ 0; GRPO's choice).

    The loss adds kl_coef · aggregate(kl_penalty(...), mask, ...); DAPO drops the term (§2.3), so
    the coefficient is 0 by default and this is only evaluated when it is not. For k3, log ρ is
    clamped to ±20 so that exp() stays finite at any position, padded ones included.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} "
            "must have the same shape"
        )
    log_rho = ref_logprobs.detach() - logprobs
    if kind == "k1":
        return -log_rho
    if kind == "k2":
        return 0.5 * log_rho.square()
    if kind == "k3":
        return k3(log_rho.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    raise ValueError(f"kind={kind!r}: use 'k1', 'k2' or 'k3'")
