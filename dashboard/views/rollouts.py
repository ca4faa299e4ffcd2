"""Rollouts: what the policy actually wrote at a step, and how the reward was made up."""

from __future__ import annotations

import streamlit as st

from dashboard import rollouts, widgets
from db import reads

st.title("Rollouts")
engine = widgets.store()
run_id = widgets.pick_run(engine, key="rollout-run", param="run")
if run_id is None:
    st.stop()

every = reads.samples(engine, run_id, limit=100_000)
if every.empty:
    st.info(f"Run {run_id} has no sampled rollouts stored yet.")
    st.stop()

steps = sorted(int(s) for s in every["step"].unique())
c1, c2 = st.columns([1, 2])
step = c1.selectbox("Step", steps, index=len(steps) - 1, key="rollout-step")
which = c2.radio("Show", list(rollouts.FILTERS), horizontal=True, key="rollout-filter")
shown = reads.samples(engine, run_id, step=int(step), **rollouts.FILTERS[which])

at_step = every[every["step"] == step]
st.caption(rollouts.step_summary(at_step))
if shown.empty:
    st.info(f"No {which.lower()} samples at step {step}.")
    st.stop()

st.dataframe(
    rollouts.reward_table(shown),
    hide_index=True,
    width="stretch",
    column_config={"correct": st.column_config.CheckboxColumn("correct")},
)
for _, sample in shown.iterrows():
    with st.expander(rollouts.sample_title(sample)):
        st.markdown("**Prompt**")
        st.text(sample["prompt"])
        st.markdown("**Response**")
        st.text(sample["response"])
        # Model output and data as text: a backtick in them would end Markdown's code span
        # and let the rest render (links, images fetched from anywhere).
        st.text(f"ground truth: {sample['ground_truth']}\npredicted: {sample['pred']}")
        st.caption(rollouts.reward_text(sample))
