"""Ablation ladders as data: TOML files of arms, each a parent arm plus dotted changes.

A ladder file (the built-in ones live in `dapo_core/setup/ladders/*.toml`):

    name = "beyond the paper"            # free text: names the ladder in the table
    description = "..."                   # optional, free text

    [[arms]]
    name = "base"                         # the arm's key: see NAME_RULE below
    from = "dapo"                         # a paper arm, or an earlier arm of this file;
                                          #   default: the previous arm (none for the first)
    adds = "the paper's DAPO"             # what it adds to its parent, in words (optional)

    [[arms]]
    name = "eps32"
    adds = "epsilon_high 0.32"
    set = { "algo.clip_high" = 0.32 }     # dotted config keys, typed like the config's fields
    paper_score = 51.0                    # optional: a published number for the table

An arm's config is the preset's base, then the cumulative changes of its ancestors, then its
own `set`, then the user's overrides (so `--set run.steps=4` moves the whole ladder while each
arm still differs from its parent by exactly its own change). TOML has no null: write
`"algo.clip_c" = "none"` to unset an optional field.

Parent, for the table's Δ: an arm's parent is the earlier arm of the same ladder it builds on.
An arm whose `from` is a paper arm is a root (parent None) that starts from that arm's config;
that is how a ladder begins with the paper's DAPO, and the only case where an arm may equal the
arm it comes from. Every other arm must change its parent's config on the validating preset.

`expand_grid` turns a base arm and `--grid key=v1,v2` lists into a ladder (the cartesian
product, one arm per point, named by its values, parent = the base); `resolve_ladder` finds a
ladder by built-in name or file path. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import re
import textwrap
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dapo_common.util import flatten
from dapo_core.setup.config import ConfigError, ExperimentConfig
from dapo_core.setup.overrides import field_types, type_value
from dapo_core.setup.presets import preset_config

BUILTIN_LADDERS: tuple[str, ...] = (
    "paper",
    "beyond-dapo",
    "dr-grpo",
    "clip-dose",
    "clip-entropy",
    "estimators",
    "trust-region",
    "entropy-tokens",
    "staleness",
)
"""Ladders shipped in dapo_core/setup/ladders/<name>.toml; `paper` is the DAPO paper's Table 1."""

# Arm names key runs in the store (runs.arm is String(100)), name Prefect flow runs
# (`{arm}-s{seed}-sweep{id}`) and run directories, and pass through URLs and shell commands, so
# they are kept to characters that need no quoting anywhere. `=` and `.` are allowed so that a
# grid arm can be named by its values (`dapo-clip_high=0.24`). Prefect artifact keys are
# stricter (lowercase letters, digits, dashes): use `artifact_slug(name)` for those.
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.=-]*")
NAME_MAX_LEN = 100
NAME_RULE = "lowercase letters, digits and _ . = - (starting with a letter or digit), at most 100"

_TOP_KEYS = ("name", "description", "arms")
_ARM_KEYS = ("name", "from", "adds", "set", "paper_score", "grid")


@dataclass(frozen=True)
class Arm:
    """One arm of a ladder: its parent's config plus `changes`. Treat the dicts as read-only."""

    name: str
    """Short id used everywhere (CLI, store, dashboard); see NAME_RULE."""
    adds: str
    """What this arm adds to its parent, in words."""
    paper_score: float | None = None
    """A published score for the table (the DAPO paper: AIME 2024 avg@32 on Qwen2.5-32B)."""
    changes: dict[str, Any] = field(default_factory=dict, hash=False)
    """Dotted config fields this arm sets relative to its parent (for a root: to `start`)."""
    parent: str | None = None
    """The earlier arm of the same ladder this arm builds on; None for a root."""
    start: str | None = None
    """Roots only: the paper arm this arm starts from (its `from`); None: the preset's base."""
    cumulative: dict[str, Any] = field(default_factory=dict, hash=False)
    """Every dotted change from the preset's base up to and including this arm."""
    grid: dict[str, Any] = field(default_factory=dict, hash=False)
    """Grid ladders: the swept key(s) and this arm's value(s), for plots against the value."""


