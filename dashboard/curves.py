"""Training curves: join an x-axis, smooth, and fold seeds into a band, then draw with altair.

Input is db.reads.metric_curves' (or evaluation_curves') long frame (run_id, arm, seed, step,
name, value). Seeds of one arm are aligned by rollout step (every seed logs every step and
evaluates at the same steps), so the band at a step is over the seeds' values there, and its x
is the seeds' mean x (tokens differ a little between seeds). The band is the 95% t-interval of
the mean over seeds (db.stats, as in the ablation table); one seed has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import altair as alt
import numpy as np
import pandas as pd

from dapo_common import metric_display, metric_names
from db import stats

DEFAULT_SMOOTHING = 0.6  # the EMA weight the curves page starts with (TensorBoard's default)
BAND_COLUMNS = ["arm", "name", "step", "x", "mean", "low", "high", "min", "max", "n_seeds"]


def to_display_units(curves: pd.DataFrame) -> pd.DataFrame:
    """The long frame with each value in the unit the dashboard shows it in
    (dapo_common.metric_display: a share x 100, in percent; everything else as stored). Every
    later step (EMA, the t-interval, min and max) is linear, so the band of the scaled values is
    the scaled band."""
    if curves.empty:
        return curves
    factor = curves["name"].map({n: metric_display.scale(n) for n in curves["name"].unique()})
    return curves.assign(value=curves["value"] * factor.astype(float))


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
    NaN with one seed) and the seeds' min and max.

    The interval is db.stats.t_interval's, mean ± t(0.975, n − 1) · s / √n over the n seeds
    with a value there (NaN values left out), computed for every step at once: one grouped
    aggregate, the t quantile looked up once per n (two seeds 0.0, 1.0 -> 0.5 ± 12.7062 ·
    0.7071 / 1.4142)."""
    if curves.empty:
        return pd.DataFrame(columns=BAND_COLUMNS)
    band = (
        curves.groupby(["arm", "name", "step"], sort=False)
        .agg(
            x=("x", "mean"),
            mean=("value", "mean"),
            sd=("value", "std"),  # n − 1, NaN below two values
            n=("value", "count"),  # the seeds with a value: NaN ones are left out
            min=("value", "min"),
            max=("value", "max"),
            n_seeds=("seed", "nunique"),
        )
        .reset_index()
    )
    t = band["n"].map({n: _t_factor(int(n)) for n in band["n"].unique()})
    half = t * band["sd"] / np.sqrt(band["n"].where(band["n"] > 0))
    band["low"], band["high"] = band["mean"] - half, band["mean"] + half
    band["n_seeds"] = band["n_seeds"].astype(int)
    band = band[BAND_COLUMNS]
    return band.sort_values(["name", "arm", "step"]).reset_index(drop=True)


def _t_factor(n: int) -> float:
    """t((1 + level) / 2, n − 1), the interval's multiplier for n values (NaN below two)."""
    return stats.t_quantile(0.5 + stats.LEVEL / 2.0, n - 1) if n >= 2 else np.nan


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
    return curve_bands(curves, metrics, x_metric, weight)[0]


