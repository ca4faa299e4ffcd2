"""The ablation ladder of the DAPO paper (Table 1): each arm is the previous arm plus one change.

Arms are named presets of flags, never copy-pasted configs: an arm's config is the preset's
base plus the cumulative changes of every arm up to it. This module imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dapo_core.config import ConfigError, ExperimentConfig
from dapo_core.presets import preset_config


@dataclass(frozen=True)
class Arm:
    name: str
    """Short id used everywhere (CLI, store, dashboard)."""
    adds: str
    """What this arm adds to the previous one, in words."""
    paper_score: float
    """AIME 2024 avg@32 (%) on Qwen2.5-32B in the paper's Table 1."""
    changes: dict[str, Any] = field(default_factory=dict)
    """Dotted config fields this arm changes relative to the previous arm."""


ARMS: tuple[Arm, ...] = (
    Arm(
        "grpo",
        "naive GRPO: symmetric clip 0.2, sample-level loss, no KL",
        30.0,
        {
            "algo.clip_low": 0.2,
            "algo.clip_high": 0.2,
            "algo.loss_agg": "seq-mean-token-mean",
            "algo.overlong_filter": False,
            "algo.overlong_penalty": False,
            "algo.dynamic_sampling": False,
            "algo.kl_coef": 0.0,
        },
    ),
    Arm(
        "overlong_filter",
        "overlong filtering: truncated samples leave the loss",
        36.0,
        {"algo.overlong_filter": True},
    ),
    Arm("clip_higher", "Clip-Higher: ε_low 0.2, ε_high 0.28", 38.0, {"algo.clip_high": 0.28}),
    Arm("soft_punish", "soft overlong punishment (Eq. 13)", 41.0, {"algo.overlong_penalty": True}),
    Arm(
        "token_loss",
        "token-level policy-gradient loss (Eq. 12)",
        42.0,
        {"algo.loss_agg": "token-mean"},
    ),
    Arm(
        "dapo",
        "dynamic sampling: keep groups with 0 < #correct < G",
        50.0,
        {"algo.dynamic_sampling": True},
    ),
)

ARM_NAMES: tuple[str, ...] = tuple(a.name for a in ARMS)


def get_arm(name: str) -> Arm:
    for arm in ARMS:
        if arm.name == name:
            return arm
    raise ConfigError(f"unknown arm {name!r}: choose one of {', '.join(ARM_NAMES)}")


def arm_changes(name: str) -> dict[str, Any]:
    """Cumulative dotted changes from the baseline up to and including `name`."""
    get_arm(name)
    out: dict[str, Any] = {}
    for arm in ARMS:
        out.update(arm.changes)
        if arm.name == name:
            break
    return out


def build_arm_config(
    name: str, preset: str = "tiny", overrides: dict[str, Any] | None = None
) -> ExperimentConfig:
    """The experiment config of arm `name` on `preset`, plus the user's dotted overrides.

    User overrides come last, so a researcher can move the whole ladder (e.g. run.steps) while
    each arm still differs from its neighbour by exactly its own change.
    """
    changes = arm_changes(name)
    changes["arm"] = name
    changes.update(overrides or {})
    return preset_config(preset, arm=name).with_overrides(changes)


def ladder_rows() -> list[dict[str, Any]]:
    """The ladder as plain rows (arm, adds, paper_score): stored with each sweep."""
    return [{"arm": a.name, "adds": a.adds, "paper_score": a.paper_score} for a in ARMS]


def format_ladder() -> str:
    """`dapo arms`: the ladder as an aligned text table."""
    rows = [("arm", "adds", "paper AIME24")]
    rows += [(a.name, a.adds, f"{a.paper_score:.0f}") for a in ARMS]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]:>12}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