@dataclass(frozen=True)
class Ladder:
    """An ordered list of arms, each its parent plus one change; validated when built."""

    name: str
    arms: tuple[Arm, ...]
    description: str = ""
    source: str = field(default="<ladder>", compare=False)
    """Where it came from (a file path, `built-in ladder 'paper'`): prefixes every error."""

    # --- lookups ---------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arms)

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ConfigError(f"unknown arm {name!r}: choose one of {', '.join(self.names)}")

    def changes(self, name: str) -> dict[str, Any]:
        """Cumulative dotted changes from the preset's base up to and including arm `name`."""
        return dict(self.arm(name).cumulative)

    def config(
        self, arm: str, preset: str = "tiny", overrides: Mapping[str, Any] | None = None
    ) -> ExperimentConfig:
        """The experiment config of `arm` on `preset`, plus the user's dotted overrides (last)."""
        changes = self.changes(arm)
        changes["arm"] = arm
        changes.update(overrides or {})
        return preset_config(preset, arm=arm).with_overrides(changes)

    def check(self, preset: str = "tiny") -> None:
        """Every arm builds a valid config on `preset`, its grid values are its config's, and
        every arm with a parent differs from it. Raises ConfigError naming source and arm."""
        _check_arms(self.arms, self.source, preset)

    # --- output ----------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """The ladder as plain rows for the store, in order: arm, adds, parent (the table's Δ
        is to this arm; None for a root), paper_score, grid ({} unless a grid arm)."""
        return [
            {
                "arm": a.name,
                "adds": a.adds,
                "parent": a.parent,
                "paper_score": a.paper_score,
                "grid": dict(a.grid),
            }
            for a in self.arms
        ]

    def format(self, width: int | None = None) -> str:
        """`dapo arms`: an aligned text table. A `from` column appears only when some arm does
        not build on the row above it; a paper column only when some arm has a score. With
        `width`, lines longer than that wrap their `adds` text onto lines of their own (the
        names and scores stay whole: they are what a reader looks up)."""
        linear = all(
            (a.parent is None and a.start is None and i == 0)
            or (i > 0 and a.parent == self.arms[i - 1].name)
            for i, a in enumerate(self.arms)
        )
        scored = any(a.paper_score is not None for a in self.arms)
        header = ["arm"] + ([] if linear else ["from"]) + ["adds"] + (["paper AIME24"] * scored)
        rows = [header]
        for a in self.arms:
            row = [a.name]
            if not linear:
                row.append(a.parent or (f"{a.start} (paper)" if a.start else "-"))
            row.append(a.adds)
            if scored:
                row.append("" if a.paper_score is None else f"{a.paper_score:.0f}")
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        adds = header.index("adds")
        if width is not None and sum(widths) + 2 * (len(widths) - 1) > width:
            others = sum(widths) - widths[adds] + 2 * (len(widths) - 1)
            widths[adds] = max(len("adds"), 24, width - others)
            rows = [
                [cell if i != adds else text for i, cell in enumerate(first)]
                if k == 0
                else ["" if i != adds else text for i in range(len(first))]
                for first in rows
                for k, text in enumerate(textwrap.wrap(first[adds], widths[adds]) or [""])
            ]
        # Text columns align left, the score right (as numbers do).
        lines = [
            "  ".join(
                f"{cell:>{w}}" if scored and i == len(row) - 1 else f"{cell:<{w}}"
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in rows
        ]
        lines.insert(1, "-" * max(len(line) for line in lines))
        return "\n".join(lines)

    # --- (de)serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The file's structure as plain data (what `tomllib` returns for `to_toml()`); also the
        form a Prefect parameter can carry ({"name", "arms": [{"name", "from", ...}]})."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        arms: list[dict[str, Any]] = []
        for i, a in enumerate(self.arms):
            entry: dict[str, Any] = {"name": a.name}
            previous = self.arms[i - 1].name if i else None
            if a.start is not None:
                entry["from"] = a.start
            elif a.parent is not None and a.parent != previous:
                entry["from"] = a.parent
            elif a.parent is None and i > 0:
                # A file can start from the preset's base only in its first arm.
                raise ConfigError(
                    f"{self.source}: arm {a.name!r}: a root without a paper arm to start from "
                    "must be the first arm"
                )
            entry["adds"] = a.adds
            if a.paper_score is not None:
                entry["paper_score"] = a.paper_score
            if a.changes:
                entry["set"] = {k: _plain(v) for k, v in a.changes.items()}
            if a.grid:
                entry["grid"] = {k: _plain(v) for k, v in a.grid.items()}
            arms.append(entry)
        out["arms"] = arms
        return out

    def to_toml(self) -> str:
        """A ladder file; `from_toml(to_toml())` gives this ladder back."""
        data = self.to_dict()
        lines = [f"name = {_toml_value(data['name'])}"]
        if "description" in data:
            lines.append(f"description = {_toml_value(data['description'])}")
        for entry in data["arms"]:
            lines += ["", "[[arms]]"]
            for key in ("name", "from", "adds", "paper_score"):
                if key in entry:
                    lines.append(f"{key} = {_toml_value(entry[key])}")
            in_subtable = False
            for key in ("set", "grid"):
                if key not in entry:
                    continue
                inline = f"{key} = {_toml_inline_table(entry[key])}"
                if len(inline) <= 100 and not in_subtable:
                    lines.append(inline)
                else:
                    # Long tables read better one key a line. A sub-table takes every key
                    # below it, so it comes after the arm's own keys, and once one is open
                    # the next table must be a sub-table too.
                    in_subtable = True
                    lines.append(f"[arms.{key}]")
                    lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in entry[key].items()]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, source: str = "<ladder>", preset: str = "tiny"
    ) -> Ladder:
        """Parse and validate a ladder (the structure of a file); `from` may name paper arms."""
        return _parse(data, source=source, preset=preset, builtins=paper_ladder())

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<ladder>", preset: str = "tiny") -> Ladder:
        """Parse and validate a ladder file's text; errors are one line naming `source`."""
        return cls.from_dict(_load_toml(text, source), source=source, preset=preset)


