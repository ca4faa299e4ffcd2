"""Training curves: join an x-axis, smooth, and fold seeds into a band, then draw with altair.

Input is db.reads.metric_curves' (or evaluation_curves') long frame (run_id, arm, seed, step,
name, value). Seeds of one arm are aligned by rollout step (every seed logs every step and
evaluates at the same steps), so the band at a step is over the seeds' values there, and its x
is the seeds' mean x (tokens differ a little between seeds). The band is the 95% t-interval of
the mean over seeds (db.stats, as in the ablation table); one seed has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import altair as alt
import numpy as np
import pandas as pd

from dapo_common import metric_names
from db import stats

DEFAULT_SMOOTHING = 0.6  # the EMA weight the curves page starts with (TensorBoard's default)
BAND_COLUMNS = ["arm", "name", "step", "x", "mean", "low", "high", "min", "max", "n_seeds"]


def ema(values: Sequence[float], weight: float) -> np.ndarray:
    """Exponential moving average, TensorBoard's smoothing slider without debiasing.

    s_0 = x_0 and s_t = weight * s_{t-1} + (1 - weight) * x_t; weight 0 leaves the curve as is.
    NaNs are skipped (the running value carries over them).
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out = np.empty(len(values), dtype=float)
    running = np.nan
    for i, value in enumerate(values):
        x = float(value)
        if np.isnan(x):
            out[i] = running
            continue
        running = x if np.isnan(running) else weight * running + (1.0 - weight) * x
        out[i] = running
    return out


# The wall-clock x-axis: minutes since the run began, the running sum of its steps' own
# `time/step_s` (a run that resumed carries its earlier steps over, so its clock does too).
# Not stored: derived here, named like a metric so that attach_x and eval_band take it as one.
WALL_CLOCK = "time/wall_min"
WALL_CLOCK_LABEL = "wall-clock (min)"


def x_axes() -> dict[str, str]:
    """The x-axes a curve can be drawn against: label -> metric (the counters, wall-clock)."""
    return {**metric_names.X_AXES, WALL_CLOCK_LABEL: WALL_CLOCK}


def with_wall_clock(curves: pd.DataFrame, times: pd.DataFrame | None = None) -> pd.DataFrame:
    """`curves` (long frame) plus WALL_CLOCK rows: per run, the cumulative sum of
    `time/step_s` over its steps, in minutes (steps 0, 1, 2 at 30 s each -> 0.5, 1.0, 1.5).
    `times`: where the step times come from (default `curves`); pass every step's, since a
    sum over a downsampled read (db.reads.metric_curves' max_points) would skip steps."""
    source = curves if times is None else times
    steps = source[source["name"] == metric_names.STEP_S].sort_values(["run_id", "step"])
    if steps.empty:
        return curves
    clock = steps.assign(
        name=WALL_CLOCK,
        value=steps.groupby("run_id")["value"].transform(lambda s: s.fillna(0.0).cumsum() / 60.0),
    )
    return pd.concat([curves, clock], ignore_index=True)


def attach_x(curves: pd.DataFrame, x_metric: str | None) -> pd.DataFrame:
    """Add column `x`: the x metric's value logged at the same (run, step), or the step itself.

    Steps where the x metric was not logged are dropped (they have no place on that axis).
    """
    frame = curves.copy()
    if x_metric is None:
        frame["x"] = frame["step"].astype(float)
        return frame
    xs = curves.loc[curves["name"] == x_metric, ["run_id", "step", "value"]]
    xs = xs.rename(columns={"value": "x"})
    merged = frame.merge(xs, on=["run_id", "step"], how="inner")
    return merged


def smooth(curves: pd.DataFrame, weight: float) -> pd.DataFrame:
    """EMA of `value` along the steps of each (run, metric); weight 0 is a no-op."""
    frame = curves.sort_values(["run_id", "name", "step"]).reset_index(drop=True)
    if weight == 0.0 or frame.empty:
        return frame
    smoothed = frame.groupby(["run_id", "name"], sort=False)["value"].transform(
        lambda s: pd.Series(ema(s.to_numpy(), weight), index=s.index)
    )
    frame["value"] = smoothed
    return frame


