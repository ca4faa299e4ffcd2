"""The third embedded task, `lookup`: one decision per response, so that the clip acts on it.

Why a third task. On `explore` (dapo_core.data.explore) Clip-Higher never shows: the rewarded
uncertain token is one in 5-45 response tokens, only 2.4-2.7% of the tokens are eligible for the
upper bound, and the push on each is weak and inconsistent across a group (docs/explore.md).
The published evidence shows the clip most cleanly where the decision is most of the response:
DAPO §3.1 (arXiv 2503.14476: the upper clip caps how fast a rare rewarded token can rise), and
Park et al. (arXiv 2509.26114) and Chen et al. (arXiv 2512.16912), who show that under a reward
independent of the answer the clip alone moves the entropy. So here the response IS the
decision.

The task. A key in, one of 8 answer symbols out, then EOS:

    prompt    k=37?            (the `raw-answer` template adds `Answer: `, so the model reads
              Answer:           `k=37?\\nAnswer: ` and the grader reads `Answer: C`)
    response  C <eos>          2 tokens: the decision is half the loss tokens

A fixed random TABLE maps NUM_KEYS two-digit keys to the symbols A-H (seeded by TABLE_SEED,
versioned by TASK_VERSION). Nothing about a key tells its answer: RL has to learn the table
key by key, and a rewarded symbol starts rare.

The warm start imitates a demonstrator who knows each key's answer only a little: it answers
right RIGHT_RATE of the time, else one of the 7 wrong symbols with weights that fall by DECAY
from a per-key favourite (a decoy, half the demonstrations) down (`answer_weights`). The fitted
policy answers right about 15% of the time (p ≈ 0.15 on the rewarded token, far below the 1/(1+ε_high) ≈ 0.78 where
a token can still reach the upper bound), and its decision entropy sits in the middle of its
range (not at log 8), so that a reward can move it either way (the entropy probe).

Training and evaluation use the same keys: a random table has nothing to generalise, so the
evaluation (`lookup-eval`: every key once, k fresh samples each, graded by the platform's
grader) measures how much of the table the policy knows, sampled apart from training. It is
never used to calibrate anything: the warm start is calibrated on the exact P(right) of the
warm-started model over the keys (`p_right` of docs/mechanisms.md's calibration log), a
training-side number.

`lookup-coin` is the same keys with a reward that is a fair coin, independent of the answer
(`coin`): the entropy probe of Park et al. and Chen et al. Its training list repeats every key
COIN_REPEATS times so that, within a run shorter than an epoch, each row is scored once and its
coins depend only on (run seed, row, place in the group).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from dapo_core.data.answer import ANSWER_PREFIX

TASK_VERSION = 1
"""Bump when the table, the prompt text, the demonstrator or the coin change: it keys the
warm-start cache of the `tiny-lookup` model (with the rates below)."""

SYMBOLS = "ABCDEFGH"
"""The 8 answer symbols, one tiny-tokenizer token each."""
NUM_KEYS = 32
"""Keys in the table: two-digit numbers drawn once (TABLE_SEED), a few dozen so that a rollout
step of NUM_KEYS prompts visits every key once."""
TABLE_SEED = 20261128
RIGHT_RATE = 0.175
"""How often the demonstrator answers right: 7 of each key's ROUND = 40 demonstrations. The
warm-started model answers right 16.3% of the time (its exact P(right) over the keys)."""
DECAY = 0.4
"""The wrong symbols' weights, favourite first: 1, DECAY, DECAY², ... (then scaled to
1 − RIGHT_RATE). Per 40 demonstrations of a key: the decoy 20, then 8, 3, 1, 1, and two wrong
symbols never shown (`quotas`)."""
ROUND = 40
"""Demonstrations of each key per round of the warm start (`demonstrations`)."""
COIN_REPEATS = 256
"""`lookup-coin` lists each key this many times (8,192 rows: 256 rollout steps of 32 prompts
per epoch)."""
COIN_SEED = 20261128

DECISION_POSITIONS: tuple[int, ...] = (0,)
"""Response positions where the task takes its decision: the answer symbol."""

RECIPE = ("lookup", TASK_VERSION, NUM_KEYS, TABLE_SEED, RIGHT_RATE, DECAY, ROUND)
"""Everything about the task that the warm-started weights depend on (a cache key part)."""


@dataclass(frozen=True)
class LookupTask:
    """One key of the table and its answer symbol."""

    key: int
    answer: str

    @property
    def text(self) -> str:
        """The prompt before the `raw-answer` template's `Answer: `: `k=37?` and a newline."""
        return f"k={self.key}?\n"


