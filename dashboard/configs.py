"""Config diffs: flatten nested run configs to dotted keys and keep only what differs.

Each arm of the ladder is the previous arm plus one change, so the diff of a run against the
previous arm's run should show exactly that change (plus the seed-independent bookkeeping).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

# one flattening for the run page's diff, the mechanism table's `changes` and the trainer's
from dapo_common.util import flatten

ABSENT = "(absent)"


def show_value(value: Any) -> str:
    """One config value as text (JSON for non-strings, so None reads `null`, True `true`)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def config_diff(
    left: Mapping[str, Any], right: Mapping[str, Any], left_name: str, right_name: str
) -> pd.DataFrame:
    """Rows (key, left value, right value) for every dotted key whose values differ."""
    flat_left, flat_right = flatten(left), flatten(right)
    rows = []
    for key in sorted(set(flat_left) | set(flat_right)):
        both = key in flat_left and key in flat_right
        if both and flat_left[key] == flat_right[key]:
            continue
        rows.append(
            {
                "key": key,
                left_name: show_value(flat_left[key]) if key in flat_left else ABSENT,
                right_name: show_value(flat_right[key]) if key in flat_right else ABSENT,
            }
        )
    return pd.DataFrame(rows, columns=["key", left_name, right_name])
