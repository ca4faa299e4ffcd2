"""Policy losses: a per-token loss found by name, then one of three aggregations.

The decomposition follows verl's core_algos: a per-token loss `[B, T]` times the response mask,
then an aggregation mode that decides how tokens and sequences are weighted. The ablation ladder
switches the mode (sample-level GRPO → token-level DAPO), the clip bounds and the loss:
`POLICY_LOSSES` holds `vanilla` (DAPO's clipped surrogate), `gspo` (a sequence-level ratio,
Zheng et al. 2025, arXiv 2507.18071) and `cispo` (a clipped, stop-gradient weight on log π,
MiniMax-M1, arXiv 2506.13585), each a pure function `[B, T]` → `TokenLoss`.

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
when the micro-batch is the whole mini-batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dapo_common import metric_names as M

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


@dataclass(frozen=True)
class TokenLoss:
    """A policy loss per token and where its clip is active, all `[B, T]`.

    The masks carry the same meaning in every mode, so the trainer sums them blindly:
    `clip_high` / `clip_low` mark tokens whose loss the upper / lower clip bound changes, and
    `clip_dual` those bounded by the dual clip. Positions outside the loss mask may hold
    anything; the caller selects them away.
    """

    loss: Tensor  # [B, T] ℓ_{i,t}, differentiable w.r.t. logprobs
    clip_high: Tensor  # [B, T] bool
    clip_low: Tensor  # [B, T] bool
    clip_dual: Tensor  # [B, T] bool


class PolicyLoss(Protocol):
    """A registered per-token loss: logprobs (requires grad), old (detached), adv (detached) and
    mask (bool) all `[B, T]`, and the clip scalars; a mode ignores the scalars it has no use for.
    """

    def __call__(
        self,
        logprobs: Tensor,
        old: Tensor,
        adv: Tensor,
        mask: Tensor,
        *,
        clip_low: float,
        clip_high: float,
        clip_c: float | None,
    ) -> TokenLoss: ...


def _token_log_ratio(logprobs: Tensor, old: Tensor, mask: Tensor) -> Tensor:
    # Padded positions get log r = 0 so that whatever they hold cannot reach exp().
    return torch.where(mask, logprobs - old, torch.zeros_like(logprobs))


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
    ratio = torch.exp(_token_log_ratio(logprobs, old, mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    loss = clipped_surrogate(ratio, adv, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)
    r = ratio.detach()
    dual = (adv < 0) & (r > clip_c) if clip_c is not None else torch.zeros_like(mask)
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
    clip_c: float | None,
) -> TokenLoss:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071; its GSPO-token form): the ratio is
    the sequence's length-normalised likelihood ratio, clipped once per sequence,

        s_i = exp(1/|o_i| Σ_t log r_{i,t}),   s_{i,t} = sg[s_i] · π_θ(o_{i,t}) / sg[π_θ(o_{i,t})]
        ℓ_{i,t} = max(−A·s_{i,t}, −A·clip(s_{i,t}, 1 − ε_low, 1 + ε_high))

    so every token of a sequence has the value s_i and its own gradient s_i·∇log π_θ(o_{i,t}).
    As verl's `compute_policy_loss_gspo`: |o_i| counts the tokens of `mask` (at least 1), log s
    is clamped to ≤ 10 (no lower bound), and there is no dual clip (`clip_c` is not used).
    The paper (and verl's default) aggregates by "seq-mean-token-mean"; here `agg` stays the
    caller's choice. Shapes `[B, T]`; a row is one sequence.
    """
    log_ratio = _token_log_ratio(logprobs, old, mask)  # [B, T]
    lengths = mask.sum(dim=-1).clamp(min=1)  # [B]
    log_seq = (log_ratio.sum(dim=-1) / lengths).detach()  # [B] log s_i, a constant
    lp = torch.where(mask, logprobs, torch.zeros_like(logprobs))
    log_s = (lp - lp.detach() + log_seq[:, None]).clamp(max=_MAX_LOG_SEQ_RATIO)  # [B, T]
    s = torch.exp(log_s)
    loss = clipped_surrogate(s, adv, clip_low=clip_low, clip_high=clip_high)
    return TokenLoss(loss, *_clipped(s.detach(), adv, clip_low, clip_high), torch.zeros_like(mask))


def cispo_loss(
    logprobs: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
) -> TokenLoss:
    """CISPO (MiniMax-M1, arXiv 2506.13585, the CISPO objective): REINFORCE weighted by the clipped
    importance ratio, the weight a constant, so no token's gradient is ever dropped,

        w_{i,t} = sg[clip(r_{i,t}, 1 − ε_low, 1 + ε_high)],   ℓ_{i,t} = −w_{i,t} · A · log π_θ(o_{i,t})
        ∇ℓ_{i,t} = −w_{i,t} · A · ∇log π_θ(o_{i,t})

    As verl's `compute_policy_loss_cispo` (log r clamped to ±20, no dual clip: `clip_c` is not
    used). The loss VALUE is on the scale of log π, not of r. The clip bounds the weight whatever
    the sign of A, so `clip_high` / `clip_low` mark r > 1 + ε_high / r < 1 − ε_low on every token
    (verl's clip fraction counts r ≠ clip(r)). Shapes `[B, T]`.
    """
    ratio = torch.exp(_token_log_ratio(logprobs, old, mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    loss = -weight * adv * logprobs
    r = ratio.detach()
    return TokenLoss(loss, r > 1.0 + clip_high, r < 1.0 - clip_low, torch.zeros_like(mask))


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "vanilla": vanilla_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
}


def get_policy_loss(name: str) -> PolicyLoss:
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"loss_mode={name!r}: use one of {', '.join(POLICY_LOSSES)}") from None


