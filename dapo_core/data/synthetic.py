"""The embedded task: running sums with worked solutions that end in `Answer: N`.

A problem adds a two-digit start to a few single digits, `37+4+9+1=?`. A worked solution adds
one term a line; a line either repeats the running total (`41+9=50`, 8 tokens with its newline)
or leaves it implicit (`+9=50`, 6 tokens):

    37+4=41          37+4=41
    41+9=50          +9=50
    50+1=51          +1=51
    Answer: 51       Answer: 51

The warm start imitates a demonstrator with three habits RL has to deal with:
- it forgets a carry one time in SLIP_RATE⁻¹ (`37+4=31`) and carries the wrong total on to the
  answer, so a problem's difficulty grows with its number of carries: problems without a carry
  are solved by nearly every sample and problems with many mostly by none (dynamic sampling
  matters), and RL can learn not to slip;
- it picks each line's form at random: free choices that carry no reward of their own, where
  the policy has entropy to keep or to lose (Clip-Higher's concern);
- one time in RAMBLE_RATE⁻¹ it falls into a loop: from a random line on it writes every line
  twice. The answer stays right, but a looping solution of four or five terms runs into the
  penalty zone or past the budget (the overlong arms act on it).

Lengths, in tokens of the tiny tokenizer (`Answer:` is one token; EOS included): the first line
takes 8, a later line 8 (long) or 6 (short), `Answer: NN` and EOS 5: a k-term solution without a
loop takes 8 + 8·j + 6·(k − 2 − j) + 5 tokens for j long lines, at most 37 for five terms. The
tiny preset's budget, L_max = 44 with L_cache = 6, starts the soft punishment (Eq. 13) at 38
tokens, one above the longest solution written without a loop: the penalty falls on rambling
only, never on a solution written straight, as the paper's L_max − L_cache = 16,384 sits above
the length of its correct answers.

Training and held-out problems are disjoint by construction: a problem belongs to the held-out
split iff a hash of its text falls in one bucket of eight, whatever the seed that drew it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

TASK_VERSION = 4
"""Bump when the task's text, distribution or demonstrations change: it keys the warm-start
cache (with the rates below)."""

MIN_TERMS, MAX_TERMS = 2, 5
TRAIN_SIZE = 4096
"""Problems in `synthetic` (drawn with replacement from the training split)."""
EVAL_SIZE = 256
"""Distinct problems in `synthetic-eval` (the held-out split)."""
EVAL_SEED = 20250317
"""The held-out set is one fixed draw, so every run and seed is scored on the same problems."""
SLIP_RATE = 0.25
"""How often the demonstrator forgets a carry."""
LONG_LINE_RATE = 0.5
"""How often the demonstrator repeats the running total on a line after the first."""
RAMBLE_RATE = 0.3
"""How often the demonstrator falls into a loop (every line from a random one on, twice)."""
_HOLDOUT_BUCKETS = 8

RECIPE = (TASK_VERSION, SLIP_RATE, LONG_LINE_RATE, RAMBLE_RATE)
"""Everything about the task that the warm-started weights depend on (a cache key part)."""

# Token counts of the parts of a solution (see the module docstring).
LONG_LINE, SHORT_LINE, ANSWER_AND_EOS = 8, 6, 5


@dataclass(frozen=True)
class SumTask:
    """One problem: the terms of the sum, the first two-digit and the rest single digits."""

    terms: tuple[int, ...]

    @property
    def answer(self) -> int:
        return sum(self.terms)

    @property
    def text(self) -> str:
        """The prompt, e.g. `37+4+9+1=?` followed by a newline."""
        return "+".join(str(t) for t in self.terms) + "=?\n"

    @property
    def steps(self) -> int:
        """Lines of a solution without a loop: one per term after the first."""
        return len(self.terms) - 1

    @property
    def carries(self) -> int:
        """Additions that carry into the tens: the demonstrator's chances to slip."""
        total, n = self.terms[0], 0
        for t in self.terms[1:]:
            n += total % 10 + t >= 10
            total += t
        return n

    def solution(self, long_lines: bool = True) -> str:
        """A correct worked solution, every line long (or every line after the first short)."""
        return self.write([long_lines] * (self.steps - 1), [False] * self.steps)

    def write(self, long_lines: list[bool], slips: list[bool], loop_from: int | None = None) -> str:
        """The solution with line 2.. long where `long_lines` says so, a forgotten carry at each
        step where `slips` says so (a step without a carry cannot slip), and every line from
        index `loop_from` on written twice (None: no loop)."""
        lines, total = [], self.terms[0]
        for i, t in enumerate(self.terms[1:]):
            new = total + t
            if slips[i] and total % 10 + t >= 10:
                new -= 10
            line = f"{total}+{t}={new}" if i == 0 or long_lines[i - 1] else f"+{t}={new}"
            lines += [line, line] if loop_from is not None and i >= loop_from else [line]
            total = new
        return "\n".join(lines) + f"\nAnswer: {total}"

    def length(self, long_lines: list[bool], loop_from: int | None = None) -> int:
        """Tokens of `write(long_lines, ..., loop_from)` in the tiny tokenizer, EOS included."""
        sizes = [LONG_LINE] + [LONG_LINE if long else SHORT_LINE for long in long_lines]
        looped = sum(sizes[loop_from:]) if loop_from is not None else 0
        return sum(sizes) + looped + ANSWER_AND_EOS


