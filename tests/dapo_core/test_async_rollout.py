"""Asynchronous rollouts, the rules and the worker (dapo_core.train.async_rollout): the staleness
filter, the gate and the lag statistics by hand; the gate's guarantee (no batch taken too stale,
never stuck, staleness 0 = the sync schedule) over every interleaving hypothesis finds; the
worker thread with an engine that records what it was asked and with which weights."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_common import metric_names as M
from dapo_core.data.loaders import Problem
from dapo_core.engines.base import Completion, SamplingParams
from dapo_core.setup.config import ConfigError, ExperimentConfig
from dapo_core.train.async_rollout import (
    Cursor,
    RolloutWorker,
    WorkerEngine,
    admit,
    lag,
    may_start,
    needed,
    staleness_metrics,
)
from dapo_core.train.collective import LOCAL
from dapo_core.train.rollout import Group, GroupSource, Rollout, Scored


# --- the rules by hand ---------------------------------------------------------------------------
def group(version: int, size: int = 2) -> Group:
    completion = Completion(0, [5], [6, 1], [-0.5, -0.1], "stop", "x")
    rollouts = [Rollout(completion, 1.0, 1.0, "x", 0.0, 1.0) for _ in range(size)]
    problem = Problem(prompt=f"p{version}", answer="1", source="t", idx=version)
    return Group(problem, problem.prompt, rollouts, version)


def test_lag_is_the_steps_between_the_sampling_policy_and_the_trainer() -> None:
    assert lag(5, 5) == 0  # sampled with step 5's own starting weights: on-policy
    assert lag(5, 3) == 2  # sampled two updates ago


def test_admit_keeps_groups_within_the_bound_in_order_and_returns_the_rest() -> None:
    gs = [group(5), group(2), group(4), group(3)]  # lags at step 5: 0, 3, 1, 2
    kept, dropped = admit(gs, step=5, max_staleness=1)
    assert kept == [gs[0], gs[2]] and dropped == [gs[1], gs[3]]
    kept, dropped = admit(gs, step=5, max_staleness=0)
    assert kept == [gs[0]] and dropped == gs[1:]
    assert admit(gs, step=5, max_staleness=3) == (gs, [])


def test_the_gate_bounds_the_lag_at_the_latest_step_a_batch_can_be_taken() -> None:
    # The next batch goes to step 4. With step-4 weights (version 4) the worker may run k
    # batches ahead: batch `ahead` is taken at step ≤ 4 + ahead, lag ≤ ahead.
    assert may_start(next_step=4, ahead=0, weights_version=4, max_staleness=0)
    assert not may_start(next_step=4, ahead=1, weights_version=4, max_staleness=0)
    assert may_start(next_step=4, ahead=1, weights_version=4, max_staleness=1)
    assert not may_start(next_step=4, ahead=2, weights_version=4, max_staleness=1)
    # Step 3's weights for step 4's batch: lag 1, allowed from k = 1 on.
    assert not may_start(next_step=4, ahead=0, weights_version=3, max_staleness=0)
    assert may_start(next_step=4, ahead=0, weights_version=3, max_staleness=1)
    # 4 + 2 − 3 = 3 versions at worst.
    assert may_start(next_step=4, ahead=2, weights_version=3, max_staleness=3)
    assert not may_start(next_step=4, ahead=2, weights_version=3, max_staleness=2)


def test_no_batch_is_made_that_no_step_can_take() -> None:
    # One batch a step (no dynamic sampling): batch `ahead` goes to step next + ahead exactly.
    assert needed(next_step=9, ahead=1, last_step=10, one_per_step=True)
    assert not needed(next_step=9, ahead=2, last_step=10, one_per_step=True)
    # Dynamic sampling may take every batch in step 9 still.
    assert needed(next_step=9, ahead=5, last_step=10, one_per_step=False)
    assert not needed(next_step=11, ahead=0, last_step=10, one_per_step=False)


def test_staleness_metrics_count_samples_by_lag() -> None:
    # At step 6: groups of 2 responses at lags 0, 1, 1 and a group of 4 at lag 2 (a carried one).
    gs = [group(6), group(5), group(5), group(4, size=4)]
    m = staleness_metrics(gs, 6, max_staleness=1, dropped=3)
    # lags of the 10 samples: 0, 0, 1, 1, 1, 1, 2, 2, 2, 2 → mean (0·2 + 1·4 + 2·4) / 10 = 1.2
    assert m[M.STALENESS_MEAN] == pytest.approx(1.2)
    assert m[M.STALENESS_MAX] == 2.0
    assert [m[M.staleness_lag(n)] for n in range(3)] == [2.0, 4.0, 4.0]
    assert m[M.STALE_DROPPED] == 3.0
    # Lags 0..k+1 are always reported, so curves have the same columns every step.
    empty = staleness_metrics([], 1, max_staleness=2, dropped=0)
    assert {M.staleness_lag(n) for n in range(4)} <= set(empty)
    assert empty[M.staleness_lag(3)] == 0.0


def test_config_names_the_mode_and_refuses_what_it_cannot_run() -> None:
    cfg = ExperimentConfig().with_overrides({"rollout.mode": "async", "rollout.max_staleness": 2})
    assert (cfg.rollout.mode, cfg.rollout.max_staleness) == ("async", 2)
    with pytest.raises(ConfigError, match=re.escape("rollout.mode='overlap': use sync or async")):
        ExperimentConfig().with_overrides({"rollout.mode": "overlap"})
    with pytest.raises(ConfigError, match="max_staleness=-1"):
        ExperimentConfig().with_overrides({"rollout.mode": "async", "rollout.max_staleness": -1})
    with pytest.raises(ConfigError, match=re.escape("does nothing with rollout.mode=sync")):
        ExperimentConfig().with_overrides({"rollout.max_staleness": 3})


# --- the gate's guarantee over every interleaving ------------------------------------------------
@dataclass
class Pipeline:
    """The trainer and the worker as a state machine whose moves are the real pair's: the
    worker starts a batch when `may_start` and `needed` allow (one at a time), finishes it,
    loads pushed weights; the trainer collecting step t asks for the next batch (`take(t)`
    begins: next_step = t), receives it when made (next_step = t + 1), and either asks again or,
    having the needs[t] batches dynamic sampling wants, pushes step t + 1's weights."""

    needs: list[int]  # batches each step takes (dynamic sampling: 1 or more)
    k: int
    one_per_step: bool
    step: int = 1
    taken_in_step: int = 0
    waiting: bool = False
    next_step: int = 1
    pushed: int = 1
    weights: int = 1
    started: int = 0
    taken: int = 0
    in_flight: tuple[int, int] | None = None  # (index, version) of the batch being made
    made: dict[int, int] = field(default_factory=dict)  # index -> version
    lags: list[tuple[int, int, int]] = field(default_factory=list)  # (step, version, lag)

    @property
    def last_step(self) -> int:
        return len(self.needs)

    @property
    def collecting(self) -> bool:
        return self.taken_in_step < self.needs[self.step - 1]

    def moves(self) -> list[str]:
        out = []
        ahead = self.started - self.taken
        if self.in_flight is None and self.weights < self.pushed:
            out.append("load")
        gate = may_start(
            next_step=self.next_step,
            ahead=ahead,
            weights_version=self.weights,
            max_staleness=self.k,
        ) and needed(
            next_step=self.next_step,
            ahead=ahead,
            last_step=self.last_step,
            one_per_step=self.one_per_step,
        )
        if self.in_flight is None and gate:
            out.append("start")
        if self.in_flight is not None:
            out.append("finish")
        if self.step <= self.last_step:
            if self.collecting and not self.waiting:
                out.append("ask")
            if self.waiting and self.taken in self.made:
                out.append("receive")
            if not self.collecting:
                out.append("push")
        return out

    def move(self, name: str) -> None:
        if name == "load":
            self.weights = self.pushed
        elif name == "start":  # the real worker fixes index and version when it starts
            self.in_flight = (self.started, self.weights)
            self.started += 1
        elif name == "finish":
            assert self.in_flight is not None
            index, version = self.in_flight
            self.made[index] = version
            self.in_flight = None
        elif name == "ask":
            self.waiting, self.next_step = True, self.step
        elif name == "receive":
            version = self.made.pop(self.taken)
            self.taken += 1
            self.waiting, self.next_step = False, self.step + 1
            self.lags.append((self.step, version, lag(self.step, version)))
            self.taken_in_step += 1
        elif name == "push":
            self.pushed = self.step + 1
            self.step, self.taken_in_step = self.step + 1, 0


