"""Ablation table: did each rung of the ladder help, by how much, across seeds?"""

from __future__ import annotations

import math

import altair as alt
import streamlit as st

from dashboard import shaping, widgets
from db import queries

st.title("Ablation ladder")

engine = widgets.store()
sweep_id = widgets.pick_sweep(engine)
if sweep_id is None:
    st.stop()

sweeps = queries.list_sweeps(engine)
sweep = sweeps[sweeps["sweep_id"] == sweep_id].iloc[0]
live = widgets.live_refresh(running=sweep["status"] == "running")


@st.fragment(run_every=widgets.REFRESH_S if live else None)
def ablation_body() -> None:
    table = queries.ablation_table(engine, sweep_id)
    if table.empty:
        st.info(f"Sweep {sweep_id} has no arms.")
        return
    runs_done = queries.list_sweeps(engine).set_index("sweep_id").loc[sweep_id]
    dataset = table["eval_dataset"].dropna()
    k = table["eval_k"].dropna()
    metric = f"{dataset.iloc[0]} avg@{int(k.iloc[0])}" if len(dataset) and len(k) else "avg@k"
    st.caption(
        f"Preset **{sweep['preset']}** · {shaping.status_badge(runs_done['status'])} · "
        f"{int(runs_done['runs_done'])}/{int(runs_done['arms_total'])} runs done · "
        f"scores: final {metric} in %, mean ± std over seeds, Δ in percentage points · "
        f"paper: Table 1 (AIME 2024 avg@32, Qwen2.5-32B)"
    )

    display = shaping.ablation_display(table)
    means = [shaping.to_pct(v) for v in table["score_mean"]]
    scored = [(m, a) for m, a in zip(means, table["arm"], strict=True) if not math.isnan(m)]
    cols = st.columns(3)
    if scored:
        best_score, best = max(scored)
        cols[0].metric("Best arm", best, f"{best_score:.1f}%", delta_color="off", delta_arrow="off")
        base_arm, last_arm = table["arm"].iloc[0], table["arm"].iloc[-1]
        last_delta = shaping.to_pct(table["delta_base"].iloc[-1])
        if not math.isnan(last_delta):
            cols[1].metric(
                f"{last_arm} vs {base_arm}",
                f"{means[-1]:.1f}%",
                f"{last_delta:+.1f} pp",
            )
        paper = table["paper_score"].astype(float)
        if paper.notna().all() and len(paper) > 1:
            cols[2].metric(
                f"Paper (Qwen2.5-32B): {last_arm} vs {base_arm}",
                f"{paper.iloc[-1]:.0f}%",
                f"{paper.iloc[-1] - paper.iloc[0]:+.0f} pp",
            )
    else:
        st.info("No arm has a completed, evaluated run yet: scores appear as seeds finish.")

    right = {
        column: st.column_config.TextColumn(column, alignment="right")
        for column in [*shaping.numeric_columns(display), shaping.MEAN_STD, "time"]
    }
    st.dataframe(
        shaping.style_ablation(display),
        hide_index=True,
        width="stretch",
        column_config={
            **right,
            "arm": st.column_config.TextColumn("arm", pinned=True),
            "adds": st.column_config.TextColumn("adds", width="medium"),
        },
    )
    st.download_button(
        "Download CSV",
        shaping.ablation_csv(table),
        file_name=f"ablation-sweep{sweep_id}.csv",
        mime="text/csv",
        icon=":material/download:",
    )

    points = shaping.score_points(table)
    if not points.empty:
        order = shaping.ladder_order(table)
        summary = shaping.score_summary(table)
        x = alt.X("arm:N", sort=order, title=None, axis=alt.Axis(labelAngle=0))
        bars = (
            alt.Chart(summary)
            .mark_bar(opacity=0.55, color="#4c78a8")
            .encode(x=x, y=alt.Y("mean (%):Q", title="score (%)"))
        )
        spread = alt.Chart(summary).mark_rule(strokeWidth=2).encode(x=x, y="low:Q", y2="high:Q")
        seeds = (
            alt.Chart(points)
            .mark_circle(size=55, color="#1f3b57")
            .encode(x=x, y="score (%):Q", tooltip=["arm", "seed", "score (%)"])
        )
        st.altair_chart(
            (bars + spread + seeds).properties(
                height=240, title="Final score per arm: mean ± std over seeds, dots are seeds"
            ),
            width="stretch",
        )


ablation_body()

with st.expander("Runs of this sweep"):
    runs = queries.runs_of_sweep(engine, sweep_id)
    if runs.empty:
        st.caption("No runs yet.")
    else:
        runs = runs.assign(
            page="run?run=" + runs["run_id"].astype(str),
            status=runs["status"].map(shaping.status_badge),
        )
        st.dataframe(
            runs[["page", "arm", "seed", "attempt", "status", "steps", "wall_s", "error"]],
            hide_index=True,
            width="stretch",
            column_config={
                "page": st.column_config.LinkColumn("run", display_text=r"run\?run=(\d+)")
            },
        )

with st.expander("Rerun an arm"):
    table = queries.ablation_table(engine, sweep_id)
    runs = queries.runs_of_sweep(engine, sweep_id)
    seeds = sorted({int(s) for s in runs["seed"]}) if not runs.empty else []
    if table.empty or not seeds:
        st.caption("Nothing to rerun yet.")
    else:
        c1, c2 = st.columns(2)
        arm = c1.selectbox("Arm", list(table["arm"]), key="rerun-arm")
        seed = c2.selectbox("Seed", seeds, key="rerun-seed")
        widgets.rerun_box(sweep_id, str(arm), int(seed), key="ablation-rerun")