def curve_bands(
    curves: pd.DataFrame, metrics: Sequence[str], x_metric: str | None, weight: float
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(smoothed band, unsmoothed band) of the chosen metrics from one x-axis join; the second
    is None when `weight` is 0 (the smoothed band is then the unsmoothed one)."""
    with_x = attach_x(curves, x_metric)
    chosen = with_x[with_x["name"].isin(list(metrics))]
    band = seed_band(smooth(chosen, weight))
    return band, (seed_band(chosen) if weight > 0 else None)


BANDS = {"95% interval over seeds": ("low", "high"), "min–max of the seeds": ("min", "max")}
RAW = "raw"  # chart_frame's column of the unsmoothed mean


def chart_frame(
    band: pd.DataFrame,
    metric: str,
    bounds: tuple[str, str] = ("low", "high"),
    raw: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The one table a metric's chart draws, every layer from the same rows: per arm and step
    the x, the mean over seeds, the 95% interval (the tooltip's), the band's `bounds` where
    they are other columns, the seed count and, with `raw` (the unsmoothed band), its mean in
    column RAW. Only these columns, so that the browser gets no more than it draws."""
    columns = ["arm", "step", "x", "mean", "low", "high"]
    columns += [b for b in bounds if b not in columns] + ["n_seeds"]
    frame = band.loc[band["name"] == metric, columns]
    if raw is not None:
        unsmoothed = raw.loc[raw["name"] == metric, ["arm", "step", "mean"]]
        frame = frame.merge(
            unsmoothed.rename(columns={"mean": RAW}), on=["arm", "step"], how="left"
        )
    return frame.reset_index(drop=True)


class BandChart(alt.LayerChart):
    """band_chart's layered chart. Its `to_dict()` (what st.altair_chart calls on every page
    view) skips Altair's JSON-schema validation of the whole spec: half of its cost, 14 of 28 ms
    a chart (5 charts a curves page). The spec is assembled here from fixed parts, so it is
    validated where those parts change: tests/dashboard/test_curves_data.py validates every
    variant."""

    def to_dict(self, validate: bool = False, **kwargs: Any) -> dict[str, Any]:
        return super().to_dict(validate=validate, **kwargs)


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
    y_title: str | None = None,
    colour_title: str = "arm",
    n_title: str = "seeds",
    subtitle: str | None = None,
    legend_below: bool = False,
) -> BandChart:
    """One metric: a line per arm (mean over seeds) over its shaded band, the 95% interval over
    seeds by default (`bounds`: a pair of seed_band's columns). The band's edges are drawn as
    thin dashed lines in the arm's colour, so overlapping bands of several arms stay apart.
    `raw`: the unsmoothed band (seed_band of the same runs), drawn as a faint line behind the
    smoothed one, so smoothing never hides a spike. `log_y`: a log-scale y (positive values;
    see log_ready). The y axis is titled with the metric's display name and unit
    (dapo_common.metric_display; `y_title` overrides it), the chart with its display name over
    the metric's key (`subtitle` replaces it, "" drops it); values are expected in display
    units (to_display_units).

    Every layer reads one table (chart_frame), given once to the chart: the browser receives
    and parses each row once, not once per layer."""
    low, high = bounds
    mine = band[band["name"] == metric]
    raw_data = None if raw is None else raw[raw["name"] == metric]
    with_raw = raw_data is not None and not raw_data.empty
    data = chart_frame(mine, metric, bounds, raw_data if with_raw else None)
    # ten colours while they suffice, twenty beyond (the Runs page may draw many lines)
    scale = alt.Scale(domain=list(arms), scheme="category10" if len(arms) <= 10 else "tableau20")
    # One legend for every layer; its symbols drawn as solid strokes (the band's opacity would
    # otherwise fade them).
    # labelLimit: long arm names (a grid's) are shown whole, not cut to the same first letters;
    # `legend_below`: under the plot in two columns (many or long labels beside a half-width
    # chart would leave the plot a sliver)
    placement: dict[str, Any] = (
        {"orient": "bottom", "columns": 2, "labelLimit": 190} if legend_below else {}
    )
    legend = alt.Legend(
        **{
            "symbolType": "stroke",
            "symbolOpacity": 1,
            "symbolStrokeWidth": 3,
            "labelLimit": 420,
            **placement,
        }
    )
    colour = alt.Color("arm:N", scale=scale, sort=list(arms), title=colour_title, legend=legend)
    shown = metric_display.display(metric)
    y_label = y_title or shown.label
    number = metric_display.number_format(metric)
    # a title longer than the plot is tall ends in "…" instead of pushing the title aside
    # (the plot is what is left of `height` once the x axis and the title are drawn)
    y_axis = alt.Axis(titleLimit=max(int(height * 0.6), 60))
    # whole numbers on a step, update or token axis (no "2.5" steps); minutes may be fractions
    x = alt.X(
        "x:Q",
        title=x_title,
        axis=alt.Axis(tickMinStep=1) if x_title != WALL_CLOCK_LABEL else alt.Axis(),
    )
    # the faint raw line is part of what is shown: the range covers it too
    domain = value_domain(mine if not with_raw else pd.concat([mine, raw_data]), log=log_y)
    kind: Literal["log", "linear"] = "log" if log_y else "linear"
    y_scale = alt.Scale(type=kind, domain=domain, zero=False) if domain else alt.Scale(type=kind)
    # Every layer has the same colour encoding: a layer with legend=None removes the merged
    # legend of the whole chart, not only its own symbols.
    # aria=False: no screen-reader description per point, a string with several number formats
    # that Vega-Lite builds for every row of every layer (a line's path reads only its first):
    # about 5% of the browser's CPU on the curves page (bench/bench_curves.py).
    quiet: dict[str, Any] = {"clip": True, "aria": False}
    # The band's layers skip the steps without bounds (one seed there) and join the steps on
    # either side, as a line would.
    area = (
        alt.Chart()
        .mark_area(opacity=0.14, invalid="filter", **quiet)
        .encode(
            x=x,
            y=alt.Y(f"{low}:Q", title=y_label, scale=y_scale, axis=y_axis),
            y2=f"{high}:Q",
            color=colour,
        )
    )
    edges = [
        alt.Chart()
        .mark_line(strokeWidth=1, strokeDash=[4, 3], opacity=0.8, invalid="filter", **quiet)
        .encode(x=x, y=alt.Y(f"{edge}:Q", title=y_label, scale=y_scale, axis=y_axis), color=colour)
        for edge in (low, high)
    ]
    point = alt.OverlayMarkDef(aria=False) if points else False
    line = (
        alt.Chart()
        .mark_line(strokeWidth=2.5, point=point, **quiet)
        .encode(
            x=x,
            y=alt.Y("mean:Q", title=y_label, scale=y_scale, axis=y_axis),
            color=colour,
            tooltip=[
                alt.Tooltip("arm:N", title=colour_title),
                "step",
                alt.Tooltip("x:Q", title=x_title, format=",.4~g"),
                alt.Tooltip("mean:Q", title=y_label, format=number),
                alt.Tooltip("low:Q", title="95% low", format=number),
                alt.Tooltip("high:Q", title="95% high", format=number),
                alt.Tooltip("n_seeds:Q", title=n_title),
            ],
        )
    )
    behind = []
    if with_raw:
        behind.append(
            alt.Chart()
            .mark_line(strokeWidth=1.2, opacity=0.3, **quiet)
            .encode(
                x=x, y=alt.Y(f"{RAW}:Q", title=y_label, scale=y_scale, axis=y_axis), color=colour
            )
        )
    layered = BandChart(data=data, layer=[*behind, area, *edges, line])
    if legend_below:
        # Streamlit fits the whole chart in `height`: the legend's rows are added to it, or
        # they would squeeze the plot to nothing
        height += 18 * ((len(arms) + 1) // 2) + 28
    # the key under the display name, to look it up by (`subtitle`: another line, "" none)
    below = metric if subtitle is None else subtitle
    heading = (
        alt.TitleParams(
            text=title or shown.name, subtitle=below, subtitleColor="#888", anchor="start"
        )
        if below
        else alt.TitleParams(text=title or shown.name, anchor="start")
    )
    return layered.properties(title=heading, height=height)


def chart_data(band: pd.DataFrame, x_title: str, raw: pd.DataFrame | None = None) -> pd.DataFrame:
    """What a chart plots, as a table to download: per arm, metric and step the x value, the
    mean over seeds, its 95% interval, the seeds' range and n (with `raw`, the unsmoothed mean
    beside the smoothed one), and the unit of those numbers (the shown one: % for a share)."""
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
    out["unit"] = out["metric"].map(metric_display.unit) if len(out) else pd.Series(dtype=str)
    return out.reset_index(drop=True)


def final_values(
    finals: pd.DataFrame, run_ids: Sequence[int], labels: Sequence[str]
) -> pd.DataFrame:
    """Each metric's value at its own last logged step, one column per run (for Compare):
    `finals` is db.reads.final_metrics (run_id, name, step, value) or any longer frame of the
    runs' rows, whose last step per (run, name) is taken. A value logged as NaN/inf at that
    step stays NaN: it is what the run ended on."""
    out = pd.DataFrame(columns=["metric", *labels])
    if finals.empty:
        return out
    last = finals.sort_values("step", kind="stable").groupby(["run_id", "name"]).tail(1)
    wide = last.pivot(index="name", columns="run_id", values="value")
    wide = wide.reindex(columns=list(run_ids))
    wide.columns = list(labels)
    return wide.reset_index(names="metric").sort_values("metric").reset_index(drop=True)


def final_text(finals: pd.DataFrame, name_a: str, name_b: str) -> pd.DataFrame:
    """final_values' two columns as text in each metric's shown unit, with B − A (a share's
    difference in percentage points): metric (its display name), key, A, B, B − A. A value
    logged as NaN reads '—'."""
    rows = []
    for row in finals.to_dict("records"):
        key = str(row["metric"])
        shown = metric_display.display(key)
        a, b = row[name_a], row[name_b]
        delta = b - a if not (pd.isna(a) or pd.isna(b)) else np.nan
        if pd.isna(delta):
            change = "—"
        elif delta == 0:
            change = "0 pp" if shown.unit == metric_display.PERCENT else "0"
        elif shown.unit == metric_display.PERCENT:
            change = f"{delta * shown.scale:+.1f} pp"
        else:
            change = metric_display.text(key, delta)
            change = change if change.startswith("-") else f"+{change}"
        rows.append(
            {
                "metric": shown.name,
                "key": key,
                name_a: metric_display.text(key, a),
                name_b: metric_display.text(key, b),
                "B − A": change,
            }
        )
    return pd.DataFrame(rows, columns=["metric", "key", name_a, name_b, "B − A"])
