"""The trainer: one object holding everything stateful, one `step()` that is Algorithm 1 of DAPO.

    step():
      1. sample a batch of prompts, G responses each          (rollout engine)
      2. reward each response: correctness + soft overlong     (Eq. 13)
      3. dynamic sampling: keep groups with 0 < #correct < G,  (§3.2, Eq. 11's constraint)
         over-sample until the batch is full
      4. group-relative advantages                             (Eq. 9)
      5. old log-probs with one forward pass, no grad
      6. μ passes over mini-batches: clipped surrogate with    (Eq. 8 / Eq. 10 / Eq. 12)
         decoupled ε_low / ε_high, token- or sample-level aggregation, overlong filter;
         gradients accumulate exactly over micro-batches
      7. push the new weights to the rollout engine; metrics

The math lives in pure functions elsewhere (advantages, losses, overlong, sampling, rewards);
this module only orchestrates. Nothing here imports Prefect, Ray, SQLAlchemy or Streamlit.

Dynamic sampling carry-over: informative groups beyond the training batch are kept for the next
step instead of being thrown away. They were sampled by the policy one update-step earlier (at
most one: the carry is capped below the batch size, so every step generates at least one fresh
batch and consumes its carry first). Their old log-probs are recomputed with the current policy
in step 5 like everyone else's, so the importance ratio in the loss stays exact; only the
advantages describe samples one version older — the same off-policyness μ > 1 already has.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dapo_core import metric_names as M
from dapo_core.advantages import group_advantages
from dapo_core.config import ExperimentConfig
from dapo_core.engines.base import Completion, RolloutEngine, SamplingParams
from dapo_core.logprobs import token_logprobs_and_entropy
from dapo_core.losses import policy_loss
from dapo_core.overlong import overlong_filter_mask, overlong_penalty
from dapo_core.rewards import math_score
from dapo_core.sampling import informative_groups

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from dapo_core.data import Problem

log = logging.getLogger(__name__)
_warned: set[str] = set()

STATE_VERSION = 1


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


# --- rollout records -------------------------------------------------------------------
@dataclass
class Rollout:
    """One sampled response and how it was scored."""

    completion: Completion
    score: float  # correctness: +1 / −1
    acc: float  # 1.0 if correct
    pred: str | None  # the extracted answer
    penalty: float  # soft overlong penalty (Eq. 13), ≤ 0
    reward: float  # score + penalty: what the advantage sees


@dataclass
class Group:
    """G responses to one prompt: GRPO's unit of comparison."""

    problem: Problem
    prompt: str
    rollouts: list[Rollout]
    policy_version: int  # rollout step whose policy sampled it

    @property
    def accs(self) -> list[float]:
        return [r.acc for r in self.rollouts]


@dataclass
class StepResult:
    """What one rollout step produced: scalar metrics and a few rollouts to keep."""

    step: int
    metrics: dict[str, float]
    samples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Collected:
    groups: list[Group]  # the training batch
    generated: list[Group]  # every group generated this step (metrics see all of them)
    gen_batches: int
    rollout_s: float
    reward_s: float
    dropped_carry: int


