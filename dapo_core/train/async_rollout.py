"""Rollouts that overlap training (`rollout.mode = async`): a rollout worker keeps sampling
groups with the newest weights it has received while the trainer updates.

Versions. A policy version is a rollout step: version v is the trainer's weights at the start
of step v (after v − 1 updates), and a group sampled with them carries `policy_version = v`
(as in sync, where every fresh group of step v has version v). A group trained at step t lags
t − v versions.

The worker (`RolloutWorker`, a thread of the trainer's process with its own engine and its own
copy of the weights; torch releases the GIL in its kernels) makes generation batches one after
another, in the prompt stream's order, each from the same prompts and the same random stream
as the sync run's batch of that place. The trainer takes them in that order (`AsyncSource`, the
sync `GroupSource`'s stand-in). Two rules keep the lag bounded:

* the gate (`may_start`): the worker starts a batch only when, whatever dynamic sampling does,
  it is taken at a lag ≤ k = rollout.max_staleness. Every step takes at least one batch, so a
  batch `ahead` places after the next one to be taken is taken at step ≤ next_step + ahead;
  with weights of version w it may start iff next_step + ahead − w ≤ k. The next one goes to
  step t only while step t's trainer waits for it (`take(t)`); from the moment a batch is
  handed over the next one is counted for step t + 1 (dynamic sampling may still ask for it in
  step t: then it is fresher than counted). So no generation is wasted on samples that will be
  dropped, and at k = 0 the worker samples batch b exactly when, and with exactly the weights
  with which, the sync run samples it.
* the filter (`admit`): the trainer drops and counts every group taken at a lag > k. Under the
  gate none is; the filter is the guarantee's witness (staleness/dropped_samples).

Dynamic sampling's carry-over keeps informative surplus groups for the next step, as in sync:
a carried group may train one version older than it was taken (staleness/max ≤ k + 1).

Weights go to the worker by version after every step (`RolloutWorker.push`): a snapshot the
trainer takes (a copy: its own tensors move on in the next update), left in a mailbox that the
worker empties between batches; a step without an update sends the version alone. The trainer
never waits for the worker to load them.

Checkpoints: the trainer's state names the stream's place and the engine's random stream
before the first batch it has not taken (`RolloutWorker.cursor`), exactly what a sync
checkpoint of the same step holds; batches queued or in flight at a kill are regenerated from
there on resume (with the checkpoint's newer weights), never replayed or counted twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from dapo_common import metric_names as M
from dapo_core.engines.base import Completion, RolloutEngine, SamplingParams
from dapo_core.train.rollout import Group, GroupSource, RewardFn, Shard

if TYPE_CHECKING:
    from dapo_core.data.loaders import Problem
    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.train.collective import Collective

log = logging.getLogger(__name__)

T = TypeVar("T")


# --- the rules, as pure functions ------------------------------------------------------------
def lag(step: int, policy_version: int) -> int:
    """Versions a group of `policy_version` lags the trainer at rollout step `step`."""
    return step - policy_version


def admit(
    groups: Sequence[Group], step: int, max_staleness: int
) -> tuple[list[Group], list[Group]]:
    """The staleness filter: (groups within `max_staleness` versions of step `step`, the rest),
    each in the order given."""
    kept = [g for g in groups if lag(step, g.policy_version) <= max_staleness]
    dropped = [g for g in groups if lag(step, g.policy_version) > max_staleness]
    return kept, dropped


def may_start(*, next_step: int, ahead: int, weights_version: int, max_staleness: int) -> bool:
    """The worker's gate: may it start, with weights of `weights_version`, the batch that is
    `ahead` places after the next one the trainer takes (ahead = 0: that one), the next one
    being taken at step `next_step`? Each step takes at least one batch, so this one is taken
    at step ≤ next_step + ahead, at a lag ≤ next_step + ahead − weights_version."""
    return next_step + ahead - weights_version <= max_staleness


def needed(*, next_step: int, ahead: int, last_step: int, one_per_step: bool) -> bool:
    """Whether the batch `ahead` places after the next one can still be taken by step
    `last_step`: at step next_step + ahead when every step takes exactly one batch (no dynamic
    sampling), at next_step at the earliest otherwise."""
    earliest = next_step + ahead if one_per_step else next_step
    return earliest <= last_step


def staleness_metrics(
    groups: Sequence[Group], step: int, *, max_staleness: int, dropped: int
) -> dict[str, float]:
    """The lag of the samples (responses) trained at `step`: mean, max and the count at each lag
    from 0 to max_staleness + 1 (and any beyond that occurs); `dropped` samples were too stale."""
    lags = [lag(step, g.policy_version) for g in groups for _ in g.rollouts]
    top = max([max_staleness + 1, *lags])
    out = {M.staleness_lag(n): float(lags.count(n)) for n in range(top + 1)}
    out[M.STALENESS_MEAN] = sum(lags) / len(lags) if lags else float("nan")
    out[M.STALENESS_MAX] = float(max(lags)) if lags else float("nan")
    out[M.STALE_DROPPED] = float(dropped)
    return out


# --- the worker ------------------------------------------------------------------------------
@dataclass
class Batch:
    """One generation batch the worker made: this rank's share, and what it cost."""

    index: int  # its place in the stream of batches since the worker (re)started
    policy_version: int
    shard: Shard
    tokens: int  # response tokens of this rank's share


