"""The Runs page's table: every run of every sweep (db.run_index), filtered, sorted and grouped.

Filters are conditions `key op value` (op one of = != >= <= > <), space- or comma-separated:
a key is a dotted config key (`algo.clip_high>=0.24`, `rollout.group_size=8`) or a column of
the table (`final>=40` in percent as shown, `seed=0`, `status=running`, or the metric column's
name). A value is read as JSON where it parses (0.28, true, null), else as text; a missing key
never matches. Grouping puts the runs that share a value of a key (the arm, the sweep, the
preset, any config key) into one line of the curves, their seeds folded into a band.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dapo_common import metric_display
from dashboard.grids import short, value_name
from dashboard.shaping import status_badge

OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
    "=": operator.eq,
}
_CONDITION = re.compile(r"^([^\s=!<>]+)\s*(>=|<=|!=|=|>|<)\s*(\S+)$")
# Table columns a condition may name besides config keys (the shown values: scores in %).
TABLE_KEYS = ("run_id", "sweep_id", "sweep", "preset", "arm", "seed", "attempt", "status")
TABLE_KEYS += ("start", "final", "steps", "tags")
NO_GROUP = "(none: a line per run)"
GROUP_FIELDS = ("arm", "sweep", "preset")


@dataclass(frozen=True)
class Condition:
    key: str
    op: str
    value: Any

    def __str__(self) -> str:
        shown = self.value if isinstance(self.value, str) else json.dumps(self.value)
        return f"{self.key}{self.op}{shown}"

    def holds(self, held: Any) -> bool:
        """Whether a run's value `held` satisfies the condition (a missing one never does):
        numbers compare as numbers, anything else by its text, and only with = or !=; a
        tag list holds a tag; true is not 1."""
        if held is None or (isinstance(held, float) and math.isnan(held)):
            return False
        equality = self.op in ("=", "!=")
        if isinstance(held, tuple):  # tags: whether the list has it
            return equality and ((str(self.value) in held) == (self.op == "="))
        value = self.value
        if isinstance(held, bool) or isinstance(value, bool):
            return equality and OPS[self.op](str(held).lower(), str(value).lower())
        if _is_number(held) and _is_number(value):
            return bool(OPS[self.op](float(held), float(value)))
        return equality and bool(OPS[self.op](str(held), str(value)))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_conditions(text: str) -> list[Condition]:
    """'algo.clip_high >= 0.24, final>40' -> [Condition('algo.clip_high', '>=', 0.24),
    Condition('final', '>', 40)]: conditions apart by commas or spaces (spaces around an
    operator are allowed); ValueError in one line naming a part that is not `key op value`."""
    joined = re.sub(r"\s*(>=|<=|!=|=|>|<)\s*", r"\1", text.strip())
    out = []
    for part in re.split(r"[,\s]+", joined):
        if not part:
            continue
        found = _CONDITION.match(part)
        if found is None:
            raise ValueError(
                f"filter {part!r}: write key=value (or !=, >=, <=, >, <), e.g. algo.clip_high=0.28"
            )
        key, op, raw = found.groups()
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        out.append(Condition(key, op, value))
    return out


def shown_value(row: Mapping[str, Any], key: str, config: Mapping[str, Any]) -> Any:
    """What a condition on `key` compares against: the table's column as shown (scores in
    percent), else the run's config value."""
    if key in ("start", "final"):
        value = row.get(key)
        return None if value is None or value != value else 100.0 * float(value)
    if key in TABLE_KEYS or key in row:
        return row.get(key)
    return config.get(key)


def apply_filters(
    runs: pd.DataFrame,
    configs: Mapping[int, Mapping[str, Any]],
    conditions: Sequence[Condition],
    *,
    search: str = "",
) -> pd.DataFrame:
    """The runs (db.run_index's rows, plus any metric column) that meet every condition and,
    with `search`, whose sweep, arm or tags contain it (case-insensitive)."""
    if runs.empty:
        return runs
    keep = []
    needle = search.strip().lower()
    for row in runs.to_dict("records"):
        config = configs.get(int(row["run_id"]), {})
        ok = all(c.holds(shown_value(row, c.key, config)) for c in conditions)
        if ok and needle:
            hay = " ".join([str(row["sweep"]), str(row["arm"]), *row["tags"]]).lower()
            ok = needle in hay
        keep.append(ok)
    return runs[keep]


def run_label(row: Mapping[str, Any]) -> str:
    """'#12 ladder · dapo s1': a run on a chart or in a list."""
    return f"#{int(row['run_id'])} {row['sweep']} · {row['arm']} s{int(row['seed'])}"


def group_label(key: str, value: Any) -> str:
    """'clip_high=0.28' (a config key by its last part), 'arm=dapo'."""
    return f"{short(key)}={value_name(value)}"


