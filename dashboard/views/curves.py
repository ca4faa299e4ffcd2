"""Curves: training metrics of every arm overlaid, seeds folded into a min/max band."""

from __future__ import annotations

import streamlit as st

from dapo_core import metric_names
from dashboard import curves, widgets
from db import queries

st.title("Training curves")
engine = widgets.store()
sweep_id = widgets.pick_sweep(engine)
if sweep_id is None:
    st.stop()

runs = queries.runs_of_sweep(engine, sweep_id)
if runs.empty:
    st.info(f"Sweep {sweep_id} has no runs yet: curves appear as soon as a run logs a step.")
    st.stop()
# One attempt per (arm, seed): the latest, which is what a rerun replaces.
latest = runs.sort_values("attempt").groupby(["arm", "seed"], as_index=False).last()
ladder = list(queries.ablation_table(engine, sweep_id)["arm"])
arms_present = [a for a in ladder if a in set(latest["arm"])]
available = queries.metric_names(engine, [int(r) for r in latest["run_id"]])
if not available:
    st.info("No metrics logged yet for this sweep.")
    st.stop()

headline = [m for m in metric_names.HEADLINE if m in available]
x_axes = {label: name for label, name in metric_names.X_AXES.items()}
c1, c2, c3 = st.columns([3, 1, 1])
chosen = c1.multiselect(
    "Metrics", available, default=headline[:4] or available[:4], key="curve-metrics"
)
x_label = c2.selectbox("x-axis", list(x_axes), key="curve-x")
weight = c3.slider("Smoothing (EMA)", 0.0, 0.95, 0.0, 0.05, key="curve-smoothing")
arms = st.multiselect("Arms", arms_present, default=arms_present, key="curve-arms")

if not chosen or not arms:
    st.info("Pick at least one metric and one arm.")
    st.stop()

selected = latest[latest["arm"].isin(arms)]
x_metric = x_axes[x_label]
long = queries.metric_curves(
    engine, [int(r) for r in selected["run_id"]], names=[*chosen, x_metric]
)
if x_metric not in set(long["name"]):
    st.warning(f"`{x_metric}` was not logged: plotting against the rollout step instead.")
    x_metric, x_label = None, "rollout step"
band = curves.curve_band(long, chosen, x_metric, weight)
st.caption(
    f"{selected['seed'].nunique()} seed(s) per arm: line = mean over seeds, band = min..max. "
    f"Latest attempt of each (arm, seed)."
)
grid = st.columns(2)
for i, metric in enumerate(chosen):
    if band[band["name"] == metric].empty:
        grid[i % 2].info(f"No values of `{metric}` for these arms.")
        continue
    chart = curves.band_chart(band, metric, arms, x_label)
    grid[i % 2].altair_chart(chart, width="stretch")
