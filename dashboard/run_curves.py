"""Curves of any set of runs, one line per group (the Runs page) or per run (the Run page).

The runs may come from several sweeps: a line folds the runs it holds (its seeds) into a band
at each step, as the Curves page folds an arm's seeds (dashboard.curves), and is labelled by
what it stands for ('clip_high=0.28', '#12 ladder · dapo s1'). The held-out score comes first,
with the starting model at step 0 and a point per evaluation, so a run evaluated once still
shows; a training metric draws its points too when its lines are short (a run of a few steps, a
single point). Every value in the unit the tables show (dapo_common.metric_display).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import sqlalchemy as sa
import streamlit as st

from dapo_common import metric_display, metric_names
from dashboard import curves
from db import reads

HELD_OUT = "held-out score"  # the metrics list's entry for avg@k of the evaluations
CURVE_POINTS = 1000  # steps read per (run, metric), as on the Curves page
POINTS_UP_TO = 40  # a line of at most this many steps is drawn with its points


def eval_set(runs: pd.DataFrame) -> tuple[str, int] | None:
    """The (data set, k) most of the runs were evaluated on (db.run_index's eval columns)."""
    known = runs.dropna(subset=["eval_dataset", "eval_k"])
    if known.empty:
        return None
    counts = known.groupby(["eval_dataset", "eval_k"]).size().sort_values(ascending=False)
    dataset, k = counts.index[0]
    return str(dataset), int(k)


def as_lines(long: pd.DataFrame, line_of: Mapping[int, str]) -> pd.DataFrame:
    """A long frame (db.reads.metric_curves / evaluation_curves) with `arm` replaced by each
    run's line and `seed` by its run id, so that dashboard.curves folds the runs of a line
    (seeds, or the same seed in two sweeps) and counts them; in display units."""
    if long.empty:
        return long
    ids = long["run_id"].astype(int)
    out = long.assign(arm=ids.map(line_of), seed=ids).dropna(subset=["arm"])
    return curves.to_display_units(out)


def with_points(band: pd.DataFrame) -> bool:
    """Whether the band's lines are short enough to draw each point (one step: only a point)."""
    if band.empty:
        return False
    return int(band.groupby(["arm", "name"])["step"].nunique().max()) <= POINTS_UP_TO


def draw(
    engine: sa.Engine,
    runs: pd.DataFrame,
    line_of: Mapping[int, str],
    *,
    key: str,
    n_title: str = "runs",
    default: Sequence[str] | None = None,
) -> None:
    """The controls (metrics, x-axis, band, smoothing) and the charts of `runs` (db.run_index
    rows), one line per distinct value of `line_of` (run id -> label), in first-seen order."""
    ids = [int(r) for r in runs["run_id"]]
    lines = list(dict.fromkeys(line_of[i] for i in ids))
    logged = reads.metric_names(engine, ids)
    options = [HELD_OUT, *logged]
    wanted = list(default) if default is not None else [HELD_OUT, *metric_names.HEADLINE[:3]]
    c1, c2, c3, c4 = st.columns([3, 1, 1, 1])
    chosen = c1.multiselect(
        "Metrics",
        options,
        default=[m for m in wanted if m in options],
        key=f"{key}-metrics",
        format_func=lambda m: m if m == HELD_OUT else f"{metric_display.display(m).name} · {m}",
    )
    x_axes = dict(metric_names.X_AXES)
    x_label = c2.selectbox("x-axis", list(x_axes), key=f"{key}-x")
    band_label = c3.selectbox("Band", list(curves.BANDS), key=f"{key}-band")
    weight = c4.slider(
        "Smoothing (EMA)",
        0.0,
        0.95,
        curves.DEFAULT_SMOOTHING,
        0.05,
        key=f"{key}-smoothing",
        help="Exponential moving average of training metrics over steps, per run, before the "
        "runs of a line are folded; the faint line is unsmoothed. Held-out scores are never "
        "smoothed.",
    )
    if not chosen:
        st.info("Pick at least one metric.")
        return
    bounds = curves.BANDS[band_label]
    x_metric: str | None = x_axes[x_label]
    if x_metric == metric_names.ROLLOUT_STEP:
        x_metric = None  # the step itself: every row has one, step 0 included
    counters = reads.metric_curves(engine, ids, names=[x_metric]) if x_metric is not None else None
    if counters is not None and counters.empty:
        st.warning(f"`{x_metric}` was not logged: plotting against the rollout step instead.")
        x_metric, x_label, counters = None, "rollout step", None
    charts: list[curves.BandChart | str] = []
    notes: list[str] = []
    if HELD_OUT in chosen:
        chart, note = _held_out(engine, runs, line_of, lines, x_metric, x_label, bounds, n_title)
        charts.append(chart)
        notes += [note] if note else []
    training = [m for m in chosen if m != HELD_OUT]
    if training:
        long = reads.metric_curves(
            engine,
            ids,
            names=[*training, *([x_metric] if x_metric else [])],
            max_points=CURVE_POINTS,
        )
        band, raw = curves.curve_bands(as_lines(long, line_of), training, x_metric, weight)
        points = with_points(band)
        for metric in training:
            if band[band["name"] == metric].empty:
                charts.append(f"No values of `{metric}` for these runs.")
                continue
            charts.append(
                curves.band_chart(
                    band,
                    metric,
                    lines,
                    x_label,
                    bounds=bounds,
                    raw=raw,
                    points=points,
                    colour_title="line",
                    n_title=n_title,
                    legend_below=True,
                )
            )
    grid = st.columns(2)
    for i, chart in enumerate(charts):
        if isinstance(chart, str):
            grid[i % 2].info(chart)
        else:
            grid[i % 2].altair_chart(chart, width="stretch")
    smoothed = f"training metrics smoothed (EMA {weight:g}, faint: unsmoothed)" if weight else ""
    st.caption(
        f"Line = mean over the {n_title} it holds, band = "
        + ("95% t-interval over them" if bounds == ("low", "high") else "their min–max")
        + " (none where one); held-out: step 0 is the starting model, a point per evaluation"
        + (f"; {smoothed}" if smoothed else "")
        + ". Shares in percent (docs/units.md)."
        + "".join(f" {note}" for note in notes)
    )


def _held_out(
    engine: sa.Engine,
    runs: pd.DataFrame,
    line_of: Mapping[int, str],
    lines: Sequence[str],
    x_metric: str | None,
    x_label: str,
    bounds: tuple[str, str],
    n_title: str,
) -> tuple[curves.BandChart | str, str]:
    """The held-out score's chart (avg@k on the runs' most common data set and k), or a line
    saying why there is none; and a note for the caption (runs evaluated elsewhere)."""
    chosen = eval_set(runs)
    if chosen is None:
        return "No evaluations of these runs yet.", ""
    dataset, k = chosen
    mine = runs[(runs["eval_dataset"] == dataset) & (runs["eval_k"] == k)]
    ids = [int(r) for r in mine["run_id"]]
    evals = as_lines(reads.evaluation_curves(engine, ids, dataset, k), line_of)
    counters = reads.metric_curves(engine, ids, names=[x_metric]) if x_metric is not None else evals
    band = curves.eval_band(evals, counters, x_metric)
    if band.empty:
        return f"No evaluations on {dataset} (k = {k}) yet.", ""
    left_out = len(runs) - len(mine)
    note = (
        f"The held-out chart is on {dataset} at k = {k}: {left_out} run(s) evaluated on "
        "another set (or not yet) are not in it."
        if left_out
        else ""
    )
    chart = curves.band_chart(
        band,
        reads.EVAL_CURVE,
        [line for line in lines if line in set(band["arm"])],
        x_label,
        title=f"{dataset}: held-out avg@{k}",
        y_title=metric_display.held_out(k),
        subtitle="",  # its data are the evaluations, not a logged metric
        points=True,
        bounds=bounds,
        colour_title="line",
        n_title=n_title,
        legend_below=True,
    )
    return chart, note