@settings(max_examples=400, deadline=None)
@given(
    needs=st.lists(st.integers(1, 3), min_size=1, max_size=6),
    k=st.integers(0, 3),
    choices=st.lists(st.integers(0, 10**6), min_size=50, max_size=50),
)
def test_the_gate_never_lets_a_batch_be_taken_too_stale_and_never_gets_stuck(
    needs: list[int], k: int, choices: list[int]
) -> None:
    one_per_step = all(n == 1 for n in needs)
    p = Pipeline(needs=needs, k=k, one_per_step=one_per_step)
    for i in range(10_000):
        if p.step > p.last_step:
            break
        moves = p.moves()
        assert moves, f"stuck: {p}"  # liveness: some move is always possible
        p.move(moves[choices[i % len(choices)] % len(moves)])
    assert p.step > p.last_step, "every step completed"
    assert [s for s, _, _ in p.lags] == [s for s, n in enumerate(needs, 1) for _ in range(n)]
    assert all(0 <= lg <= k for _, _, lg in p.lags), p.lags
    if k == 0:
        # The sync schedule: every batch sampled with the starting weights of its own step.
        assert all(version == step for step, version, _ in p.lags)
    # No batch is made that no step takes (one batch a step: exactly the steps' batches).
    if one_per_step:
        assert p.started == len(needs)