def seed_band(curves: pd.DataFrame) -> pd.DataFrame:
    """Fold seeds: per (arm, metric, step) the mean over seeds, its 95% t-interval (low, high;
    NaN with one seed) and the seeds' min and max."""
    if curves.empty:
        return pd.DataFrame(columns=BAND_COLUMNS)
    rows = []
    for (arm, name, step), group in curves.groupby(["arm", "name", "step"], sort=False):
        values = [float(v) for v in group["value"] if not np.isnan(v)]
        estimate = stats.t_interval(values) if values else stats.EMPTY
        rows.append(
            {
                "arm": arm,
                "name": name,
                "step": step,
                "x": float(group["x"].mean()),
                "mean": estimate.mean,
                "low": estimate.low,
                "high": estimate.high,
                "min": min(values, default=np.nan),
                "max": max(values, default=np.nan),
                "n_seeds": int(group["seed"].nunique()),
            }
        )
    band = pd.DataFrame(rows, columns=BAND_COLUMNS)
    return band.sort_values(["name", "arm", "step"]).reset_index(drop=True)


def eval_band(evals: pd.DataFrame, counters: pd.DataFrame, x_metric: str | None) -> pd.DataFrame:
    """The held-out score's seed band against an x-axis.

    `evals` is db.reads.evaluation_curves (step 0 is the starting model); `counters` the
    runs' progress counters (metric_curves). The x of an evaluation at step s is the counter
    logged at (run, s); at step 0 it is 0 on every axis (no update, no token yet).
    """
    frame = evals.copy()
    if x_metric is None:
        frame["x"] = frame["step"].astype(float)
    else:
        xs = counters.loc[counters["name"] == x_metric, ["run_id", "step", "value"]]
        frame = frame.merge(xs.rename(columns={"value": "x"}), on=["run_id", "step"], how="left")
        frame.loc[frame["step"] == 0, "x"] = 0.0
        frame = frame.dropna(subset=["x"])
    return seed_band(frame)


def value_domain(band: pd.DataFrame, *, log: bool = False) -> list[float] | None:
    """The y range of the seeds' own values (min..max, padded 5%): the chart keeps it and clips
    a wider interval band at its edges, so two seeds' wide t-band cannot flatten the lines.
    `log`: the positive values only, padded by a factor (5% of the range in decades)."""
    values = pd.concat([band["min"], band["mean"], band["max"]]).dropna()
    if log:
        values = values[values > 0]
    if values.empty:
        return None
    low, high = float(values.min()), float(values.max())
    if log:
        ratio = (high / low) ** 0.05 if high > low else 1.1
        return [low / ratio, high * ratio]
    pad = 0.05 * (high - low) if high > low else 0.05 * max(abs(high), 1.0)
    return [low - pad, high + pad]


def log_ready(band: pd.DataFrame) -> bool:
    """Whether a log-scale y can show this band: every mean and seed value is above 0."""
    values = pd.concat([band["min"], band["mean"]]).dropna()
    return bool(len(values)) and bool((values > 0).all())


def curve_band(
    curves: pd.DataFrame, metrics: Sequence[str], x_metric: str | None, weight: float
) -> pd.DataFrame:
    """The whole pipeline: x-axis join -> smoothing -> seed band, for the chosen metrics."""
    with_x = attach_x(curves, x_metric)
    chosen = with_x[with_x["name"].isin(list(metrics))]
    return seed_band(smooth(chosen, weight))


BANDS = {"95% interval over seeds": ("low", "high"), "min–max of the seeds": ("min", "max")}