# --- built-in ladders and files ----------------------------------------------------------------
@functools.cache
def builtin_ladder(name: str) -> Ladder:
    """A shipped ladder by name (validated on the tiny preset; cached)."""
    if name not in BUILTIN_LADDERS:
        raise ConfigError(
            f"unknown built-in ladder {name!r}: choose one of {', '.join(BUILTIN_LADDERS)}"
        )
    source = f"built-in ladder {name!r}"
    text = resources.files("dapo_core.setup").joinpath("ladders", f"{name}.toml").read_text("utf-8")
    # The paper ladder is what the others' `from` refers to, so it is parsed without it.
    builtins = None if name == "paper" else paper_ladder()
    return _parse(_load_toml(text, source), source=source, preset="tiny", builtins=builtins)


def paper_ladder() -> Ladder:
    """The DAPO paper's Table 1: grpo → … → dapo, with the paper's scores."""
    return builtin_ladder("paper")


def resolve_ladder(name_or_path: str, preset: str = "tiny") -> Ladder:
    """A built-in ladder by name, else a ladder file by path; validated on `preset`."""
    if name_or_path in BUILTIN_LADDERS:
        ladder = builtin_ladder(name_or_path)
        if preset != "tiny":
            ladder.check(preset)
        return ladder
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        if path.suffix != ".toml" and "/" not in name_or_path:
            raise ConfigError(
                f"unknown ladder {name_or_path!r}: give a built-in ladder "
                f"({', '.join(BUILTIN_LADDERS)}) or a .toml file"
            )
        raise ConfigError(f"ladder file {name_or_path} does not exist")
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name_or_path}: cannot read the ladder file ({exc})") from None
    return Ladder.from_toml(text, source=name_or_path, preset=preset)


