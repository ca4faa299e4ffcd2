"""Data shaping and the chart of the Grid page: a score or a metric against a swept value.

Input is db.grids.grid_table (one row per grid arm: its point {key: value}, the final score's
and optionally a metric's stats.Estimate). With one swept key the chart is one line; with more,
one line per combination of the other keys' values (the "series"). Every point carries its 95%
t-interval over seeds as a whisker (none for one seed); the base arm is drawn as a diamond.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import pandas as pd

from db import mechanisms, stats, table_format

PLOT_COLUMNS = ["arm", "label", "x", "series", "mean", "low", "high", "n", "role", "text"]
SCORE_DOMAIN = [0.0, 100.0]  # a held-out score is a share: its axis spans what it can be
MIN_ZOOM_SPAN_PP = 10.0  # a zoomed share axis is never narrower than this (percentage points)
BASE, POINT = "base arm", "grid point"
ONE_SERIES = "all"


def short(key: str) -> str:
    """'algo.clip_high' -> 'clip_high' (grid arms are named the same way)."""
    return key.rsplit(".", 1)[-1]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def numeric(frame: pd.DataFrame) -> bool:
    """True when every x is a number (a quantitative axis), else the values are categories."""
    return len(frame) > 0 and all(_number(x) is not None for x in frame["x"])


def series_label(point: Mapping[str, Any], others: Sequence[str]) -> str:
    """The other swept keys' values of a point: 'clip_low=0.16' ('all' with one swept key)."""
    if not others:
        return ONE_SERIES
    return ", ".join(f"{short(k)}={value_name(point.get(k))}" for k in others)


def value_name(value: Any) -> str:
    """A swept value as the arm names write it (0.2, not 0.20000000000000001; true, not True)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    number = _number(value)
    return f"{number:g}" if number is not None else str(value)


def plot_frame(
    grid: pd.DataFrame,
    x_key: str,
    column: str = "score",
    *,
    metric: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Long frame (PLOT_COLUMNS) of one statistic against `x_key`: per grid arm its label
    (`labels`, arm_labels': what varies; else its name), x, its series (the other keys'
    values), the mean and 95% interval in display units (scores and fraction metrics in
    percent), n, and whether it is the base arm. Sorted by series, then x; arms without a
    value (no completed seed yet) are left out."""
    keys = list(grid["point"].iloc[0]) if len(grid) else []
    others = [k for k in keys if k != x_key]
    scale = 100.0 if column == "score" else mechanisms.scale(metric or "")
    rows = []
    for record in grid.to_dict("records"):
        estimate: stats.Estimate = record[column]
        if estimate.n == 0 or math.isnan(estimate.mean):
            continue
        x = record["point"].get(x_key)
        number = _number(x)
        rows.append(
            {
                "arm": str(record["arm"]),
                "label": (labels or {}).get(str(record["arm"]), str(record["arm"])),
                "x": number if number is not None else value_name(x),
                "series": series_label(record["point"], others),
                "mean": scale * estimate.mean,
                "low": scale * estimate.low,
                "high": scale * estimate.high,
                "n": estimate.n,
                "role": BASE if record["base"] else POINT,
                "text": (
                    mechanisms.value_text(estimate, metric)
                    if metric is not None and column != "score"
                    else table_format.estimate_text(estimate)
                ),
            }
        )
    frame = pd.DataFrame(rows, columns=PLOT_COLUMNS)
    if frame.empty:
        return frame
    ordered = frame.assign(_x=[_sort_key(x) for x in frame["x"]])
    return ordered.sort_values(["series", "_x"]).drop(columns="_x").reset_index(drop=True)


def arm_labels(ladder: Sequence[Mapping[str, Any]] | None) -> dict[str, str]:
    """A grid sweep's arms by what varies: 'clip_high=0.24, clip_low=0.16', the base arm's
    values followed by ' (base)', from the sweep's stored ladder (its rungs' `grid`). Keys that
    hold one value over every point are left out, so a one-key grid reads 'clip_high=0.24'.
    Arms that are not grid points keep their names ({} for a sweep that is not a grid), and
    so do all of them if two labels came out the same: a label must name one arm."""
    rungs = [r for r in ladder or [] if r.get("grid") and "arm" in r]
    if not rungs:
        return {}
    keys = list(dict.fromkeys(str(k) for r in rungs for k in r["grid"]))
    varying = [k for k in keys if len({value_name(r["grid"].get(k)) for r in rungs}) > 1]
    labels = {}
    for rung in rungs:
        text = ", ".join(f"{short(k)}={value_name(rung['grid'].get(k))}" for k in varying or keys)
        labels[str(rung["arm"])] = text + (" (base)" if not rung.get("parent") else "")
    if len(set(labels.values())) < len(labels):
        return {}
    return labels


def relabel(frame: pd.DataFrame, labels: Mapping[str, str]) -> pd.DataFrame:
    """A frame with an `arm` column, each arm replaced by its label where it has one."""
    if not labels or frame.empty:
        return frame
    return frame.assign(arm=frame["arm"].map(lambda a: labels.get(str(a), a)))