# --- the trainer -------------------------------------------------------------------------
class Trainer:
    """Owns the policy, optimizer, LR schedule, rollout engine and the dynamic-sampling buffer."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        engine: RolloutEngine,
        problems: Sequence[Problem],
        *,
        format_prompt: Callable[[Problem], str] | None = None,
        logprob_chunk_size: int | None = None,
    ) -> None:
        if not problems:
            raise ValueError(f"data.train={cfg.data.train!r} holds no problems")
        self.cfg = cfg
        self.model = model
        self.tokenizer = tokenizer
        self.engine = engine
        self.problems = list(problems)
        self.device = next(model.parameters()).device
        self.chunk_size = logprob_chunk_size
        if format_prompt is None:
            from dapo_core.data import format_prompt as _fmt

            template = cfg.data.prompt_template
            format_prompt = lambda p: _fmt(p, template, tokenizer)  # noqa: E731
        self._format = format_prompt

        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=o.lr,
            betas=o.betas,
            weight_decay=o.weight_decay,
        )
        # Linear warm-up over gradient updates (not rollout steps): update u (0-based) uses
        # lr · min(1, (u + 1) / warmup_updates).
        warm = o.warmup_updates
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda u: min(1.0, (u + 1) / warm) if warm > 0 else 1.0
        )

        seed = cfg.run.seed
        self._shuffle_gen = torch.Generator(device="cpu").manual_seed(seed + 1)
        self._data_epoch = 0
        self._data_pos = 0
        self._order = self._epoch_order(0)
        self._carry: list[Group] = []

        # Progress counters (cumulative). The paper's x-axis is gradient updates.
        self.rollout_step = 0
        self.grad_updates = 0
        self.gen_batches_total = 0
        self.tokens_total = 0

        self._ref_model: PreTrainedModel | None = None
        if cfg.algo.kl_coef > 0:
            import copy

            self._ref_model = copy.deepcopy(model).eval().requires_grad_(False)

        b = cfg.batch
        if b.train_batch_size <= b.mini_batch_size and cfg.algo.ppo_epochs == 1:
            _warn_once(
                "ratio-one",
                "one mini-batch and one epoch per rollout step: the importance ratio is exactly 1, "
                "so clipping (and Clip-Higher) never acts; lower batch.mini_batch_size or raise "
                "algo.ppo_epochs for the clip to matter",
            )

    @property
    def carried_groups(self) -> list[Group]:
        """Informative groups waiting for the next step (dynamic sampling's surplus)."""
        return list(self._carry)

    # ==================================================================================
    # Algorithm 1
    # ==================================================================================
    def step(self) -> StepResult:
        """One rollout step; returns its metrics and sampled rollouts."""
        t_step = time.perf_counter()
        self.rollout_step += 1
        cfg = self.cfg

        # 1–3. sample prompts → G responses → rewards → dynamic-sampling filter
        col = self._collect()
        batch = col.groups

        metrics: dict[str, float] = {}
        metrics.update(self._rollout_metrics(col))
        nan = float("nan")
        # Defaults for a step that trains on nothing (dynamic sampling kept no group).
        update_metrics: dict[str, float] = {
            M.OLD_LOGPROB_S: 0.0,
            M.UPDATE_S: 0.0,
            M.UPDATE_TOKENS_PER_S: 0.0,
            M.ENTROPY_MEAN: nan,
            M.POLICY_LOSS: nan,
            M.KL_LOSS: nan,
            M.APPROX_KL: nan,
            M.CLIP_RATIO_HIGH: nan,
            M.CLIP_RATIO_LOW: nan,
            M.CLIP_RATIO_DUAL: nan,
            M.GRAD_NORM: nan,
        }
        if batch:
            # 4. group-relative advantages over the final batch
            G = cfg.rollout.group_size
            rewards = torch.tensor([r.reward for g in batch for r in g.rollouts])  # [P*G]
            advantages = group_advantages(
                rewards, G, eps=cfg.algo.adv_eps, scale_by_std=cfg.algo.scale_adv_by_std
            )
            seqs = self._sequences(batch, advantages)

            # 5. old log-probs (and the entropy metric) with the current policy, no grad
            t0 = time.perf_counter()
            entropy_sum, entropy_tokens = self._old_logprobs(seqs)
            update_metrics[M.OLD_LOGPROB_S] = time.perf_counter() - t0
            update_metrics[M.ENTROPY_MEAN] = entropy_sum / max(entropy_tokens, 1)

            # 6. μ passes over mini-batches with the clipped objective
            t0 = time.perf_counter()
            update_metrics.update(self._update(seqs, n_groups=len(batch)))
            update_s = time.perf_counter() - t0
            update_metrics[M.UPDATE_S] = update_s
            # Tokens (prompt + response) through forward + backward per second of update.
            update_tokens = update_metrics.pop("_update_tokens")
            update_metrics[M.UPDATE_TOKENS_PER_S] = update_tokens / update_s if update_s else 0.0

            # 7. the engine samples the next step with the new weights
            self.engine.load_weights(self.model.state_dict())
        else:
            _warn_once(
                f"empty-{self.rollout_step}",
                f"step {self.rollout_step}: dynamic sampling kept 0 informative groups out of "
                f"{len(col.generated)} in {col.gen_batches} generation batches "
                f"(algo.max_gen_batches={cfg.algo.max_gen_batches}); skipping the update",
            )
        metrics.update(update_metrics)

        self.gen_batches_total += col.gen_batches
        step_s = time.perf_counter() - t_step
        metrics.update(
            {
                M.ROLLOUT_STEP: float(self.rollout_step),
                M.GRAD_UPDATES: float(self.grad_updates),
                M.GEN_BATCHES_TOTAL: float(self.gen_batches_total),
                M.TOKENS_TOTAL: float(self.tokens_total),
                M.ROLLOUT_S: col.rollout_s,
                M.REWARD_S: col.reward_s,
                M.STEP_S: step_s,
                M.LR: float(self.optimizer.param_groups[0]["lr"]),
            }
        )
        return StepResult(self.rollout_step, metrics, self._samples(col.generated))

    # --- 1–3: collect a training batch ---------------------------------------------------
    def _collect(self) -> _Collected:
        cfg, b = self.cfg, self.cfg.batch
        target = b.train_batch_size
        generated: list[Group] = []
        gen_batches = 0
        rollout_s = reward_s = 0.0

        def generate(n_prompts: int) -> list[Group]:
            nonlocal gen_batches, rollout_s, reward_s
            problems = self._next_problems(n_prompts)
            groups, t_gen, t_rew = self._rollout(problems)
            gen_batches += 1
            rollout_s += t_gen
            reward_s += t_rew
            generated.extend(groups)
            return groups

        if not cfg.algo.dynamic_sampling:
            # One generation batch of exactly the training batch size; every group trains.
            groups = generate(target)
            return _Collected(groups, generated, gen_batches, rollout_s, reward_s, 0)

        kept = list(self._carry)  # oldest first: consumed before fresh groups
        self._carry = []
        while len(kept) < target and gen_batches < cfg.algo.max_gen_batches:
            fresh = generate(b.gen_batch_size)
            acc = torch.tensor([a for g in fresh for a in g.accs])  # [P*G]
            mask = informative_groups(acc, cfg.rollout.group_size)  # [P] bool
            kept.extend(g for g, keep in zip(fresh, mask.tolist(), strict=True) if keep)
        batch, surplus = kept[:target], kept[target:]
        # Cap the carry below the batch size so the next step generates at least once and its
        # training batch is never more than one policy version old.
        cap = target - 1
        self._carry, dropped = surplus[:cap], len(surplus[cap:])
        if len(batch) < target:
            log.warning(
                "step %d: dynamic sampling reached algo.max_gen_batches=%d with %d/%d informative "
                "groups (of %d generated); training on what was collected",
                self.rollout_step,
                cfg.algo.max_gen_batches,
                len(batch),
                target,
                len(generated),
            )
        return _Collected(batch, generated, gen_batches, rollout_s, reward_s, dropped)

    def _next_problems(self, n: int) -> list[Problem]:
        """The next n problems of a seeded per-epoch shuffle of the training set."""
        out: list[Problem] = []
        while len(out) < n:
            if self._data_pos >= len(self._order):
                self._data_epoch += 1
                self._data_pos = 0
                self._order = self._epoch_order(self._data_epoch)
            take = min(n - len(out), len(self._order) - self._data_pos)
            idx = self._order[self._data_pos : self._data_pos + take]
            out.extend(self.problems[i] for i in idx)
            self._data_pos += take
        return out

    def _epoch_order(self, epoch: int) -> list[int]:
        gen = torch.Generator(device="cpu").manual_seed(self.cfg.run.seed * 100_003 + epoch)
        return torch.randperm(len(self.problems), generator=gen).tolist()

    def _rollout(self, problems: list[Problem]) -> tuple[list[Group], float, float]:
        """G responses per problem, scored. Returns the groups and (generate, reward) seconds."""
        cfg = self.cfg
        G, L_max = cfg.rollout.group_size, cfg.rollout.max_response_len
        prompts = [self._format(p) for p in problems]
        t0 = time.perf_counter()
        completions = self.engine.generate(
            prompts,
            SamplingParams(
                n=G,
                max_tokens=L_max,
                temperature=cfg.rollout.temperature,
                top_p=cfg.rollout.top_p,
            ),
        )
        t_gen = time.perf_counter() - t0
        t0 = time.perf_counter()
        groups: list[Group] = []
        for i, (problem, prompt) in enumerate(zip(problems, prompts, strict=True)):
            rollouts = []
            for c in completions[i * G : (i + 1) * G]:
                result = math_score(c.text, problem.answer)
                penalty = 0.0
                if cfg.algo.overlong_penalty:  # Eq. 13 with L_max = the generation budget
                    penalty = float(
                        overlong_penalty(
                            len(c.token_ids),
                            L_max,
                            cfg.algo.overlong_cache_len,
                            cfg.algo.overlong_penalty_factor,
                        )
                    )
                score = float(result.score)
                rollouts.append(
                    Rollout(c, score, float(result.acc), result.pred, penalty, score + penalty)
                )
                self.tokens_total += len(c.token_ids)
            groups.append(Group(problem, prompt, rollouts, self.rollout_step))
        return groups, t_gen, time.perf_counter() - t0

    # --- 4–5: sequences and old log-probs --------------------------------------------------
    def _sequences(self, batch: list[Group], advantages: Tensor) -> list[_Seq]:
        seqs: list[_Seq] = []
        k = 0
        for gi, g in enumerate(batch):
            for r in g.rollouts:
                c = r.completion
                seqs.append(
                    _Seq(
                        group=gi,
                        prompt_ids=c.prompt_ids,
                        response_ids=c.token_ids,
                        truncated=c.truncated,
                        advantage=float(advantages[k]),
                    )
                )
                k += 1
        return seqs

    @torch.no_grad()
    def _old_logprobs(self, seqs: list[_Seq]) -> tuple[float, int]:
        """Fill each sequence's old log-probs (and ref log-probs for KL); returns the entropy
        sum and token count over every response token of the batch."""
        was_training = self.model.training
        self.model.eval()
        entropy_sum, tokens = 0.0, 0
        try:
            mb = self.cfg.batch.micro_batch_size
            for s in range(0, len(seqs), mb):
                chunk = seqs[s : s + mb]
                packed = self._pack(chunk)
                lp, ent = self._logprobs(self.model, packed)
                mask = packed.response_mask
                entropy_sum += float((ent * mask).sum())
                tokens += int(mask.sum())
                ref = self._logprobs(self._ref_model, packed)[0] if self._ref_model else None
                for row, seq in enumerate(chunk):
                    sl = packed.slices[row]
                    seq.old_logprobs = lp[row, sl].cpu()
                    if ref is not None:
                        seq.ref_logprobs = ref[row, sl].cpu()
        finally:
            self.model.train(was_training)
        return entropy_sum, tokens

    def _logprobs(self, model: PreTrainedModel, packed: _Packed) -> tuple[Tensor, Tensor]:
        return token_logprobs_and_entropy(
            model,
            packed.input_ids,
            packed.attention_mask,
            packed.response_tokens,
            temperature=self.cfg.rollout.temperature,
            chunk_size=self.chunk_size,
        )

    def _pack(self, seqs: Sequence[_Seq]) -> _Packed:
        """Right-padded [B, L] tensors for a micro-batch, plus masks aligned with the shifted
        [B, L−1] log-prob positions (position t scores token t + 1)."""
        pad = int(self.tokenizer.pad_token_id or 0)
        L = max(len(s.prompt_ids) + len(s.response_ids) for s in seqs)
        B = len(seqs)
        input_ids = torch.full((B, L), pad, dtype=torch.long)
        attention = torch.zeros((B, L), dtype=torch.long)
        response_tokens = torch.zeros((B, L), dtype=torch.long)
        slices: list[slice] = []
        for i, s in enumerate(seqs):
            P, R = len(s.prompt_ids), len(s.response_ids)
            input_ids[i, : P + R] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
            attention[i, : P + R] = 1
            response_tokens[i, P : P + R] = 1
            slices.append(slice(P - 1, P - 1 + R))  # shifted positions of the response tokens
        dev = self.device
        return _Packed(
            input_ids=input_ids.to(dev),
            attention_mask=attention.to(dev),
            response_tokens=response_tokens.to(dev),
            response_mask=response_tokens[:, 1:].float().to(dev),
            slices=slices,
        )

    # --- 6: μ passes over mini-batches -----------------------------------------------------
    def _update(self, seqs: list[_Seq], n_groups: int) -> dict[str, float]:
        cfg = self.cfg
        a, b = cfg.algo, cfg.batch
        G = cfg.rollout.group_size
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]

        # Exact, token-weighted sums over every micro-batch of the step.
        tot = dict.fromkeys(("tokens", "high", "low", "dual", "kl1", "seq_tokens"), 0.0)
        losses: list[float] = []
        kl_losses: list[float] = []
        grad_norms: list[float] = []
        skipped = 0
        by_group = [seqs[g * G : (g + 1) * G] for g in range(n_groups)]
        for _epoch in range(a.ppo_epochs):
            perm = torch.randperm(n_groups, generator=self._shuffle_gen).tolist()
            for m in range(0, n_groups, b.mini_batch_size):
                mini = [s for gi in perm[m : m + b.mini_batch_size] for s in by_group[gi]]
                # Overlong filter (§3.4): truncated rows leave the loss and the token count.
                keep = self._loss_rows(mini)
                rows = [s for s, k in zip(mini, keep, strict=True) if k]
                num_tokens = sum(len(s.response_ids) for s in rows)
                if num_tokens == 0:
                    skipped += 1
                    continue
                # Dr.GRPO's constant normaliser counts every row; the sample-level mean only
                # the rows that stay in the loss.
                agg_all = cfg.algo.loss_agg == "seq-mean-token-sum-norm"
                num_seqs = len(mini) if agg_all else len(rows)
                self.optimizer.zero_grad(set_to_none=True)
                mini_loss = mini_kl = 0.0
                for s in range(0, len(rows), b.micro_batch_size):
                    out = self._micro_step(rows[s : s + b.micro_batch_size], num_tokens, num_seqs)
                    mini_loss += out["loss"]
                    mini_kl += out["kl_loss"]
                    for key in ("tokens", "high", "low", "dual", "kl1", "seq_tokens"):
                        tot[key] += out[key]
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
                self.optimizer.step()
                self.scheduler.step()
                self.grad_updates += 1
                losses.append(mini_loss)
                kl_losses.append(mini_kl)
                grad_norms.append(float(grad_norm))
        self.optimizer.zero_grad(set_to_none=True)
        if skipped:
            log.warning(
                "step %d: %d mini-batch(es) had no loss tokens after the overlong filter "
                "(all truncated) and were skipped",
                self.rollout_step,
                skipped,
            )
        n = max(tot["tokens"], 1.0)
        nan = float("nan")
        return {
            M.POLICY_LOSS: sum(losses) / len(losses) if losses else nan,
            M.KL_LOSS: sum(kl_losses) / len(kl_losses) if kl_losses else nan,
            M.APPROX_KL: tot["kl1"] / n if tot["tokens"] else nan,
            M.CLIP_RATIO_HIGH: tot["high"] / n,
            M.CLIP_RATIO_LOW: tot["low"] / n,
            M.CLIP_RATIO_DUAL: tot["dual"] / n,
            M.GRAD_NORM: sum(grad_norms) / len(grad_norms) if grad_norms else nan,
            "_update_tokens": tot["seq_tokens"],
        }

    def _loss_rows(self, rows: list[_Seq]) -> list[bool]:
        if not self.cfg.algo.overlong_filter:
            return [True] * len(rows)
        truncated = torch.tensor([s.truncated for s in rows])
        return overlong_filter_mask(truncated).bool().tolist()

    def _micro_step(self, rows: list[_Seq], num_tokens: int, num_seqs: int) -> dict[str, float]:
        """Forward + backward of one micro-batch; the loss is already its share of the
        mini-batch's loss (global num_tokens / num_seqs), so gradients just add up."""
        a = self.cfg.algo
        packed = self._pack(rows)
        lp, _ = self._logprobs(self.model, packed)  # [B, L−1]
        mask = packed.response_mask  # [B, L−1]
        old = torch.zeros_like(lp)
        for i, s in enumerate(rows):
            old[i, packed.slices[i]] = s.old_logprobs.to(lp.device)
        adv = torch.tensor([s.advantage for s in rows], device=lp.device)  # [B]
        loss, stats = policy_loss(
            lp,
            old,
            adv,
            mask,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            clip_c=a.clip_c,
            agg=a.loss_agg,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_len=self.cfg.rollout.max_response_len,
        )
        kl_value = 0.0
        if self._ref_model is not None and a.kl_coef > 0:
            from dapo_core.losses import aggregate, kl_penalty

            ref = torch.zeros_like(lp)
            for i, s in enumerate(rows):
                ref[i, packed.slices[i]] = s.ref_logprobs.to(lp.device)
            kl = aggregate(
                kl_penalty(lp, ref),
                mask,
                agg=a.loss_agg,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                max_len=self.cfg.rollout.max_response_len,
            )
            loss = loss + a.kl_coef * kl
            kl_value = float(kl.detach())
        loss.backward()
        # Clip fractions travel as token counts (summed over micro-batches, divided once at the
        # end), so the step's fraction is exact whatever the micro-batch split.
        return {
            "loss": float(loss.detach()),
            "kl_loss": kl_value,
            "tokens": stats["_n_tokens"],
            "high": stats["_n_clip_high"],
            "low": stats["_n_clip_low"],
            "dual": stats["_n_clip_dual"],
            "kl1": stats["_sum_kl"],
            "seq_tokens": float(packed.attention_mask.sum()),
        }

    # --- metrics -----------------------------------------------------------------------
    def _rollout_metrics(self, col: _Collected) -> dict[str, float]:
        """Rewards and lengths over every response generated this step, before filtering."""
        rs = [r for g in col.generated for r in g.rollouts]
        n = max(len(rs), 1)
        lengths = [len(r.completion.token_ids) for r in rs]
        G = self.cfg.rollout.group_size
        if col.generated:
            acc = torch.tensor([r.acc for r in rs])
            informative = float(informative_groups(acc, G).float().mean())
        else:
            informative = float("nan")
        gen_tokens = sum(lengths)
        tps = gen_tokens / col.rollout_s if col.rollout_s > 0 else 0.0
        return {
            M.REWARD_MEAN: sum(r.reward for r in rs) / n,
            M.SCORE_MEAN: sum(r.score for r in rs) / n,
            M.OVERLONG_PENALTY_MEAN: sum(r.penalty for r in rs) / n,
            M.ACC_MEAN: sum(r.acc for r in rs) / n,
            M.RESPONSE_LENGTH_MEAN: gen_tokens / n,
            M.RESPONSE_LENGTH_MAX: float(max(lengths, default=0)),
            M.RESPONSE_CLIP_RATIO: sum(r.completion.truncated for r in rs) / n,
            M.KEPT_GROUPS: informative,
            M.GEN_BATCHES: float(col.gen_batches),
            M.CARRIED_GROUPS: float(len(self._carry)),
            M.TRAIN_GROUPS: float(len(col.groups)),
            M.TOKENS_PER_S: tps,
            M.ROLLOUT_TOKENS_PER_S: tps,
        }

    def _samples(self, groups: list[Group]) -> list[dict[str, Any]]:
        """run.samples_per_step rollouts, evenly spaced over the step's responses."""
        rs = [(g, r) for g in groups for r in g.rollouts]
        k = min(self.cfg.run.samples_per_step, len(rs))
        out = []
        for i in range(k):
            g, r = rs[i * len(rs) // k]
            out.append(
                {
                    "prompt": g.prompt,
                    "response": r.completion.text,
                    "ground_truth": g.problem.answer,
                    "pred": r.pred,
                    "reward": r.reward,
                    "score": r.score,
                    "overlong_penalty": r.penalty,
                    "correct": bool(r.acc > 0),
                    "length": len(r.completion.token_ids),
                    "truncated": r.completion.truncated,
                }
            )
        return out

    # --- checkpoint state ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything but the model weights (saved by the checkpoint as a model directory)."""
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        try:
            import numpy as np

            rng["numpy"] = np.random.get_state()
        except ImportError:  # pragma: no cover - numpy ships with torch's usual installs
            pass
        return {
            "version": STATE_VERSION,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng,
            "shuffle_gen": self._shuffle_gen.get_state(),
            "engine": self.engine.state_dict(),
            "data": {"epoch": self._data_epoch, "pos": self._data_pos},
            "carry": [_group_to_dict(g) for g in self._carry],
            "progress": {
                "rollout_step": self.rollout_step,
                "grad_updates": self.grad_updates,
                "gen_batches": self.gen_batches_total,
                "tokens": self.tokens_total,
            },
            "ref_model": self._ref_model.state_dict() if self._ref_model is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state_dict() (the model weights must already be loaded)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"checkpoint trainer state version {state.get('version')} is not {STATE_VERSION}"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        if "numpy" in rng:
            import numpy as np

            np.random.set_state(rng["numpy"])
        self._shuffle_gen.set_state(state["shuffle_gen"])
        self.engine.load_state_dict(state["engine"])
        self._data_epoch = int(state["data"]["epoch"])
        self._data_pos = int(state["data"]["pos"])
        self._order = self._epoch_order(self._data_epoch)
        self._carry = [_group_from_dict(d) for d in state["carry"]]
        p = state["progress"]
        self.rollout_step = int(p["rollout_step"])
        self.grad_updates = int(p["grad_updates"])
        self.gen_batches_total = int(p["gen_batches"])
        self.tokens_total = int(p["tokens"])
        if self._ref_model is not None and state.get("ref_model") is not None:
            self._ref_model.load_state_dict(state["ref_model"])
        self.engine.load_weights(self.model.state_dict())


# --- internal records ----------------------------------------------------------------------
@dataclass
class _Seq:
    """One training sequence: prompt + response tokens, its advantage and old log-probs."""

    group: int
    prompt_ids: list[int]
    response_ids: list[int]
    truncated: bool
    advantage: float
    old_logprobs: Tensor = field(default_factory=lambda: torch.empty(0))  # [R]
    ref_logprobs: Tensor = field(default_factory=lambda: torch.empty(0))  # [R]


@dataclass
class _Packed:
    input_ids: Tensor  # [B, L]
    attention_mask: Tensor  # [B, L]
    response_tokens: Tensor  # [B, L] 1 on response tokens
    response_mask: Tensor  # [B, L−1] float, aligned with log-prob positions
    slices: list[slice]  # per row: the response's log-prob positions


def _group_to_dict(g: Group) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "problem": asdict(g.problem),
        "prompt": g.prompt,
        "policy_version": g.policy_version,
        "rollouts": [{**asdict(r), "completion": asdict(r.completion)} for r in g.rollouts],
    }


def _group_from_dict(d: dict[str, Any]) -> Group:
    from dapo_core.data import Problem

    rollouts = []
    for r in d["rollouts"]:
        c = Completion(**r["completion"])
        rollouts.append(Rollout(c, r["score"], r["acc"], r["pred"], r["penalty"], r["reward"]))
    return Group(Problem(**d["problem"]), d["prompt"], rollouts, d["policy_version"])
