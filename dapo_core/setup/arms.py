"""The ablation ladder of the DAPO paper (Table 1): each arm is the previous arm plus one change.

The arms are data: the built-in ladder file `dapo_core/setup/ladders/paper.toml`, parsed and
validated by `dapo_core.setup.ladders`. This module keeps the names the flows, the dashboard and
the CLI have always used for that one ladder. An arm's config is the preset's base plus the
cumulative changes of every arm up to it. This module imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

from dapo_core.setup.config import ExperimentConfig
from dapo_core.setup.ladders import Arm, paper_ladder

__all__ = [
    "ARMS",
    "ARM_NAMES",
    "PAPER",
    "Arm",
    "arm_changes",
    "build_arm_config",
    "format_ladder",
    "get_arm",
    "ladder_rows",
]

PAPER = paper_ladder()
"""The paper's ladder as a Ladder (rows, format, to_toml, config)."""

ARMS: tuple[Arm, ...] = PAPER.arms
ARM_NAMES: tuple[str, ...] = PAPER.names


def get_arm(name: str) -> Arm:
    return PAPER.arm(name)


def arm_changes(name: str) -> dict[str, Any]:
    """Cumulative dotted changes from the baseline up to and including `name`."""
    return PAPER.changes(name)


def build_arm_config(
    name: str, preset: str = "tiny", overrides: dict[str, Any] | None = None
) -> ExperimentConfig:
    """The experiment config of arm `name` on `preset`, plus the user's dotted overrides.

    User overrides come last, so a researcher can move the whole ladder (e.g. run.steps) while
    each arm still differs from its neighbour by exactly its own change.
    """
    return PAPER.config(name, preset, overrides)


def ladder_rows() -> list[dict[str, Any]]:
    """The ladder as plain rows (arm, adds, parent, paper_score, grid): stored with each sweep."""
    return PAPER.rows()


def format_ladder() -> str:
    """`dapo arms`: the ladder as an aligned text table."""
    return PAPER.format()
