"""The second embedded task, `explore`: running sums where the rewarded path starts rare.

Why a second task. On running sums (dapo_core.data.synthetic) RL learns, but the ladder's arms
cannot differ: after the warm start nearly every token is near-certain (0.08-0.24 nats of mean
entropy). A token sampled at old probability p can reach a ratio of at most 1/p, so only tokens
with p < 1/(1 + ε_high) (0.78 at ε_high = 0.28) can ever reach Clip-Higher's upper bound, and
there almost none do (0.008-0.04% of tokens). DAPO's Fig. 3a finds the up-clipped tokens at
π < 0.2; Cui et al. (arXiv 2505.22617) show that entropy collapses with the covariance of a
token's log-probability and its advantage, i.e. when rewarded tokens are already likely. So
this task makes the rewarded tokens rare, at one named decision token, the fork.

The task. The same problems as running sums with up to six terms, `37+4+9+1+8+2=?`, and a fork
at the first response token:
- answer at once, `Answer: 61` (5 tokens with EOS). The demonstrator guesses: the sum plus a
  uniform error in [−GUESS_SPREAD, +GUESS_SPREAD], so an answer at once is right about one time
  in seven at best. Its answer digits are the "wide alphabet with the right symbol among
  several": rewarded tokens at p ≈ 0.14, as Clip-Higher wants;
- write the working, one term a line, as in running sums (same line forms, same forgotten
  carries, same loops), ending in the same `Answer:` line. After the warm start the policy takes
  this branch at the fork about WORK_RATE of the time: rare, but right far more often. Learning
  to take it is the "escape"; its first token is a rewarded token at p ≈ 0.05-0.1.

What each arm of the ladder meets here:
- Clip-Higher: the fork token of a right worked answer has p ≈ 0.05-0.1 and a positive
  advantage, so ε_high bounds how fast p can grow per rollout step (at most 1 + ε_high per old
  policy); at-once digits at p ≈ 0.14 likewise;
- overlong filter and soft punishment: worked answers are long and right. A six-term worked
  answer takes 37-45 tokens and a loop more, against L_max = 44 with L_cache = 6 (the penalty
  from 38 tokens on): the penalty and the budget fall on right answers too, and a truncated
  worked answer without the filter teaches the fork to answer at once;
- token-level loss: a worked answer has 13-44 tokens, an answer at once 5; under the sample-
  level loss the fork token of a worked answer weighs 1/|o_i| of its sequence, under the token-
  level loss as much as any token;
- dynamic sampling: while the policy mostly answers at once, many groups have no right answer.

Lengths, in tokens of the tiny tokenizer: a worked answer of k terms takes 8 + 8·j + 6·(k−2−j)
+ 5 tokens for j long lines (13 to 45); an answer at once 5 (`Answer:`, space, two digits, EOS;
every sum here has two digits: at most 49 + 5·9 = 94, guesses clamped to [10, 99]).

The evaluation is the platform's, untouched: held-out problems (a hash bucket of the problem's
text, as in running sums), graded by the configured grader on the last `Answer:` line.

Alternatives considered and not taken: a held-out test forbidding each prompt's modal answer
(many valid answers) changes what "right" means between training and evaluation, which is
tuning the evaluation; a wide alphabet alone (no fork) has rare rewarded tokens but no long
right answers for the overlong arms to act on.
"""

from __future__ import annotations

import random

from dapo_core.data.synthetic import SumTask, split_tasks

TASK_VERSION = 1
"""Bump when the task's text, distribution or demonstrations change: it keys the warm-start
cache of the `tiny-explore` model (with the rates below)."""

MIN_TERMS, MAX_TERMS = 2, 6
TRAIN_SIZE = 4096
"""Problems in `explore` (drawn with replacement from the training split)."""
EVAL_SIZE = 256
"""Distinct problems in `explore-eval` (the held-out split)."""
EVAL_SEED = 20261125
"""The held-out set is one fixed draw, so every run and seed is scored on the same problems."""

