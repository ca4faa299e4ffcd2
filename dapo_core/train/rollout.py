"""Steps 1–3 of Algorithm 1: which prompts, G responses each, their rewards, and the
dynamic-sampling buffer that over-samples until the training batch holds only informative groups.

Records (`Rollout`, `Group`) are plain dataclasses with a dict form made of JSON-like types only,
so the carried-over groups go into a checkpoint that loads with `torch.load(weights_only=True)`.

The reward is pluggable (`RewardFn`): the default, `ShapedReward`, is correctness by the
configured grader (Eq. 7) plus the soft overlong punishment (Eq. 13).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dapo_common import metric_names as M
from dapo_core.algo.overlong import overlong_penalty
from dapo_core.algo.rewards import get_grader
from dapo_core.algo.sampling import informative_groups
from dapo_core.engines.base import Completion, RolloutEngine, SamplingParams
from dapo_core.train.collective import Collective, shard

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dapo_core.data.loaders import Problem
    from dapo_core.setup.config import ExperimentConfig

log = logging.getLogger(__name__)


# --- records -------------------------------------------------------------------------------
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


def group_to_dict(g: Group) -> dict[str, Any]:
    """Only str / int / float / bool / None / lists / dicts: safe for weights_only loading."""
    return {
        "problem": asdict(g.problem),
        "prompt": g.prompt,
        "policy_version": g.policy_version,
        "rollouts": [{**asdict(r), "completion": asdict(r.completion)} for r in g.rollouts],
    }


def group_from_dict(d: dict[str, Any]) -> Group:
    from dapo_core.data.loaders import Problem

    rollouts = []
    for r in d["rollouts"]:
        c = Completion(**r["completion"])
        rollouts.append(Rollout(c, r["score"], r["acc"], r["pred"], r["penalty"], r["reward"]))
    return Group(Problem(**d["problem"]), d["prompt"], rollouts, d["policy_version"])


# --- the reward ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Scored:
    score: float
    acc: float
    pred: str | None
    penalty: float

    @property
    def reward(self) -> float:
        return self.score + self.penalty


class RewardFn(Protocol):
    """Scores one completion of one problem."""

    def __call__(self, completion: Completion, problem: Problem) -> Scored: ...


class ShapedReward:
    """Correctness by a named grader (Eq. 7: +1 / −1) plus, when enabled, the soft overlong
    punishment of Eq. 13 with L_max = the generation budget."""

    def __init__(
        self,
        *,
        grader: str,
        max_len: int,
        overlong: bool,
        cache_len: int,
        factor: float,
        response_prefix: str = "",
    ) -> None:
        self.grade = get_grader(grader)
        # What the prompt already wrote of the reply (`Answer: ` with data.prompt_template
        # chat-answer): the grader reads the reply as a reader of the assistant's turn does.
        self.response_prefix = response_prefix
        self.max_len, self.overlong, self.cache_len, self.factor = (
            max_len,
            overlong,
            cache_len,
            factor,
        )

    @classmethod
    def from_config(cls, cfg: ExperimentConfig) -> ShapedReward:
        from dapo_core.data.loaders import response_prefix

        a = cfg.algo
        return cls(
            grader=cfg.reward.grader,
            max_len=cfg.rollout.max_response_len,
            overlong=a.overlong_penalty,
            cache_len=a.overlong_cache_len,
            factor=a.overlong_penalty_factor,
            response_prefix=response_prefix(cfg.data.prompt_template),
        )

    def __call__(self, completion: Completion, problem: Problem) -> Scored:
        result = self.grade(self.response_prefix + completion.text, problem.answer)
        penalty = 0.0
        if self.overlong:
            length = len(completion.token_ids)
            penalty = float(overlong_penalty(length, self.max_len, self.cache_len, self.factor))
        return Scored(float(result.score), float(result.acc), result.pred, penalty)


def score_groups(
    problems: Sequence[Problem],
    prompts: Sequence[str],
    completions: Sequence[Completion],
    reward: RewardFn,
    group_size: int,
    version: int,
) -> list[Group]:
    """completions[i*G:(i+1)*G] answer problems[i]: one Group per problem."""
    groups = []
    for i, (problem, prompt) in enumerate(zip(problems, prompts, strict=True)):
        rollouts = []
        for c in completions[i * group_size : (i + 1) * group_size]:
            s = reward(c, problem)
            rollouts.append(Rollout(c, s.score, s.acc, s.pred, s.penalty, s.reward))
        groups.append(Group(problem, prompt, rollouts, version))
    return groups


# --- which prompts -------------------------------------------------------------------------
def templated_prompt(template: str, tokenizer: PreTrainedTokenizerBase) -> Callable[[Problem], str]:
    """The default prompt of a problem: `template` (data.prompt_template) as
    dapo_core.data.loaders.format_prompt writes it for `tokenizer`."""
    from dapo_core.data.loaders import format_prompt

    return lambda problem: format_prompt(problem, template, tokenizer)


class ProblemStream:
    """Indices of a seeded per-epoch shuffle of n problems, taken in order across steps."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self.epoch, self.pos = 0, 0
        self._order = self._epoch_order(0)

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            chunk = self._order[self.pos : self.pos + k - len(out)]
            out.extend(chunk)
            self.pos += len(chunk)
        return out

    def _epoch_order(self, epoch: int) -> list[int]:
        gen = torch.Generator(device="cpu").manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.n, generator=gen).tolist()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._epoch_order(self.epoch)


