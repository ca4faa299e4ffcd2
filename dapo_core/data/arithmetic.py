"""The real model's task: easy addition asked in words, `What is 17 + 25?`.

Why this task: SmolLM2-135M-Instruct must start with signal (a step-0 held-out score well
between 0 and 1, so that groups have mixed rewards) on a 2-core CPU, where a response has to be a
few tokens. Asked for a final `Answer: N` line in words, it almost never writes one (5-7 of 64
replies had the format, none right); with its reply begun as `Answer: ` (the `chat-answer`
prompt template) it answers in a few tokens. Measured 2026-11-25 on the 96 held-out problems at
T = 1: avg@4 8.1%, pass@4 24% (tests/real_model/test_train.py keeps it within 5-60%). GSM8K's
easiest items need worked solutions of a hundred tokens and more, about 3 s each at the ~30
tokens/s this CPU samples the model at: too slow for RL steps of 64 responses.

a and b are uniform in [2, 30]: 841 distinct problems. Training and held-out problems are
disjoint by construction, as in dapo_core.data.synthetic: a problem is held out iff a hash of its
text falls in one bucket of eight (about 105 problems).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

LOW, HIGH = 2, 30
TRAIN_SIZE = 2048
"""Problems in `arithmetic` (drawn with replacement from the training split)."""
EVAL_SIZE = 96
"""Distinct problems in `arithmetic-eval` (the held-out split holds about 105)."""
EVAL_SEED = 20261125
_HOLDOUT_BUCKETS = 8


@dataclass(frozen=True)
class AddTask:
    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def text(self) -> str:
        return f"What is {self.a} + {self.b}?"


def is_held_out(task: AddTask) -> bool:
    digest = hashlib.sha256(task.text.encode()).digest()
    return digest[0] % _HOLDOUT_BUCKETS == 0


def all_tasks() -> list[AddTask]:
    return [AddTask(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)]


def train_tasks(n: int, seed: int) -> list[AddTask]:
    """n problems from the training split, drawn with replacement (the split has ~736)."""
    pool = [t for t in all_tasks() if not is_held_out(t)]
    rng = random.Random(f"dapo-arithmetic-train-{seed}")
    return [rng.choice(pool) for _ in range(n)]


def eval_tasks(n: int = EVAL_SIZE) -> list[AddTask]:
    """n distinct held-out problems in one fixed order, the same for every seed."""
    pool = [t for t in all_tasks() if is_held_out(t)]
    if n > len(pool):
        raise ValueError(f"the arithmetic held-out split has {len(pool)} problems, not {n}")
    random.Random(f"dapo-arithmetic-eval-{EVAL_SEED}").shuffle(pool)
    return pool[:n]