@dataclass(frozen=True)
class LossCounts:
    """Raw sums of one `policy_loss` call over its valid tokens, so that a trainer can combine
    exact fractions over micro-batches and ranks (fraction = Σ numerator / Σ tokens)."""

    tokens: float
    """Valid tokens (the mask's)."""
    clip_high: float
    """Tokens whose loss the upper clip bound changes."""
    clip_low: float
    """Tokens whose loss the lower clip bound changes."""
    clip_dual: float
    """Tokens bounded by the dual clip."""
    sum_kl: float
    """Σ old_logprobs − logprobs (the k1 estimate's numerator)."""
    clip_eligible: float = 0.0
    """Tokens that could reach the upper clip bound: A > 0 and old p < 1 / (1 + ε_high)
    (`clip_eligible`)."""


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
) -> tuple[Tensor, dict[str, float], LossCounts]:
    """Policy-gradient loss: the per-token loss named by `loss_mode`, aggregated by `agg`.

    Per token, with `loss_mode="vanilla"` (DAPO Eq. 8 with the decoupled clip of Eq. 10, as a
    loss to minimise):

        r = exp(logprobs − old_logprobs)
        ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))

    ε_low = ε_high is PPO's clip. With `clip_c` (dual clip, c > 1) and only where A < 0:
    ℓ = min(ℓ, −A·c), which bounds the loss of a negative-advantage token whose ratio has run
    far above 1 (see `clipped_surrogate`). `gspo` and `cispo` replace ℓ (see `gspo_loss`,
    `cispo_loss`; neither has a dual clip). Then ℓ·token_weights, then
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
            importance weights of a rollout correction), or None.

    Returns:
        (loss, metrics, counts). metrics are python floats computed without grad over the
        valid tokens of this call (NaN when it has none):
          * ``clip_ratio/high``: fraction of tokens whose loss the upper clip changes (vanilla:
            A > 0 and r > 1 + ε_high; gspo: the same with the sequence ratio s_i; cispo:
            r > 1 + ε_high, any A);
          * ``clip_ratio/low``: the same at the lower bound (A < 0 and r < 1 − ε_low; cispo:
            r < 1 − ε_low, any A);
          * ``clip_ratio/dual``: fraction with A < 0 where −A·c is the active bound (r > c;
            always 0 for gspo and cispo);
          * ``clip_ratio/high_eligible``: fraction of tokens that could reach the upper bound
            at all, A > 0 and old probability below 1 / (1 + ε_high) (see `clip_eligible`;
            the same rule for every loss mode: it is about the tokens, not the mode's ratio);
          * ``losses/approx_kl``: mean of old_logprobs − logprobs, the k1 estimate of
            KL(π_old ‖ π_θ) on tokens sampled from π_old;
          * ``losses/policy_loss``: the loss value.
        counts (`LossCounts`) are the raw sums behind the fractions, for a trainer to combine
        over micro-batches.
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
    if token_weights is not None and token_weights.shape != logprobs.shape:
        raise ValueError(
            f"token_weights {tuple(token_weights.shape)} must be [B, T] like logprobs "
            f"{tuple(logprobs.shape)}"
        )
    adv = adv.detach().to(logprobs.dtype)
    old = old_logprobs.detach()
    m = mask.bool()

    tl = per_token_loss(
        logprobs, old, adv, m, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c
    )
    per_token = tl.loss  # [B, T]
    if token_weights is not None:
        per_token = per_token * token_weights.detach()
    loss = aggregate(per_token, m, agg, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)

    with torch.no_grad():
        # One device-to-host copy for all of them: the update calls this per micro-batch.
        sums = torch.stack(
            [
                m.sum().double(),
                (tl.clip_high & m).sum().double(),
                (tl.clip_low & m).sum().double(),
                (tl.clip_dual & m).sum().double(),
                torch.where(m, old - logprobs.detach(), torch.zeros_like(old)).sum().double(),
                loss.detach().double(),
                (clip_eligible(old, adv, clip_high=clip_high) & m).sum().double(),
            ]
        )
        n, n_high, n_low, n_dual, sum_kl, loss_value, n_eligible = sums.tolist()

    def frac(x: float) -> float:
        return x / n if n > 0 else float("nan")

    metrics = {
        M.CLIP_RATIO_HIGH: frac(n_high),
        M.CLIP_RATIO_LOW: frac(n_low),
        M.CLIP_RATIO_DUAL: frac(n_dual),
        M.CLIP_RATIO_HIGH_ELIGIBLE: frac(n_eligible),
        M.APPROX_KL: frac(sum_kl),
        M.POLICY_LOSS: loss_value,
    }
    return loss, metrics, LossCounts(n, n_high, n_low, n_dual, sum_kl, n_eligible)


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
