"""Compare: any two runs side by side — config diff, final metrics, evaluations."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import configs, curves, widgets
from db import reads

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
long = reads.metric_curves(engine, [run_a, run_b])
finals = curves.final_values(long, [run_a, run_b], [name_a, name_b])
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
