"""The one table from a sweep's named parameters to the config keys they set.

A few config values are asked for by name on every front door: the Prefect form's fields
(flows/params.py `SweepParams`, `EvalParams`), the flags of `dapo sweep`, `dapo train`,
`dapo eval` and `dapo plan`, and the overrides a sweep hands each arm. Each is one row here
(field name, config key, type, help), so that the form, the flags and the overrides cannot
drift apart: the flag is the field's name (`train_data` is `--train-data`), and both set the
row's key (`data.train`). Spellings the flags had before they were named after the fields are
kept as aliases, so that existing command lines still work.

Plain data and one function, no argparse and no pydantic: dapo_core/cli.py builds the flags
from it, flows/params.py the form's fields and the sweep's overrides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SweepField:
    """One named parameter that sets one config key."""

    name: str
    """The field of SweepParams (and of EvalParams where it has it); the flag is spelled
    after it (`eval_k` → `--eval-k`) and stores into it."""
    key: str
    """The dotted config key it sets."""
    type: type[int] | type[str]
    """int, or str: a model or data set name, or a path."""
    help: str
    """What it is, in a few words; `describe` adds where the default comes from."""
    metavar: str
    """The placeholder of the value in --help."""
    minimum: int | None = None
    """An int's least accepted value: 1 for a count, 0 where 0 means "all"."""
    aliases: tuple[str, ...] = ()
    """Older flag spellings, still accepted (not shown in --help)."""

    @property
    def flag(self) -> str:
        """The command-line flag: the field's name, dashed."""
        return "--" + self.name.replace("_", "-")

    def describe(self, default_from: str) -> str:
        """The help of the flag and the form's description, e.g. `rollout steps per run
        (default: the preset's run.steps)` for default_from "the preset"."""
        return f"{self.help} (default: {default_from}'s {self.key})"


SWEEP_FIELDS: tuple[SweepField, ...] = (
    SweepField("steps", "run.steps", int, "rollout steps per run", "N", minimum=1),
    SweepField(
        "model",
        "model.name_or_path",
        str,
        "`tiny`, a local model directory or a hub name",
        "NAME_OR_PATH",
    ),
    SweepField(
        "train_data",
        "data.train",
        str,
        "training data: a data set name or a .jsonl/.parquet path",
        "NAME_OR_PATH",
        aliases=("--data",),
    ),
    SweepField(
        "eval_data",
        "data.eval",
        str,
        "evaluation set: a data set name or a .jsonl/.parquet path",
        "NAME_OR_PATH",
        aliases=("--eval",),
    ),
    SweepField(
        "eval_k",
        "data.eval_k",
        int,
        "samples per eval problem: the k of avg@k and pass@k",
        "K",
        minimum=1,
        aliases=("--k",),
    ),
    SweepField(
        "eval_problems",
        "data.eval_problems",
        int,
        "evaluate on the first N problems, 0 for all",
        "N",
        minimum=0,
        aliases=("--problems",),
    ),
)
"""In the order the overrides are applied and the flags listed."""

SWEEP_FIELD: dict[str, SweepField] = {f.name: f for f in SWEEP_FIELDS}
"""The rows by field name."""

FIELD_OF_KEY: dict[str, str] = {f.key: f.name for f in SWEEP_FIELDS}
"""The other way: the field that sets a config key, to name it in an error."""


def field_overrides(source: object, names: Iterable[str] | None = None) -> dict[str, Any]:
    """`{config key: value}` for each row (those of `names`, else all) that `source` gives a
    value: an attribute named like the field, on a SweepParams, an EvalParams or argparse's
    Namespace. Missing, None and blank text are not given: a form's emptied text box and
    `--eval-data ""` both mean the default."""
    rows = SWEEP_FIELDS if names is None else [SWEEP_FIELD[n] for n in names]
    out: dict[str, Any] = {}
    for row in rows:
        value = getattr(source, row.name, None)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        out[row.key] = value
    return out
