"""The training reward a run uses: the grader's verdict (ShapedReward), or a task's own reward.

Most tasks are rewarded by the configured grader (Eq. 7) plus the soft overlong punishment
(Eq. 13): `ShapedReward`. A task may name another training reward
(dapo_core.data.loaders.task_reward); today one does: `lookup-coin`, whose reward is a fair coin
independent of the answer (`CoinReward`), the probe with which Park et al. (arXiv 2509.26114)
and Chen et al. (arXiv 2512.16912) show what the clip alone does to the entropy. Evaluation
always grades with the grader, whatever the training reward.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from dapo_core.data import lookup
from dapo_core.data.loaders import task_reward
from dapo_core.train.rollout import RewardFn, Scored, ShapedReward

if TYPE_CHECKING:
    from dapo_core.data.loaders import Problem
    from dapo_core.engines.base import Completion
    from dapo_core.setup.config import ExperimentConfig


class CoinReward:
    """score = +1 or −1 by a fair coin that never sees the response (dapo_core.data.lookup.coin
    of the run's seed, the problem's row and the response's place among the responses scored for
    that row); acc, pred and the overlong penalty are the grader's (`shaped`), so `acc/mean`
    still says how often the policy is right while the reward ignores it.

    Deterministic: a row's responses are scored in group order, so the m-th response of a row
    gets coin(seed, row, m). A run shorter than an epoch of its data (lookup-coin: 256 rollout
    steps of 32 prompts) scores each row once, so its coins are the same after a resume.
    """

    def __init__(self, shaped: ShapedReward, seed: int) -> None:
        self.shaped, self.seed = shaped, seed
        self._scored: Counter[int] = Counter()  # row -> responses scored so far

    def __call__(self, completion: Completion, problem: Problem) -> Scored:
        graded = self.shaped(completion, problem)
        member = self._scored[problem.idx]
        self._scored[problem.idx] += 1
        heads = lookup.coin(self.seed, problem.idx, member)
        return Scored(1.0 if heads else -1.0, graded.acc, graded.pred, graded.penalty)


def training_reward(cfg: ExperimentConfig) -> RewardFn:
    """The reward a run of `cfg` trains on: its data set's own (`coin`) or ShapedReward."""
    shaped = ShapedReward.from_config(cfg)
    kind = task_reward(cfg.data.train)
    if kind == "coin":
        return CoinReward(shaped, cfg.run.seed)
    return shaped