# --- the worker thread ---------------------------------------------------------------------------
class RecordingEngine:
    """A RolloutEngine whose responses are fixed, which records every call: the thread, the
    prompts, the version of the weights it held and the seed. Its random stream is the count of
    unseeded calls; load_weights reads the version from the `v` tensor."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls = 0
        self.weights = 1
        self.fail_at = fail_at
        self.log: list[tuple[str, list[str], int, int | None]] = []

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        if sampling.seed is None:
            if self.calls == self.fail_at:
                raise ValueError("the sampling distribution holds NaN or inf")
            self.calls += 1
        self.log.append(
            (threading.current_thread().name, list(prompts), self.weights, sampling.seed)
        )
        return [
            Completion(i, [5], [6, 7, 1], [-0.1] * 3, "stop", p)
            for i, p in enumerate(prompts)
            for _ in range(sampling.n)
        ]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.weights = int(state_dict["v"])

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.calls = int(state["calls"])

    def close(self) -> None:
        pass


PROBLEMS = [Problem(prompt=f"q{i}", answer="1", source="t", idx=i) for i in range(32)]
CFG = ExperimentConfig().with_overrides(
    {
        "rollout.group_size": 2,
        "batch.train_batch_size": 2,
        "batch.gen_batch_size": 2,
        "batch.mini_batch_size": 1,
    }
)


def reward(completion: Completion, problem: Problem) -> Scored:
    return Scored(1.0, 1.0, completion.text, 0.0)


def make_worker(engine: RecordingEngine, k: int, last_step: int = 10) -> RolloutWorker:
    producer = GroupSource(CFG, engine, PROBLEMS, lambda p: p.prompt, reward, LOCAL)
    return RolloutWorker(
        producer, batch_prompts=2, max_staleness=k, last_step=last_step, one_per_step=True
    )


def weights(version: int) -> dict[str, torch.Tensor]:
    return {"v": torch.tensor(version)}


def sync_prompts(n_batches: int) -> list[list[str]]:
    """The prompts of the sync source's first batches (2 prompts each)."""
    source = GroupSource(CFG, RecordingEngine(), PROBLEMS, lambda p: p.prompt, reward, LOCAL)
    return [[g.prompt for g in source(2)] for _ in range(n_batches)]


def test_staleness_zero_samples_each_batch_with_its_own_steps_weights() -> None:
    engine = RecordingEngine()
    worker = make_worker(engine, k=0)
    worker.start()
    try:
        for step in (1, 2, 3):
            batch, _ = worker.take(step)
            assert batch.policy_version == step
            worker.push(step + 1, weights(step + 1))
    finally:
        worker.close()
    made = [(name, prompts, w) for name, prompts, w, _ in engine.log[:3]]
    assert [w for _, _, w in made] == [1, 2, 3]  # the weights the sync run samples with
    assert [p for _, p, _ in made] == sync_prompts(3)  # the same prompts, in the same order
    assert all(name == "dapo-rollout" for name, _, _ in made)


