"""Sweeps: every ladder in the store, with its progress, tags and note; refreshes itself while
one runs. Hidden (trial) sweeps are listed only with the sidebar's "Show hidden sweeps" on."""

from __future__ import annotations

import streamlit as st

from dashboard import layout, notes, progress, shaping, widgets
from db import ablation, table_format
from db import annotations as ann
from db import live as in_flight

st.title("Sweeps")
engine = widgets.store()
first = ablation.sweep_choices(engine)  # is there any, is one running: not every table
if first.empty:
    st.info(widgets.NO_SWEEPS)
    st.stop()

live = widgets.live_refresh(running=bool((first["status"] == "running").any()))
shown_hidden = notes.show_hidden()
# Each listed sweep's progress and leader come from its ablation table, computed once per
# dashboard process (then kept while nothing under it changes): listing only the newest few
# keeps a first load's cost to what is shown, not to every sweep the store holds.
PAGE_SIZES = {"25 newest": 25, "100 newest": 100, "all": None}
size = PAGE_SIZES[st.selectbox("Sweeps listed", list(PAGE_SIZES), key="sweeps-listed", width=160)]


@st.fragment(run_every=widgets.REFRESH_S if live else None)
def sweeps_body() -> None:
    ids = sorted((int(i) for i in ablation.sweep_choices(engine)["sweep_id"]), reverse=True)
    listable = notes.visible(ids, ann.hidden_sweeps(engine), show=shown_hidden)
    page = listable[:size] if size is not None else listable
    sweeps = notes.with_sweep_annotations(ablation.list_sweeps(engine, among=page), engine)
    sweeps = sweeps.sort_values("sweep_id", ascending=False)
    # Progress in steps: the running runs' last stored step counts, not only finished runs
    # (db.live: a read per running run, whatever the store holds).
    steps = in_flight.run_progress(engine, in_flight.running_runs(engine, page))
    running = steps.groupby("sweep_id").size() if not steps.empty else {}
    frame = sweeps.assign(
        open="./?sweep=" + sweeps["sweep_id"].astype(str),
        status=sweeps["status"].map(shaping.status_badge),
        progress=[
            in_flight.sweep_fraction(int(done), int(total), steps, int(sweep_id))
            for done, total, sweep_id in zip(
                sweeps["runs_done"], sweeps["arms_total"], sweeps["sweep_id"], strict=True
            )
        ],
        runs=[
            f"{int(done)} / {int(total)}"
            + (f" · {int(running[int(i)])} running" if int(i) in running else "")
            for done, total, i in zip(
                sweeps["runs_done"], sweeps["arms_total"], sweeps["sweep_id"], strict=True
            )
        ],
        best_arm=sweeps["best_arm"].fillna("—"),
        headline=sweeps["leader"].map(table_format.headline),
    )
    if shown_hidden:  # say which of the listed ones are hidden
        frame = frame.assign(name=[f"{n} (hidden)" if h else n for n, h in zip(
            frame["name"], frame["hidden"], strict=True)])  # fmt: skip
    st.dataframe(
        frame[layout.SWEEP_ORDER],
        hide_index=True,
        width="stretch",
        column_order=layout.SWEEP_ORDER,
        column_config=layout.sweep_columns(),
    )
    left_out = len(ids) - len(listable)
    st.caption(
        f"{len(sweeps)} sweep(s)"
        + (
            f" of {len(listable)}, the newest (Sweeps listed: more)"
            if len(page) < len(listable)
            else ""
        )
        + (
            f", {left_out} hidden (Show hidden sweeps, in the sidebar, lists them)"
            if left_out
            else ""
        )
        + ". The best arm is named only when the arm with the highest mean final score leads the "
        "runner-up significantly: the exact paired sign-flip test of their difference over "
        "seeds gives p < 0.05 (which takes at least 6 seeds)."
    )
    if not steps.empty:
        st.markdown("**Running now**")
        progress.show_running(steps, key="sweeps-running")


sweeps_body()

with st.expander("Tags, note, hide"):
    ids = [int(s) for s in first.sort_values("sweep_id", ascending=False)["sweep_id"]]
    hidden_now = ann.hidden_sweeps(engine)
    ids = notes.visible(ids, hidden_now, show=shown_hidden)
    names = dict(zip(first["sweep_id"].astype(int), first["name"], strict=True))
    if ids:
        picked = st.selectbox(
            "Sweep", ids, format_func=lambda i: f"#{i} · {names[i]}", key="sweeps-annotate"
        )
        notes.editor(engine, ann.Target(int(picked)), key="sweeps-notes")
    st.caption("Or from a terminal: `dapo tag --sweep ID TAG`, `dapo note --sweep ID TEXT`, "
               "`dapo sweep hide ID`.")  # fmt: skip
