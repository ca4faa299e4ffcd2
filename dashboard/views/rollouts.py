"""Rollouts: what the policy actually wrote at a step, and how the reward was made up."""

from __future__ import annotations

import streamlit as st

from dashboard import rollouts, token_colours, widgets
from db import reads

PER_ROW = 4  # responses side by side in the group view

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
c1, c2, c3 = st.columns([1, 1, 2])
step = c1.selectbox("Step", steps, index=len(steps) - 1, key="rollout-step")
view = c2.radio("View", ["Responses", "Groups"], horizontal=True, key="rollout-view")
at_step = every[every["step"] == step]
st.caption(rollouts.step_summary(at_step))

if view == "Groups":
    # GRPO's unit of comparison: a prompt's responses side by side, each with the advantage
    # the update gave it (the filter is off here: a group is read whole).
    size = rollouts.group_size(reads.run_details(engine, run_id)["config"])
    st.caption(
        "Responses of each prompt side by side; A is the group-relative advantage the update "
        "used (— where the trainer did not record it, or did not train on the group)."
    )
    tokens = reads.sample_tokens(engine, run_id, step)
    mode = "ratio"
    if tokens:
        mode = st.radio(
            "Colour tokens by",
            list(token_colours.MODES),
            format_func=token_colours.MODES.__getitem__,
            horizontal=True,
            key="rollout-token-colour",
        )
    else:
        st.caption(rollouts.NO_TOKENS)
    for i, group in enumerate(rollouts.group_frames(reads.sample_groups(engine, run_id, step))):
        st.markdown(f"**{rollouts.group_title(group, size)}**")
        st.text(f"prompt: {group.iloc[0]['prompt']}")
        st.dataframe(
            rollouts.group_table(group),
            hide_index=True,
            width="stretch",
            key=f"rollout-group-{i}",
            column_config={
                "correct": st.column_config.CheckboxColumn("correct"),
                "truncated": st.column_config.CheckboxColumn("truncated"),
                "advantage": st.column_config.NumberColumn("advantage", format="%+.3f"),
            },
        )
        records = rollouts.group_tokens(group, tokens)
        scale = token_colours.entropy_scale(records.values())
        if records:
            st.markdown(
                token_colours.legend_html(mode, entropy_scale=scale), unsafe_allow_html=True
            )
        members = [sample for _, sample in group.iterrows()]
        for at in range(0, len(members), PER_ROW):  # rows of PER_ROW, so G = 16 stays legible
            row = members[at : at + PER_ROW]
            for column, sample in zip(st.columns(PER_ROW), row, strict=False):
                column.caption(rollouts.response_caption(sample))
                record = records.get(int(sample["idx"]))
                if record is None:
                    column.text(sample["response"])
                else:
                    html = token_colours.response_html(record, mode, entropy_scale=scale)
                    column.markdown(html, unsafe_allow_html=True)
    st.stop()

which = c3.radio("Show", list(rollouts.FILTERS), horizontal=True, key="rollout-filter")
shown = reads.samples(engine, run_id, step=int(step), **rollouts.FILTERS[which])
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