def test_staleness_one_samples_the_next_batch_before_the_update_lands() -> None:
    engine = RecordingEngine()
    worker = make_worker(engine, k=1)
    worker.start()
    try:
        first, _ = worker.take(1)
        # No weights pushed yet: the worker made step 2's batch with step 1's weights.
        second, _ = worker.take(2)
        assert (first.policy_version, second.policy_version) == (1, 1)
        worker.push(2, weights(2))  # step 1's update, late
        worker.push(3, None)  # step 2 changed nothing: the version alone, step 1's tensors kept
        third, _ = worker.take(3)
    finally:
        worker.close()
    assert third.policy_version == 3 and engine.log[2][2] == 2  # version 3 = weights of 2
    assert [[g.prompt for g in b.shard.groups] for b in (first, second, third)] == sync_prompts(3)


def test_the_cursor_is_the_state_before_the_first_batch_not_taken() -> None:
    engine = RecordingEngine()
    worker = make_worker(engine, k=2)
    worker.start()
    try:
        worker.take(1)
        # Whatever the worker has made ahead (up to 2 batches), the checkpoint's place is after
        # batch 0: 2 prompts drawn, 1 unseeded generate.
        cursor = worker.cursor()
    finally:
        worker.close()
    assert cursor.data == {"epoch": 0, "pos": 2} and cursor.engine == {"calls": 1}
    # A worker resumed from it makes batch 1 again: the same prompts, the same stream.
    again = RecordingEngine()
    resumed = make_worker(again, k=2)
    resumed.restart(Cursor(cursor.data, cursor.engine), next_step=2)
    resumed.push(2, weights(2))
    resumed.start()
    try:
        batch, _ = resumed.take(2)
    finally:
        resumed.close()
    assert [g.prompt for g in batch.shard.groups] == sync_prompts(2)[1]
    assert batch.policy_version == 2 and again.log[0][2] == 2


def test_calls_run_on_the_worker_thread_with_the_newest_weights_and_must_be_seeded() -> None:
    engine = RecordingEngine()
    worker = make_worker(engine, k=0)
    view = WorkerEngine(worker)
    seeded = SamplingParams(n=1, max_tokens=4, seed=7)
    view.generate(["before"], seeded)  # before start: on this thread
    worker.start()
    try:
        worker.take(1)
        worker.push(2, weights(2))
        view.generate(["eval"], seeded)
        with pytest.raises(ValueError, match="must be seeded"):
            view.generate(["x"], SamplingParams(n=1, max_tokens=4))
        with pytest.raises(TypeError, match="by version"):
            view.load_weights(weights(3))
    finally:
        worker.close()
    calls = [(name, prompts, w) for name, prompts, w, seed in engine.log if seed == 7]
    assert calls == [
        (threading.current_thread().name, ["before"], 1),
        ("dapo-rollout", ["eval"], 2),
    ]


def test_a_failure_on_the_worker_thread_is_raised_in_the_trainer() -> None:
    worker = make_worker(RecordingEngine(fail_at=1), k=1)
    worker.start()
    try:
        worker.take(1)  # batch 0 is made; batch 1 fails
        with pytest.raises(ValueError, match="NaN or inf"):
            worker.take(2)
    finally:
        worker.close()


def test_no_batch_is_made_past_the_last_step() -> None:
    engine = RecordingEngine()
    worker = make_worker(engine, k=3, last_step=2)
    worker.start()
    try:
        for step in (1, 2):
            worker.take(step)
        worker.push(3, weights(3))
    finally:
        worker.close()
    # Two steps, two batches, whatever the interleaving: none made for a step 3 that never
    # comes, though k = 3 would let the worker run three batches ahead.
    assert engine.calls == 2


# --- the ladder ------------------------------------------------------------------------------------
def test_the_staleness_ladder_is_dapo_with_async_rollouts_at_0_1_2_4() -> None:
    from dapo_common.util import flatten
    from dapo_core.setup.ladders import BUILTIN_LADDERS, builtin_ladder, paper_ladder

    assert "staleness" in BUILTIN_LADDERS
    ladder = builtin_ladder("staleness")
    assert ladder.names == ("staleness=0", "staleness=1", "staleness=2", "staleness=4")
    assert [r["parent"] for r in ladder.rows()] == [None, *ladder.names[:-1]]
    dapo = flatten(paper_ladder().config("dapo").to_dict())
    for name, k in zip(ladder.names, (0, 1, 2, 4), strict=True):
        cfg = flatten(ladder.config(name).to_dict())
        changed = {key for key, v in cfg.items() if dapo[key] != v and key != "arm"}
        # max_staleness's default is 1: at k = 1 only the mode differs from dapo's config
        assert changed <= {"rollout.mode", "rollout.max_staleness"}, name
        assert (cfg["rollout.mode"], cfg["rollout.max_staleness"]) == ("async", k), name