def is_held_out(task: SumTask) -> bool:
    digest = hashlib.sha256(task.text.encode()).digest()
    return digest[0] % _HOLDOUT_BUCKETS == 0


def draw_task(rng: random.Random) -> SumTask:
    """Number of terms uniform in [2, 5]; start uniform in [10, 49]; digits uniform in [1, 9].

    Every partial sum stays two-digit (at most 49 + 4·9 = 85), so a line's length in tokens
    depends only on its form.
    """
    k = rng.randint(MIN_TERMS, MAX_TERMS)
    return SumTask((rng.randint(10, 49), *(rng.randint(1, 9) for _ in range(k - 1))))


def split_tasks(
    n: int, rng: random.Random, draw: Callable[[random.Random], SumTask], *, held_out: bool
) -> list[SumTask]:
    """n problems drawn with `draw` from one side of the split that every sums task shares
    (is_held_out): the training side with repeats (small problems are few), the held-out side
    distinct."""
    seen: set[tuple[int, ...]] = set()
    out: list[SumTask] = []
    while len(out) < n:
        task = draw(rng)
        if is_held_out(task) != held_out or (held_out and task.terms in seen):
            continue
        seen.add(task.terms)
        out.append(task)
    return out


def train_tasks(n: int, seed: int) -> list[SumTask]:
    """n problems from the training split (repeats allowed)."""
    return split_tasks(n, random.Random(f"dapo-synthetic-train-{seed}"), draw_task, held_out=False)


def eval_tasks(n: int = EVAL_SIZE) -> list[SumTask]:
    """n distinct held-out problems, the same for every seed."""
    rng = random.Random(f"dapo-synthetic-eval-{EVAL_SEED}")
    return split_tasks(n, rng, draw_task, held_out=True)


def demonstration(task: SumTask, rng: random.Random) -> str:
    """A worked solution as the demonstrator writes it: random line forms, carries sometimes
    forgotten, sometimes a loop (see the module docstring)."""
    long_lines = [rng.random() < LONG_LINE_RATE for _ in range(task.steps - 1)]
    slips = [rng.random() < SLIP_RATE for _ in range(task.steps)]
    loop_from = rng.randrange(task.steps) if rng.random() < RAMBLE_RATE else None
    return task.write(long_lines, slips, loop_from)


def demonstrations(n: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, demonstrated solution) pairs for the supervised warm start."""
    rng = random.Random(f"dapo-synthetic-demo-{seed}")
    return [(t.text, demonstration(t, rng)) for t in train_tasks(n, seed)]
