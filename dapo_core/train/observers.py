"""What one step's update is watched for beyond its own metrics: observers the trainer attaches
to `Updater.run` (dapo_core.train.update), so that the update itself reads as Algorithm 1's
steps 5-6 and what the dashboard or one task wants from it lives here.

- `TraceObserver`: the per-token record of the kept rollouts (ratio, clip, entropy, eligibility)
  for the rollout browser, read off the loss passes' own tensors: no extra forward, no draw.
- `DecisionObserver`: entropy and the upper clip at the task's decision positions (the explore
  and lookup tasks' fork), beside the means over every token (docs/mechanisms.md).

An observer's sums ride on the update's own: each loss pass's are added over the micro-batches
and, with the update's counts, over the ranks in the mini-batch's one all-reduce; the observer
gets each mini-batch's totals and whether its update was applied (a non-finite one is skipped).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dapo_common import metric_names as M
from dapo_core.algo.losses import (
    MAX_LOG_RATIO,
    LossInputs,
    LossParams,
    clip_eligible,
    get_policy_loss,
)
from dapo_core.setup.config import AlgoConfig
from dapo_core.train.batching import Packed, Seq
from dapo_core.train.collective import Collective


@dataclass(frozen=True)
class LossPass:
    """One micro-batch's loss pass as `policy_loss` saw it: `[B, T]` tensors, one sequence per
    row (`logprobs` still carries its gradient), `advantages` `[B]`."""

    rows: Sequence[Seq]
    keys: Sequence[int]  # each row's index into the step's batch
    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    mask: Tensor  # the loss mask
    entropy: Tensor
    fill: bool  # this pass's forward stands in for the old-log-prob pass on its rows


class UpdateObserver:
    """Hooks at the points of one step's update; each does nothing unless overridden.
    `old_width` and `width`: how many sums `old_forward` and `loss_pass` return."""

    old_width = 0
    width = 0

    def old_forward(self, packed: Packed, entropy: Tensor) -> Sequence[float]:
        """One forward of the old-log-prob pass (eval mode, no gradient); `entropy` `[R, C−1]`."""
        return ()

    def old_totals(self, totals: Sequence[float]) -> None:
        """The old pass's sums over every forward of every rank."""

    def loss_pass(self, p: LossPass) -> Sequence[float]:
        """One micro-batch's loss pass, after its backward."""
        return ()

    def minibatch(self, totals: Sequence[float], *, filled: bool, applied: bool) -> None:
        """A mini-batch's sums over its passes and the ranks; `filled`: its first pass stood in
        for the old pass; `applied`: its update was taken (not skipped as non-finite)."""

    def finish(self, seqs: Sequence[Seq], dist: Collective) -> None:
        """After the last update (a collective point: every rank calls it)."""

    def metrics(self) -> dict[str, float]:
        return {}


def frac(x: float, n: float) -> float:
    """A share of counts, NaN when nothing was counted (the update's metrics use it too)."""
    return x / n if n else math.nan


class DecisionObserver(UpdateObserver):
    """Entropy and the upper clip at the task's decision positions. The entropy is the batch's
    under the policy that sampled it (the old pass's forwards and the loss pass that stands in
    for them); the clip share counts the loss passes of the applied updates, as clip_ratio/high."""

    old_width = 2
    width = 4

    def __init__(self, positions: Sequence[int], *, clip_high: float) -> None:
        self.positions, self.clip_high = tuple(positions), clip_high
        self.entropy = [0.0, 0.0]  # Σ entropy, tokens
        self.clip = [0.0, 0.0]  # up-clipped tokens with A > 0, loss tokens

    def old_forward(self, packed: Packed, entropy: Tensor) -> Sequence[float]:
        return decision_sums(packed.per_seq(entropy), packed.loss_mask, self.positions)

    def old_totals(self, totals: Sequence[float]) -> None:
        self.entropy = [float(totals[0]), float(totals[1])]

    def loss_pass(self, p: LossPass) -> Sequence[float]:
        ent = decision_sums(p.entropy.detach(), p.mask, self.positions) if p.fill else (0.0, 0.0)
        clip = decision_clip_counts(
            p.logprobs.detach(),
            p.old_logprobs,
            p.advantages,
            p.mask,
            self.positions,
            clip_high=self.clip_high,
        )
        return (*ent, *clip)

    def minibatch(self, totals: Sequence[float], *, filled: bool, applied: bool) -> None:
        if filled:
            self.entropy = [self.entropy[0] + float(totals[0]), self.entropy[1] + float(totals[1])]
        if applied:
            self.clip = [self.clip[0] + float(totals[2]), self.clip[1] + float(totals[3])]

    def metrics(self) -> dict[str, float]:
        return {
            M.ENTROPY_DECISION: frac(*self.entropy),
            M.CLIP_RATIO_HIGH_DECISION: frac(*self.clip),
        }