@dataclass(frozen=True)
class Cursor:
    """Where the worker's inputs stood before a batch: the prompt stream and the engine's
    random stream (what a sync checkpoint keeps as `data` and `engine`)."""

    data: dict[str, int]
    engine: dict[str, Any]


@dataclass
class WorkerReport:
    """The worker's time since the previous report."""

    idle_s: float = 0.0  # waiting at the gate, for weights or for the trainer
    busy_s: float = 0.0  # generating and scoring
    tokens: int = 0  # response tokens generated (this rank's)


class _Call:
    """A function of the engine, run on the worker's thread (evaluation, ReMax's baseline)."""

    def __init__(self, fn: Callable[[RolloutEngine], Any]) -> None:
        self.fn = fn
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class RolloutWorker:
    """Generation batches of `batch_prompts` prompts, made on a thread of this process by
    `producer` (a GroupSource holding the worker's own engine and prompt stream; only its
    collective-free `produce` runs here), under the gate of `may_start`.

    The trainer's side: `take(step)` (the next batch, in order, for rollout step `step`),
    `push(version, weights)`, `call(fn)` (a function of the engine on the worker's thread, after
    the newest weights are loaded), `cursor()`, `restart(cursor, next_step)` (after the
    trainer's state was restored, before `start()`), `report()`, `close()`.
    """

    def __init__(
        self,
        producer: GroupSource,
        *,
        batch_prompts: int,
        max_staleness: int,
        last_step: int,
        one_per_step: bool,
    ) -> None:
        self.producer = producer
        self.engine = producer.engine
        self.batch_prompts = batch_prompts
        self.max_staleness, self.last_step, self.one_per_step = (
            max_staleness,
            last_step,
            one_per_step,
        )
        self._cond = threading.Condition()
        self._queue: dict[int, Batch] = {}
        self._cursors: dict[int, Cursor] = {}
        self._started = 0  # batches started since the (re)start
        self._taken = 0  # batches the trainer took
        self._next_step = 1  # the step that takes the next batch
        self._weights_version = 1  # the version of the weights the engine holds
        self._mail: tuple[int, Mapping[str, Tensor] | None] | None = None
        self._calls: list[_Call] = []
        self._report = WorkerReport()
        self._error: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self._threads = torch.get_num_threads()
        self._cursors[0] = self._snapshot()

    # --- the trainer's side ------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def next_step(self) -> int:
        """The rollout step that takes the next batch."""
        return self._next_step

    def start(self) -> None:
        """Start the thread (once): after the trainer's state is restored, before it takes."""
        if self._thread is None:
            self._threads = torch.get_num_threads()
            self._thread = threading.Thread(target=self._run, name="dapo-rollout", daemon=True)
            self._thread.start()

    def take(self, step: int) -> tuple[Batch, float]:
        """The next batch in stream order, for rollout step `step`, and the seconds waited for
        it. While waiting, the batch is known to go to `step`; once handed over, the next one
        is counted for step + 1 until the trainer asks for it in `step` again."""
        t0 = time.perf_counter()
        with self._cond:
            self._next_step = step
            self._cond.notify_all()
            while self._taken not in self._queue:
                self._raise_if_failed()
                if self._thread is None:
                    raise RuntimeError("the rollout worker was asked for a batch before start()")
                self._cond.wait()
            batch = self._queue.pop(self._taken)
            self._taken += 1
            self._next_step = step + 1
            for i in [i for i in self._cursors if i < self._taken]:
                del self._cursors[i]
            self._cond.notify_all()
        return batch, time.perf_counter() - t0

    def push(self, version: int, weights: Mapping[str, Tensor] | None) -> None:
        """The trainer's weights of policy `version` (None: unchanged since the last push, a
        step without an update). The newest replaces an older one not loaded yet, keeping its
        tensors when it brings none."""
        with self._cond:
            if weights is None and self._mail is not None:
                weights = self._mail[1]
            self._mail = (version, weights)
            self._cond.notify_all()

    def call(self, fn: Callable[[RolloutEngine], T]) -> T:
        """fn(engine) with the newest pushed weights loaded: on the worker's thread once it runs
        (after the batch it is making), on the caller's before."""
        if self._thread is None:
            self._load_mail()
            return fn(self.engine)
        job = _Call(fn)
        with self._cond:
            self._calls.append(job)
            self._cond.notify_all()
            while not job.done:
                self._raise_if_failed()
                self._cond.wait()
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[no-any-return]

    def cursor(self) -> Cursor:
        """The inputs' state before the first batch the trainer has not taken."""
        with self._cond:
            return self._cursors[self._taken]

    def restart(self, cursor: Cursor | None, next_step: int) -> None:
        """Begin again before the thread starts: from `cursor` (None: where the stream and the
        engine stand), the next batch going to `next_step` (a resumed run's)."""
        if self._thread is not None:
            raise RuntimeError("the rollout worker restarts only before it starts")
        if cursor is not None:
            self.producer.stream.load_state_dict(cursor.data)
            self.engine.load_state_dict(cursor.engine)
        self._queue.clear()
        self._started = self._taken = 0
        self._cursors = {0: self._snapshot()}
        self._next_step = next_step

    def report(self) -> WorkerReport:
        """Idle and busy seconds and tokens since the previous report."""
        with self._cond:
            out, self._report = self._report, WorkerReport()
        return out

    def close(self) -> None:
        """Stop the thread (after the batch it is making); idempotent."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    # --- the worker's thread -----------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
        if self._stop:
            raise RuntimeError("the rollout worker was closed")
        if self._thread is not None and not self._thread.is_alive():
            raise RuntimeError("the rollout worker stopped")

    def _may_start(self) -> bool:
        ahead = self._started - self._taken
        return needed(
            next_step=self._next_step,
            ahead=ahead,
            last_step=self.last_step,
            one_per_step=self.one_per_step,
        ) and may_start(
            next_step=self._next_step,
            ahead=ahead,
            weights_version=self._weights_version,
            max_staleness=self.max_staleness,
        )

    def _snapshot(self) -> Cursor:
        return Cursor(dict(self.producer.stream.state_dict()), self.engine.state_dict())

    def _load_mail(self) -> None:
        """Load the newest pushed weights, if any (on the worker's thread once it runs)."""
        with self._cond:
            mail, self._mail = self._mail, None
        if mail is None:
            return
        version, weights = mail
        if weights is not None:
            self.engine.load_weights(weights)
        with self._cond:
            self._weights_version = version
            self._cond.notify_all()

    def _run(self) -> None:
        # Each thread has its own intra-op setting: the worker computes with the trainer's.
        torch.set_num_threads(self._threads)
        try:
            while True:
                with self._cond:
                    t0 = time.perf_counter()
                    while not (self._stop or self._mail or self._calls or self._may_start()):
                        self._cond.wait()
                    self._report.idle_s += time.perf_counter() - t0
                    if self._stop:
                        return
                    mail, call = self._mail is not None, self._calls[0] if self._calls else None
                    if not mail and call is None:
                        index, version = self._started, self._weights_version
                        self._started += 1
                if mail:  # weights first: a call or a batch after them uses them
                    self._load_mail()
                elif call is not None:
                    self._serve(call)
                else:
                    self._produce(index, version)
        except BaseException as exc:  # raised in the trainer by take() or call()
            log.exception("the rollout worker failed")
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _serve(self, job: _Call) -> None:
        try:
            job.result = job.fn(self.engine)
        except Exception as exc:  # the caller's error, raised in the caller
            job.error = exc
        with self._cond:
            self._calls.remove(job)
            job.done = True
            self._cond.notify_all()

    def _produce(self, index: int, version: int) -> None:
        t0 = time.perf_counter()
        self.producer.version = version
        part = self.producer.produce(self.batch_prompts)
        tokens = sum(len(r.completion.token_ids) for g in part.groups for r in g.rollouts)
        after = self._snapshot()
        with self._cond:
            self._queue[index] = Batch(index, version, part, tokens)
            self._cursors[index + 1] = after
            self._report.busy_s += time.perf_counter() - t0
            self._report.tokens += tokens
            self._cond.notify_all()


class WorkerEngine:
    """The trainer's view of the worker's engine (a RolloutEngine): seeded generation
    (evaluation, ReMax's greedy baseline) runs on the worker's thread with the newest pushed
    weights; the engine's own random stream is the worker's alone, so an unseeded call is
    refused. Its state is the worker's cursor's."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        if sampling.seed is None:
            raise ValueError(
                "rollout.mode=async: the rollout worker owns the engine's random stream; the "
                "trainer's own calls must be seeded (SamplingParams.seed)"
            )
        return self.worker.call(lambda engine: engine.generate(prompts, sampling))

    def load_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        raise TypeError(
            "rollout.mode=async: weights reach the rollout worker by version "
            "(RolloutWorker.push), not through the engine"
        )

    def state_dict(self) -> dict[str, Any]:
        return dict(self.worker.cursor().engine)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        cursor = self.worker.cursor()
        self.worker.restart(Cursor(cursor.data, dict(state)), self.worker.next_step)

    def close(self) -> None:
        """The worker is closed by the trainer, its engine by whoever made it."""


# --- the trainer's side --------------------------------------------------------------------------
class AsyncSource(GroupSource):
    """The sync GroupSource's stand-in in async mode: `source(n)` takes the worker's next batch
    (the same prompts the sync source would draw), gathers the ranks' shares, drops and counts
    the groups too stale to train, and adds the batch's generation and scoring seconds (the
    worker's) to the step's times. Its checkpoint state is the worker's cursor."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        engine: RolloutEngine,
        problems: Sequence[Problem],
        format_prompt: Callable[[Problem], str],
        reward: RewardFn,
        dist: Collective,
    ) -> None:
        # The worker's own producer: its engine, its prompt stream, the same reward.
        producer = GroupSource(cfg, engine, problems, format_prompt, reward, dist)
        a, b = cfg.algo, cfg.batch
        self.worker = RolloutWorker(
            producer,
            batch_prompts=b.gen_batch_size if a.dynamic_sampling else b.train_batch_size,
            max_staleness=cfg.rollout.max_staleness,
            last_step=cfg.run.steps,
            one_per_step=not a.dynamic_sampling,
        )
        super().__init__(cfg, WorkerEngine(self.worker), problems, format_prompt, reward, dist)
        self.stream = producer.stream  # the stream's place is the worker's (see data_state)
        self.max_staleness = cfg.rollout.max_staleness
        self.step = 0
        self.dropped = 0  # samples dropped as too stale this step
        self.idle_s = 0.0  # seconds the trainer waited for batches this step

    def start_step(self, version: int) -> dict[str, float]:
        self.worker.start()
        self.step, self.dropped, self.idle_s = version, 0, 0.0
        return super().start_step(version)

    def __call__(self, n_prompts: int) -> list[Group]:
        if n_prompts != self.worker.batch_prompts:
            raise ValueError(
                f"the rollout worker makes batches of {self.worker.batch_prompts} prompts, not "
                f"{n_prompts}"
            )
        while True:
            batch, waited = self.worker.take(self.step)
            self.idle_s += waited
            self.times["rollout"] += batch.shard.rollout_s
            self.times["reward"] += batch.shard.reward_s
            kept, stale = admit(self.gather(batch.shard), self.step, self.max_staleness)
            self.dropped += sum(len(g.rollouts) for g in stale)
            if kept or not stale:
                return kept
            log.warning(
                "step %d: a generation batch of policy version %d was %d versions stale "
                "(rollout.max_staleness=%d): dropped",
                self.step,
                batch.policy_version,
                lag(self.step, batch.policy_version),
                self.max_staleness,
            )

    def publish(self, version: int, weights: Mapping[str, Tensor] | None) -> None:
        self.worker.push(version, weights)

    def restart(self, next_step: int) -> None:
        """After a restore: the worker begins at the restored stream and engine states."""
        self.worker.restart(None, next_step)

    def step_metrics(self) -> dict[str, float]:
        report = self.worker.report()
        return {M.ROLLOUT_IDLE_S: report.idle_s, M.TRAINER_IDLE_S: self.idle_s}

    def data_state(self) -> dict[str, int]:
        return dict(self.worker.cursor().data)

    def load_data_state(self, state: dict[str, Any]) -> None:
        cursor = self.worker.cursor()
        self.worker.restart(Cursor(dict(state), cursor.engine), self.worker.next_step)

    def engine_state(self) -> dict[str, Any]:
        return dict(self.worker.cursor().engine)

    def load_engine_state(self, state: Mapping[str, Any]) -> None:
        cursor = self.worker.cursor()
        self.worker.restart(Cursor(cursor.data, dict(state)), self.worker.next_step)

    def close(self) -> None:
        self.worker.close()
