"""Curves: the held-out score and the training metrics of every arm, seeds folded into a band."""

from __future__ import annotations

import streamlit as st

from dapo_common import metric_display, metric_names
from dashboard import curves, grids, widgets
from db import ablation, reads

CURVE_POINTS = 1000  # steps read per (run, metric) unless the full series is asked for

st.title("Training curves")
engine = widgets.store()
sweep_id = widgets.pick_sweep(engine)
if sweep_id is None:
    st.stop()

runs = reads.runs_of_sweep(engine, sweep_id)
if runs.empty:
    st.info(f"Sweep {sweep_id} has no runs yet: curves appear as soon as a run logs a step.")
    st.stop()
# Training metrics: the latest attempt of each (arm, seed), which is what a rerun replaces.
latest = runs.sort_values("attempt").groupby(["arm", "seed"], as_index=False).last()
table = ablation.ablation_table(engine, sweep_id)
ladder = list(table["arm"])
arms_present = [a for a in ladder if a in set(latest["arm"])]
# A grid's arms by what varies ("clip_high=0.24"), not by names that share a long prefix.
arm_label = grids.arm_labels(reads.sweep_details(engine, sweep_id)["ladder"])

# The paper's x-axis is gradient updates: the default here too. Wall-clock minutes are summed
# from the steps' own times (dashboard.curves.with_wall_clock).
x_axes = curves.x_axes()
default_x = next(
    (i for i, name in enumerate(x_axes.values()) if name == metric_names.GRAD_UPDATES), 0
)
c1, c2, c3, c4 = st.columns([1, 1, 1, 0.6])
x_label = c1.selectbox("x-axis", list(x_axes), index=default_x, key="curve-x")
band_label = c2.selectbox(
    "Band",
    list(curves.BANDS),
    key="curve-band",
    help="The 95% interval of the mean over seeds (t over seeds, as in the table; two seeds "
    "give a wide one), or simply the range the seeds span.",
)
# Smoothed by default (TensorBoard's 0.6): per-step metrics of small batches are noisy; the
# raw mean is drawn faintly behind, so a spike stays visible.
weight = c3.slider(
    "Smoothing of training metrics (EMA)",
    0.0,
    0.95,
    curves.DEFAULT_SMOOTHING,
    0.05,
    key="curve-smoothing",
    help="Exponential moving average over steps, per run, before seeds are folded; the faint "
    "line is the unsmoothed mean. 0 turns it off.",
)
log_y = c4.toggle(
    "Log y", key="curve-log", help="A log-scale y axis (metrics with values ≤ 0 stay linear)."
)
bounds = curves.BANDS[band_label]
band_text = (
    "its 95% t-interval over seeds (none where one seed)"
    if bounds == ("low", "high")
    else "the range the seeds span"
)
arms = st.multiselect(
    "Arms",
    arms_present,
    default=arms_present,
    key="curve-arms",
    format_func=lambda a: arm_label.get(a, a),
)
if not arms:
    st.info("Pick at least one arm.")
    st.stop()
shown_arms = [arm_label.get(a, a) for a in arms]
x_metric: str | None = x_axes[x_label]
counters = reads.metric_curves(
    engine,
    [int(r) for r in latest["run_id"]],
    names=[*metric_names.X_AXES.values(), metric_names.STEP_S],
)
counters = curves.with_wall_clock(counters)
if x_metric not in set(counters["name"]):
    missing = metric_names.STEP_S if x_metric == curves.WALL_CLOCK else x_metric
    st.warning(f"`{missing}` was not logged: plotting against the rollout step instead.")
    x_metric, x_label = None, "rollout step"

# --- the held-out score: the runs behind the ablation table, the starting model at x = 0 ---
st.subheader("Held-out score")
dataset, k = table["eval_dataset"].dropna(), table["eval_k"].dropna()
if dataset.empty or k.empty:
    st.info("No evaluation yet: the held-out score appears once runs have evaluated.")
