"""Run page: one attempt of one (arm, seed) — what it changed, how it went (its progress while
it trains, its own curves), how to rerun it."""

from __future__ import annotations

import streamlit as st

from dapo_common.util import duration
from dashboard import configs, notes, progress, run_curves, shaping, widgets
from db import annotations as ann
from db import live as in_flight
from db import reads, run_index, table_format, tracker_status

st.title("Run")
engine = widgets.store()
run_id = widgets.pick_run(engine, key="run-page-run", param="run")
if run_id is None:
    st.stop()
run = reads.run_details(engine, run_id)

st.subheader(f"{run['arm']} · seed {run['seed']} · attempt {run['attempt']}")
target = ann.Target(int(run["sweep_id"]), run_id)
notes.show(engine, target)
# The status as a line of its own: a metric tile cut "✔ completed" to "✔ comple…" at 1440 px.
st.markdown(f"**Status:** {shaping.status_badge(run['status'])}")
cols = st.columns(4)
cols[0].metric("steps", "—" if run["steps"] is None else f"{int(run['steps']):,}")
cols[1].metric(
    "grad updates", "—" if run["grad_updates"] is None else f"{int(run['grad_updates']):,}"
)
cols[2].metric("tokens", "—" if run["tokens"] is None else f"{int(run['tokens']):,}")
cols[3].metric("wall time", duration(run["wall_s"], compact=True, missing=table_format.MISSING))
if run["status"] == "running":
    # how far it is, from the steps it has stored (db.live), and when it should end
    progress.show_running(in_flight.run_progress(engine, [run_id]), key="run-progress")

if run["status"] == "failed":
    error = str(run.get("error") or "no error message recorded")
    st.error(f"This run failed: {error.strip().splitlines()[-1] if error.strip() else error}")
    with st.expander("Full error"):
        st.code(error, language=None)

st.markdown(
    f"Sweep `{run['sweep_id']}` · host `{run.get('host') or '—'}` · config hash "
    f"`{run['config_hash']}` · started {shaping.format_time(run.get('started_at'))} · "
    f"finished {shaping.format_time(run.get('finished_at'))}"
)
st.markdown(f"Checkpoint dir: `{run.get('checkpoint_dir') or 'none recorded'}`")
reached = tracker_status.of_runs(engine, [run_id]).get(int(run_id))
if reached:  # the trackers of run.loggers: which the run reached, and where (db.tracker_status)
    st.markdown("Trackers: " + tracker_status.run_line(reached, markdown=True))
widgets.show_flow_run_link(run.get("flow_run_id"))

st.subheader("What this arm changes")
previous = reads.previous_arm_run(engine, run_id)
if previous is None:
    st.info(
        "No completed run of the previous arm with this seed in this sweep "
        "(this is the first arm, or its predecessor has not finished)."
    )
else:
    before = reads.run_details(engine, previous)
    left, right = f"{before['arm']} (run {previous})", f"{run['arm']} (run {run_id})"
    diff = configs.config_diff(before["config"], run["config"], left, right)
    if diff.empty:
        st.info(f"Same config as {left}.")
    else:
        st.dataframe(diff, hide_index=True, width="stretch")
with st.expander("Tags and note of this run"):
    notes.editor(engine, target, key="run-notes")
with st.expander("Full config"):
    st.json(run["config"], expanded=False)

st.subheader("Evaluations")
evals = reads.evaluations(engine, run_id)
if evals.empty:
    st.info(
        "No evaluations for this run yet: a run scores its starting model (step 0) first, "
        "then every data.eval_every steps and at its last step."
    )
else:
    shown = evals.copy()
    for column in ("avg_at_k", "pass_at_k", "cons_at_k"):
        shown[column] = shown[column] * 100.0
    st.dataframe(
        shown,
        hide_index=True,
        width="stretch",
        column_config=widgets.EVAL_SCORE_COLUMNS,
    )

st.subheader("Curves of this run")
this = run_index.run_index(engine, [run_id])
run_curves.draw(
    engine, this, {run_id: f"{run['arm']} s{run['seed']}"}, key="run-curves", n_title="runs"
)

if run["sweep_id"] is not None:
    st.subheader("Attempts of this arm")
    attempts = reads.arm_attempts(engine, int(run["sweep_id"]), str(run["arm"]))
    if not attempts.empty and "status" in attempts:
        attempts = attempts.assign(status=attempts["status"].map(shaping.status_badge))
    if not attempts.empty and "error" in attempts:  # an empty cell, not "None"
        attempts = attempts.assign(error=attempts["error"].fillna("").map(str))
    wanted = ["run_id", "seed", "attempt", "status", "started_at", "finished_at", "wall_s"]
    wanted += ["steps", "error", "config_hash"]
    st.dataframe(
        attempts[[c for c in wanted if c in attempts.columns]],
        hide_index=True,
        width="stretch",
        column_config={
            "started_at": st.column_config.DatetimeColumn("started", format="YYYY-MM-DD HH:mm:ss"),
            "finished_at": st.column_config.DatetimeColumn(
                "finished", format="YYYY-MM-DD HH:mm:ss"
            ),
            "wall_s": st.column_config.NumberColumn("wall (s)", format="%.0f"),
        },
    )
    st.subheader("Rerun")
    widgets.rerun_box(int(run["sweep_id"]), str(run["arm"]), int(run["seed"]), key="run-rerun")
