"""A step of whole groups for the rollout group view's tests: `build_many_groups` writes one run
whose step 1 holds GROUPS groups of G responses each, as the trainer stores them (group,
member, advantage in the sample's extra), in three kinds:

    groups 0-5    mixed: members 0 .. G/2 − 1 right (+1), the rest wrong (−1): advantages
                  ±1 / std, std the unbiased one of G values ±1 (√(G / (G − 1)))
    groups 6-10   all right: no advantage (dynamic sampling left them out)
    groups 11-15  all wrong: likewise

Each response is LINES lines long, so a page that drew them whole would be very tall.
"""

from __future__ import annotations

import math
from typing import Any

import dashboard_fixtures as fx

from db.store import Store

GROUPS = 16
MIXED = range(0, 6)
ALL_RIGHT = range(6, 11)
ALL_WRONG = range(11, 16)
LINES = 40


def advantage(size: int, right: bool) -> float:
    std = math.sqrt(size / (size - 1))  # G values ±1 with mean 0: unbiased std
    return (1.0 if right else -1.0) / std


def group_samples(size: int) -> list[dict[str, Any]]:
    out = []
    for g in range(GROUPS):
        for member in range(size):
            right = g in ALL_RIGHT or (g in MIXED and member < size // 2)
            text = "\n".join(f"line {i} of group {g}'s member {member}" for i in range(LINES))
            out.append(
                {
                    "prompt": f"What is {g}+{g}?",
                    "response": f"{text}\nAnswer: {2 * g if right else -1}",
                    "ground_truth": str(2 * g),
                    "pred": str(2 * g) if right else "-1",
                    "reward": 1.0 if right else -1.0,
                    "score": 1.0 if right else -1.0,
                    "overlong_penalty": 0.0,
                    "correct": right,
                    "length": 10 * LINES,
                    "truncated": False,
                    "group": g,
                    "member": member,
                    "advantage": advantage(size, right) if g in MIXED else None,
                }
            )
    return out


# The per-token record (dapo_core.train.rollout.token_record) of group 0's first two members,
# so that the colouring and its legend show; the other responses are plain text.
TOKENS = {
    "text": ["Answer", ": ", "0", "</s>"],
    "p_old": [0.9, 0.5, 0.1, 0.95],
    "ratio": [1.0, 1.1, 1.4, 1.0],
    "clip": [0, 0, 1, 0],
    "entropy": [0.3, 1.2, 2.0, 0.1],
    "eligible": [0, 1, 1, 0],
}


def build_many_groups(url: str, size: int = 16) -> tuple[int, int]:
    """(sweep id, run id) of a one-run sweep whose step 1 holds GROUPS groups of `size`."""
    store = Store(url)
    config = fx.arm_config("dapo", 0)
    config["rollout"] = {**config["rollout"], "group_size": size}
    sweep_id = store.create_sweep(
        name="many-groups", preset="tiny", arms=["dapo"], seeds=[0], base_config=config, ladder=[]
    )
    run_id = store.resume_attempt(
        sweep_id=sweep_id,
        arm="dapo",
        seed=0,
        config=config,
        config_hash="many",
        after=None,
        resume_step=None,
        checkpoint_dir="/runs/many-groups",
    ).run_id
    samples = group_samples(size)
    for sample in samples[:2]:
        sample["tokens"] = TOKENS
    with store.sink(run_id) as sink:
        sink.log_samples(1, samples)
    store.update_run(run_id, status="completed", steps=1)
    return sweep_id, run_id
