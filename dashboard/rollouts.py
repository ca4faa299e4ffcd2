"""Rollout shaping: filters, the reward split into correctness and overlong penalty, titles.

The shaped reward of DAPO is R = score + overlong penalty (Eq. 13 of the paper adds the soft
punishment R_length to the rule-based ±1 score), so the two parts are shown side by side.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

# Keyword arguments of db.reads.samples for each filter of the page.
FILTERS: dict[str, dict[str, Any]] = {
    "All": {},
    "Correct": {"correct": True},
    "Wrong": {"correct": False},
    "Truncated": {"truncated": True},
}

REWARD_COLUMNS = ["idx", "correct", "reward", "score", "overlong_penalty", "length", "truncated"]


def reward_table(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per sample: the reward and its two parts (score + overlong penalty)."""
    frame = samples[REWARD_COLUMNS].copy()
    frame["correct"] = frame["correct"].astype(bool)
    frame["truncated"] = frame["truncated"].astype(bool)
    return frame.rename(columns={"overlong_penalty": "overlong penalty"})


def reward_text(sample: pd.Series) -> str:
    """'reward -1.25 = score -1 + overlong penalty -0.25'."""
    return (
        f"reward {float(sample['reward']):+.3g} = score {float(sample['score']):+.3g} "
        f"+ overlong penalty {float(sample['overlong_penalty']):+.3g}"
    )


def sample_title(sample: pd.Series) -> str:
    """Expander title: index, verdict, reward, length (and truncation)."""
    verdict = "✔ correct" if bool(sample["correct"]) else "✖ wrong"
    cut = " · truncated" if bool(sample["truncated"]) else ""
    return (
        f"#{int(sample['idx'])} · {verdict} · reward {float(sample['reward']):+.3g} · "
        f"{int(sample['length'])} tokens{cut}"
    )


def step_summary(samples: pd.DataFrame) -> str:
    """One line over all samples of a step: counts, accuracy, truncation, mean reward parts."""
    n = len(samples)
    if n == 0:
        return "No samples at this step."
    correct = int(samples["correct"].astype(bool).sum())
    truncated = int(samples["truncated"].astype(bool).sum())
    return (
        f"{n} samples · {correct} correct ({100.0 * correct / n:.0f}%) · {truncated} truncated · "
        f"mean reward {samples['reward'].mean():+.3f} = score {samples['score'].mean():+.3f} "
        f"+ penalty {samples['overlong_penalty'].mean():+.3f}"
    )