@dataclass
class TokenTrace:
    """What the update did to each token of one response, for the rollout browser: lists of
    one entry per response token (None where the value was not computed; see `token_trace`)."""

    logprob_old: list[float]  # log π_θold of the token
    ratio: list[float | None]  # r = π_θ / π_θold at the forward that updated it; None: no loss
    clip: list[int]  # −1 clipped at the lower bound, +1 at the upper, 0 not clipped
    entropy: list[float | None]  # H(π_θ(·|s_t)) in nats at that forward; None: no forward
    eligible: list[bool]  # could reach the upper bound (losses.clip_eligible)


class TraceObserver(UpdateObserver):
    """The per-token trace of the watched rows (indices into the step's batch), in `traces`.

    Each epoch's trace replaces the one before: the kept one is the last epoch's that reached
    the row, whose ratio is what the row's own update step saw after the earlier epochs moved
    θ away from θ_old. That is where the clip acts (in the first epoch's first mini-batch
    θ = θ_old, r = 1)."""

    def __init__(self, watch: Collection[int], algo: AlgoConfig) -> None:
        self.watch, self.algo = set(watch), algo  # the loss as the update runs it
        self.traces: dict[int, TokenTrace] = {}

    def loss_pass(self, p: LossPass) -> Sequence[float]:
        watched = {k: key for k, key in enumerate(p.keys) if key in self.watch}
        if watched:
            a = self.algo
            traces = token_trace(
                p.logprobs,
                p.old_logprobs,
                p.advantages,
                p.mask,
                p.entropy,
                list(watched),
                [len(p.rows[k].response_ids) for k in watched],
                loss_mode=a.loss_mode,
                clip_low=a.clip_low,
                clip_high=a.clip_high,
                clip_c=a.clip_c,
                params=a,
            )
            self.traces.update(zip(watched.values(), traces, strict=True))
        return ()

    def finish(self, seqs: Sequence[Seq], dist: Collective) -> None:
        """Every rank's traces, and a trace without ratios for each watched row that no loss
        pass saw (the overlong filter dropped it, or the step halted first): its old
        log-probs, eligibility and no clip."""
        if not self.watch:
            return
        if dist.world_size > 1:
            for part in dist.all_gather_object(self.traces):
                self.traces.update(part)
        for j in sorted(self.watch - set(self.traces)):
            old = seqs[j].old_logprobs.detach().float().cpu()  # [R]
            if old.numel() != len(seqs[j].response_ids):
                continue  # no old log-probs either (nothing scored this row)
            adv = torch.full_like(old, seqs[j].advantage)
            n = old.numel()
            self.traces[j] = TokenTrace(
                logprob_old=old.tolist(),
                ratio=[None] * n,
                clip=[0] * n,
                entropy=[None] * n,
                eligible=clip_eligible(old, adv, clip_high=self.algo.clip_high).tolist(),
            )