WORK_RATE = 0.06
"""How often the demonstrator writes the working in the warm start's last phase: the fork's
prior after the warm start."""
LEARN_WORK_RATE = 0.9
"""How often it writes the working in the first phase, where the tiny model learns to add."""
LEARN_SHARE = 0.8
"""Share of the warm start's examples in the first phase (the rest set the fork's prior)."""
GUESS_SPREAD = 3
"""An answer at once is the sum plus a uniform error in [−GUESS_SPREAD, GUESS_SPREAD]."""
SLIP_RATE = 0.1
"""How often the demonstrator forgets a carry in a worked answer (as in running sums)."""
LONG_LINE_RATE = 0.5
"""How often a line after the first repeats the running total (as in running sums)."""
RAMBLE_RATE = 0.2
"""How often a worked answer falls into a loop (every line from a random one on, twice)."""

RECIPE = (
    "explore",
    TASK_VERSION,
    WORK_RATE,
    LEARN_WORK_RATE,
    LEARN_SHARE,
    GUESS_SPREAD,
    SLIP_RATE,
    LONG_LINE_RATE,
    RAMBLE_RATE,
)
"""Everything about the task that the warm-started weights depend on (a cache key part)."""

DECISION_POSITIONS: tuple[int, ...] = (0,)
"""Response positions where the task's decision is taken: the fork (answer at once or work)."""

AT_ONCE, WORKING = "at_once", "working"
_ANSWER = "Answer:"


def draw_task(rng: random.Random) -> SumTask:
    """Terms uniform in [2, 6]; start uniform in [10, 49]; digits uniform in [1, 9]."""
    k = rng.randint(MIN_TERMS, MAX_TERMS)
    return SumTask((rng.randint(10, 49), *(rng.randint(1, 9) for _ in range(k - 1))))


def train_tasks(n: int, seed: int) -> list[SumTask]:
    """n problems from the training split (repeats allowed)."""
    return split_tasks(n, random.Random(f"dapo-explore-train-{seed}"), draw_task, held_out=False)


def eval_tasks(n: int = EVAL_SIZE) -> list[SumTask]:
    """n distinct held-out problems, the same for every seed."""
    rng = random.Random(f"dapo-explore-eval-{EVAL_SEED}")
    return split_tasks(n, rng, draw_task, held_out=True)


def at_once(answer: int) -> str:
    """An answer at once: `Answer: 61`."""
    return f"{_ANSWER} {answer}"


def guess(task: SumTask, rng: random.Random) -> int:
    """The demonstrator's answer at once: the sum plus a uniform error, kept two-digit."""
    return min(99, max(10, task.answer + rng.randint(-GUESS_SPREAD, GUESS_SPREAD)))


def worked(task: SumTask, rng: random.Random) -> str:
    """A worked answer as the demonstrator writes it (running sums' habits)."""
    long_lines = [rng.random() < LONG_LINE_RATE for _ in range(task.steps - 1)]
    slips = [rng.random() < SLIP_RATE for _ in range(task.steps)]
    loop_from = rng.randrange(task.steps) if rng.random() < RAMBLE_RATE else None
    return task.write(long_lines, slips, loop_from)


def demonstration(task: SumTask, rng: random.Random, work_rate: float) -> str:
    """Worked with probability `work_rate`, else an answer at once."""
    if rng.random() < work_rate:
        return worked(task, rng)
    return at_once(guess(task, rng))


def demonstrations(n: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, demonstration) pairs for the supervised warm start, in the order it reads them:
    the first LEARN_SHARE with half of them worked (the model learns to add), the rest worked
    at WORK_RATE only, which leaves the fork's prior near WORK_RATE."""
    rng = random.Random(f"dapo-explore-demo-{seed}")
    first = round(n * LEARN_SHARE)
    return [
        (t.text, demonstration(t, rng, LEARN_WORK_RATE if i < first else WORK_RATE))
        for i, t in enumerate(train_tasks(n, seed))
    ]


def branch(response: str) -> str:
    """Which side of the fork a response took: AT_ONCE when it opens with `Answer:` (leading
    blanks ignored), else WORKING."""
    return AT_ONCE if response.lstrip().startswith(_ANSWER) else WORKING
