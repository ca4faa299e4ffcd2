"""Data shaping for the ablation table: plain pandas in, display frames and a Styler out.

The cells come from db.table_format.ablation_records, the one function behind `dapo table`, the
Prefect artifact and this dashboard: the dashboard only adds colour (a Δ the exact paired
sign-flip test calls real is green or red) and status glyphs. Scores are percent, Δs percentage points (pp).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from pandas.io.formats.style import Styler

from db import stats, table_format

# Colours of a Δ cell the exact paired test calls real: green when the arm helped, red when it
# hurt (pandas Styler CSS). Any other Δ (p >= 0.05, fewer than 6 seeds, n=1) stays plain.
UP_CSS = "color: #137333; background-color: #e6f4ea; font-weight: 600"
DOWN_CSS = "color: #a50e0e; background-color: #fce8e6; font-weight: 600"

# Glyphs that plain system fonts carry (DejaVu), so badges render even without emoji fonts.
STATUS_BADGES = {
    "completed": "✔ completed",
    "running": "● running",
    "pending": "○ pending",
    "failed": "✖ failed",
    "interrupted": "◌ interrupted",
}

# Displayed column -> the ablation_table column holding its stats.Estimate (for the colour).
ESTIMATE_COLUMNS = {"gain": "gain", "Δ parent": "delta_parent", "Δ base": "delta_base"}
# Columns read left-aligned (text); every other column is a number, right-aligned.
TEXT_COLUMNS = ("arm", "adds", "parent", "status")


def to_pct(fraction: Any) -> float:
    """A score fraction (0.43) as percent (43.0); missing values stay NaN."""
    if fraction is None:
        return math.nan
    value = float(fraction)
    return value * 100.0


def format_time(value: Any) -> str:
    """A timestamp to the second ('2026-11-22 21:07:34'), or '—'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    stamp = pd.Timestamp(value)
    return "—" if pd.isna(stamp) else stamp.strftime("%Y-%m-%d %H:%M:%S")


def status_badge(status: Any) -> str:
    """A run or arm status with a glyph, so a failed arm stands out in a long table."""
    text = "pending" if status is None or status != status else str(status)
    return STATUS_BADGES.get(text, text)


def _per_seed(row: pd.Series) -> dict[int, float]:
    seeds = row.get("seeds") or []
    scores = row.get("scores") or []
    return {int(s): to_pct(v) for s, v in zip(seeds, scores, strict=False)}


def ablation_display(table: pd.DataFrame) -> pd.DataFrame:
    """The ablation table as a researcher reads it: table_format.ablation_records' cells (the
    same columns as `dapo table` and the Prefect artifact), statuses with a glyph."""
    frame = pd.DataFrame(table_format.ablation_records(table, iqm=table_format.wants_iqm(table)))
    if "status" in frame:
        frame["status"] = frame["status"].map(status_badge)
    return frame


def number_columns(display: pd.DataFrame) -> list[str]:
    """The displayed columns that hold numbers (right-aligned on screen)."""
    return [c for c in display.columns if c not in TEXT_COLUMNS]


def estimate_css(estimate: Any) -> str:
    """Styler CSS for one difference: green when its interval is above 0, red when below,
    nothing when it holds 0 or there is no interval."""
    if not isinstance(estimate, stats.Estimate) or not estimate.significant:
        return ""
    return UP_CSS if estimate.low > 0 else DOWN_CSS


def style_ablation(table: pd.DataFrame) -> Styler:
    """ablation_display with its difference cells coloured from their intervals."""
    display = ablation_display(table)
    css = pd.DataFrame("", index=display.index, columns=display.columns)
    for column, source in ESTIMATE_COLUMNS.items():
        if column in display.columns:
            css[column] = [estimate_css(e) for e in table[source]]
    return display.style.hide(axis="index").apply(lambda _: css, axis=None)


def score_points(table: pd.DataFrame) -> pd.DataFrame:
    """Long frame (arm, seed, score %) of the per-seed scores, for the ablation chart."""
    rows = [
        {"arm": row["arm"], "seed": seed, "score (%)": score}
        for _, row in table.iterrows()
        for seed, score in _per_seed(row).items()
    ]
    return pd.DataFrame(rows, columns=["arm", "seed", "score (%)"])


def score_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per arm in percent: mean final score, its 95% interval over seeds (low, high: NaN for
    n=1, so no bar is drawn), the starting model's score, n and the interval as text."""
    estimates: list[stats.Estimate] = list(table["score"])
    return pd.DataFrame(
        {
            "arm": table["arm"],
            "mean (%)": [to_pct(e.mean) for e in estimates],
            "low": [to_pct(e.low) for e in estimates],
            "high": [to_pct(e.high) for e in estimates],
            "start (%)": [to_pct(v) for v in table["start_mean"]],
            "n": [e.n for e in estimates],
            "final": [table_format.estimate_text(e) for e in estimates],
        }
    )


def ladder_order(table: pd.DataFrame) -> list[str]:
    """Arm names in ladder order (the colour order of every chart)."""
    return [str(a) for a in table["arm"]]
