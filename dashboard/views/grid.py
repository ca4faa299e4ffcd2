"""Grid: the eval score (and a metric) against the swept value, one point per grid arm."""

from __future__ import annotations

import streamlit as st

from dashboard import grids, widgets
from db import ablation, mechanisms, reads, table_format
from db.grids import grid_keys, grid_table

NO_METRIC = "(none)"

st.title("Grid")
engine = widgets.store()
sweep_id = widgets.pick_sweep(engine)
if sweep_id is None:
    st.stop()

keys = grid_keys(engine, sweep_id)
if not keys:
    st.info(
        f"Sweep {sweep_id} is not a grid. A grid sweep expands arms from a base arm, e.g. "
        "`dapo sweep --arms dapo --grid algo.clip_high=0.24,0.28,0.32`; its arms then show "
        "here against the swept value."
    )
    st.stop()

runs = reads.runs_of_sweep(engine, sweep_id)
logged = reads.metric_names(engine, [int(r) for r in runs["run_id"]])
c1, c2, c3 = st.columns([1, 2, 1])
x_key = str(c1.selectbox("x: swept key", keys, key="grid-x"))
metric_choice = c2.selectbox("Also plot a training metric", [NO_METRIC, *logged], key="grid-metric")
window = int(
    c3.number_input(
        "Window (rollout steps)",
        min_value=1,
        max_value=10_000,
        value=10,
        key="grid-window",
        help="The metric is each seed's mean over the last this many rollout steps.",
    )
)
metric = None if metric_choice == NO_METRIC else str(metric_choice)
grid = grid_table(engine, sweep_id, metric=metric, window=window)
others = [k for k in keys if k != x_key]
score_label = table_format.metric_label(grid)
st.caption(
    "One point per grid arm: mean over seeds with its 95% t-interval over seeds (no whisker "
    "for n=1); diamond = the base arm the points branch from"
    + (f"; one line per value of {', '.join(others)}" if others else "")
    + ". Each arm's Δ to its parent (the base) is in the ablation table."
)

scores = grids.plot_frame(grid, x_key)
if scores.empty:
    st.info("No grid arm has a completed, evaluated run yet.")
else:
    st.altair_chart(
        grids.grid_chart(
            scores, x_key, f"{score_label} (%)", f"Final {score_label} against {x_key}"
        ),
        width="stretch",
    )
    st.dataframe(
        scores.rename(columns={"x": x_key, "text": "final (%) [95% interval]"}),
        hide_index=True,
        width="stretch",
    )

if metric is not None:
    values = grids.plot_frame(grid, x_key, "metric", metric=metric)
    label = mechanisms.metric_label(metric)
    if values.empty:
        st.info(f"No completed grid run logged `{metric}`.")
    else:
        st.altair_chart(
            grids.grid_chart(
                values, x_key, label, f"{label}, mean of the last {window} steps, against {x_key}"
            ),
            width="stretch",
        )
        st.dataframe(
            values.rename(columns={"x": x_key, "text": f"{label} [95% interval]"}),
            hide_index=True,
            width="stretch",
        )

with st.expander("Δ to the base, per arm (the ablation table)"):
    table = ablation.ablation_table(engine, sweep_id)
    records = table_format.ablation_records(table)
    st.dataframe(
        [{c: r[c] for c in ("arm", "parent", "n", "final", "Δ parent")} for r in records],
        hide_index=True,
        width="stretch",
    )