def group_of(
    runs: pd.DataFrame, configs: Mapping[int, Mapping[str, Any]], key: str
) -> dict[int, str]:
    """run id -> the line it is drawn in: its own (NO_GROUP), or its value of `key`."""
    out = {}
    for row in runs.to_dict("records"):
        run_id = int(row["run_id"])
        if key == NO_GROUP:
            out[run_id] = run_label(row)
        elif key == "sweep":
            out[run_id] = f"#{int(row['sweep_id'])} {row['sweep']}"
        elif key in GROUP_FIELDS:  # the arm or the preset: its name says what it is
            out[run_id] = str(row[key])
        else:
            value = configs.get(run_id, {}).get(key, "(absent)")
            out[run_id] = group_label(key, value)
    return out


SORTS = {
    "newest sweep, then arm and seed": ("order", True),
    "newest run first": ("run_id", False),
    "held-out, best first": ("final", False),
    "held-out, worst first": ("final", True),
    "gain over the start, best first": ("gain", False),
}


def _reading_order(runs: pd.DataFrame) -> pd.Series:
    """A sortable key: the newest sweep first; within it its arms in the order they started
    (the ladder's, as a sweep starts them), each arm's seeds ascending, the newest attempt of
    a seed first."""
    first = runs.groupby(["sweep_id", "arm"])["run_id"].transform("min").astype(int)
    return (
        (10**9 - runs["sweep_id"].astype(int)).astype(str).str.zfill(10)
        + "|"
        + first.astype(str).str.zfill(12)
        + "|"
        + runs["seed"].astype(int).astype(str).str.zfill(9)
        + "|"
        + (10**6 - runs["attempt"].astype(int)).astype(str).str.zfill(7)
    )


def sorted_runs(runs: pd.DataFrame, sort: str, metric_column: str | None = None) -> pd.DataFrame:
    """The runs in the order `sort` (a key of SORTS, or 'metric: highest first' / 'metric:
    lowest first' for the metric column) names; missing values last, ties in reading order."""
    if runs.empty:
        return runs
    frame = runs.assign(gain=runs["final"] - runs["start"], order=_reading_order(runs))
    frame = frame.sort_values("order", kind="stable")
    if metric_column is not None and sort.startswith("metric"):
        column, ascending = metric_column, sort.endswith("lowest first")
    else:
        column, ascending = SORTS.get(sort, SORTS["newest sweep, then arm and seed"])
    return (
        frame.sort_values(column, ascending=ascending, na_position="last", kind="stable")
        .drop(columns=["gain", "order"])
        .reset_index(drop=True)
    )


def number_text(values: pd.Series, places: int | None = 1) -> list[str]:
    """Numbers as a table's text: `places` decimals (None: whole), '—' where there is none
    (a number column would show 'None'). Streamlit's table sorts such text as numbers."""
    out = []
    for value in values:
        if value is None or pd.isna(value):
            out.append("—")
        elif places is None:
            out.append(f"{int(value):,}")
        else:
            out.append(f"{float(value):.{places}f}")
    return out


def display_table(
    runs: pd.DataFrame,
    config_columns: Mapping[str, Sequence[Any]] | None = None,
    metric: str | None = None,
    arm_names: Mapping[tuple[int, str], str] | None = None,
) -> pd.DataFrame:
    """The table as shown: a link to each run's page, what it is (a grid's arm by what varies,
    from `arm_names`: (sweep id, arm) -> label), its status with a glyph, its held-out scores
    in percent (the table's unit), its metric column in the metric's shown unit, then the
    config columns asked for; a missing number reads '—'."""
    names = arm_names or {}
    frame = pd.DataFrame(
        {
            "page": "run?run=" + runs["run_id"].astype(int).astype(str),
            "sweep": "#" + runs["sweep_id"].astype(int).astype(str) + " " + runs["sweep"],
            "arm": [
                names.get((int(w), str(a)), str(a))
                for w, a in zip(runs["sweep_id"], runs["arm"], strict=True)
            ],
            "seed": runs["seed"].astype(int),
            "attempt": runs["attempt"].astype(int),
            "status": runs["status"].map(status_badge),
            "tags": runs["tags"].map(", ".join),
            "start": number_text(100.0 * runs["start"].astype(float)),
            "final": number_text(100.0 * runs["final"].astype(float)),
            "final_step": number_text(runs["final_step"], None),
            "steps": number_text(runs["steps"], None),
            "preset": runs["preset"],
        }
    )
    if metric is not None and metric in runs:
        shown = runs[metric].astype(float) * metric_display.scale(metric)
        if metric_display.is_share(metric):
            frame[metric] = number_text(shown, 1)
        else:
            frame[metric] = ["—" if pd.isna(v) else f"{v:.4g}" for v in shown]
    for key, values in (config_columns or {}).items():
        frame[key] = list(values)
    return frame.reset_index(drop=True)