# --- steps 1-2: fresh groups ------------------------------------------------------------------
@dataclass
class Shard:
    """One generation batch as this rank made it: its share of the batch's prompts (whole
    groups, in prompt order), sampled and scored, before the ranks' shares are gathered."""

    n_prompts: int  # prompts of the whole batch (every rank's share)
    groups: list[Group]  # this rank's share
    rollout_s: float  # seconds generating
    reward_s: float  # seconds scoring


class GroupSource:
    """`source(n)`: the next n prompts, G responses each, scored. Every rank draws the same
    prompts and samples its share (whole groups) with its own engine; the groups are gathered
    back into prompt order, so every rank holds the same groups.

    `produce` (draw, sample and score this rank's share: no collective) and `gather` (the
    ranks' shares into one batch) are the two halves of a call; an asynchronous rollout
    worker runs the first on its own thread and the trainer the second
    (dapo_core.train.async_rollout)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        engine: RolloutEngine,
        problems: Sequence[Problem],
        format_prompt: Callable[[Problem], str],
        reward: RewardFn,
        dist: Collective,
    ) -> None:
        self.engine, self.problems, self.format, self.reward, self.dist = (
            engine,
            problems,
            format_prompt,
            reward,
            dist,
        )
        self.group_size = cfg.rollout.group_size
        self.sampling = SamplingParams(
            n=cfg.rollout.group_size,
            max_tokens=cfg.rollout.max_response_len,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
        )
        self.stream = ProblemStream(len(problems), cfg.run.seed)
        self.tokens = 0  # response tokens generated, cumulative
        self.version = 0
        self.times = {"rollout": 0.0, "reward": 0.0}
        self.dropped = 0  # samples taken this step but too stale to train (async only)

    def start_step(self, version: int) -> dict[str, float]:
        """Reset the step's timers; the groups drawn from now on carry policy `version`."""
        self.version = version
        self.times = {"rollout": 0.0, "reward": 0.0}
        return self.times

    def __call__(self, n_prompts: int) -> list[Group]:
        part = self.produce(n_prompts)
        self.times["rollout"] += part.rollout_s
        self.times["reward"] += part.reward_s
        return self.gather(part)

    def produce(self, n_prompts: int) -> Shard:
        """The next n prompts of the stream; this rank's share sampled with its engine and
        scored, stamped with the current policy `version`. No collective."""
        problems = [self.problems[i] for i in self.stream.take(n_prompts)]
        rank, world = self.dist.rank, self.dist.world_size
        mine = shard(list(range(len(problems))), rank, world)
        t0 = time.perf_counter()
        prompts = [self.format(problems[i]) for i in mine]
        completions = self.engine.generate(prompts, self.sampling) if prompts else []
        t1 = time.perf_counter()
        groups = score_groups(
            [problems[i] for i in mine],
            prompts,
            completions,
            self.reward,
            self.group_size,
            self.version,
        )
        return Shard(len(problems), groups, t1 - t0, time.perf_counter() - t1)

    def gather(self, part: Shard) -> list[Group]:
        """Every rank's share of one batch, in prompt order (a collective on N workers); their
        response tokens count as generated."""
        groups = part.groups
        world = self.dist.world_size
        if world > 1:
            n = part.n_prompts
            parts = self.dist.all_gather_object(groups)
            order = [i for r in range(world) for i in shard(list(range(n)), r, world)]
            by_index = dict(zip(order, [g for p in parts for g in p], strict=True))
            groups = [by_index[i] for i in range(n)]
        self.tokens += sum(len(r.completion.token_ids) for g in groups for r in g.rollouts)
        return groups

    # --- what a checkpoint keeps of the stream (the async source keeps its worker's) ------
    def data_state(self) -> dict[str, int]:
        """Where the prompt stream stands: the next prompt a step draws."""
        return self.stream.state_dict()

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)

    def engine_state(self) -> dict[str, Any]:
        """The sampling engine's random stream: the next step's samples follow from it."""
        return self.engine.state_dict()

    def load_engine_state(self, state: Mapping[str, Any]) -> None:
        self.engine.load_state_dict(state)

    def step_metrics(self) -> dict[str, float]:
        """What the source adds to a step's metrics (the async source: its idle times)."""
        return {}

    def greedy_rewards(self, groups: Sequence[Group]) -> list[float]:
        """ReMax's baseline (arXiv 2310.10505): each group's prompt answered once greedily
        (temperature 0) by the current policy and scored by the same reward; one per group, in
        order. Every rank answers its share and the rewards are gathered. A seeded call, so the
        engine's own random stream is left as it was; its time and tokens count as the step's
        rollout, like the sampled responses'."""
        rank, world = self.dist.rank, self.dist.world_size
        mine = shard(list(range(len(groups))), rank, world)
        greedy = SamplingParams(
            n=1, max_tokens=self.sampling.max_tokens, temperature=0.0, top_p=1.0, seed=0
        )
        t0 = time.perf_counter()
        prompts = [groups[i].prompt for i in mine]
        completions = self.engine.generate(prompts, greedy) if prompts else []
        t1 = time.perf_counter()
        scored = {
            i: self.reward(c, groups[i].problem).reward
            for i, c in zip(mine, completions, strict=True)
        }
        self.times["rollout"] += t1 - t0
        self.times["reward"] += time.perf_counter() - t1
        tokens = sum(len(c.token_ids) for c in completions)
        if world > 1:
            parts = self.dist.all_gather_object((scored, tokens))
            scored = {i: r for part, _ in parts for i, r in part.items()}
            tokens = sum(n for _, n in parts)
        self.tokens += tokens
        return [scored[i] for i in range(len(groups))]