else:
    eval_k, eval_set = int(k.iloc[0]), str(dataset.iloc[0])
    metric = metric_display.held_out(eval_k)  # "held-out avg@4 (%)", as the table's unit
    behind = [int(r) for arm, ids in zip(table["arm"], table["run_ids"], strict=True)
              if arm in arms for r in ids]  # fmt: skip
    evals = reads.evaluation_curves(engine, behind, eval_set, eval_k)
    evals = curves.to_display_units(grids.relabel(evals, arm_label))
    band = curves.eval_band(evals, counters, x_metric)
    if band.empty:
        st.info(f"No {metric} evaluations of these arms yet.")
    else:
        chart = curves.band_chart(
            band,
            reads.EVAL_CURVE,
            shown_arms,
            x_label,
            height=320,
            title=f"{eval_set}: held-out avg@{eval_k}",
            y_title=metric,
            subtitle="",  # its data are the evaluations, not a logged metric
            points=True,
            bounds=bounds,
            log_y=log_y and curves.log_ready(band),
        )
        st.altair_chart(chart, width="stretch")
        st.caption(
            f"{metric} on {eval_set} against {x_label}: line = mean over seeds, band = "
            f"{band_text}, step 0 = the starting model; the attempts behind the ablation table. "
            "A band wider than the seeds' range is clipped at the chart's edge."
        )
        st.download_button(
            "Download the held-out curve (CSV)",
            curves.chart_data(band, x_label).to_csv(index=False),
            file_name=f"heldout-sweep{sweep_id}.csv",
            mime="text/csv",
            icon=":material/download:",
            key="curve-heldout-csv",
        )

# --- training metrics ----------------------------------------------------------------------
st.subheader("Training metrics")
available = reads.metric_names(engine, [int(r) for r in latest["run_id"]])
if not available:
    st.info("No metrics logged yet for this sweep.")
    st.stop()
headline = [m for m in metric_names.HEADLINE if m in available]
chosen = st.multiselect(
    "Metrics",
    available,
    default=headline[:4] or available[:4],
    key="curve-metrics",
    format_func=lambda m: f"{metric_display.display(m).name} · {m}",
)
if not chosen:
    st.info("Pick at least one metric.")
    st.stop()
selected = latest[latest["arm"].isin(arms)]
# the wall clock is not stored: it comes from every step's time in `counters`, below
names = [*chosen, x_metric] if x_metric not in (None, curves.WALL_CLOCK) else chosen
# Long runs are read downsampled by the database (db.reads.metric_curves: a common step grid
# plus each series' ends, so seeds and the x-axis stay aligned); one click reads every step.
full_series = st.toggle(
    "Full series",
    value=False,
    key="curve-full",
    help=f"Off: at most about {CURVE_POINTS} steps per run and metric (a spike between two "
    "kept steps can hide). On: every logged step.",
)
long = reads.metric_curves(
    engine,
    [int(r) for r in selected["run_id"]],
    names=names,
    max_points=None if full_series else CURVE_POINTS,
)
if x_metric == curves.WALL_CLOCK:
    long = curves.with_wall_clock(long, counters)
# Shares in percent, as the tables show them (the x-axis counters are unscaled counts).
long = curves.to_display_units(grids.relabel(long, arm_label))
# The smoothed band, and the unsmoothed one: its mean is drawn faintly behind the smoothed
# line (and beside it in the CSV). Each chart then gets one table of its metric's rows.
band, raw = curves.curve_bands(long, chosen, x_metric, weight)
smoothing = f"smoothed (EMA {weight:g}; faint line: unsmoothed)" if weight > 0 else "unsmoothed"
st.caption(
    f"{selected['seed'].nunique()} seed(s) per arm: line = mean over seeds, {smoothing}, band = "
    f"{band_text}. Latest attempt of each (arm, seed). Shares in percent (docs/units.md)."
)
grid = st.columns(2)
linear = []
for i, metric in enumerate(chosen):
    mine = band[band["name"] == metric]
    if mine.empty:
        grid[i % 2].info(f"No values of `{metric}` for these arms.")
        continue
    log = log_y and curves.log_ready(mine)
    if log_y and not log:
        linear.append(metric_display.display(metric).name)
    chart = curves.band_chart(band, metric, shown_arms, x_label, bounds=bounds, raw=raw, log_y=log)
    grid[i % 2].altair_chart(chart, width="stretch")
if linear:
    st.caption(f"Linear y (values ≤ 0, which a log scale cannot show): {', '.join(linear)}.")
st.download_button(
    "Download the plotted data (CSV)",
    curves.chart_data(band, x_label, raw).to_csv(index=False),
    file_name=f"curves-sweep{sweep_id}.csv",
    mime="text/csv",
    icon=":material/download:",
    key="curve-csv",
    help="Per arm, metric and step: the x value, the mean over seeds as drawn (smoothed), "
    "its 95% interval, the seeds' range and count, the unsmoothed mean, and their unit "
    "(shares in %).",
)