def table() -> dict[int, str]:
    """key -> answer symbol: NUM_KEYS distinct keys in [10, 99], answers uniform over SYMBOLS,
    the same on every machine (a string-seeded random.Random)."""
    rng = random.Random(f"dapo-lookup-table-{TABLE_SEED}")
    keys = sorted(rng.sample(range(10, 100), NUM_KEYS))
    return {k: rng.choice(SYMBOLS) for k in keys}


def tasks() -> list[LookupTask]:
    """Every key of the table once, in key order."""
    return [LookupTask(k, a) for k, a in table().items()]


def train_tasks() -> list[LookupTask]:
    """The `lookup` training list: every key once (the run's seed shuffles the order)."""
    return tasks()


def coin_tasks() -> list[LookupTask]:
    """The `lookup-coin` training list: every key COIN_REPEATS times, key order repeated."""
    return tasks() * COIN_REPEATS


def eval_tasks() -> list[LookupTask]:
    """The evaluation: every key once (see the module docstring for why not held-out keys)."""
    return tasks()


def answer_weights(task: LookupTask) -> dict[str, float]:
    """The demonstrator's distribution over SYMBOLS for one key: RIGHT_RATE on the answer; the
    rest over the wrong symbols in a per-key random order, each DECAY times the one before."""
    wrong = [s for s in SYMBOLS if s != task.answer]
    random.Random(f"dapo-lookup-decoys-{TABLE_SEED}-{task.key}").shuffle(wrong)
    raw = [DECAY**i for i in range(len(wrong))]
    total = sum(raw)
    weights = {s: (1.0 - RIGHT_RATE) * w / total for s, w in zip(wrong, raw, strict=True)}
    weights[task.answer] = RIGHT_RATE
    return {s: weights[s] for s in SYMBOLS}


def quotas(task: LookupTask) -> dict[str, int]:
    """How many of a key's ROUND demonstrations give each symbol: `answer_weights` × ROUND,
    rounded by largest remainder (so they sum to ROUND)."""
    weights = answer_weights(task)
    exact = {s: w * ROUND for s, w in weights.items()}
    out = {s: int(x) for s, x in exact.items()}
    short = ROUND - sum(out.values())
    for s in sorted(SYMBOLS, key=lambda s: out[s] - exact[s])[:short]:
        out[s] += 1
    return out


def demonstrations(n: int, seed: int) -> list[tuple[str, str]]:
    """(prompt as the policy reads it, demonstrated answer) pairs for the supervised warm start.

    Read in rounds: a round holds every key ROUND times with its answers in the exact
    proportions of `quotas`, shuffled. Drawn independently instead, the per-key differences the
    warm start has to learn (0.15 on the answer against 0.13-0.21 on its neighbours) drown in
    the labels' sampling noise: 1,200 supervised steps left the tiny model at chance (P(right)
    0.134 with a gentler DECAY; docs/mechanisms.md). The prompt carries the `raw-answer` template's `Answer: `, so the
    warm start and RL see the same tokens."""
    rng = random.Random(f"dapo-lookup-demo-{seed}")
    block = [
        (t.text + ANSWER_PREFIX, symbol)
        for t in tasks()
        for symbol, count in quotas(t).items()
        for _ in range(count)
    ]
    out: list[tuple[str, str]] = []
    while len(out) < n:
        rnd = list(block)
        rng.shuffle(rnd)
        out.extend(rnd)
    return out[:n]


def coin(run_seed: int, row: int, member: int) -> bool:
    """A fair coin for the `member`-th response to training row `row` of a run seeded
    `run_seed`: bit 0 of SHA-256 over the three numbers. It never sees the response, so the
    reward it gives is independent of the answer by construction (Park et al. arXiv 2509.26114,
    §4: a random reward isolates what the clip itself does to the entropy)."""
    text = f"dapo-lookup-coin-{COIN_SEED}-{run_seed}-{row}-{member}"
    return hashlib.sha256(text.encode()).digest()[0] & 1 == 1
