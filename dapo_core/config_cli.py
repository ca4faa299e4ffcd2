"""`dapo config --arm NAME`: an arm's resolved config, and what it changes from its parent.

A ladder file says what each arm sets; this shows what that comes to on a preset (every field,
as the run would get it and as its config hash names it) and the keys in which the arm differs
from the arm it builds on: its parent in the ladder, for a root the paper arm it starts from
(`from`), else the preset's base. Registered by dapo_lab.cli's registrars; torch-free.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from dapo_common.text import terminal_width, wrapped
from dapo_common.util import flatten
from dapo_core.setup.config import ExperimentConfig
from dapo_core.setup.ladders import BUILTIN_LADDERS, Ladder, paper_ladder, resolve_ladder
from dapo_core.setup.presets import PRESETS, preset_config

# Bookkeeping, not a change to the algorithm: every arm carries its own name.
_NOT_A_CHANGE = frozenset({"arm"})


@dataclass(frozen=True)
class ArmConfig:
    """An arm's config on a preset, the config it builds on and the keys that differ."""

    arm: str
    parent: str  # what it builds on, in words: 'dapo', 'dapo (paper)', 'the preset's base'
    config: ExperimentConfig
    diff: dict[str, tuple[Any, Any]]  # dotted key -> (the parent's value, this arm's)


def register(subparsers: Any) -> None:
    """Add `config` to the `dapo` dispatcher."""
    p = subparsers.add_parser(
        "config",
        help="print an arm's resolved config and the keys it changes from its parent",
        description="Print the config an arm of a ladder trains with on a preset (every field, "
        "dotted, with its config hash) after the keys in which it differs from the arm it "
        "builds on: its parent, for a root the paper arm it starts from, else the preset's "
        "base. An unknown arm, ladder or preset is one line and exit 2.",
    )
    p.add_argument("--arm", required=True, help="the arm (see `dapo arms --ladder L`)")
    p.add_argument(
        "--ladder",
        metavar="NAME_OR_FILE",
        default="paper",
        help=f"a built-in ladder ({', '.join(BUILTIN_LADDERS)}; default paper) or a .toml file",
    )
    p.add_argument(
        "--preset", default="tiny", help=f"base config: {', '.join(PRESETS)} (default tiny)"
    )
    p.add_argument(
        "--diff-only", action="store_true", help="only the keys that differ from the parent"
    )
    p.set_defaults(func=cmd_config)


def arm_config(ladder: Ladder, arm: str, preset: str) -> ArmConfig:
    """The arm's config on `preset` and its difference from what it builds on."""
    mine = ladder.config(arm, preset)
    spec = ladder.arm(arm)
    if spec.parent is not None:
        parent, theirs = spec.parent, ladder.config(spec.parent, preset)
    elif spec.start is not None:
        parent, theirs = f"{spec.start} (paper)", paper_ladder().config(spec.start, preset)
    else:
        parent, theirs = "the preset's base", preset_config(preset, arm=arm)
    a, b = flatten(theirs.to_dict()), flatten(mine.to_dict())
    diff = {
        key: (a.get(key), b.get(key))
        for key in sorted(a.keys() | b.keys())
        if key not in _NOT_A_CHANGE and a.get(key) != b.get(key)
    }
    return ArmConfig(arm=arm, parent=parent, config=mine, diff=diff)


def _value(value: Any) -> str:
    """A value as a ladder file's `set` table writes it (JSON: strings quoted, lists, null)."""
    return json.dumps(value, ensure_ascii=False)


def format_arm_config(found: ArmConfig, ladder: Ladder, *, diff_only: bool = False) -> str:
    cfg = found.config
    n = len(found.diff)
    head = (
        f"arm {found.arm} of ladder {ladder.name} on preset {cfg.preset}: builds on "
        f"{found.parent}; adds: {ladder.arm(found.arm).adds}"
    )
    lines = [
        wrapped(head, terminal_width()),
        "",
        f"changed from {found.parent} ({n} key{'s' if n != 1 else ''}):",
    ]
    width = max((len(k) for k in found.diff), default=0)
    for key, (old, new) in found.diff.items():
        lines.append(f"  {key:<{width}}  {_value(old)} -> {_value(new)}")
    if not found.diff:
        lines.append("  (none)")
    if not diff_only:
        lines += ["", f"config (hash {cfg.config_hash()}):"]
        lines += [f"  {k} = {_value(v)}" for k, v in sorted(flatten(cfg.to_dict()).items())]
    return "\n".join(lines)


def cmd_config(args: argparse.Namespace) -> int:
    ladder = resolve_ladder(args.ladder, args.preset)
    ladder.arm(args.arm)  # an unknown arm: one line naming the arms there are
    found = arm_config(ladder, args.arm, args.preset)
    print(format_arm_config(found, ladder, diff_only=args.diff_only))
    return 0
