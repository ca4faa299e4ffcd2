"""Curves: the held-out score and the training metrics of every arm, seeds folded into a band."""

from __future__ import annotations

import streamlit as st

from dapo_common import metric_names
from dashboard import curves, widgets
from db import ablation, reads, table_format

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

# The paper's x-axis is gradient updates: the default here too.
x_axes = dict(metric_names.X_AXES)
default_x = next(
    (i for i, name in enumerate(x_axes.values()) if name == metric_names.GRAD_UPDATES), 0
)
c1, c2, c3 = st.columns([1, 1, 1])
x_label = c1.selectbox("x-axis", list(x_axes), index=default_x, key="curve-x")
band_label = c2.selectbox(
    "Band",
    list(curves.BANDS),
    key="curve-band",
    help="The 95% interval of the mean over seeds (t over seeds, as in the table; two seeds "
    "give a wide one), or simply the range the seeds span.",
)
weight = c3.slider(
    "Smoothing of training metrics (EMA)", 0.0, 0.95, 0.0, 0.05, key="curve-smoothing"
)
bounds = curves.BANDS[band_label]
band_text = (
    "its 95% t-interval over seeds (none where one seed)"
    if bounds == ("low", "high")
    else "the range the seeds span"
)
arms = st.multiselect("Arms", arms_present, default=arms_present, key="curve-arms")
if not arms:
    st.info("Pick at least one arm.")
    st.stop()
x_metric: str | None = x_axes[x_label]
counters = reads.metric_curves(
    engine, [int(r) for r in latest["run_id"]], names=list(metric_names.X_AXES.values())
)
if x_metric not in set(counters["name"]):
    st.warning(f"`{x_metric}` was not logged: plotting against the rollout step instead.")
    x_metric, x_label = None, "rollout step"

# --- the held-out score: the runs behind the ablation table, the starting model at x = 0 ---
st.subheader("Held-out score")
dataset, k = table["eval_dataset"].dropna(), table["eval_k"].dropna()
if dataset.empty or k.empty:
    st.info("No evaluation yet: the held-out score appears once runs have evaluated.")
else:
    metric = table_format.metric_label(table)
    behind = [int(r) for arm, ids in zip(table["arm"], table["run_ids"], strict=True)
              if arm in arms for r in ids]  # fmt: skip
    evals = reads.evaluation_curves(engine, behind, str(dataset.iloc[0]), int(k.iloc[0]))
    band = curves.eval_band(evals, counters, x_metric)
    if band.empty:
        st.info(f"No {metric} evaluations of these arms yet.")
    else:
        chart = curves.band_chart(
            band,
            reads.EVAL_CURVE,
            arms,
            x_label,
            height=320,
            title=metric,
            points=True,
            bounds=bounds,
        )
        st.altair_chart(chart, width="stretch")
        st.caption(
            f"{metric} against {x_label}: line = mean over seeds, band = {band_text}, step 0 = "
            "the starting model; the attempts behind the ablation table. A band wider than the "
            "seeds' range is clipped at the chart's edge."
        )

# --- training metrics ----------------------------------------------------------------------
st.subheader("Training metrics")
available = reads.metric_names(engine, [int(r) for r in latest["run_id"]])
if not available:
    st.info("No metrics logged yet for this sweep.")
    st.stop()
headline = [m for m in metric_names.HEADLINE if m in available]
chosen = st.multiselect(
    "Metrics", available, default=headline[:4] or available[:4], key="curve-metrics"
)
if not chosen:
    st.info("Pick at least one metric.")
    st.stop()
selected = latest[latest["arm"].isin(arms)]
names = [*chosen, x_metric] if x_metric is not None else chosen
long = reads.metric_curves(engine, [int(r) for r in selected["run_id"]], names=names)
band = curves.curve_band(long, chosen, x_metric, weight)
st.caption(
    f"{selected['seed'].nunique()} seed(s) per arm: line = mean over seeds, band = {band_text}. "
    "Latest attempt of each (arm, seed)."
)
grid = st.columns(2)
for i, metric in enumerate(chosen):
    if band[band["name"] == metric].empty:
        grid[i % 2].info(f"No values of `{metric}` for these arms.")
        continue
    chart = curves.band_chart(band, metric, arms, x_label, bounds=bounds)
    grid[i % 2].altair_chart(chart, width="stretch")