# --- dynamic sampling (§3.2) -----------------------------------------------------------------
@dataclass
class Collected:
    groups: list[Group]  # the training batch
    generated: list[Group]  # every group generated this step (metrics see all of them)
    gen_batches: int
    dropped_carry: int


class DynamicSampler:
    """Fills a training batch of `target` groups.

    Off: one generation batch of exactly `target` prompts, every group trains.
    On: keep only groups with 0 < #correct < G (Eq. 11's constraint), generating batches of
    `gen_batch_size` prompts until `target` are kept or `max_gen_batches` were generated.
    Informative groups beyond the batch are carried to the next step (oldest first) instead of
    being thrown away; the carry is capped below `target`, so every step generates at least once
    and trains on groups at most one policy version old.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        target: int,
        gen_batch_size: int,
        max_gen_batches: int,
        group_size: int,
    ) -> None:
        self.enabled, self.target = enabled, target
        self.gen_batch_size, self.max_gen_batches = gen_batch_size, max_gen_batches
        self.group_size = group_size
        self.carry: list[Group] = []

    @classmethod
    def from_config(cls, cfg: ExperimentConfig) -> DynamicSampler:
        b = cfg.batch
        return cls(
            enabled=cfg.algo.dynamic_sampling,
            target=b.train_batch_size,
            gen_batch_size=b.gen_batch_size,
            max_gen_batches=cfg.algo.max_gen_batches,
            group_size=cfg.rollout.group_size,
        )

    def collect(self, generate: Callable[[int], list[Group]], step: int) -> Collected:
        """`generate(n)` samples and scores n fresh prompts."""
        if not self.enabled:
            groups = generate(self.target)
            return Collected(groups, list(groups), 1, 0)
        generated: list[Group] = []
        kept, self.carry = list(self.carry), []
        batches = 0
        while len(kept) < self.target and batches < self.max_gen_batches:
            fresh = generate(self.gen_batch_size)
            batches += 1
            generated.extend(fresh)
            acc = torch.tensor([a for g in fresh for a in g.accs])  # [P*G]
            mask = informative_groups(acc, self.group_size)  # [P] bool
            kept.extend(g for g, keep in zip(fresh, mask.tolist(), strict=True) if keep)
        batch, surplus = kept[: self.target], kept[self.target :]
        cap = self.target - 1
        self.carry, dropped = surplus[:cap], len(surplus[cap:])
        if len(batch) < self.target:
            log.warning(
                "step %d: dynamic sampling reached algo.max_gen_batches=%d with %d/%d informative "
                "groups (of %d generated); training on what was collected",
                step,
                self.max_gen_batches,
                len(batch),
                self.target,
                len(generated),
            )
        return Collected(batch, generated, batches, dropped)

    def state_dict(self) -> list[dict[str, Any]]:
        return [group_to_dict(g) for g in self.carry]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self.carry = [group_from_dict(d) for d in state]


# --- what a step reports about its rollouts ---------------------------------------------------
def rollout_metrics(
    col: Collected, group_size: int, carried: int, rollout_s: float
) -> dict[str, float]:
    """Rewards and lengths over every response generated this step, before filtering."""
    rs = [r for g in col.generated for r in g.rollouts]
    n = max(len(rs), 1)
    lengths = [len(r.completion.token_ids) for r in rs]
    informative = math.nan
    if col.generated:
        acc = torch.tensor([r.acc for r in rs])
        informative = float(informative_groups(acc, group_size).float().mean())
    gen_tokens = sum(lengths)
    tps = gen_tokens / rollout_s if rollout_s > 0 else 0.0
    return {
        M.REWARD_MEAN: sum(r.reward for r in rs) / n,
        M.SCORE_MEAN: sum(r.score for r in rs) / n,
        M.OVERLONG_PENALTY_MEAN: sum(r.penalty for r in rs) / n,
        M.ACC_MEAN: sum(r.acc for r in rs) / n,
        M.RESPONSE_LENGTH_MEAN: gen_tokens / n,
        M.RESPONSE_LENGTH_MAX: float(max(lengths, default=0)),
        M.RESPONSE_CLIP_RATIO: sum(r.completion.truncated for r in rs) / n,
        M.KEPT_GROUPS: informative,
        M.TRAIN_INFORMATIVE: _informative_share(col.groups, group_size),
        M.GEN_BATCHES: float(col.gen_batches),
        M.CARRIED_GROUPS: float(carried),
        M.TRAIN_GROUPS: float(len(col.groups)),
        M.TOKENS_PER_S: tps,
    }


def _informative_share(groups: Sequence[Group], group_size: int) -> float:
    if not groups:
        return math.nan
    acc = torch.tensor([a for g in groups for a in g.accs])
    return float(informative_groups(acc, group_size).float().mean())


def advantages_by_group(
    generated: Sequence[Group], batch: Sequence[Group], advantages: Sequence[float]
) -> dict[int, list[float]]:
    """Each trained group's advantages (`advantages`: `[P*G]`, `batch` group by group) keyed
    by its index in `generated`, which is how keep_samples names groups; a group carried over
    from an earlier step is not among the generated ones and is left out."""
    where = {id(g): gi for gi, g in enumerate(generated)}
    out: dict[int, list[float]] = {}
    at = 0
    for g in batch:
        if id(g) in where:
            out[where[id(g)]] = [float(a) for a in advantages[at : at + len(g.rollouts)]]
        at += len(g.rollouts)
    return out


def batch_rows(
    generated: Sequence[Group], batch: Sequence[Group], positions: Sequence[tuple[int, int]]
) -> dict[int, tuple[int, int]]:
    """The training rows (indices into the batch's sequences, group by group, as
    dapo_core.train.batching.sequences lays them out) of the given (group index in
    `generated`, member) positions, mapped back to them; a position whose group the batch
    did not train on is left out."""
    at, start = 0, {}
    for g in batch:
        start[id(g)] = at
        at += len(g.rollouts)
    out = {}
    for gi, j in positions:
        first = start.get(id(generated[gi]))
        if first is not None:
            out[first + j] = (gi, j)
    return out


def kept_positions(groups: Sequence[Group], k: int) -> list[tuple[int, int]]:
    """(group index in `groups`, member) of the at most k rollouts keep_samples keeps.

    Whole groups when k holds one (k >= G): k // G groups evenly spaced over the step's
    generated groups, every member of each, so that a reader sees a prompt's G responses side
    by side with their advantages (GRPO's unit of comparison; a group of which one response is
    stored says nothing about its spread). Below G, k responses evenly spaced over the step's,
    group by group."""
    if not groups or k <= 0:
        return []
    size = max(len(g.rollouts) for g in groups)
    if k >= size:
        n = min(k // size, len(groups))
        picked = [i * len(groups) // n for i in range(n)]
        return [(gi, j) for gi in picked for j in range(len(groups[gi].rollouts))]
    rs = [(gi, j) for gi, g in enumerate(groups) for j in range(len(g.rollouts))]
    k = min(k, len(rs))
    return [rs[i * len(rs) // k] for i in range(k)]


def significant(x: float | None, digits: int = 4) -> float | None:
    """`x` rounded to `digits` significant digits (None stays None): a stored trace's size."""
    return None if x is None else float(f"{x:.{digits}g}")


