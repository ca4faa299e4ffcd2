"""The grid table: one row per point of a grid sweep (the arms a `--grid` expands), its score
over seeds from the ablation table and, when asked, one metric's last-window mean from the
mechanism table; the dashboard's grid page plots them against the swept values.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import sqlalchemy as sa

from dapo_common.util import flatten
from db import stats
from db.ablation import ablation_table
from db.mechanism_table import mechanism_table
from db.reads import run_details, sweep_details

GRID_COLUMNS = [
    "arm",
    "parent",
    "base",  # the arm the grid's points branch from
    "point",  # {dotted key: value} of the swept keys
    "n_seeds",
    "score",  # stats.Estimate of the final avg@k (the ablation table's)
    "metric",  # stats.Estimate of the chosen metric's last-window mean, or EMPTY
    "metric_name",
    "eval_dataset",
    "eval_k",
]


def grid_keys(engine: sa.Engine, sweep_id: int) -> list[str]:
    """The dotted config keys the sweep's ladder sweeps (rungs with a `grid`), sorted (a JSONB
    column does not keep the order the keys were given in); [] for a sweep that is not a grid."""
    ladder = sweep_details(engine, sweep_id)["ladder"] or []
    return sorted({str(key) for rung in ladder for key in rung.get("grid") or {}})


def grid_table(
    engine: sa.Engine,
    sweep_id: int,
    *,
    metric: str | None = None,
    window: int = 10,
    dataset: str | None = None,
    k: int | None = None,
) -> pd.DataFrame:
    """One row per grid arm of the sweep (rungs with a `grid`), in ladder order (GRID_COLUMNS):
    its point (swept key -> value), whether it is the base the other points branch from, its
    final score with the 95% interval over seeds (ablation_table's `score`, on (dataset, k) as
    there), and, when `metric` is given, that metric's last-window mean over seeds
    (mechanism_table's `last`). A key a rung does not carry is read from its runs' config.
    Empty for a sweep without a grid."""
    keys = grid_keys(engine, sweep_id)
    if not keys:
        return pd.DataFrame(columns=GRID_COLUMNS)
    sweep = sweep_details(engine, sweep_id)
    rungs = {str(r["arm"]): r for r in sweep["ladder"] or [] if "arm" in r and r.get("grid")}
    table = ablation_table(engine, sweep_id, dataset=dataset, k=k)
    table = table[table["arm"].isin(list(rungs))]
    bases = {str(p) for p in table["parent"] if not pd.isna(p) and p in rungs}
    metric_of: dict[str, stats.Estimate] = {}
    if metric is not None:
        mech = mechanism_table(engine, sweep_id, [metric], window)
        metric_of = dict(zip(mech["arm"], mech["last"], strict=True))
    rows: list[dict[str, Any]] = []
    for row in table.to_dict("records"):
        arm = str(row["arm"])
        point = {key: rungs[arm]["grid"].get(key) for key in keys}
        if any(v is None for v in point.values()) and row["run_ids"]:
            flat = flatten(run_details(engine, int(row["run_ids"][0]))["config"] or {})
            point = {key: flat.get(key) if v is None else v for key, v in point.items()}
        parent = None if pd.isna(row["parent"]) else str(row["parent"])
        rows.append(
            {
                "arm": arm,
                "parent": parent,
                # the grid's base; a grid without parents (rungs written before they carried
                # one) has its first arm as the base
                "base": arm in bases or (not bases and not rows),
                "point": point,
                "n_seeds": row["n_seeds"],
                "score": row["score"],
                "metric": metric_of.get(arm, stats.EMPTY),
                "metric_name": metric,
                "eval_dataset": row["eval_dataset"],
                "eval_k": row["eval_k"],
            }
        )
    return pd.DataFrame(rows, columns=GRID_COLUMNS)
