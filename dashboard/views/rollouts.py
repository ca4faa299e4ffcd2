"""Rollouts: what the policy actually wrote at a step, and how the reward was made up."""

from __future__ import annotations

import streamlit as st

from dashboard import rollouts, token_colours, widgets
from db import reads

PER_ROW = 4  # responses side by side in the group view
RESPONSES_PER_PAGE = 32  # the group view shows as many whole groups a page as this allows
TABLE_ROWS = 6  # a group's table shows this many rows, the rest a scroll away

st.title("Rollouts")
engine = widgets.store()
run_id = widgets.pick_run(engine, key="rollout-run", param="run")
if run_id is None:
    st.stop()

# The steps from their keys, then one step's rows: not every stored rollout of the run (whole
# groups a step make that thousands of texts on a long run).
steps = reads.sample_steps(engine, run_id)
if not steps:
    st.info(f"Run {run_id} has no sampled rollouts stored yet.")
    st.stop()

c1, c2, c3 = st.columns([1, 1, 2])
step = c1.selectbox("Step", steps, index=len(steps) - 1, key="rollout-step")
view = c2.radio("View", ["Responses", "Groups"], horizontal=True, key="rollout-view")
at_step = reads.samples(engine, run_id, step=int(step), limit=None)
st.caption(rollouts.step_summary(at_step))

if view == "Groups":
    # GRPO's unit of comparison: a prompt's responses side by side, each with the advantage
    # the update gave it. A few groups a page, each response in a box that scrolls: 16 groups
    # of G = 16 once made a page of 12,833 px.
    size = rollouts.group_size(reads.run_details(engine, run_id)["config"])
    groups = rollouts.group_frames(reads.sample_groups(engine, run_id, step))
    kinds = [rollouts.group_kind(g, size) for g in groups]
    f1, f2 = st.columns([3, 1])
    wanted = f1.radio(
        "Groups",
        list(rollouts.GROUP_FILTERS),
        horizontal=True,
        key="rollout-group-filter",
        help="Mixed: right and wrong responses, the groups with a learning signal (dynamic "
        "sampling keeps only these); all right / all wrong: every response of the group stored "
        "and alike (its advantages are 0).",
    )
    kind = rollouts.GROUP_FILTERS[str(wanted)]
    shown = [g for g, k in zip(groups, kinds, strict=True) if kind is None or k == kind]
    largest = max([size or 0, *(len(g) for g in groups)])
    per_page = max(1, RESPONSES_PER_PAGE // max(largest, 1))  # 2 groups of 16, 4 of 8
    pages = max(1, -(-len(shown) // per_page))
    page = int(
        f2.number_input(
            f"Page (of {pages})", min_value=1, max_value=pages, value=1, key="rollout-group-page"
        )
    )
    st.caption(
        f"{rollouts.groups_summary(kinds)}. Responses of each prompt side by side; A is the "
        "group-relative advantage the update used (— where the trainer did not record it, or "
        "did not train on the group)."
    )
    if not shown:
        st.info(f"No {str(wanted).lower()} group stored at step {step}.")
        st.stop()
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
    first = (min(page, pages) - 1) * per_page
    for i, group in enumerate(shown[first : first + per_page], start=first):
        st.markdown(f"**{rollouts.group_title(group, size)}**")
        st.text(f"prompt: {group.iloc[0]['prompt']}")
        st.dataframe(
            rollouts.group_table(group),
            hide_index=True,
            width="stretch",
            height=35 * (min(len(group), TABLE_ROWS) + 1) + 3,
            key=f"rollout-group-{i}",
            column_config={
                "correct": st.column_config.CheckboxColumn("correct"),
                "truncated": st.column_config.CheckboxColumn("truncated"),
                "advantage": st.column_config.TextColumn("advantage", help="group-relative"),
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
                    column.markdown(rollouts.plain_html(sample["response"]), unsafe_allow_html=True)
                else:
                    html = token_colours.response_html(record, mode, entropy_scale=scale)
                    column.markdown(rollouts.boxed(html), unsafe_allow_html=True)
    if pages > 1:
        st.caption(f"Groups {first + 1}-{min(first + per_page, len(shown))} of "
                   f"{len(shown)}: the next ones are on page {min(page + 1, pages)}.")  # fmt: skip
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