def token_record(
    text: Sequence[str],
    logprob_old: Sequence[float],
    ratio: Sequence[float | None],
    clip: Sequence[int],
    entropy: Sequence[float | None],
    eligible: Sequence[bool],
) -> dict[str, list[Any]]:
    """One response's per-token record as the rollout browser stores it (a sample's
    `tokens`): lists of one entry per response token, numbers to 4 significant digits.

    `text` the decoded piece of each token, `p_old` π_θold of the token, `ratio` π_θ / π_θold
    when its mini-batch was updated (None: not in the loss), `clip` −1 / 0 / +1 (clipped at the
    lower bound, not, the upper bound), `entropy` nats (None: not computed), `eligible` 0 / 1
    (could reach the upper clip bound; see dapo_core.train.observers.token_trace)."""
    n = len(text)
    if not n == len(logprob_old) == len(ratio) == len(clip) == len(entropy) == len(eligible):
        raise ValueError("a token record's lists must all have one entry per response token")
    return {
        "text": list(text),
        "p_old": [significant(math.exp(x)) for x in logprob_old],
        "ratio": [significant(x) for x in ratio],
        "clip": [int(c) for c in clip],
        "entropy": [significant(x) for x in entropy],
        "eligible": [int(bool(e)) for e in eligible],
    }


