"""Data shaping for the Mechanisms page: db.mechanism_table.mechanism_table in, display frames out.

The cells are db.mechanisms' text (the same strings `render` prints for scripts and the README);
the dashboard adds the highlight: each arm's focus metrics (what its change is about, from its
config diff to its parent) get a coloured cell, and a Δ the exact paired test calls real is bold.
"""

from __future__ import annotations

import math

import pandas as pd
from pandas.io.formats.style import Styler

from db import mechanisms, stats

FOCUS_CSS = "background-color: #fff4ce"  # a metric the arm's change is about
SIGNIFICANT_CSS = "font-weight: 700"  # a Δ to the parent the exact paired test calls real
# What a cell of the wide table shows: display label -> mechanism_table column.
CELLS = {  # the first window first, as in every table of it
    "first window": "first",
    "last window": "last",
    "Δ parent (first window)": "delta_parent_first",
    "Δ parent (last window)": "delta_parent",
}
SUMMARY_COLUMNS = ["arm", "mean", "low", "high", "first", "n", "focus", "text"]


def arms(table: pd.DataFrame) -> list[str]:
    """The arms in the table's (ladder) order."""
    return list(dict.fromkeys(str(a) for a in table["arm"]))


def metrics(table: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(str(m) for m in table["metric"]))


def signature(table: pd.DataFrame) -> pd.DataFrame:
    """Each arm's own metrics only (db.mechanisms.mechanism_records with focus_only)."""
    records = mechanisms.mechanism_records(table, focus_only=True)
    return pd.DataFrame(records)


def signature_css(table: pd.DataFrame, shown: pd.DataFrame) -> pd.DataFrame:
    """Bold Δ cells of `signature(table)` the exact paired test calls real."""
    css = pd.DataFrame("", index=shown.index, columns=shown.columns)
    focus = table[table["focus"]].reset_index(drop=True)
    labels = mechanisms.delta_labels(mechanisms.window_of(table))
    # signature rows follow the focus rows in order; rows naming no metric carry no estimate
    significant = {
        (str(r["arm"]), mechanisms.metric_label(str(r["metric"])), labels[delta])
        for r in focus.to_dict("records")
        for delta in mechanisms.DELTAS
        if r[delta].significant
    }
    for i, record in shown.iterrows():
        label = str(record["metric"]).removeprefix(f"{mechanisms.FOCUS_MARK} ")
        for column in labels.values():
            if (str(record["arm"]), label, column) in significant:
                css.loc[i, column] = SIGNIFICANT_CSS
    return css


def wide(table: pd.DataFrame, cell: str) -> pd.DataFrame:
    """One row per arm, one column per metric (labelled with its unit); each cell the chosen
    statistic (`cell`: a CELLS value) as text with its interval."""
    rows = []
    for arm in arms(table):
        mine = table[table["arm"] == arm]
        first = mine.iloc[0]
        row = {"arm": arm, "changes": ", ".join(first["changes"] or ()) or mechanisms.MISSING}
        for record in mine.to_dict("records"):
            metric = str(record["metric"])
            row[mechanisms.metric_label(metric)] = mechanisms.value_text(
                record[cell], metric, signed=cell in mechanisms.DELTAS
            )
        rows.append(row)
    columns = ["arm", "changes", *(mechanisms.metric_label(m) for m in metrics(table))]
    return pd.DataFrame(rows, columns=columns)


def wide_css(table: pd.DataFrame, cell: str) -> pd.DataFrame:
    """Styler CSS for `wide(table, cell)`: focus cells coloured, significant Δs bold."""
    shown = wide(table, cell)
    css = pd.DataFrame("", index=shown.index, columns=shown.columns)
    row_of = {arm: i for i, arm in enumerate(shown["arm"])}
    for record in table.to_dict("records"):
        i, column = row_of[str(record["arm"])], mechanisms.metric_label(str(record["metric"]))
        parts = []
        if record["focus"]:
            parts.append(FOCUS_CSS)
        if cell in mechanisms.DELTAS and record[cell].significant:
            parts.append(SIGNIFICANT_CSS)
        css.loc[i, column] = "; ".join(parts)
    return css


def style_wide(table: pd.DataFrame, cell: str) -> Styler:
    shown, css = wide(table, cell), wide_css(table, cell)
    return shown.style.hide(axis="index").apply(lambda _: css, axis=None)


def metric_summary(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per arm, one metric in its display unit: last-window mean over seeds, its 95% interval
    (NaN for one seed: no whisker), the first-window mean, n, whether it is the arm's focus."""
    mine = table[table["metric"] == metric]
    k = mechanisms.scale(metric)
    rows = []
    for record in mine.to_dict("records"):
        last: stats.Estimate = record["last"]
        rows.append(
            {
                "arm": str(record["arm"]),
                "mean": k * last.mean,
                "low": k * last.low,
                "high": k * last.high,
                "first": k * record["first"].mean,
                "n": last.n,
                "focus": "its change is about it" if record["focus"] else "other",
                "text": mechanisms.value_text(last, metric),
            }
        )
    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return frame[[not math.isnan(m) for m in frame["mean"]]].reset_index(drop=True)


def metric_points(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Long frame (arm, seed, value) of the per-seed last-window means, in the display unit."""
    k = mechanisms.scale(metric)
    rows = [
        {"arm": str(r["arm"]), "seed": int(seed), "value": k * float(value)}
        for r in table[table["metric"] == metric].to_dict("records")
        for seed, value in zip(r["seeds"], r["last_values"], strict=True)
    ]
    return pd.DataFrame(rows, columns=["arm", "seed", "value"])
