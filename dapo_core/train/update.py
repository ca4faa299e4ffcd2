"""Steps 5–6 of Algorithm 1: old log-probs, then μ passes of the clipped objective over
mini-batches, with exact gradient accumulation over micro-batches and ranks.

Exactness: every loss is a sum over tokens divided by a normaliser that the aggregation
declares (dapo_core.algo.losses.Aggregation). The normaliser is counted once over the whole
mini-batch (every rank holds the same global batch, so it is global by construction) and passed
to every micro-batch of every rank, so the micro-losses add up to the mini-batch loss and their
gradients to its gradient, whatever the split. Gradients are summed over ranks: FSDP averages
them, so each rank's loss is scaled by the world size (a no-op for one worker).

FSDP needs every rank to run the same number of forward/backward passes: a rank whose share
of a mini-batch is smaller pads with zero-weight passes over one token.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from dapo_common import metric_names as M
from dapo_core.algo.correction import rollout_correction
from dapo_core.algo.losses import (
    COVARIANCE_MODES,
    Aggregation,
    LossParams,
    aggregate,
    batch_selection,
    entropy_bonus,
    get_aggregation,
    kl_penalty,
    policy_loss,
)
from dapo_core.algo.overlong import overlong_filter_mask
from dapo_core.algo.token_filters import high_entropy_mask, off_policy_sequence_mask
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.batching import (
    Packed,
    Seq,
    gather_rows,
    pack,
    packing_attention_cost,
    scatter_rows,
)
from dapo_core.train.collective import Collective, shard
from dapo_core.train.memory import PhaseMemory
from dapo_core.train.observers import LossPass, UpdateObserver, frac, split_sums
from dapo_core.train.policy import PolicyForward

log = logging.getLogger(__name__)

Forward = Callable[..., tuple[Tensor, Tensor]]


@dataclass
class Counts:
    """Sums over the tokens of every micro-batch of every rank (fractions divide once at the end)."""

    tokens: float = 0.0  # loss tokens
    clip_high: float = 0.0
    clip_low: float = 0.0
    clip_dual: float = 0.0
    sum_kl: float = 0.0  # Σ (old − new) log-prob: k1 of KL(old ‖ new)
    entropy_sum: float = 0.0  # Σ entropy of the loss tokens; counted on the filled pass only
    seq_tokens: float = 0.0  # prompt + response tokens through forward + backward
    clip_eligible: float = 0.0  # loss tokens that could reach the upper clip bound
    # The loss variants' own counts (losses.LossCounts, the token filters): eligible tokens
    # whose unclipped ratio passed 1 + ε_high, tokens a covariance loss chose, tokens of
    # sequences the off-policy mask dropped, tokens the top-entropy filter kept.
    natural_high: float = 0.0
    cov_selected: float = 0.0
    off_policy_masked: float = 0.0
    entropy_kept: float = 0.0

    def add(self, other: Counts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_tensor(self) -> Tensor:
        return torch.tensor([getattr(self, f.name) for f in fields(self)], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, x: Tensor) -> Counts:
        return cls(*[float(v) for v in x.tolist()])


@dataclass
class UpdateStats:
    """What one rollout step's update did, as typed numbers (metrics() names them)."""

    policy_loss: float = math.nan  # mean over applied mini-batches
    kl_loss: float = math.nan
    grad_norm: float = math.nan
    updates: int = 0  # gradient updates applied
    empty_minibatches: int = 0  # no loss token left after the overlong filter
    nonfinite: int = 0  # skipped: NaN / inf loss or gradient
    trailing_nonfinite: int = 0  # of those, the ones after the last applied update
    filled_entropy: tuple[float, float] = (0.0, 0.0)  # Σ entropy, tokens: see Updater.run
    long_shares: list[float] = field(default_factory=list)  # per mini-batch, see long_share
    truncated_shares: list[float] = field(default_factory=list)  # per mini-batch, likewise
    counts: Counts | None = None
    mismatch: dict[str, float] | None = None  # rollout_correction's sums over the batch
    old_entropy: float = math.nan  # entropy of the batch under the policy that sampled it
    ratio_max: float = math.nan  # largest token ratio π_θ / π_θold of the applied updates
    old_logprob_s: float = 0.0
    update_s: float = 0.0

    def metrics(self) -> dict[str, float]:
        c = self.counts or Counts()
        mm = self.mismatch or {}
        n_mm = mm.get("mismatch_tokens", 0.0)
        return {
            M.POLICY_LOSS: self.policy_loss,
            M.KL_LOSS: self.kl_loss,
            M.GRAD_NORM: self.grad_norm,
            M.APPROX_KL: frac(c.sum_kl, c.tokens),
            M.CLIP_RATIO_HIGH: frac(c.clip_high, c.tokens),
            M.CLIP_RATIO_LOW: frac(c.clip_low, c.tokens),
            M.CLIP_RATIO_DUAL: frac(c.clip_dual, c.tokens),
            M.CLIP_RATIO_HIGH_ELIGIBLE: frac(c.clip_eligible, c.tokens),
            M.CLIP_RATIO_HIGH_NATURAL: frac(c.natural_high, c.clip_eligible),
            M.RATIO_MAX: self.ratio_max,
            M.COV_SELECTED: frac(c.cov_selected, c.tokens),
            M.OFF_POLICY_MASKED: frac(c.off_policy_masked, c.tokens),
            M.ENTROPY_KEPT: frac(c.entropy_kept, c.tokens),
            M.ENTROPY_MEAN: self.old_entropy,
            M.MISMATCH_ABS_LOGP: frac(mm.get("mismatch_abs", 0.0), n_mm),
            M.MISMATCH_KL: frac(mm.get("mismatch_k3", 0.0), n_mm),
            M.IS_MASKED_FRAC: frac(mm.get("is_masked", 0.0), n_mm),
            M.NONFINITE_UPDATES: float(self.nonfinite),
            M.LOSS_LONG_SHARE: _mean(self.long_shares),
            M.LOSS_TRUNCATED_SHARE: _mean(self.truncated_shares),
            M.OLD_LOGPROB_S: self.old_logprob_s,
            M.UPDATE_S: self.update_s,
            M.UPDATE_TOKENS_PER_S: c.seq_tokens / self.update_s if self.update_s else 0.0,
        }