# --- grids -------------------------------------------------------------------------------------
def expand_grid(
    base: str | Ladder,
    grids: Sequence[tuple[str, Sequence[Any]]],
    *,
    arm: str | None = None,
    preset: str = "tiny",
    name: str | None = None,
) -> Ladder:
    """A ladder of one base arm and the cartesian product of `grids` on top of it.

    `base` is a paper arm's name, or a Ladder whose arm `arm` (default: its last) is the base.
    `grids` is [(dotted key, values), ...], values typed like the field (`type_value`).

    Every grid arm's parent is the base, so the table shows each point's Δ to the base. The base
    is always the first arm, under its own name, with its own values in `grid` (so a plot of a
    metric against the swept value includes it); a grid point equal to the base's values on
    `preset` is that same config and run, so it is not repeated as a second arm. Grid arms are
    named `<base>-<field>=<value>[-<field>=<value>...]`, in the order given (deterministic).
    """
    ladder = paper_ladder() if isinstance(base, str) else base
    base_name = base if isinstance(base, str) else (arm or ladder.arms[-1].name)
    if isinstance(base, str) and arm is not None and arm != base:
        raise ConfigError(f"grid: give the base arm once ({base!r} or {arm!r})")
    keys, value_lists = _check_grids(grids)
    base_flat = flatten(ladder.config(base_name, preset).to_dict())
    base_values = {k: _normalise(base_flat[k]) for k in keys}
    root = dataclasses.replace(_as_root(ladder, ladder.arm(base_name)), grid=base_values)
    arms = [root]
    seen = {root.name: "the base"}
    for combo in itertools.product(*value_lists):
        point = dict(zip(keys, combo, strict=True))
        if point == base_values:
            continue
        arm_name = grid_arm_name(base_name, point)
        described = ", ".join(f"{_short(k)}={_fmt(v)}" for k, v in point.items())
        if arm_name in seen:
            raise ConfigError(
                f"grid: {described} and {seen[arm_name]} both give the arm name {arm_name!r}: "
                "choose values that differ in their name"
            )
        seen[arm_name] = described
        arms.append(
            Arm(
                name=arm_name,
                adds=described,
                changes=dict(point),
                parent=base_name,
                cumulative={**root.cumulative, **point},
                grid=dict(point),
            )
        )
    source = f"grid from {base_name!r}"
    _check_arms(tuple(arms), source, preset)
    title = name or f"{base_name} grid over {', '.join(keys)}"
    return Ladder(name=title, arms=tuple(arms), source=source)


def _as_root(ladder: Ladder, arm: Arm) -> Arm:
    """`arm` as the first arm of a new ladder: same config, no parent, starting from the paper
    arm its chain starts from (so its `set` stays short and a paper arm stays itself)."""
    paper = paper_ladder()
    if arm.name in paper.names:
        # Only the paper's own arm may carry a paper arm's name (see _parse).
        start: str | None = arm.name
    else:
        top = arm
        while top.parent is not None:
            top = ladder.arm(top.parent)
        start = top.start
    base = paper.arm(start).cumulative if start else {}
    changes = {k: v for k, v in arm.cumulative.items() if k not in base or base[k] != v}
    return Arm(
        name=arm.name,
        adds=arm.adds,
        paper_score=arm.paper_score,
        changes=changes,
        start=start,
        cumulative=dict(arm.cumulative),
    )


def grid_arm_name(base: str, point: Mapping[str, Any]) -> str:
    """`dapo` + {"algo.clip_high": 0.24} → `dapo-clip_high=0.24` (checked against NAME_RULE)."""
    name = "-".join([base] + [f"{_short(k)}={_name_part(v)}" for k, v in point.items()])
    if len(name) > NAME_MAX_LEN or not NAME_RE.fullmatch(name):
        raise ConfigError(
            f"grid: the arm name {name!r} breaks the naming rule ({NAME_RULE} characters): "
            "grid over fewer keys or shorter values"
        )
    return name


def artifact_slug(name: str) -> str:
    """An arm name as a Prefect artifact key (lowercase letters, digits, dashes only). A name
    that changes on the way gets a short hash of itself, so two names never share a slug."""
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "arm"
    if slug == name:
        return slug
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:6]}"


# --- values ------------------------------------------------------------------------------------
def _normalise(value: Any) -> Any:
    """Config values as type_value returns them (tuples stay tuples; lists become tuples)."""
    return tuple(value) if isinstance(value, list) else value


# --- parsing -----------------------------------------------------------------------------------
def _load_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None


