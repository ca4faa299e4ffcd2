"""Training curves: join an x-axis, smooth, and fold seeds into a band, then draw with altair.

Input is db.queries.metric_curves' long frame (run_id, arm, seed, step, name, value). Seeds of
one arm are aligned by rollout step (every seed logs every step), so the band at a step spans
the seeds' values there, and its x is the seeds' mean x (tokens differ a little between seeds).
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import numpy as np
import pandas as pd

BAND_COLUMNS = ["arm", "name", "step", "x", "mean", "low", "high", "n_seeds"]


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
    """Fold seeds: per (arm, metric, step) the mean line and the min/max band over seeds."""
    if curves.empty:
        return pd.DataFrame(columns=BAND_COLUMNS)
    grouped = curves.groupby(["arm", "name", "step"], sort=False)
    band = grouped.agg(
        x=("x", "mean"),
        mean=("value", "mean"),
        low=("value", "min"),
        high=("value", "max"),
        n_seeds=("seed", "nunique"),
    ).reset_index()
    return band.sort_values(["name", "arm", "step"]).reset_index(drop=True)[BAND_COLUMNS]


def curve_band(
    curves: pd.DataFrame, metrics: Sequence[str], x_metric: str | None, weight: float
) -> pd.DataFrame:
    """The whole pipeline: x-axis join -> smoothing -> seed band, for the chosen metrics."""
    with_x = attach_x(curves, x_metric)
    chosen = with_x[with_x["name"].isin(list(metrics))]
    return seed_band(smooth(chosen, weight))


def band_chart(
    band: pd.DataFrame, metric: str, arms: Sequence[str], x_title: str, height: int = 260
) -> alt.LayerChart:
    """One metric: a line per arm (mean over seeds) over a shaded min/max band of the seeds."""
    data = band[band["name"] == metric]
    scale = alt.Scale(domain=list(arms), scheme="category10")
    # One legend for both layers; its symbols drawn as solid strokes (the band's opacity would
    # otherwise fade them).
    legend = alt.Legend(symbolType="stroke", symbolOpacity=1, symbolStrokeWidth=3)
    colour = alt.Color("arm:N", scale=scale, sort=list(arms), title="arm", legend=legend)
    x = alt.X("x:Q", title=x_title)
    area = (
        alt.Chart(data)
        .mark_area(opacity=0.18)
        .encode(
            x=x,
            y=alt.Y("low:Q", title=metric),
            y2="high:Q",
            # The same encoding as the line's: a layer with legend=None removes the merged legend
            # of the whole chart, not only its own symbols.
            color=colour,
        )
    )
    line = (
        alt.Chart(data)
        .mark_line(strokeWidth=2)
        .encode(
            x=x,
            y=alt.Y("mean:Q", title=metric),
            color=colour,
            tooltip=["arm", "step", alt.Tooltip("x:Q", title=x_title), "mean", "low", "high"],
        )
    )
    return (area + line).properties(title=metric, height=height)


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
