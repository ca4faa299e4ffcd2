"""Progress while runs train: db.live's rows as a table a researcher reads at a glance.

One colour for progress everywhere (PROGRESS_COLOUR): a bar says how far, never whether it went
well (a failed run says so in its status, with its glyph); Streamlit's default bar colour is its
red primary colour, which reads as failure on a finished run.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dapo_common.util import duration

PROGRESS_COLOUR = "green"
RUNNING_ORDER = ["run", "sweep_id", "arm", "seed", "attempt", "progress", "steps_text", "pace"]
RUNNING_ORDER += ["eta", "reported"]


def progress_column(label: str = "progress", **kwargs: Any) -> Any:
    """A 0..1 progress bar in percent, in PROGRESS_COLOUR."""
    return st.column_config.ProgressColumn(
        label, min_value=0.0, max_value=1.0, format="percent", color=PROGRESS_COLOUR, **kwargs
    )


def step_text(step: Any, steps: Any) -> str:
    """'12 / 20' ('12 / ?' when the run's config does not say how many)."""
    total = "?" if steps is None or steps != steps else f"{int(steps):,}"
    return f"{int(step):,} / {total}"


def pace_text(step_s: Any) -> str:
    """'3.0 s/step' ('—' before a step has been stored)."""
    return "—" if step_s is None or step_s != step_s else f"{float(step_s):.1f} s/step"


def age_text(when: Any, now: pd.Timestamp | None = None) -> str:
    """How long ago a run last wrote to the store: '12s ago', '3m 05s ago'."""
    if when is None or pd.isna(when):
        return "—"
    now = now if now is not None else pd.Timestamp.now(tz="UTC")
    return duration((now - pd.Timestamp(when)).total_seconds(), compact=True) + " ago"


def running_frame(progress: pd.DataFrame, now: pd.Timestamp | None = None) -> pd.DataFrame:
    """db.live.run_progress's rows as RUNNING_ORDER's columns: a link to the run's page, its
    bar, 'step / steps', the pace, the ETA and when it last reported."""
    if progress.empty:
        return pd.DataFrame(columns=RUNNING_ORDER)
    return pd.DataFrame(
        {
            "run": "run?run=" + progress["run_id"].astype(str),
            "sweep_id": progress["sweep_id"].astype(int),
            "arm": progress["arm"],
            "seed": progress["seed"].astype(int),
            "attempt": progress["attempt"].astype(int),
            "progress": progress["fraction"].astype(float),
            "steps_text": [
                step_text(a, b) for a, b in zip(progress["step"], progress["steps"], strict=True)
            ],
            "pace": progress["step_s"].map(pace_text),
            "eta": progress["eta_s"].map(lambda s: duration(s, compact=True, missing="—")),
            "reported": progress["updated_at"].map(lambda t: age_text(t, now)),
        }
    )[RUNNING_ORDER]


def running_columns() -> dict[str, Any]:
    return {
        "run": st.column_config.LinkColumn("run", display_text=r"run\?run=(\d+)", width=60),
        "sweep_id": st.column_config.NumberColumn("sweep", format="%d", width=60),
        "arm": st.column_config.TextColumn("arm", width=170),
        "seed": st.column_config.NumberColumn("seed", format="%d", width=50),
        "attempt": st.column_config.NumberColumn("attempt", format="%d", width=65),
        "progress": progress_column(width=150),
        "steps_text": st.column_config.TextColumn("step", width=90),
        "pace": st.column_config.TextColumn(
            "pace", help="mean time of the last 10 stored steps", width=90
        ),
        "eta": st.column_config.TextColumn(
            "ETA",
            help="the steps left × the pace; evaluations are not counted",
            width=80,
        ),
        "reported": st.column_config.TextColumn(
            "last report", help="when the run last wrote to the store", width=100
        ),
    }


def show_running(progress: pd.DataFrame, *, key: str) -> None:
    """The running runs' table (nothing when none runs)."""
    running = progress[progress["status"] == "running"] if not progress.empty else progress
    if running.empty:
        return
    st.dataframe(
        running_frame(running),
        hide_index=True,
        width="stretch",
        column_order=RUNNING_ORDER,
        column_config=running_columns(),
        key=key,
    )
    st.caption(
        "Each running run's last stored step, out of its run.steps, as the trainer writes "
        "them; ETA = steps left × the mean step time of the last 10 steps (evaluations not "
        "counted)."
    )
