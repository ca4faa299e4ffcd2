"""Compare: any two runs side by side — config diff, final metrics, evaluations and curves, in
the units the tables use. Runs of several sweeps together: the Runs page."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import configs, curves, run_curves, widgets
from db import ablation, reads, run_index

st.title("Compare two runs")
engine = widgets.store()
if ablation.sweep_choices(engine).empty:  # said once here, not once per picker
    st.info(widgets.NO_SWEEPS)
    st.stop()
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
    # in each metric's shown unit (a share in %, its difference in pp), as every table shows it
    st.dataframe(
        curves.final_text(finals, name_a, name_b),
        hide_index=True,
        width="stretch",
        column_config={"metric": st.column_config.TextColumn("metric", width="medium")},
    )
    st.caption("Each metric at its own last logged step; shares in %, their B − A in pp.")

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
        column_config=widgets.EVAL_SCORE_COLUMNS,
    )

st.subheader("Curves")
both_runs = run_index.run_index(engine, [run_a, run_b])
lines = {run_a: name_a, run_b: name_b}
run_curves.draw(engine, both_runs, lines, key="compare-curves")
st.markdown(
    "Runs of several sweeps on one chart, grouped by any config key with their seeds in a "
    "band: the [Runs](runs) page."
)