def band_chart(
    band: pd.DataFrame,
    metric: str,
    arms: Sequence[str],
    x_title: str,
    height: int = 260,
    *,
    title: str | None = None,
    points: bool = False,
    bounds: tuple[str, str] = ("low", "high"),
    raw: pd.DataFrame | None = None,
    log_y: bool = False,
) -> alt.LayerChart:
    """One metric: a line per arm (mean over seeds) over its shaded band, the 95% interval over
    seeds by default (`bounds`: a pair of seed_band's columns). The band's edges are drawn as
    thin dashed lines in the arm's colour, so overlapping bands of several arms stay apart.
    `raw`: the unsmoothed band (seed_band of the same runs), drawn as a faint line behind the
    smoothed one, so smoothing never hides a spike. `log_y`: a log-scale y (positive values;
    see log_ready)."""
    data = band[band["name"] == metric]
    low, high = bounds
    scale = alt.Scale(domain=list(arms), scheme="category10")
    # One legend for every layer; its symbols drawn as solid strokes (the band's opacity would
    # otherwise fade them).
    legend = alt.Legend(symbolType="stroke", symbolOpacity=1, symbolStrokeWidth=3)
    colour = alt.Color("arm:N", scale=scale, sort=list(arms), title="arm", legend=legend)
    x = alt.X("x:Q", title=x_title)
    raw_data = None if raw is None else raw[raw["name"] == metric]
    # the faint raw line is part of what is shown: the range covers it too
    domain = value_domain(
        data if raw_data is None else pd.concat([data, raw_data], ignore_index=True), log=log_y
    )
    kind: Literal["log", "linear"] = "log" if log_y else "linear"
    y_scale = alt.Scale(type=kind, domain=domain, zero=False) if domain else alt.Scale(type=kind)
    banded = alt.Chart(data.dropna(subset=[low, high]))
    # Every layer has the same colour encoding: a layer with legend=None removes the merged
    # legend of the whole chart, not only its own symbols.
    area = banded.mark_area(opacity=0.14, clip=True).encode(
        x=x, y=alt.Y(f"{low}:Q", title=metric, scale=y_scale), y2=f"{high}:Q", color=colour
    )
    edges = [
        banded.mark_line(strokeWidth=1, strokeDash=[4, 3], opacity=0.8, clip=True).encode(
            x=x, y=alt.Y(f"{edge}:Q", title=metric, scale=y_scale), color=colour
        )
        for edge in (low, high)
    ]
    line = (
        alt.Chart(data)
        .mark_line(strokeWidth=2.5, point=points, clip=True)
        .encode(
            x=x,
            y=alt.Y("mean:Q", title=metric, scale=y_scale),
            color=colour,
            tooltip=[
                "arm",
                "step",
                alt.Tooltip("x:Q", title=x_title),
                alt.Tooltip("mean:Q", format=".3f"),
                alt.Tooltip("low:Q", title="95% low", format=".3f"),
                alt.Tooltip("high:Q", title="95% high", format=".3f"),
                alt.Tooltip("n_seeds:Q", title="seeds"),
            ],
        )
    )
    behind = []
    if raw_data is not None and not raw_data.empty:
        behind.append(
            alt.Chart(raw_data)
            .mark_line(strokeWidth=1.2, opacity=0.3, clip=True)
            .encode(x=x, y=alt.Y("mean:Q", title=metric, scale=y_scale), color=colour)
        )
    layered = alt.LayerChart(layer=[*behind, area, *edges, line])
    return layered.properties(title=title or metric, height=height)


def chart_data(band: pd.DataFrame, x_title: str, raw: pd.DataFrame | None = None) -> pd.DataFrame:
    """What a chart plots, as a table to download: per arm, metric and step the x value, the
    mean over seeds, its 95% interval, the seeds' range and n (with `raw`, the unsmoothed mean
    beside the smoothed one)."""
    out = band.rename(
        columns={
            "name": "metric",
            "x": x_title,
            "low": "low (95%)",
            "high": "high (95%)",
            "min": "seed min",
            "max": "seed max",
            "n_seeds": "seeds",
        }
    )
    if raw is not None and not raw.empty:
        unsmoothed = raw[["arm", "name", "step", "mean"]].rename(
            columns={"name": "metric", "mean": "mean (raw)"}
        )
        out = out.merge(unsmoothed, on=["arm", "metric", "step"], how="left")
    return out.reset_index(drop=True)


def final_values(
    curves: pd.DataFrame, run_ids: Sequence[int], labels: Sequence[str]
) -> pd.DataFrame:
    """Each metric's value at each run's last logged step, one column per run (for Compare)."""
    out = pd.DataFrame(columns=["metric", *labels])
    if curves.empty:
        return out
    last = curves.sort_values("step").groupby(["run_id", "name"], as_index=False).last()
    wide = last.pivot(index="name", columns="run_id", values="value")
    wide = wide.reindex(columns=list(run_ids))
    wide.columns = list(labels)
    return wide.reset_index(names="metric").sort_values("metric").reset_index(drop=True)
