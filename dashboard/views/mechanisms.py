"""Mechanisms: did each arm's change show in the metric it is about, beyond the seed spread?"""

from __future__ import annotations

import altair as alt
import streamlit as st

from dapo_common import metric_display
from dashboard import grids, layout, mechanisms, widgets
from db import mechanisms as mech_text
from db import reads
from db.mechanism_table import mechanism_table

st.title("Mechanisms")
engine = widgets.store()
sweep_id = widgets.pick_sweep(engine)
if sweep_id is None:
    st.stop()

runs = reads.runs_of_sweep(engine, sweep_id)
logged = set(reads.metric_names(engine, [int(r) for r in runs["run_id"]]))
# The same default as `dapo table --mechanisms` and the Prefect artifact (db.mechanisms).
default = list(mech_text.default_metrics(logged))
c1, c2 = st.columns([1, 3])
window = int(
    c1.number_input(
        "Window (rollout steps)",
        min_value=1,
        max_value=10_000,
        value=10,
        step=1,
        key="mech-window",
        help="Each seed's metric is averaged over the first and over the last this many "
        "rollout steps of its run.",
    )
)
chosen = c2.multiselect(
    "Metrics", sorted(set(default) | logged), default=default, key="mech-metrics"
)
if not chosen:
    st.info("Pick at least one metric.")
    st.stop()

table = mechanism_table(engine, sweep_id, chosen, window)
if table.empty:
    st.info(f"Sweep {sweep_id} has no arms.")
    st.stop()
st.caption(mech_text.caption(table))
done = runs[runs["status"] == "completed"]["steps"].dropna()
if len(done) and int(done.min()) < 2 * window:
    # first and last windows then share steps: a small change over training reads as none
    st.warning(
        f"Some runs have only {int(done.min())} rollout steps: the first and last {window} "
        "steps overlap. Lower the window to compare the start with the end."
    )

st.subheader("Each arm's signature")
st.markdown(
    "The metrics each arm's change is about (from its config diff to its parent arm): "
    "Δ parent is the evidence that its mechanism acted, over the last steps and over the "
    "first (a mechanism that acts on truncations or uninformative groups is largest early, "
    "while there are many)."
)
summary = mechanisms.signature(table)
if summary.empty:
    st.info("No arm changes a key with a mechanism metric (or no arm has a parent).")
else:
    css = mechanisms.signature_css(table, summary)
    # What moved (arm, metric, Δ parent) first, so it fits a 1440 px screen (dashboard.layout).
    st.dataframe(
        summary.style.hide(axis="index").apply(lambda _: css, axis=None),
        hide_index=True,
        width="stretch",
        column_order=layout.signature_order(list(summary.columns)),
        column_config=layout.signature_columns(list(summary.columns)),
    )

st.subheader("Every metric")
cell_label = st.radio(
    "Cells", list(mechanisms.CELLS), horizontal=True, key="mech-cells", label_visibility="collapsed"
)
cell = mechanisms.CELLS[str(cell_label)]
wide = mechanisms.style_wide(table, cell)
st.dataframe(
    wide,
    hide_index=True,
    width="stretch",
    column_order=layout.wide_order(list(wide.data.columns)),
    column_config={
        "arm": st.column_config.TextColumn("arm", pinned=True, width=125),
        "changes": st.column_config.TextColumn("changes", width="medium"),
    },
)
st.caption(
    "Highlighted: a metric the arm's change is about; bold: a Δ the exact paired sign-flip test calls real (p < 0.05)."
)
st.download_button(
    "Download CSV",
    mech_text.render(table, "csv"),
    file_name=f"mechanisms-sweep{sweep_id}.csv",
    mime="text/csv",
    icon=":material/download:",
    key="mech-csv",
)

st.subheader("One metric across arms")
metric = st.selectbox(
    "Metric",
    mechanisms.metrics(table),
    key="mech-plot-metric",
    format_func=lambda m: f"{metric_display.display(m).name} · {m}",
)
summary_frame = mechanisms.metric_summary(table, str(metric))
if summary_frame.empty:
    st.info(f"No completed run logged `{metric}`.")
else:
    # A grid's arms by what varies ("clip_high=0.24"): their names share a long prefix, and
    # an axis cut them to the same first letters.
    arm_label = grids.arm_labels(reads.sweep_details(engine, sweep_id)["ladder"])
    summary_frame = grids.relabel(summary_frame, arm_label)
    order = [arm_label.get(a, a) for a in mechanisms.arms(table)]
    # the axis title by display name and unit; the values are in the table's unit above
    # (db.mechanisms), which is the display table's wherever the two agree on the factor
    label = (
        metric_display.label(str(metric))
        if mech_text.scale(str(metric)) == metric_display.scale(str(metric))
        else mech_text.metric_label(str(metric))
    )
    x = alt.X(
        "arm:N",
        sort=order,
        title=None,
        axis=alt.Axis(labelAngle=0 if len(order) <= 6 else -30, labelLimit=320),
    )
    colour = alt.Color(
        "focus:N",
        scale=alt.Scale(domain=["its change is about it", "other"], range=["#e8a200", "#4c78a8"]),
        title=None,
    )
    bars = (
        alt.Chart(summary_frame)
        .mark_bar(opacity=0.5)
        .encode(x=x, y=alt.Y("mean:Q", title=label), color=colour, tooltip=["arm", "text", "n"])
    )
    whiskers = (
        alt.Chart(summary_frame.dropna(subset=["low", "high"]))
        .mark_errorbar(ticks={"size": 14}, thickness=2, color="#1f3b57")
        .encode(x=x, y=alt.Y("low:Q", title=label), y2="high:Q")
    )
    first = (
        alt.Chart(summary_frame.dropna(subset=["first"]))
        .mark_tick(color="#e45756", thickness=2, size=30)
        .encode(x=x, y=alt.Y("first:Q", title=label), tooltip=["arm", "first"])
    )
    seeds = (
        alt.Chart(grids.relabel(mechanisms.metric_points(table, str(metric)), arm_label))
        .mark_circle(size=50, color="#1f3b57")
        .encode(x=x, y=alt.Y("value:Q", title=label), tooltip=["arm", "seed", "value"])
    )
    st.altair_chart(
        (bars + whiskers + first + seeds).properties(
            height=260,
            title=f"{label}: bar = mean of the last {window} steps over seeds, whisker = 95% "
            f"interval (none for n=1), dots = seeds, red tick = the first {window} steps",
        ),
        width="stretch",
    )