def _parse(data: Mapping[str, Any], *, source: str, preset: str, builtins: Ladder | None) -> Ladder:
    """Build the arms of one ladder, checking each as it comes (so the first error wins)."""

    def fail(msg: str) -> ConfigError:
        return ConfigError(f"{source}: {msg}")

    if not isinstance(data, Mapping):
        raise fail("a ladder is a table with `name` and [[arms]]")
    unknown = [k for k in data if k not in _TOP_KEYS]
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (a ladder has: {', '.join(_TOP_KEYS)})")
    title = data.get("name")
    if not isinstance(title, str) or not title.strip() or "\n" in title:
        raise fail('missing `name = "..."`: name the ladder in one line')
    description = data.get("description", "")
    if not isinstance(description, str):
        raise fail("`description` must be a string")
    raw_arms = data.get("arms")
    if not isinstance(raw_arms, list) or not raw_arms:
        raise fail("no [[arms]]: a ladder needs at least one arm")

    paper = {a.name: a for a in builtins.arms} if builtins else {}
    in_file = [r.get("name") for r in raw_arms if isinstance(r, Mapping)]
    arms: dict[str, Arm] = {}
    position: dict[str, int] = {}
    configs: dict[str, dict[str, Any]] = {}
    for i, raw in enumerate(raw_arms, start=1):
        label = (
            f"arm {raw['name']!r}"
            if isinstance(raw, Mapping) and isinstance(raw.get("name"), str)
            else f"arm #{i}"
        )

        def bad(msg: str, label: str = label) -> ConfigError:
            return ConfigError(f"{source}: {label}: {msg}")

        if not isinstance(raw, Mapping):
            raise bad("each arm is a [[arms]] table")
        unknown = [k for k in raw if k not in _ARM_KEYS]
        if unknown:
            raise bad(f"unknown key {unknown[0]!r} (an arm has: {', '.join(_ARM_KEYS)})")
        name = raw.get("name")
        if not isinstance(name, str):
            raise bad('missing `name = "..."`')
        if len(name) > NAME_MAX_LEN or not NAME_RE.fullmatch(name):
            raise bad(
                f"the name must be {NAME_RULE} characters (it keys the store and names runs): "
                f"rename it, e.g. {_suggest(name)!r}"
            )
        if name in arms:
            raise bad(
                f"defined twice (arms #{position[name]} and #{i}): give each arm its own name"
            )

        # Where it builds from: an earlier arm of this file, else a paper arm.
        origin = raw.get("from")
        parent: str | None
        start: str | None = None
        if origin is None:
            parent = next(reversed(arms)) if arms else None
        elif not isinstance(origin, str):
            raise bad("`from` must be an arm's name")
        elif origin in arms:
            parent = origin
        elif origin in paper:
            parent, start = None, origin
        elif origin in in_file:
            raise bad(
                f"from = {origin!r} is not an earlier arm: an arm builds only on arms above it "
                "(so no cycles); move it below its parent"
            )
        else:
            choices = ", ".join([*arms, *paper]) or "none yet"
            raise bad(
                f"from = {origin!r} is unknown: name an earlier arm or a paper arm ({choices})"
            )

        changes = _typed_table(raw.get("set", {}), "set", bad)
        grid = _typed_table(raw.get("grid", {}), "grid", bad)
        if parent is not None:
            base = arms[parent].cumulative
        elif start is not None:
            base = paper[start].cumulative
        else:
            base = {}
        cumulative = {**base, **changes}
        # A paper arm's name means that arm everywhere (store, table, dashboard): another
        # config under it would be compared with the paper's numbers as if it were the same.
        if name in paper and cumulative != paper[name].cumulative:
            raise bad(
                f"{name!r} is the paper's arm of that name: rename yours, or include the paper's "
                f'arm itself with from = "{name}" and no `set`'
            )

        unchanged_paper_arm = start is not None and not changes
        adds = raw.get("adds")
        if adds is None:
            if unchanged_paper_arm and start is not None:
                adds = paper[start].adds
            elif changes:
                adds = ", ".join(f"{k}={_fmt(v)}" for k, v in changes.items())
            else:
                adds = "the preset's base config"
        if not isinstance(adds, str) or not adds.strip() or "\n" in adds:
            raise bad("`adds` must be one line of text saying what the arm changes")
        score = raw.get("paper_score")
        if score is None and unchanged_paper_arm and start:
            score = paper[start].paper_score
        if score is not None and (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
        ):
            raise bad(f"paper_score={score!r}: expected a number")

        arm = Arm(
            name=name,
            adds=adds,
            paper_score=None if score is None else float(score),
            changes=changes,
            parent=parent,
            start=start,
            cumulative=cumulative,
            grid=grid,
        )
        _check_arm(arm, configs, source, preset)
        arms[name] = arm
        position[name] = i
    return Ladder(name=title, arms=tuple(arms.values()), description=description, source=source)


def _typed_table(table: Any, key: str, bad: Any) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise bad(f'`{key}` must be a table of dotted keys, e.g. {{ "algo.clip_high" = 0.28 }}')
    out: dict[str, Any] = {}
    for dotted, value in table.items():
        if dotted in ("arm", "preset"):
            raise bad(
                f"{key} {dotted!r}: not settable here (the arm's name is `name`; the preset is "
                "chosen when the ladder runs)"
            )
        try:
            out[dotted] = type_value(ExperimentConfig, dotted, value)
        except ValueError as exc:
            raise bad(f"{key} {exc}") from None
    return out