def keep_samples(
    groups: Sequence[Group],
    k: int,
    advantages: Mapping[int, Sequence[float]] | None = None,
    tokens: Mapping[tuple[int, int], dict[str, list[Any]]] | None = None,
) -> list[dict[str, Any]]:
    """At most k rollouts: whole groups when k holds one, else single responses (see
    kept_positions and MetricsSink.log_samples).

    Each also says which of the step's groups it belongs to (`group`: its index in `groups`,
    `member`: its place in the group), so that a reader can put a prompt's responses side by
    side, and its `advantage` when `advantages` (keyed by the index in `groups`, one value
    per rollout) has its group: None for a group this step did not train on (dynamic
    sampling dropped it, or it waits in the carry). `tokens` (keyed by (group, member)): the
    per-token record (`token_record`) of the rollouts that have one, kept as `tokens`."""
    advantages = advantages or {}
    tokens = tokens or {}
    out = []
    for gi, j in kept_positions(groups, k):
        g = groups[gi]
        r = g.rollouts[j]
        trained = advantages.get(gi)
        sample: dict[str, Any] = {
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
            "group": gi,
            "member": j,
            "advantage": None if trained is None else float(trained[j]),
        }
        if (gi, j) in tokens:
            sample["tokens"] = tokens[(gi, j)]
        out.append(sample)
    return out
