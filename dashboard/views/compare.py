"""Compare: any two runs side by side — config diff, final metrics, evaluations — then the
curves of arms from several sweeps overlaid (dashboard.sweep_compare)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dapo_common import metric_names
from dashboard import configs, curves, notes, sweep_compare, widgets
from db import ablation, reads

st.title("Compare two runs")
engine = widgets.store()
left_col, right_col = st.columns(2)
with left_col:
    run_a = widgets.pick_run(engine, key="compare-a", param="a", label="Run A")
with right_col:
    run_b = widgets.pick_run(engine, key="compare-b", param="b", label="Run B", index_hint=1)
if run_a is None or run_b is None:
    st.stop()

a, b = reads.run_details(engine, run_a), reads.run_details(engine, run_b)
name_a = f"A: {a['arm']} s{a['seed']} (run {run_a})"
name_b = f"B: {b['arm']} s{b['seed']} (run {run_b})"

st.subheader("Config diff")
diff = configs.config_diff(a["config"], b["config"], name_a, name_b)
if diff.empty:
    st.info("The two runs have the same config.")
else:
    st.dataframe(diff, hide_index=True, width="stretch")

st.subheader("Final metrics")
# One row per (run, metric), not the runs' whole curves: the read does not grow with their length.
finals = curves.final_values(
    reads.final_metrics(engine, [run_a, run_b]), [run_a, run_b], [name_a, name_b]
)
if finals.empty:
    st.info("Neither run has logged metrics yet.")
else:
    finals["B − A"] = finals[name_b] - finals[name_a]
    st.dataframe(finals, hide_index=True, width="stretch")

st.subheader("Evaluations")
frames = []
for name, run_id in ((name_a, run_a), (name_b, run_b)):
    evals = reads.evaluations(engine, run_id)
    if evals.empty:
        st.info(f"{name} has no evaluations.")
        continue
    frames.append(evals.assign(run=name))
if frames:
    both = pd.concat(frames, ignore_index=True)
    for column in ("avg_at_k", "pass_at_k", "cons_at_k"):
        both[column] = both[column] * 100.0
    st.dataframe(
        both[["run", "step", "dataset", "k", "avg_at_k", "pass_at_k", "cons_at_k", "n_problems"]],
        hide_index=True,
        width="stretch",
        column_config={
            c: st.column_config.NumberColumn(c.replace("_at_", "@") + " (%)", format="%.1f")
            for c in ("avg_at_k", "pass_at_k", "cons_at_k")
        },
    )

# --- curves across sweeps -----------------------------------------------------------------
st.subheader("Curves across sweeps")
every_sweep = ablation.sweep_choices(engine)  # labels only, not every sweep's table
every_sweep = notes.with_sweep_annotations(every_sweep, engine)
sweep_labels = {int(r["sweep_id"]): widgets.sweep_label(r) for _, r in every_sweep.iterrows()}
both_sweeps = sorted({int(a["sweep_id"]), int(b["sweep_id"])})
hidden = {int(s) for s, h in zip(every_sweep["sweep_id"], every_sweep["hidden"], strict=True) if h}
# hidden sweeps only with the sidebar's switch on (the two runs' own sweeps are always offered)
offered = notes.visible(sweep_labels, hidden, show=notes.show_hidden(), keep=both_sweeps)
picked_sweeps = st.multiselect(
    "Sweeps",
    offered,
    default=both_sweeps,
    format_func=lambda i: sweep_labels[i],
    key="xs-sweeps",
)
across = reads.runs_of_sweeps(engine, picked_sweeps)
options = sweep_compare.series_options(across)
if not options:
    st.info("Pick sweeps that have runs.")
    st.stop()
names = dict(zip(across["sweep_id"].astype(int), across["sweep_name"], strict=True))
# The two runs above, as (sweep, arm) series, are the starting point.
default_series = [
    label
    for label in (
        sweep_compare.series_label(r["sweep_id"], names.get(int(r["sweep_id"]), ""), r["arm"])
        for r in (a, b)
    )
    if label in options
]
series = st.multiselect(
    "Arms (sweep · arm)", options, default=list(dict.fromkeys(default_series)), key="xs-series"
)
c1, c2, c3 = st.columns([2, 1, 1])
where_text = c1.text_input(
    "Only runs whose config has",
    key="xs-filter",
    placeholder="algo.clip_high=0.28",
    help="One dotted config key = value; the value is read as JSON where it parses "
    "(0.28, true, null), else as text.",
)
x_axes = dict(metric_names.X_AXES)
# The paper's x-axis, gradient updates, as on the curves page.
x_label = c2.selectbox(
    "x-axis", list(x_axes), index=list(x_axes.values()).index(metric_names.GRAD_UPDATES), key="xs-x"
)
try:
    where = sweep_compare.parse_filter(where_text)
except ValueError as error:
    st.warning(str(error))
    where = None
chosen = sweep_compare.series_runs(across, series, where)
if chosen.empty:
    st.info("No runs of these arms" + (f" with {where[0]} = {where[1]!r}." if where else "."))
    st.stop()
run_ids = [int(r) for r in chosen["run_id"]]
available = reads.metric_names(engine, run_ids)
if not available:
    st.info("These runs have not logged metrics yet.")
    st.stop()
headline = [m for m in metric_names.HEADLINE if m in available]
metric = c3.selectbox(
    "Metric", available, index=available.index((headline or available)[0]), key="xs-metric"
)
x_metric: str | None = x_axes[x_label]
long = reads.metric_curves(engine, run_ids, names=[metric, x_metric])
if x_metric not in set(long["name"]):
    st.warning(f"`{x_metric}` was not logged: plotting against the rollout step instead.")
    x_metric, x_label = None, "rollout step"
band = curves.curve_band(sweep_compare.labelled_curves(long, chosen), [metric], x_metric, 0.0)
shown = [s for s in series if s in set(band["arm"])]
if band.empty:
    st.info(f"No values of `{metric}` for these runs.")
    st.stop()
st.altair_chart(curves.band_chart(band, metric, shown, x_label, height=320), width="stretch")
st.dataframe(sweep_compare.last_values(band, shown), hide_index=True, width="stretch")
st.caption(
    "One line per (sweep, arm): the mean over its seeds (latest attempt of each), band = the "
    "95% t-interval over seeds (none with one seed)."
)