def _check_arms(arms: tuple[Arm, ...], source: str, preset: str) -> None:
    configs: dict[str, dict[str, Any]] = {}
    for arm in arms:
        _check_arm(arm, configs, source, preset)


def _check_arm(arm: Arm, configs: dict[str, dict[str, Any]], source: str, preset: str) -> None:
    """Build `arm`'s config on `preset` (the config's own validation runs), check its grid
    values, and refuse a config equal to its parent's (the arm would measure nothing). `configs`
    holds the flat configs of the arms checked so far and gets this one's."""
    try:
        cfg = preset_config(preset, arm=arm.name).with_overrides(
            {**arm.cumulative, "arm": arm.name}
        )
    except ConfigError as exc:
        raise ConfigError(f"{source}: arm {arm.name!r}: {exc}") from None
    flat = flatten(cfg.to_dict())
    flat.pop("arm")
    configs[arm.name] = flat
    for key, value in arm.grid.items():
        if _normalise(flat[key]) != value:
            raise ConfigError(
                f"{source}: arm {arm.name!r}: grid says {key}={_fmt(value)} but its config "
                f"has {_fmt(flat[key])}: fix `grid` or `set`"
            )
    if arm.parent is not None and configs[arm.parent] == flat:
        raise ConfigError(
            f"{source}: arm {arm.name!r}: same config as its parent {arm.parent!r} on preset "
            f"{preset!r}: give it a `set` that changes something, or remove it"
        )


def _check_grids(
    grids: Sequence[tuple[str, Sequence[Any]]],
) -> tuple[list[str], list[list[Any]]]:
    if not grids:
        raise ConfigError("grid: give at least one key=v1,v2,... to sweep")
    keys: list[str] = []
    value_lists: list[list[Any]] = []
    for key, values in grids:
        if key in keys:
            raise ConfigError(f"grid: {key} is given twice: list all its values in one --grid")
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise ConfigError(f"grid: {key} needs a list of values")
        try:
            typed = [type_value(ExperimentConfig, key, v) for v in values]
        except ValueError as exc:
            raise ConfigError(f"grid: {exc}") from None
        for j, v in enumerate(typed):
            if v in typed[:j]:
                raise ConfigError(f"grid: {key} lists {_fmt(v)} twice")
        keys.append(key)
        value_lists.append(typed)
    return keys, value_lists


# --- formatting helpers ------------------------------------------------------------------------
def _short(key: str) -> str:
    """The field name alone when no other section has a field of that name (it reads better in
    an arm name); the dotted key otherwise."""
    name = key.partition(".")[2]
    clashes = [k for k in field_types(ExperimentConfig) if k.partition(".")[2] == name]
    return name if len(clashes) == 1 else key


def _fmt(value: Any) -> str:
    """A value as a person writes it: 0.28, true, none, token-mean, (0.9, 0.95)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, tuple | list):
        return "(" + ", ".join(_fmt(v) for v in value) + ")"
    return str(value) if not isinstance(value, float) else repr(value)


def _name_part(value: Any) -> str:
    """A value inside an arm name: NAME_RULE characters only (1e+20 → 1e20, a/b → a_b)."""
    if isinstance(value, tuple | list):
        return "_".join(_name_part(v) for v in value)
    text = _fmt(value).replace("+", "").lower()
    return re.sub(r"[^a-z0-9_.-]", "_", text)


def _suggest(name: str) -> str:
    slug = re.sub(r"[^a-z0-9_.=-]+", "_", name.lower()).strip("_.=-")
    return slug[:NAME_MAX_LEN] or "arm"


def _plain(value: Any) -> Any:
    """TOML-ready: None → "none" (TOML has no null), tuples → lists."""
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return list(value)
    return value


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # repr round-trips exactly, and its inf / -inf / nan are TOML's spellings too.
        return repr(value)
    if isinstance(value, str):
        # JSON's escapes (\" \\ \n \uXXXX ...) are all valid in a TOML basic string.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write {value!r} to a ladder file")


def _toml_inline_table(table: Mapping[str, Any]) -> str:
    return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()) + " }"
