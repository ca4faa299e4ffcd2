"""Ablation table: did each rung of the ladder help, by how much, and is it real?"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from dapo_common import metric_display
from dashboard import grids as grids_view
from dashboard import layout, notes, shaping, widgets
from dashboard import progress as progress_view
from db import ablation, decisions, decisions_format, efficiency, grids, reads, report, table_format
from db import annotations as ann
from db import live as in_flight

st.title("Ablation ladder")

engine = widgets.store()
picked = widgets.pick_sweep(engine)
if picked is None:
    st.stop()
sweep_id: int = int(picked)  # named once more: the fragment below is a closure mypy can't narrow

sweep = reads.sweep_details(engine, sweep_id)
notes.show(engine, ann.Target(sweep_id))
live = widgets.live_refresh(running=sweep["status"] == "running")


@st.fragment(run_every=widgets.REFRESH_S if live else None)
def ablation_body() -> None:
    table = ablation.ablation_table(engine, sweep_id)
    if table.empty:
        st.info(f"Sweep {sweep_id} has no arms.")
        return
    progress = ablation.list_sweeps(engine, sweep_id).iloc[0]  # this sweep's only
    # Progress in steps (db.live): a running run's stored steps count, not only finished runs.
    steps = in_flight.run_progress(engine, in_flight.running_runs(engine, [sweep_id]))
    done, total = int(progress["runs_done"]), int(progress["arms_total"])
    fraction = in_flight.sweep_fraction(done, total, steps, sweep_id)
    st.caption(
        f"Preset **{sweep['preset']}** · {shaping.status_badge(progress['status'])} · "
        f"{done}/{total} runs done"
        + (f" ({100 * fraction:.0f}% of the steps)" if len(steps) and fraction == fraction else "")
        + f" · {table_format.caption(table)}"
    )

    lead = progress["leader"]  # the same table's leader, computed with the progress
    if lead.best is None:
        st.info("No arm has a completed, evaluated run yet: scores appear as seeds finish.")
    else:
        # The headline names an arm only when its lead over the runner-up is significant.
        st.markdown(f"**{table_format.headline(lead)}**")
        base_arm, last_arm = str(table["arm"].iloc[0]), str(table["arm"].iloc[-1])
        last, paper = table.iloc[-1], table["paper_score"].astype(float)
        if len(table) > 1 and last["delta_base"].n > 0:
            # as text, not a big metric: one seed must not read as a certain number
            line = (
                f"**{last_arm} vs {base_arm}** (paired by seed, pp): "
                f"{table_format.estimate_text(last['delta_base'], signed=True)}"
            )
            if paper.notna().all():
                line += (
                    f" · paper (Qwen2.5-32B): {paper.iloc[-1]:.0f}% vs {paper.iloc[0]:.0f}% "
                    f"({paper.iloc[-1] - paper.iloc[0]:+.0f} pp)"
                )
            st.markdown(line)

    styled = shaping.style_ablation(table)
    # Key columns first, at widths that fit a 1440 px screen together (dashboard.layout).
    st.dataframe(
        styled,
        hide_index=True,
        width="stretch",
        column_order=layout.ablation_order(list(styled.data.columns)),
        column_config=layout.ablation_columns(shaping.number_columns(styled.data)),
    )
    if len(steps):
        st.caption("Running now: each run's last stored step and its ETA")
        progress_view.show_running(steps, key="ablation-running")
    extra = report.extras(engine, sweep_id, table)
    st.caption(extra["protocol"])
    comparisons_view(table, extra)
    # Five Δs at 5% each: some star may be noise. The same note as `dapo table --holm`.
    if st.checkbox(
        "Holm",
        key="ablation-holm",
        help="Correct the Δ parent stars for testing every arm at once (Holm's step-down, "
        "family-wise 5%): how many the table starred, and which stars it takes away.",
    ):
        st.caption(ablation.holm_note(ablation.holm_stars(table)))
    with st.expander("Sample efficiency"):
        efficiency_view(table)
    # Where to look next: whether each arm's mechanism acted, and a grid's points against
    # the swept value (links keep the sweep).
    more = f"[Mechanisms](mechanisms?sweep={sweep_id}): did each arm's change move its own metric?"
    if grids.grid_keys(engine, sweep_id):
        more += f" · [Grid](grid?sweep={sweep_id}): the score against the swept value."
    st.markdown(more)
    st.download_button(
        "Download CSV",
        table_format.render(table, "csv"),
        file_name=f"ablation-sweep{sweep_id}.csv",
        mime="text/csv",
        icon=":material/download:",
        help="Every number of the table with its 95% interval (_low / _high) and n; for one "
        "seed, also an interval over eval problems (problem sampling only).",
    )

    points = shaping.score_points(table)
    if not points.empty:
        order = shaping.ladder_order(table)
        summary = shaping.score_summary(table)
        # A grid's points by what varies ('clip_high=0.24'), not by names cut to one prefix.
        labels = grids_view.arm_labels(sweep.get("ladder"))
        if labels:
            points = points.assign(arm=points["arm"].map(lambda a: labels.get(a, a)))
            summary = summary.assign(arm=summary["arm"].map(lambda a: labels.get(a, a)))
            order = [labels.get(a, a) for a in order]
        x = alt.X("arm:N", sort=order, title=None, axis=alt.Axis(labelAngle=0, labelLimit=240))
        score = metric_display.held_out(
            int(table["eval_k"].dropna().iloc[0]) if table["eval_k"].notna().any() else None
        )
        y = alt.Y("mean (%):Q", title=score, scale=alt.Scale(domain=[0, 100]))
        bars = alt.Chart(summary).mark_bar(opacity=0.45, color="#4c78a8").encode(x=x, y=y)
        interval = (
            alt.Chart(summary.dropna(subset=["low", "high"]))
            .mark_errorbar(ticks={"size": 14}, thickness=2, color="#1f3b57")
            .encode(x=x, y=alt.Y("low:Q", title=score), y2="high:Q", tooltip=["arm", "final"])
        )
        start = (
            alt.Chart(summary.dropna(subset=["start (%)"]))
            .mark_tick(color="#e45756", thickness=2, size=30)
            .encode(x=x, y="start (%):Q", tooltip=["arm", "start (%)"])
        )
        seeds = (
            alt.Chart(points)
            .mark_circle(size=55, color="#1f3b57")
            .encode(x=x, y="score (%):Q", tooltip=["arm", "seed", "score (%)"])
        )
        layers = bars + interval + start + seeds
        paired = st.checkbox(
            "Pair the seeds",
            key="ablation-paired",
            help="A line per seed across the arms: a paired Δ is about these lines' slopes, "
            "not about how far apart the dots of two arms spread.",
        )
        if paired:
            lines = (
                alt.Chart(points.assign(order=points["arm"].map(order.index)))
                .mark_line(opacity=0.45, strokeWidth=1.2, color="#1f3b57")
                .encode(x=x, y="score (%):Q", detail="seed:N", order="order:Q")
            )
            layers = layers + lines
        st.altair_chart(
            layers.properties(
                height=260,
                title="Final score per arm: bar = mean, whisker = 95% interval over seeds "
                "(none for n=1), dots = seeds"
                + (", lines = the same seed" if paired else "")
                + ", red tick = starting model",
            ),
            width="stretch",
        )


def comparisons_view(table: pd.DataFrame, extra: dict[str, Any]) -> None:
    """How sure each Δ is: `dapo table`'s comparisons (exact p, MDE, seeds needed, P(A>B), the
    verdict, an adaptive sweep's decisions), with the effect to plan for typed in."""
    st.subheader("How sure is each difference")
    effect = st.number_input(
        "Plan for an effect of (pp)",
        min_value=0.1,
        max_value=100.0,
        value=None,
        step=0.5,
        key="ablation-effect",
        placeholder="e.g. 3: how many seeds would detect 3 pp",
        help="The seeds a comparison would need to detect this effect with 80% power at 5% "
        "(`dapo table --effect`).",
    )
    comps = decisions.comparisons(
        table,
        planned=extra.get("planned", ()),
        effect=None if effect is None else effect / 100.0,
        sequential=extra.get("sequential"),
        running=bool(extra.get("running")),
    )
    if not comps:
        st.caption("One arm: nothing to compare.")
        return
    frame = pd.DataFrame(decisions_format.records(comps))
    st.dataframe(frame, hide_index=True, width="stretch")
    st.caption(
        decisions_format.CAPTION
        + (f". {decisions_format.SEQUENTIAL_CAPTION}" if "until decided" in frame else "")
    )