def _sort_key(x: Any) -> tuple[int, float, str]:
    number = _number(x)
    return (0, number, "") if number is not None else (1, 0.0, str(x))


def y_domain(frame: pd.DataFrame, *, score: bool, share: bool, zoom: bool) -> list[float] | None:
    """The y axis of a grid chart, by one rule (the Grid page's caption says it):

    - the held-out `score`, not zoomed: 0 to 100 %, what a score can be, so that a gap is read
      against the whole scale (zoomed to 40-46 %, a 1.5 pp gap between two means looked like a
      trend);
    - a training metric, not zoomed: None, an axis from 0 (Vega-Lite's zero=True), so that
      sizes compare as sizes (a clip ratio of 1-3 % would be a flat line on 0-100 %);
    - zoomed: the points and their 95% whiskers, padded by a tenth of their span; a `share`
      (or the score) never narrower than MIN_ZOOM_SPAN_PP and kept within 0-100: the noise
      stays in view with the means, so a gap within the whiskers looks like one."""
    if not zoom:
        return list(SCORE_DOMAIN) if score else None
    values = pd.concat([frame["mean"], frame["low"], frame["high"]]).dropna()
    if values.empty:
        return list(SCORE_DOMAIN) if score else None
    low, high = float(values.min()), float(values.max())
    pad = 0.1 * (high - low) if high > low else 0.05 * max(abs(high), 1.0)
    low, high = low - pad, high + pad
    if score or share:
        if high - low < MIN_ZOOM_SPAN_PP:
            middle = (low + high) / 2
            low, high = middle - MIN_ZOOM_SPAN_PP / 2, middle + MIN_ZOOM_SPAN_PP / 2
        shift = max(0.0 - low, 0.0) - max(high - 100.0, 0.0)
        low, high = max(low + shift, 0.0), min(high + shift, 100.0)
    return [low, high]


def grid_chart(
    frame: pd.DataFrame,
    x_title: str,
    y_title: str,
    title: str,
    *,
    domain: Sequence[float] | None = None,
    number: str = ".1f",
) -> alt.LayerChart:
    """Lines through the points of each series, a 95% whisker per point (none for n = 1),
    the base arm as a diamond. `domain`: the y axis (y_domain); None includes 0. `number`:
    the d3 format of the values in the tooltip."""
    quantitative = numeric(frame)
    # ticks at the swept values only: a grid's values are the only x that exist
    xs = sorted({float(x) for x in frame["x"]}) if quantitative else []
    # pad the domain so the end points and their whiskers are not cut in half by the frame
    pad = 0.08 * ((xs[-1] - xs[0]) or abs(xs[0]) or 1.0) if xs else 0.0
    x_domain = [xs[0] - pad, xs[-1] + pad] if xs else []
    x = (
        alt.X(
            "x:Q",
            title=x_title,
            scale=alt.Scale(domain=x_domain, nice=False),
            axis=alt.Axis(values=xs),
        )
        if quantitative
        else alt.X("x:N", title=x_title, sort=list(dict.fromkeys(frame["x"])))
    )
    y_scale = alt.Scale(domain=list(domain), nice=False) if domain else alt.Scale(zero=True)
    y = alt.Y("mean:Q", title=y_title, scale=y_scale)
    series = list(dict.fromkeys(frame["series"]))
    colour = alt.Color(
        "series:N",
        sort=series,
        scale=alt.Scale(scheme="category10"),
        title=None if series == [ONE_SERIES] else "other keys",
        legend=None if series == [ONE_SERIES] else alt.Legend(),
    )
    tooltip = [
        alt.Tooltip("label:N", title="point"),
        alt.Tooltip("mean:Q", title="mean", format=number),
        alt.Tooltip("text:N", title="value [95% interval]"),
        "n",
        "role",
        "arm",
    ]
    line = alt.Chart(frame).mark_line(strokeWidth=2, clip=True).encode(x=x, y=y, color=colour)
    whiskers = (
        alt.Chart(frame.dropna(subset=["low", "high"]))
        .mark_errorbar(ticks={"size": 10}, thickness=1.5, clip=True)
        .encode(x=x, y=alt.Y("low:Q", title=y_title, scale=y_scale), y2="high:Q", color=colour)
    )
    shape = alt.Shape(
        "role:N", scale=alt.Scale(domain=[BASE, POINT], range=["diamond", "circle"]), title=None
    )
    size = alt.Size("role:N", scale=alt.Scale(domain=[BASE, POINT], range=[260, 90]), legend=None)
    points = (
        alt.Chart(frame)
        .mark_point(filled=True, opacity=1, clip=True)
        .encode(x=x, y=y, color=colour, shape=shape, size=size, tooltip=tooltip)
    )
    label = (
        alt.Chart(frame[frame["role"] == BASE])
        .mark_text(dy=-16, fontWeight="bold")
        .encode(x=x, y=y, text=alt.value("base"))
    )
    layers = [line, whiskers, points, label]
    return alt.LayerChart(layer=layers).properties(title=title, height=300)
