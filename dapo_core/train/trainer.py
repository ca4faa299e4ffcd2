"""The trainer: one object holding everything stateful, one `step()` that is Algorithm 1 of DAPO.

    step():
      1. sample a batch of prompts, G responses each          (rollout engine)
      2. reward each response: correctness + soft overlong     (Eq. 7, Eq. 13)
      3. dynamic sampling: keep groups with 0 < #correct < G,  (§3.2, Eq. 11's constraint)
         over-sample until the batch is full
      4. group-relative advantages                             (Eq. 9)
      5. old log-probs with one forward pass, no grad (the first
         mini-batch's: its own first forward in step 6, detached)
      6. μ passes over mini-batches: clipped surrogate with    (Eq. 8 / Eq. 10 / Eq. 12)
         decoupled ε_low / ε_high, token- or sample-level aggregation, overlong filter;
         gradients accumulate exactly over micro-batches and ranks
      7. push the new weights to the rollout engine; metrics

The pieces live beside it: rollout.py (records, reward, dynamic-sampling buffer), batching.py
(sequences → tensors), update.py (steps 5–6), observers.py (token traces and decision-position
metrics read off step 6's passes), collective.py (ranks), async_rollout.py (steps
1–2 on a worker thread that overlaps step 6: rollout.mode=async, where step 7 hands the worker
the weights by version and a step takes the worker's batches instead of sampling its own). With many workers every
rank runs this same step: each generates a share of the prompts, the groups are gathered so
that every rank holds the same global batch, and the update splits each mini-batch by sequences.

Dynamic sampling carry-over: informative groups beyond the training batch wait for the next
step. Their old log-probs are recomputed with the current policy in step 5 like everyone
else's, so the importance ratio stays exact; only their advantages describe samples one
policy version older — the same off-policyness μ > 1 already has.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dapo_common import metric_names as M
from dapo_core.algo.advantages import get_estimator, group_advantages
from dapo_core.data.loaders import decision_positions
from dapo_core.engines.base import RolloutEngine
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.async_rollout import AsyncSource, staleness_metrics
from dapo_core.train.batching import Seq, sequences
from dapo_core.train.collective import LOCAL, Collective
from dapo_core.train.memory import PhaseMemory
from dapo_core.train.observers import (
    DecisionObserver,
    TokenTrace,
    TraceObserver,
    UpdateObserver,
)
from dapo_core.train.policy import PolicyForward, compute_dtype
from dapo_core.train.rng import rng_state, set_rng_state
from dapo_core.train.rollout import (
    DynamicSampler,
    Group,
    GroupSource,
    RewardFn,
    advantages_by_group,
    batch_rows,
    keep_samples,
    kept_positions,
    rollout_metrics,
    templated_prompt,
    token_record,
)
from dapo_core.train.task_reward import training_reward
from dapo_core.train.update import (
    EMPTY_STATS,
    Updater,
    make_optimizer,
    reference_model,
)

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from dapo_core.data.loaders import Problem

log = logging.getLogger(__name__)
_warned: set[str] = set()

STATE_VERSION = 2


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


@dataclass
class StepResult:
    """What one rollout step produced: scalar metrics and a few rollouts to keep."""

    step: int
    metrics: dict[str, float]
    samples: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """Owns the policy, optimizer, LR schedule, rollout engine and the dynamic-sampling buffer."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        engine: RolloutEngine,
        problems: Sequence[Problem],
        *,
        format_prompt: Callable[[Problem], str] | None = None,
        logprob_chunk_size: int | None = None,
        reward: RewardFn | None = None,
        dist: Collective = LOCAL,
        autocast: bool = True,
        sync_weights: Callable[[], None] | None = None,
        snapshot_weights: Callable[[], Mapping[str, torch.Tensor]] | None = None,
        device: torch.device | None = None,
    ) -> None:
        """`model` is the causal LM (one worker) or the FSDP2-sharded LogprobModel around it
        (many workers: then `dist` joins the ranks, `autocast=False` because FSDP casts, and
        `sync_weights` gathers the shards into this rank's engine). `device` is where batches
        go (default: the parameters' device; with CPU offload the compute device differs).

        rollout.mode=async: `engine` is the rollout worker's own (its own copy of the weights;
        the trainer's `engine` becomes the worker's seeded view, async_rollout.WorkerEngine),
        and `snapshot_weights` gives the weights the worker receives after each update, a copy
        (default: the model's state dict, cloned; many workers gather the shards)."""
        if not problems:
            raise ValueError(f"data.train={cfg.data.train!r} holds no problems")
        self.cfg, self.model, self.tokenizer, self.engine = cfg, model, tokenizer, engine
        self.problems = list(problems)
        self.dist = dist
        self.device = device or next(model.parameters()).device
        reward = reward or training_reward(cfg)
        self.asynchronous = cfg.rollout.mode == "async"
        self.source: GroupSource
        if self.asynchronous:
            # The worker formats prompts on its own thread: with its own tokenizer.
            format_prompt = format_prompt or templated_prompt(
                cfg.data.prompt_template, copy.deepcopy(tokenizer)
            )
            self.source = AsyncSource(cfg, engine, self.problems, format_prompt, reward, dist)
            self.engine = self.source.engine
        else:
            format_prompt = format_prompt or templated_prompt(cfg.data.prompt_template, tokenizer)
            self.source = GroupSource(cfg, engine, self.problems, format_prompt, reward, dist)
        self.stream = self.source.stream
        # After each update the engine samples with the new weights; by default it is handed
        # the model's state dict (free when the engine shares the model object).
        self._sync = sync_weights or (lambda: self.engine.load_weights(self.model.state_dict()))
        self._snapshot = snapshot_weights or (
            lambda: {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        )

        self.optimizer, self.scheduler = make_optimizer(cfg, model)
        self._shuffle_gen = torch.Generator(device="cpu").manual_seed(cfg.run.seed + 1)
        self.sampler = DynamicSampler.from_config(cfg)

        # Progress counters (cumulative). The paper's x-axis is gradient updates.
        self.rollout_step = 0
        self.grad_updates = 0
        self.gen_batches_total = 0
        self.nonfinite_streak = 0

        self._ref_model = ref_model = reference_model(cfg, model, dist)
        fwd = PolicyForward(
            model,
            compute_dtype=compute_dtype(cfg.model.dtype),
            temperature=cfg.rollout.temperature,
            chunk_size=logprob_chunk_size,
            autocast=autocast,
        )
        pad = int(tokenizer.pad_token_id or 0)
        # GPU runs log each phase's peak (perf/peak_mem_gib/...) beside `dapo plan`'s items.
        self.memory = PhaseMemory(self.device)
        self.updater = Updater(
            cfg,
            fwd,
            self.optimizer,
            self.scheduler,
            pad_id=pad,
            device=self.device,
            dist=dist,
            ref_model=ref_model,
        )
        self.updater.memory = self.memory
        # Response positions where the task takes its decision (the explore task's fork): the
        # entropy and the clip there are reported beside the means; () for most tasks.
        self.decision = decision_positions(cfg.data.train)
        if cfg.batch.train_batch_size <= cfg.batch.mini_batch_size and cfg.algo.ppo_epochs == 1:
            _warn_once(
                "ratio-one",
                "one mini-batch and one epoch per rollout step: the importance ratio is exactly 1, "
                "so clipping (and Clip-Higher) never acts; lower batch.mini_batch_size or raise "
                "algo.ppo_epochs for the clip to matter",
            )

    @property
    def tokens_total(self) -> int:
        """Response tokens generated so far (cumulative)."""
        return self.source.tokens

    @property
    def carried_groups(self) -> list[Group]:
        """Informative groups waiting for the next step (dynamic sampling's surplus)."""
        return list(self.sampler.carry)

    # ==================================================================================
    # Algorithm 1
    # ==================================================================================
    def step(self) -> StepResult:
        """One rollout step; returns its metrics and sampled rollouts."""
        t_step = time.perf_counter()
        self.rollout_step += 1
        times = self.source.start_step(self.rollout_step)

        # 1–3. sample prompts → G responses → rewards → dynamic-sampling filter
        with self.memory.phase("rollout"):
            col = self.sampler.collect(self.source, self.rollout_step)
        batch = col.groups
        metrics = rollout_metrics(
            col, self.cfg.rollout.group_size, len(self.sampler.carry), times["rollout"]
        )

        stats = EMPTY_STATS
        observed: dict[str, float] = {}  # the update's observers' metrics
        sample_advantages: dict[int, list[float]] = {}  # for the kept samples only
        sample_tokens: dict[tuple[int, int], dict[str, list[Any]]] = {}  # likewise
        kept = kept_positions(col.generated, self.cfg.run.samples_per_step)
        if batch:
            # 4. group-relative advantages over the final batch
            advantages = self._advantages(batch)  # [P*G]
            seqs = sequences(batch, advantages)
            sample_advantages = advantages_by_group(col.generated, batch, advantages.tolist())
            # 5. old log-probs with the current policy, no grad (the first mini-batch's from
            #    its own first forward); 6. μ passes over mini-batches, clipped objective
            self.updater.nonfinite_carried = self.nonfinite_streak
            # The kept rollouts' per-token record (ratio, clip, entropy, eligibility) is read
            # off the update's own tensors: no extra forward, no random draw.
            watch = batch_rows(col.generated, batch, kept)
            traced = TraceObserver(watch, self.cfg.algo)
            observers: list[UpdateObserver] = [traced]
            if self.decision:
                observers.append(DecisionObserver(self.decision, clip_high=self.cfg.algo.clip_high))
            stats = self.updater.run(seqs, len(batch), self._shuffle_gen, observers=observers)
            sample_tokens = self._token_records(seqs, watch, traced.traces)
            for o in observers:
                observed.update(o.metrics())
            self.grad_updates += stats.updates
            # Skipped updates in a row, across steps: an applied update ends a streak.
            run = stats.trailing_nonfinite
            self.nonfinite_streak = run if stats.updates else self.nonfinite_streak + run
        else:
            # One key for every empty step (a per-step key never repeats, so it warned every
            # time); the later ones show in each step's sampling/kept_groups.
            _warn_once(
                "empty-step",
                f"step {self.rollout_step}: dynamic sampling kept 0 informative groups out of "
                f"{len(col.generated)} in {col.gen_batches} generation batches "
                f"(algo.max_gen_batches={self.cfg.algo.max_gen_batches}); skipping the update "
                "(warned once: later empty steps skip theirs without a warning)",
            )
        # 7. the engine samples the next step with the new weights (async: the worker gets
        #    them by version, and the version even when no update changed them)
        if stats.updates or self.asynchronous:
            with self.memory.phase("sync"):
                self._publish(updated=bool(stats.updates))
        metrics.update(stats.metrics())
        metrics.update(observed)
        metrics.update(self.memory.metrics())
        metrics.update(
            staleness_metrics(
                batch,
                self.rollout_step,
                max_staleness=self.cfg.rollout.max_staleness if self.asynchronous else 0,
                dropped=self.source.dropped,
            )
        )
        metrics.update(self.source.step_metrics())

        self.gen_batches_total += col.gen_batches
        step_s = time.perf_counter() - t_step
        waited = metrics.get(M.TRAINER_IDLE_S, times["rollout"] + times["reward"])
        trained = sum(len(r.completion.token_ids) for g in batch for r in g.rollouts)
        busy = step_s - waited
        metrics.update(
            {
                M.TRAIN_TOKENS_PER_S: trained / busy if busy > 0 else 0.0,
                M.ROLLOUT_STEP: float(self.rollout_step),
                M.GRAD_UPDATES: float(self.grad_updates),
                M.GEN_BATCHES_TOTAL: float(self.gen_batches_total),
                M.TOKENS_TOTAL: float(self.tokens_total),
                M.ROLLOUT_S: times["rollout"],
                M.REWARD_S: times["reward"],
                M.STEP_S: step_s,
                M.LR: float(self.optimizer.param_groups[0]["lr"]),
            }
        )
        samples = keep_samples(
            col.generated, self.cfg.run.samples_per_step, sample_advantages, sample_tokens
        )
        return StepResult(self.rollout_step, metrics, samples)

    def _publish(self, *, updated: bool) -> None:
        """Step 7: the engine samples with the trainer's weights from now on. Async: the worker
        gets the weights of the next step's policy version (a copy; only the version when
        nothing `updated` them), without waiting for it to load them."""
        if not self.asynchronous:
            if updated:
                self._sync()
            return
        assert isinstance(self.source, AsyncSource)
        self.source.publish(self.rollout_step + 1, self._snapshot() if updated else None)

    def close(self) -> None:
        """Stop the rollout worker (async; after the batch it is making). Idempotent."""
        if isinstance(self.source, AsyncSource):
            self.source.close()

    def _advantages(self, batch: Sequence[Group]) -> torch.Tensor:
        """Step 4: `[P*G]` advantages of the batch by algo.adv_estimator, given what the
        estimators read: the rewards, the response lengths, the reward's two components
        (correctness score, overlong penalty: GDPO) and, for ReMax only, the reward of one
        greedy response per prompt, generated now by the current policy."""
        a = self.cfg.algo
        rollouts = [r for g in batch for r in g.rollouts]
        baseline = None
        if "baseline_rewards" in get_estimator(a.adv_estimator).needs:
            with self.memory.phase("rollout"):
                baseline = torch.tensor(self.source.greedy_rewards(batch))  # [P]
        return group_advantages(
            torch.tensor([r.reward for r in rollouts]),
            self.cfg.rollout.group_size,
            eps=a.adv_eps,
            scale_by_std=a.scale_adv_by_std,
            estimator=a.adv_estimator,
            lengths=torch.tensor([len(r.completion.token_ids) for r in rollouts]),
            baseline_rewards=baseline,
            components=torch.tensor([[r.score, r.penalty] for r in rollouts]),
            component_weights=a.gdpo_reward_weights,
        )

    def _token_records(
        self, seqs: Sequence[Seq], rows: dict[int, tuple[int, int]], traces: dict[int, TokenTrace]
    ) -> dict[tuple[int, int], dict[str, list[Any]]]:
        """The stored per-token record of each kept rollout the update traced, keyed by its
        (group, member) among the generated groups; each token's text is its decoded piece."""
        out = {}
        for i, position in rows.items():
            t = traces.get(i)
            if t is None:
                continue
            text = [str(self.tokenizer.decode([tok])) for tok in seqs[i].response_ids]
            out[position] = token_record(
                text, t.logprob_old, t.ratio, t.clip, t.entropy, t.eligible
            )
        return out

    @property
    def diverged(self) -> bool:
        """Whether optim.max_nonfinite_updates updates in a row were skipped as non-finite."""
        return self.nonfinite_streak >= self.cfg.optim.max_nonfinite_updates

    # --- checkpoint state ----------------------------------------------------------------
    def state_dict(self, *, optimizer: bool = True) -> dict[str, Any]:
        """Everything but the model weights, in types `torch.load(weights_only=True)` accepts:
        tensors, numbers, strings, lists and dicts (no pickled objects). optimizer=False leaves
        out the optimizer (a sharded checkpoint keeps it with torch.distributed.checkpoint); the
        random streams are this rank's (rank_state() alone gives them to each rank's file)."""
        return {
            "version": STATE_VERSION,
            "optimizer": self.optimizer.state_dict() if optimizer else None,
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "shuffle_gen": self._shuffle_gen.get_state(),
            "engine": self.source.engine_state(),
            "data": self.source.data_state(),
            "carry": self.sampler.state_dict(),
            "progress": {
                "rollout_step": self.rollout_step,
                # The policy version of the weights saved beside this state: the next step's.
                "policy_version": self.rollout_step + 1,
                "grad_updates": self.grad_updates,
                "gen_batches": self.gen_batches_total,
                "tokens": self.tokens_total,
                "nonfinite_streak": self.nonfinite_streak,
            },
            "ref_model": self._ref_model.state_dict() if self._ref_model is not None else None,
        }

    def load_state_dict(
        self, state: dict[str, Any], *, optimizer: bool = True, streams: bool = True
    ) -> None:
        """Restore state_dict() (the model weights must already be loaded). optimizer=False
        leaves the optimizer to the caller (a sharded checkpoint restores it per rank);
        streams=False leaves this process's random streams and the engine's as they are (a
        worker restores its own with load_rank_state)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"checkpoint trainer state version {state.get('version')} is not {STATE_VERSION}"
            )
        if optimizer:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if streams:
            self.load_rank_state(state)
        self._shuffle_gen.set_state(state["shuffle_gen"])
        self.source.load_data_state(state["data"])
        self.sampler.load_state_dict(state["carry"])
        p = state["progress"]
        self.rollout_step = int(p["rollout_step"])
        version = int(p.get("policy_version", self.rollout_step + 1))
        if version != self.rollout_step + 1:
            raise ValueError(
                f"checkpoint of rollout step {self.rollout_step} holds weights of policy version "
                f"{version}, not {self.rollout_step + 1}: the checkpoint is inconsistent"
            )
        self.grad_updates = int(p["grad_updates"])
        self.gen_batches_total = int(p["gen_batches"])
        self.source.tokens = int(p["tokens"])
        self.nonfinite_streak = int(p.get("nonfinite_streak", 0))
        if self._ref_model is not None and state.get("ref_model") is not None:
            self._ref_model.load_state_dict(state["ref_model"])
        if isinstance(self.source, AsyncSource):
            self.source.restart(self.rollout_step + 1)  # queued batches are made again
        self._publish(updated=True)

    def rank_state(self) -> dict[str, Any]:
        """This process's random streams and its engine's: what differs between ranks (async:
        the engine's stream before the first batch not yet taken)."""
        return {"rng": rng_state(), "engine": self.source.engine_state()}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        set_rng_state(state["rng"])
        self.source.load_engine_state(state["engine"])