def efficiency_view(table: pd.DataFrame) -> None:
    """`dapo table --efficiency`'s two tables: the area under the held-out curve, and the
    gradient updates and tokens to a threshold (the default one unless a score is given)."""
    st.caption(ablation.efficiency_caption(table))
    st.dataframe(pd.DataFrame(ablation.efficiency_records(table)), hide_index=True)
    asked = st.number_input(
        "Threshold (%)",
        min_value=0.0,
        max_value=100.0,
        value=None,
        step=1.0,
        key="ablation-threshold",
        placeholder="default: midway from the start to the best arm",
        help="The held-out score whose first reaching is timed, in percent as the table shows "
        "scores (`dapo table --threshold`).",
    )
    found = efficiency.reach(engine, sweep_id, table, None if asked is None else asked / 100.0)
    if found is None:
        st.info("No step-0 evaluation or final score yet: no threshold to time.")
        return
    st.caption(efficiency.reach_caption(found))
    st.dataframe(pd.DataFrame(efficiency.reach_records(found)), hide_index=True)


ablation_body()

runs = reads.runs_of_sweep(engine, sweep_id)
arm_rank = {str(a): i for i, a in enumerate(sweep["arms"])}.get  # the ladder's order
with st.expander("Runs of this sweep"):
    if runs.empty:
        st.caption("No runs yet.")
    else:
        listed = (
            notes.with_run_annotations(runs, engine, sweep_id)
            .assign(
                page="run?run=" + runs["run_id"].astype(str),
                status=runs["status"].map(shaping.status_badge),
                error=runs["error"].fillna(""),
            )
            .sort_values(
                ["arm", "seed", "attempt"], key=lambda c: c.map(arm_rank) if c.name == "arm" else c
            )
        )
        columns = ["page", "arm", "seed", "attempt", "status", "tags", "note", "steps", "wall_s"]
        st.dataframe(
            listed[[*columns, "error"]],
            hide_index=True,
            width="stretch",
            column_config={
                "page": st.column_config.LinkColumn("run", display_text=r"run\?run=(\d+)")
            },
        )

with st.expander("Tags and note of this sweep"):
    notes.editor(engine, ann.Target(sweep_id), key="ablation-notes")
    st.caption("A run's own tags and note are on its page (Run).")

with st.expander("Rerun an arm"):
    seeds = sorted({int(s) for s in runs["seed"]}) if not runs.empty else []
    if not seeds:
        st.caption("Nothing to rerun yet.")
    else:
        c1, c2 = st.columns(2)
        arm = c1.selectbox("Arm", list(sweep["arms"]), key="rerun-arm")
        seed = c2.selectbox("Seed", seeds, key="rerun-seed")
        widgets.rerun_box(sweep_id, str(arm), int(seed), key="ablation-rerun")
