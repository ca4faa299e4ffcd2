"""Sweeps: every ladder in the store, with its progress; refreshes itself while one runs."""

from __future__ import annotations

import streamlit as st

from dashboard import shaping, widgets
from db import ablation, table_format

st.title("Sweeps")
engine = widgets.store()
first = ablation.list_sweeps(engine)
if first.empty:
    st.info(widgets.NO_SWEEPS)
    st.stop()

live = widgets.live_refresh(running=bool((first["status"] == "running").any()))


@st.fragment(run_every=widgets.REFRESH_S if live else None)
def sweeps_body() -> None:
    sweeps = ablation.list_sweeps(engine).sort_values("sweep_id", ascending=False)
    frame = sweeps.assign(
        open="./?sweep=" + sweeps["sweep_id"].astype(str),
        status=sweeps["status"].map(shaping.status_badge),
        progress=sweeps["runs_done"] / sweeps["arms_total"].where(sweeps["arms_total"] > 0),
        runs=sweeps["runs_done"].astype(str) + " / " + sweeps["arms_total"].astype(str),
        best_arm=sweeps["best_arm"].fillna("—"),
        headline=sweeps["leader"].map(table_format.headline),
    )
    st.dataframe(
        frame[
            [
                "open",
                "sweep_id",
                "name",
                "preset",
                "status",
                "created_at",
                "runs",
                "progress",
                "best_arm",
                "headline",
            ]
        ],
        hide_index=True,
        width="stretch",
        column_config={
            "open": st.column_config.LinkColumn("table", display_text="open"),
            "sweep_id": st.column_config.NumberColumn("sweep", format="%d"),
            "created_at": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm"),
            "runs": "runs done / total",
            "progress": st.column_config.ProgressColumn(
                "progress", min_value=0.0, max_value=1.0, format="percent"
            ),
            "best_arm": "best arm",
            "headline": st.column_config.TextColumn("which arm leads", width="large"),
        },
    )
    st.caption(
        f"{len(sweeps)} sweep(s). The best arm is named only when the arm with the highest mean "
        "final score leads the runner-up significantly: the 95% t-interval of their difference, "
        "paired by seed, lies above 0."
    )


sweeps_body()