@torch.no_grad()
def token_trace(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    entropy: Tensor,
    rows: Sequence[int],
    lengths: Sequence[int],
    *,
    loss_mode: str,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
    params: LossParams | None = None,
) -> list[TokenTrace]:
    """The per-token view of one loss pass for some of its rows: `logprobs`, `old_logprobs`,
    `mask` (the loss mask) and `entropy` `[B, T]` and `advantages` `[B]` exactly as that pass
    gave them to `policy_loss`; `rows` the rows to read, `lengths` their response lengths.

    The clip flags are the registered loss's own (`get_policy_loss(loss_mode)` run again on
    these rows, detached): DAPO's Eq. 10 clip (arXiv 2503.14476, §3.1), active only where the
    clipped term is the pessimistic one, i.e. +1 where A > 0 and r > 1 + ε_high (the
    up-clipped tokens of Fig. 3a) and −1 where A < 0 and r < 1 − ε_low (for vanilla; gspo
    decides with its sequence ratio, cispo on every token). The dual clip is not flagged.
    `ratio` is the token's r = exp(log π_θ − log π_θold) (clamped at ±MAX_LOG_RATIO like the
    loss), also under gspo, whose clip reads the sequence's ratio instead. Eligibility is
    `clip_eligible`, the definition behind clip_ratio/high_eligible. Tokens outside the loss
    mask get no ratio and no clip."""
    idx = torch.tensor(list(rows), dtype=torch.long, device=logprobs.device)
    lp, old = logprobs.detach()[idx], old_logprobs.detach()[idx]  # [K, T]
    m = mask[idx].bool()
    adv = advantages.detach()[idx][:, None].expand_as(lp).to(lp.dtype)  # [K, T]
    # No covariance choice here (it moves no clip flag), so none is made.
    x = LossInputs(lp, old, adv, m, clip_low, clip_high, clip_c, selected=torch.zeros_like(m))
    tl = get_policy_loss(loss_mode)(x, params or LossParams())
    ratio = torch.exp((lp - old).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    clip = (tl.clip_high & m).long() - (tl.clip_low & m).long()
    eligible = clip_eligible(old, adv, clip_high=clip_high)
    cols = [x.cpu() for x in (old, ratio, clip, entropy.detach()[idx].float(), eligible, m)]
    out = []
    for k, n in enumerate(lengths):
        o, r, c, h, e, keep = (x[k, :n].tolist() for x in cols)
        out.append(
            TokenTrace(
                logprob_old=o,
                ratio=[v if in_loss else None for v, in_loss in zip(r, keep, strict=True)],
                clip=c,
                entropy=h,
                eligible=e,
            )
        )
    return out


def decision_sums(entropy: Tensor, mask: Tensor, positions: Sequence[int]) -> tuple[float, float]:
    """Σ entropy and the token count at the given response positions, over the rows of `mask`
    that reach them: `entropy` and `mask` `[B, T]`, one sequence per row, position t the
    sequence's t-th response token (a position past the end of every row counts nothing)."""
    cols = [t for t in positions if t < entropy.shape[1]]
    if not cols:
        return 0.0, 0.0
    m = mask[:, cols].float()
    return float((entropy[:, cols] * m).sum()), float(m.sum())


def decision_clip_counts(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    positions: Sequence[int],
    *,
    clip_high: float,
) -> tuple[float, float]:
    """(tokens with A > 0 whose ratio r = π_θ / π_θold passed 1 + ε_high, loss tokens) at the
    given response positions: `logprobs`, `old_logprobs` and `mask` `[B, T]`, `advantages` `[B]`
    (one per sequence). Where A > 0 and r > 1 + ε_high, DAPO's Eq. 10 takes the clipped term
    and the token's gradient is 0 (the vanilla loss); the comparison is in log space,
    log r > log(1 + ε_high), like clip_eligible's. Why apart from clip_ratio/high: on a task
    whose decision is one token in many, the share over every token hides whether the clip
    acted where the reward is decided."""
    cols = [t for t in positions if t < logprobs.shape[1]]
    if not cols:
        return 0.0, 0.0
    m = mask[:, cols].bool()
    up = (logprobs[:, cols] - old_logprobs[:, cols]) > math.log1p(clip_high)
    high = m & up & (advantages[:, None] > 0)
    return float(high.sum()), float(m.sum())


def split_sums(
    observers: Sequence[UpdateObserver], values: Sequence[float], *, old: bool = False
) -> list[tuple[UpdateObserver, list[float]]]:
    """Each observer with its own sums out of `values` (every observer's, one after another),
    cut by its `old_width` (`old`) or `width`."""
    out, at = [], 0
    for o in observers:
        n = o.old_width if old else o.width
        out.append((o, [float(v) for v in values[at : at + n]]))
        at += n
    return out