EMPTY_STATS = UpdateStats()


@dataclass(frozen=True)
class RowChoice:
    """What a look at the whole mini-batch decided for one of its rows (see
    `Updater._batch_choices`), `[R]` bool over the row's response tokens, or None."""

    selected: Tensor | None  # chosen by a covariance loss (clip_cov / kl_cov)
    keep: Tensor | None  # kept by the top-entropy filter


class Updater:
    """Runs old log-probs and the μ-epoch update for one trainer (policy, optimizer, schedule)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        fwd: PolicyForward,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        *,
        pad_id: int,
        device: torch.device,
        dist: Collective,
        ref_model: torch.nn.Module | None = None,
    ) -> None:
        self.cfg, self.fwd = cfg, fwd
        self.optimizer, self.scheduler = optimizer, scheduler
        self.pad_id, self.device, self.dist = pad_id, device, dist
        self.ref_model = ref_model
        self.memory = PhaseMemory(device)  # the trainer hands in its own, to report per step
        # Updates skipped in a row before this step (the trainer's streak): with this step's,
        # optim.max_nonfinite_updates of them end the step's updates (see update).
        self.nonfinite_carried = 0
        self.params = [p for p in fwd.model.parameters() if p.requires_grad]
        self.agg = get_aggregation(cfg.algo.loss_agg)
        a = cfg.algo
        self.loss_params: LossParams = a  # the config section is the loss modes' knobs
        # The covariance losses and the top-entropy filter choose tokens from statistics of the
        # whole mini-batch under the current policy: a look at it before its micro-batches.
        self.looks_ahead = a.loss_mode in COVARIANCE_MODES or a.top_entropy_quantile < 1.0
        self._packed: bool | None = None  # the packed layout, once the model passed the probe
        self._dropout = has_dropout(fwd.model)
        policy = getattr(fwd.model, "policy", fwd.model)  # a LogprobModel wraps the causal LM
        self._attention_cost = packing_attention_cost(getattr(policy, "config", None))

    def _layout(self) -> bool:
        """Whether micro-batches are packed: several sequences per row where the model keeps
        them apart (checked once, on first use: PolicyForward.packs_exactly), else one per row."""
        if self._packed is None:
            self._packed = self.fwd.packs_exactly(self.pad_id, self.device)
            if not self._packed:
                log.warning("the model lets packed sequences see each other: padding instead")
        return self._packed

    def _pack(self, rows: Sequence[Seq]) -> Packed:
        return pack(
            rows,
            self.pad_id,
            self.device,
            packed=self._layout(),
            attention_cost=self._attention_cost,
        )

    # --- 5–6 together ----------------------------------------------------------------------
    def run(
        self,
        seqs: list[Seq],
        n_groups: int,
        shuffle: torch.Generator,
        *,
        observers: Sequence[UpdateObserver] = (),
    ) -> UpdateStats:
        """Steps 5 and 6 for the batch `seqs` (n_groups groups of G, group by group): old
        log-probs and the rollout correction, then the μ-epoch update; timed separately.
        `observers` watch both (dapo_core.train.observers).

        Old log-probs of the first mini-batch of the first epoch come from that mini-batch's
        own forward (detached) rather than from the separate pass, when nothing needs them
        before it (`reuses_first_forward`): the separate pass then skips those sequences, and
        their importance ratio is exactly 1 bit for bit, as θ = θ_old there.
        """
        t0 = time.perf_counter()
        first = self.first_minibatch(seqs, n_groups, shuffle) if self.reuses_first_forward else []
        with self.memory.phase("logprob"):
            ent_sum, ent_n = self._old_pass(seqs, skip=set(first), observers=observers)
        mismatch = None if first else self.correct(seqs)
        t1 = time.perf_counter()
        with self.memory.phase("update"):
            stats = self.update(seqs, n_groups, shuffle, fill_old=first, observers=observers)
        t2 = time.perf_counter()
        if first:  # mode `none`: the mismatch sums only, now that every row has old log-probs
            mismatch = self.correct(seqs)
        ent_sum, ent_n = ent_sum + stats.filled_entropy[0], ent_n + stats.filled_entropy[1]
        stats.old_entropy = ent_sum / ent_n if ent_n > 0 else math.nan
        stats.mismatch = mismatch
        stats.old_logprob_s = (t1 - t0) + (time.perf_counter() - t2)
        stats.update_s = t2 - t1
        return stats

    @property
    def reuses_first_forward(self) -> bool:
        """Whether the update's first forward can stand in for the old-log-prob pass on its own
        sequences: no reference model (its log-probs come from the pass), no rollout-correction
        weights (the loss needs them before the forward), no dropout (the update's
        train-mode forward must compute what the pass's eval-mode one does), and no look at the
        whole mini-batch before it (`looks_ahead`: it needs every row's old log-probs)."""
        return (
            self.ref_model is None
            and self.cfg.algo.rollout_correction == "none"
            and not self._dropout
            and not self.looks_ahead
        )

    def first_minibatch(
        self, seqs: list[Seq], n_groups: int, shuffle: torch.Generator
    ) -> list[int]:
        """Indices into `seqs` of the loss rows of the first epoch's first mini-batch, as
        `update` will draw it from `shuffle` (read without advancing it)."""
        state = shuffle.get_state()
        perm = torch.randperm(n_groups, generator=shuffle).tolist()
        shuffle.set_state(state)
        G, mb = self.cfg.rollout.group_size, self.cfg.batch.mini_batch_size
        index = [g * G + j for g in perm[:mb] for j in range(G)]
        kept = {id(s) for s in self._loss_rows([seqs[i] for i in index])}
        return [i for i in index if id(seqs[i]) in kept]

    # --- 5: old log-probs ----------------------------------------------------------------
    def old_logprobs(self, seqs: list[Seq]) -> float:
        """Fill each Seq's old (and reference) log-probs; returns the mean entropy over every
        response token of the batch."""
        ent_sum, ent_n = self._old_pass(seqs, skip=set())
        return ent_sum / ent_n if ent_n > 0 else math.nan

    @torch.no_grad()
    def _old_pass(
        self, seqs: list[Seq], skip: set[int], observers: Sequence[UpdateObserver] = ()
    ) -> tuple[float, float]:
        """Old (and reference) log-probs of every Seq but those in `skip`; returns the entropy
        sum and token count over their response tokens, summed over ranks (the observers' own
        sums with them). Each rank scores its share; the rows are then gathered."""
        model = self.fwd.model
        was_training = model.training
        model.eval()
        mb = self.cfg.batch.micro_batch_size
        rank, world = self.dist.rank, self.dist.world_size
        todo = [i for i in range(len(seqs)) if i not in skip]
        mine = shard(todo, rank, world)
        passes = math.ceil(math.ceil(len(todo) / world) / mb)
        rows: dict[int, tuple[Tensor, Tensor | None]] = {}
        ent_sum = ent_n = 0.0
        observed = [0.0] * sum(o.old_width for o in observers)
        self._layout()  # the packing probe runs on every rank at the same point (FSDP)
        try:
            for i in range(passes):
                idx = mine[i * mb : (i + 1) * mb]
                if not idx:
                    self.fwd(self._dummy())  # keep FSDP's collectives in step
                    if self.ref_model is not None:
                        self.fwd(self._dummy(), self.ref_model)
                    continue
                packed = self._pack([seqs[j] for j in idx])
                lp, ent = self.fwd(packed)
                ent_sum += float((ent * packed.response_mask).sum())
                ent_n += float(packed.response_mask.sum())
                sums = [x for o in observers for x in o.old_forward(packed, ent)]
                observed = [a + b for a, b in zip(observed, sums, strict=True)]
                ref = None
                if self.ref_model is not None:
                    ref = gather_rows(self.fwd(packed, self.ref_model)[0], packed)
                for k, (j, row) in enumerate(zip(idx, gather_rows(lp, packed), strict=True)):
                    rows[j] = (row, ref[k] if ref is not None else None)
        finally:
            model.train(was_training)
        for part in self.dist.all_gather_object(rows):
            for j, (old, ref_row) in part.items():
                seqs[j].old_logprobs = old
                if ref_row is not None:
                    seqs[j].ref_logprobs = ref_row
        totals = self.dist.all_reduce_sum(
            torch.tensor([ent_sum, ent_n, *observed], dtype=torch.float64)
        )
        for o, sums in split_sums(observers, totals[2:].tolist(), old=True):
            o.old_totals(sums)
        return float(totals[0]), float(totals[1])

    # --- 6: μ passes over mini-batches ---------------------------------------------------
    def update(
        self,
        seqs: list[Seq],
        n_groups: int,
        shuffle: torch.Generator,
        *,
        fill_old: Sequence[int] = (),
        observers: Sequence[UpdateObserver] = (),
    ) -> UpdateStats:
        """μ epochs over shuffled mini-batches of whole groups. `fill_old` (see `run`): indices
        of the first mini-batch's loss rows, whose old log-probs its own forward provides.
        `observers` see each loss pass and each mini-batch (see `run`)."""
        a, b = self.cfg.algo, self.cfg.batch
        G = self.cfg.rollout.group_size
        self.fwd.model.train()
        by_group = [seqs[g * G : (g + 1) * G] for g in range(n_groups)]
        stats = UpdateStats(counts=Counts())
        losses: list[float] = []
        kl_losses: list[float] = []
        norms: list[float] = []
        index_of = {id(s): i for i, s in enumerate(seqs)}
        halted = False
        ratio_max = 0.0  # over the applied updates, this rank's rows (all ranks' at the end)
        for epoch in range(a.ppo_epochs):
            if halted:
                break
            perm = torch.randperm(n_groups, generator=shuffle).tolist()
            for m in range(0, n_groups, b.mini_batch_size):
                mini = [s for gi in perm[m : m + b.mini_batch_size] for s in by_group[gi]]
                rows = self._loss_rows(mini)
                fill = bool(fill_old) and epoch == 0 and m == 0
                if fill and [index_of[id(s)] for s in rows] != list(fill_old):
                    raise RuntimeError("fill_old is not the first mini-batch's loss rows")
                lengths = [s.loss_tokens for s in rows]
                num_tokens, num_seqs = self.agg.counts(lengths, all_rows=len(mini))
                if num_tokens == 0:
                    for s in rows if fill else []:  # no token at all: nothing to score
                        s.old_logprobs = torch.zeros(0)
                    stats.empty_minibatches += 1
                    continue
                stats.long_shares.append(long_share(self.agg, lengths))
                truncated = [s.truncated for s in rows]
                stats.truncated_shares.append(weight_share(self.agg, lengths, truncated))
                self.optimizer.zero_grad(set_to_none=True)
                local = Counts()
                local_ratio_max = [0.0]  # this mini-batch's, on this rank
                observed = [0.0] * sum(o.width for o in observers)
                loss_kl = torch.zeros(2, dtype=torch.float64)
                mine = shard(rows, self.dist.rank, self.dist.world_size)
                passes = math.ceil(math.ceil(len(rows) / self.dist.world_size) / b.micro_batch_size)
                filled: dict[int, Tensor] = {}
                choices = (
                    self._batch_choices(rows, mine, passes, shuffle) if self.looks_ahead else {}
                )
                for i in range(passes):
                    micro = mine[i * b.micro_batch_size : (i + 1) * b.micro_batch_size]
                    share, olds = self._micro_step(
                        micro,
                        num_tokens,
                        num_seqs,
                        local,
                        local_ratio_max,
                        fill=fill,
                        keys=[index_of[id(s)] for s in micro],
                        observers=observers,
                        observed=observed,
                        choices=choices,
                    )
                    loss_kl += share
                    if fill:
                        filled.update(
                            {index_of[id(s)]: x for s, x in zip(micro, olds, strict=True)}
                        )
                totals = self.dist.all_reduce_sum(
                    torch.cat(
                        [loss_kl, local.as_tensor(), torch.tensor(observed, dtype=torch.float64)]
                    )
                )
                n_counts = len(fields(Counts))
                counted = Counts.from_tensor(totals[2 : 2 + n_counts])
                if fill:  # every rank needs every row's old log-probs for the later epochs
                    for part in self.dist.all_gather_object(filled):
                        for j, old in part.items():
                            seqs[j].old_logprobs = old
                    # Σ entropy and token count of these rows (loss tokens = response tokens
                    # here: no rollout-correction mask), for the batch's entropy under θ_old.
                    stats.filled_entropy = (counted.entropy_sum, counted.tokens)
                norm = self._grad_norm()
                applied = math.isfinite(norm) and math.isfinite(float(totals[0]))
                for o, sums in split_sums(observers, totals[2 + n_counts :].tolist()):
                    o.minibatch(sums, filled=fill, applied=applied)
                if not applied:
                    # Skipped, not applied: one bad batch must not poison the weights.
                    self.optimizer.zero_grad(set_to_none=True)
                    stats.nonfinite += 1
                    stats.trailing_nonfinite += 1
                    carried = 0 if stats.updates else self.nonfinite_carried
                    if stats.trailing_nonfinite + carried >= self.cfg.optim.max_nonfinite_updates:
                        # The run stops after this step: its other updates are not tried,
                        # so it stops after exactly the limit's count of skipped updates.
                        halted = True
                        break
                    continue
                self.optimizer.step()
                self.scheduler.step()
                stats.updates += 1
                stats.trailing_nonfinite = 0
                losses.append(float(totals[0]))
                kl_losses.append(float(totals[1]))
                norms.append(norm)
                assert stats.counts is not None
                stats.counts.add(counted)
                ratio_max = max(ratio_max, local_ratio_max[0])
        self.optimizer.zero_grad(set_to_none=True)
        if self.dist.world_size > 1:  # a collective: every rank ends `update` here
            ratio_max = max(self.dist.all_gather_object(ratio_max))
        stats.ratio_max = ratio_max if ratio_max > 0 else math.nan
        for o in observers:  # a collective point: every rank attaches the same observers
            o.finish(seqs, self.dist)
        if stats.empty_minibatches:
            log.warning(
                "%d mini-batch(es) had no loss tokens after the overlong filter (all truncated) "
                "and were skipped",
                stats.empty_minibatches,
            )
        stats.policy_loss = _mean(losses)
        stats.kl_loss = _mean(kl_losses)
        stats.grad_norm = _mean(norms)
        return stats

    def _loss_rows(self, rows: list[Seq]) -> list[Seq]:
        """Overlong filter (§3.4): truncated rows leave the loss and its token count."""
        if not self.cfg.algo.overlong_filter:
            return rows
        keep = overlong_filter_mask(torch.tensor([s.truncated for s in rows])).bool().tolist()
        return [s for s, k in zip(rows, keep, strict=True) if k]

    def _batch_choices(
        self, rows: list[Seq], mine: list[Seq], passes: int, shuffle: torch.Generator
    ) -> dict[int, RowChoice]:
        """A look at the whole mini-batch before its micro-batches, for what is chosen from its
        statistics under the current policy: the covariance losses' tokens (`batch_selection`)
        and the top-entropy filter's (`high_entropy_mask`). One forward without gradient over
        this rank's rows, in the same micro-batches as the update (so FSDP's collectives stay in
        step), the rows gathered from every rank, then one choice over all of them: the same on
        every rank and whatever the split, so micro-batch accumulation stays exact. θ does not
        change within a mini-batch, so these are the log-probs and entropies the loss then sees
        (under dropout, from another draw of it). The cost: one more forward, without gradient,
        per mini-batch, for these variants only.
        Returns each row's choice, keyed by id(row)."""
        a, mb = self.cfg.algo, self.cfg.batch.micro_batch_size
        position = {id(s): k for k, s in enumerate(rows)}
        seen: dict[int, tuple[Tensor, Tensor]] = {}
        with torch.no_grad():
            for i in range(passes):
                micro = mine[i * mb : (i + 1) * mb]
                if not micro:
                    self.fwd(self._dummy())  # keep FSDP's collectives in step
                    continue
                packed = self._pack(micro)
                lp, ent = self.fwd(packed)
                for s, lp_row, ent_row in zip(
                    micro, gather_rows(lp, packed), gather_rows(ent, packed), strict=True
                ):
                    seen[position[id(s)]] = (lp_row.float(), ent_row.float())
        for part in self.dist.all_gather_object(seen):
            seen.update(part)
        lp_all = pad_sequence([seen[k][0] for k in range(len(rows))], batch_first=True)  # [B, T]
        ent_all = pad_sequence([seen[k][1] for k in range(len(rows))], batch_first=True)
        old = pad_sequence([s.old_logprobs.float() for s in rows], batch_first=True)
        mask = pad_sequence([_row_mask(s) for s in rows], batch_first=True)  # [B, T] bool
        adv = torch.tensor([s.advantage for s in rows], dtype=lp_all.dtype)  # [B]
        selected = keep = None
        if a.loss_mode in COVARIANCE_MODES:
            # The same draw on every rank: the shuffle generator is, and it moves in step.
            seed = int(torch.randint(2**62, (1,), generator=shuffle))
            selected = batch_selection(
                a.loss_mode,
                lp_all,
                old,
                adv,
                mask,
                clip_low=a.clip_low,
                clip_high=a.clip_high,
                params=self.loss_params,
                generator=torch.Generator().manual_seed(seed),
            )
        if a.top_entropy_quantile < 1.0:
            keep = high_entropy_mask(ent_all, mask, top_quantile=a.top_entropy_quantile)
        out = {}
        for k, s in enumerate(rows):
            n = len(s.response_ids)
            out[id(s)] = RowChoice(
                selected[k, :n] if selected is not None else None,
                keep[k, :n] if keep is not None else None,
            )
        return out

    def _micro_step(
        self,
        rows: Sequence[Seq],
        num_tokens: float,
        num_seqs: float,
        counts: Counts,
        ratio_max: list[float],
        *,
        fill: bool = False,
        keys: Sequence[int] = (),
        observers: Sequence[UpdateObserver] = (),
        observed: list[float] | None = None,
        choices: Mapping[int, RowChoice] | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """Forward + backward of one micro-batch. Returns its (loss, kl) share of the
        mini-batch, and when `fill` each row's old log-probs: this forward's own, detached
        (θ = θ_old here). `choices` holds `_batch_choices`' per row. Adds the micro-batch's
        counts to `counts`, raises `ratio_max[0]` to its largest token ratio, and adds the
        `observers`' sums of the pass to `observed` (`keys`: the rows' indices in the batch)."""
        a = self.cfg.algo
        if not rows:  # this rank's share ran out: a zero-weight pass keeps FSDP in step
            lp, _ = self.fwd(self._dummy())
            (lp.sum() * 0.0).backward()
            return torch.zeros(2, dtype=torch.float64), []
        packed = self._pack(rows)
        want_entropy = a.entropy_coef > 0
        lp_rows, ent_rows = self.fwd(packed, entropy_grad=want_entropy)  # [R, C−1] float32
        # The loss sees one sequence per row ([B, T]), however the model's rows were packed.
        lp, ent = packed.per_seq(lp_rows), packed.per_seq(ent_rows)
        mask = packed.loss_mask
        olds: list[Tensor] = []
        if fill:
            old = lp.detach()
            olds = gather_rows(lp_rows, packed)
        else:
            old = scatter_rows([s.old_logprobs for s in rows], packed)
        adv = torch.tensor([s.advantage for s in rows], device=lp.device)  # [B]
        weights = loss_mask = None
        if rows[0].token_weights is not None:
            weights = scatter_rows([s.token_weights for s in rows], packed)  # type: ignore[misc]
        if rows[0].token_mask is not None:
            keep = scatter_rows([s.token_mask.float() for s in rows], packed)  # type: ignore[union-attr]
            loss_mask = mask * keep
        loss_mask = mask if loss_mask is None else loss_mask
        # The token filters (TRL's): a dropped token weighs 0 in the loss and stays in its
        # normaliser. Off-policy mask: per sequence, from this forward's log-probs.
        keep = loss_mask.bool()
        n_off_policy = 0.0
        if a.off_policy_mask_threshold is not None:
            if all(len(s.sampler_logprobs) == len(s.response_ids) for s in rows):
                sampler = scatter_rows(
                    [torch.tensor(s.sampler_logprobs, dtype=torch.float32) for s in rows], packed
                )
            else:  # no sampler log-probs from the engine: the old policy sampled (TRL's fallback)
                sampler = old
            seq_keep = off_policy_sequence_mask(
                adv, lp, sampler, loss_mask, threshold=a.off_policy_mask_threshold
            )
            dropped = keep & ~seq_keep[:, None]
            n_off_policy = float(dropped.sum())
            keep = keep & ~dropped
        picks = [choices[id(s)] for s in rows] if choices else []
        selected = _rows_of(picks, "selected", packed)
        kept = _rows_of(picks, "keep", packed)
        if kept is not None:
            keep = keep & kept
            n_entropy_kept = float((kept & loss_mask.bool()).sum())
        else:
            n_entropy_kept = float(loss_mask.sum())
        if a.off_policy_mask_threshold is not None or a.top_entropy_quantile < 1.0:
            weights = keep.float() if weights is None else weights * keep
        loss, metrics = policy_loss(
            lp,
            old,
            adv,
            loss_mask,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            clip_c=a.clip_c,
            agg=a.loss_agg,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_len=self.cfg.rollout.max_response_len,
            loss_mode=a.loss_mode,
            token_weights=weights,
            params=self.loss_params,
            selected=selected,
        )
        lc = metrics.counts
        ratio_max[0] = max(ratio_max[0], lc.ratio_max)
        if want_entropy:
            loss = loss + entropy_bonus(
                ent,
                loss_mask,
                coef=a.entropy_coef,
                agg=a.loss_agg,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                max_len=self.cfg.rollout.max_response_len,
            )
        kl_value = 0.0
        if self.ref_model is not None and a.kl_coef > 0:
            ref = scatter_rows([s.ref_logprobs for s in rows], packed)
            kl = aggregate(
                kl_penalty(lp, ref),
                loss_mask,
                agg=a.loss_agg,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                max_len=self.cfg.rollout.max_response_len,
            )
            loss = loss + a.kl_coef * kl
            kl_value = float(kl.detach())
        (loss * self.dist.world_size).backward()
        if observers:
            seen = LossPass(rows, keys, lp, old, adv, loss_mask, ent, fill)
            sums = [x for o in observers for x in o.loss_pass(seen)]
            assert observed is not None
            observed[:] = [a + b for a, b in zip(observed, sums, strict=True)]
        counts.add(
            Counts(
                tokens=lc.tokens,
                clip_high=lc.clip_high,
                clip_low=lc.clip_low,
                clip_dual=lc.clip_dual,
                sum_kl=lc.sum_kl,
                # Read only where this pass stands in for the old-log-prob pass (see run).
                entropy_sum=float((ent.detach() * loss_mask).sum()) if fill else 0.0,
                seq_tokens=float(packed.tokens),
                clip_eligible=lc.clip_eligible,
                natural_high=lc.natural_high,
                cov_selected=lc.selected,
                off_policy_masked=n_off_policy,
                entropy_kept=n_entropy_kept,
            )
        )
        return torch.tensor([float(loss.detach()), kl_value], dtype=torch.float64), olds

    def correct(self, seqs: list[Seq]) -> dict[str, float] | None:
        """Rollout correction of the batch, once per step (old and sampler log-probs are fixed
        for its μ epochs): sets each Seq's token weights / mask and returns the mismatch sums.
        None when the engine reported no sampler log-probs."""
        if not seqs or any(len(s.sampler_logprobs) != len(s.response_ids) for s in seqs):
            return None
        a = self.cfg.algo
        old = pad_sequence([s.old_logprobs for s in seqs], batch_first=True)  # [B, R]
        sampler = pad_sequence(
            [torch.tensor(s.sampler_logprobs, dtype=torch.float32) for s in seqs],
            batch_first=True,
        )
        lengths = torch.tensor([len(s.response_ids) for s in seqs])
        mask = torch.arange(old.shape[1])[None, :] < lengths[:, None]  # [B, R]
        weights, keep, sums = rollout_correction(
            old, sampler, mask, mode=a.rollout_correction, cap=a.rollout_is_cap
        )
        for i, s in enumerate(seqs):
            n = len(s.response_ids)
            s.token_weights = weights[i, :n].clone() if weights is not None else None
            s.token_mask = keep[i, :n].bool().clone() if a.rollout_correction == "mis" else None
        return sums

    def _grad_norm(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.grad_clip)
        full = getattr(norm, "full_tensor", None)  # a DTensor under FSDP
        return float(full() if full is not None else norm)

    def _dummy(self) -> Packed:
        pad = self.pad_id
        return self._pack([Seq(0, [pad], [pad], False, 0.0)])


def make_optimizer(
    cfg: ExperimentConfig, model: torch.nn.Module
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters, with linear warm-up over gradient updates (not
    rollout steps): update u (0-based) uses lr · min(1, (u + 1) / warmup_updates)."""
    o = cfg.optim
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=o.lr,
        betas=o.betas,
        weight_decay=o.weight_decay,
    )
    warm = o.warmup_updates
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda u: min(1.0, (u + 1) / warm) if warm > 0 else 1.0
    )
    return optimizer, scheduler


def reference_model(
    cfg: ExperimentConfig, model: torch.nn.Module, dist: Collective
) -> torch.nn.Module | None:
    """A frozen copy of the starting policy for the KL penalty, or None when kl_coef is 0 (DAPO
    drops the term, §2.3)."""
    if cfg.algo.kl_coef <= 0:
        return None
    if dist.world_size > 1:
        raise ValueError(
            f"algo.kl_coef={cfg.algo.kl_coef}: the KL penalty's reference model is not "
            "supported on several workers yet; use --workers 1 or algo.kl_coef=0 (DAPO "
            "drops the KL term)"
        )
    import copy

    return copy.deepcopy(model).eval().requires_grad_(False)


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether a train-mode forward may differ from an eval-mode one: a dropout module with
    p > 0, or a config's `*dropout` rate above 0 (attention dropout is functional in
    transformers, so it shows only in the config)."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
        config = getattr(module, "config", None)
        to_dict = getattr(config, "to_dict", None)
        if callable(to_dict):
            for key, value in to_dict().items():
                if key.endswith("dropout") and isinstance(value, int | float) and value > 0:
                    return True
    return False


def _rows_of(picks: Sequence[RowChoice], name: str, packed: Packed) -> Tensor | None:
    """One of the rows' choices (`selected` or `keep`) in the loss layout `[B, T]` bool, or None
    when it was not made."""
    rows = [getattr(p, name) for p in picks]
    if not rows or any(r is None for r in rows):
        return None
    return scatter_rows([r.float() for r in rows], packed).bool()


def _row_mask(s: Seq) -> Tensor:
    """A row's loss tokens, `[R]` bool: its response, less what the rollout correction masked."""
    if s.token_mask is not None:
        return s.token_mask.bool()
    return torch.ones(len(s.response_ids), dtype=torch.bool)


def weight_share(agg: Aggregation, token_counts: Sequence[int], chosen: Sequence[bool]) -> float:
    """Share of a mini-batch's loss weight on the chosen rows (NaN when nothing weighs)."""
    weights = agg.row_weights(token_counts)
    total = sum(weights)
    if total == 0:
        return math.nan
    return sum(w for w, c in zip(weights, chosen, strict=True) if c) / total


def long_share(agg: Aggregation, token_counts: Sequence[int]) -> float:
    """Share of a mini-batch's loss weight on its longer responses (longer than the median):
    the token-level loss's signature. E.g. lengths 10, 10, 30, 50 — median 20: token-mean puts
    (30 + 50) / 100 = 0.8 of the weight on the two long ones, seq-mean-token-mean 2 / 4 = 0.5."""
    ordered = sorted(token_counts)
    n = len(ordered)
    if n == 0:
        return math.nan
    median = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return weight_share(agg, token_counts, [c > median for c in token_counts])


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan
