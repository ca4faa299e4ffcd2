"""Data shaping for the ablation table: plain pandas in, display frames and a Styler out.

The store keeps scores as fractions in [0, 1]; the paper prints percent, so everything a
researcher reads here is in percent and every Δ is in percentage points (pp).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from pandas.io.formats.style import Styler

# Colours of a Δ cell: green when the arm helped, red when it hurt (pandas Styler CSS).
UP_CSS = "color: #137333; background-color: #e6f4ea; font-weight: 600"
DOWN_CSS = "color: #a50e0e; background-color: #fce8e6; font-weight: 600"

# Glyphs that plain system fonts carry (DejaVu), so badges render even without emoji fonts.
STATUS_BADGES = {
    "completed": "✔ completed",
    "running": "● running",
    "pending": "○ pending",
    "failed": "✖ failed",
}

# Column names of the displayed table; units (percent, percentage points) go in the caption.
MEAN_STD = "mean ± std"
DELTA_PREV = "Δ prev"
DELTA_BASE = "Δ base"
PAPER = "paper"
PAPER_DELTA = "paper Δ"
DELTA_COLUMNS = (DELTA_PREV, DELTA_BASE, PAPER_DELTA)
COUNT_COLUMNS = ("steps", "updates", "tokens")


def seed_column(seed: int) -> str:
    return f"seed {seed}"


def to_pct(fraction: Any) -> float:
    """A score fraction (0.43) as percent (43.0); missing values stay NaN."""
    if fraction is None:
        return math.nan
    value = float(fraction)
    return value * 100.0


def mean_std_text(mean_pct: float, std_pct: float, n_seeds: int) -> str:
    """'43.8 ± 2.1' over seeds; one seed has no spread, so only the mean is shown."""
    if mean_pct is None or math.isnan(mean_pct):
        return "—"
    if n_seeds < 2 or std_pct is None or math.isnan(std_pct):
        return f"{mean_pct:.1f}"
    return f"{mean_pct:.1f} ± {std_pct:.1f}"


def format_duration(seconds: Any) -> str:
    """Wall time as '1h 02m', '3m 05s' or '42s'."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "—"
    total = round(float(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


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


def seed_columns(table: pd.DataFrame) -> list[int]:
    """Every seed that has a score in some arm, sorted (arms may lack a failed seed)."""
    seeds: set[int] = set()
    for row_seeds in table.get("seeds", pd.Series(dtype=object)):
        seeds.update(int(s) for s in (row_seeds or []))
    return sorted(seeds)


def _per_seed(row: pd.Series) -> dict[int, float]:
    seeds = row.get("seeds") or []
    scores = row.get("scores") or []
    return {int(s): to_pct(v) for s, v in zip(seeds, scores, strict=False)}


def ablation_display(table: pd.DataFrame) -> pd.DataFrame:
    """The ablation table as a researcher reads it: one row per arm in ladder order.

    `table` is db.queries.ablation_table. Scores become percent, Δs percentage points, and the
    paper's Table 1 number (with its own Δ to the previous arm) sits beside ours. Columns run
    from the answer (mean ± std, Δs) to the bookkeeping (steps, tokens, time). Numeric columns
    stay numbers (NaN where missing); ablation_text formats them.
    """
    seeds = seed_columns(table)
    rows: list[dict[str, Any]] = []
    previous_paper = math.nan
    for _, row in table.iterrows():
        per_seed = _per_seed(row)
        paper = row.get("paper_score")
        paper = math.nan if paper is None else float(paper)
        n_seeds = int(row.get("n_seeds") or len(per_seed))
        out: dict[str, Any] = {
            "arm": row["arm"],
            "adds": row.get("adds") or "",
            MEAN_STD: mean_std_text(
                to_pct(row.get("score_mean")), to_pct(row.get("score_std")), n_seeds
            ),
            DELTA_PREV: to_pct(row.get("delta_prev")),
            DELTA_BASE: to_pct(row.get("delta_base")),
            PAPER: paper,
            PAPER_DELTA: paper - previous_paper,
        }
        previous_paper = paper
        for seed in seeds:
            out[seed_column(seed)] = per_seed.get(seed, math.nan)
        out["status"] = status_badge(row.get("status"))
        out["steps"] = row.get("steps")
        out["updates"] = row.get("grad_updates")
        out["tokens"] = row.get("tokens")
        out["time"] = format_duration(row.get("wall_s"))
        rows.append(out)
    frame = pd.DataFrame(rows)
    for column in COUNT_COLUMNS:
        if column in frame:
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame


def delta_css(value: Any) -> str:
    """Styler CSS for one Δ cell: green up, red down, nothing for zero or missing."""
    if value is None or not isinstance(value, int | float) or math.isnan(value) or value == 0:
        return ""
    return UP_CSS if value > 0 else DOWN_CSS


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return format(float(value), spec)


def numeric_columns(display: pd.DataFrame) -> dict[str, str]:
    """Format spec of each numeric column of ablation_display's frame."""
    specs: dict[str, str] = {}
    for column in display.columns:
        if column in DELTA_COLUMNS:
            specs[column] = "+.1f"
        elif column == PAPER or column.startswith("seed "):
            specs[column] = ".1f"
        elif column in COUNT_COLUMNS:
            specs[column] = ",.0f"
    return specs


def ablation_text(display: pd.DataFrame) -> pd.DataFrame:
    """ablation_display with its numbers as text: '+6.0', '43.0', '12,345', '—' when missing.

    Text rather than Styler number formats because a dashboard grid shows a missing number as
    'None', which reads like a value; '—' reads as "no score yet".
    """
    text = display.copy()
    for column, spec in numeric_columns(display).items():
        text[column] = [_fmt(v, spec) for v in display[column]]
    return text


def style_ablation(display: pd.DataFrame) -> Styler:
    """The text table, with Δ cells coloured from their numbers (green up, red down)."""
    css = pd.DataFrame("", index=display.index, columns=display.columns)
    for column in DELTA_COLUMNS:
        if column in display.columns:
            css[column] = [delta_css(v) for v in display[column]]
    return ablation_text(display).style.hide(axis="index").apply(lambda _: css, axis=None)


def ablation_csv(table: pd.DataFrame) -> bytes:
    """The ablation table for a spreadsheet: one column per seed, scores and Δs in percent."""
    seeds = seed_columns(table)
    rows: list[dict[str, Any]] = []
    for _, row in table.iterrows():
        per_seed = _per_seed(row)
        out: dict[str, Any] = {"arm": row["arm"], "adds": row.get("adds")}
        out["paper_score_pct"] = row.get("paper_score")
        for seed in seeds:
            out[f"score_seed{seed}_pct"] = per_seed.get(seed, math.nan)
        for name in ("score_mean", "score_std", "best_mean", "delta_prev", "delta_base"):
            out[f"{name}_pct"] = to_pct(row.get(name))
        for name in ("n_seeds", "steps", "grad_updates", "tokens", "wall_s", "status"):
            out[name] = row.get(name)
        out["eval_dataset"] = row.get("eval_dataset")
        out["eval_k"] = row.get("eval_k")
        rows.append(out)
    return pd.DataFrame(rows).to_csv(index=False).encode("utf-8")


def score_points(table: pd.DataFrame) -> pd.DataFrame:
    """Long frame (arm, seed, score %) of the per-seed scores, for the ablation chart."""
    rows = [
        {"arm": row["arm"], "seed": seed, "score (%)": score}
        for _, row in table.iterrows()
        for seed, score in _per_seed(row).items()
    ]
    return pd.DataFrame(rows, columns=["arm", "seed", "score (%)"])


def score_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per-arm mean and mean ± std bounds in percent (bars and error bars of the chart)."""
    frame = pd.DataFrame(
        {
            "arm": table["arm"],
            "mean (%)": [to_pct(v) for v in table["score_mean"]],
            "std (%)": [to_pct(v) for v in table["score_std"]],
            "paper (%)": pd.to_numeric(table["paper_score"], errors="coerce"),
        }
    )
    spread = frame["std (%)"].fillna(0.0)
    frame["low"] = frame["mean (%)"] - spread
    frame["high"] = frame["mean (%)"] + spread
    return frame


def ladder_order(table: pd.DataFrame) -> list[str]:
    """Arm names in ladder order (the colour order of every chart)."""
    return [str(a) for a in table["arm"]]
