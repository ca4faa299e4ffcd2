"""Runs: every run of every sweep in one table (filter, sort, pick columns), and the curves of
any of them, grouped by any config key with the seeds folded into a band (W&B's "group by")."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dapo_common import metric_display
from dashboard import grids, notes, progress, run_curves, run_table, shaping, widgets
from db import live as in_flight
from db import reads, run_index

MAX_PLOTTED = 48  # runs whose curves are read and drawn at most (the table's first, or picked)
LINES_BY_DEFAULT = 12  # more runs than this are grouped by arm unless asked otherwise
MAX_CONFIG_COLUMNS = 8  # config columns shown by default: the keys that vary, first ones

st.title("Runs")
engine = widgets.store()
index = run_index.run_index(engine)
if index.empty:
    st.info(widgets.NO_SWEEPS)
    st.stop()
if not notes.show_hidden():
    index = index[~index["hidden"]]
configs = run_index.run_configs(engine, [int(r) for r in index["run_id"]])

# --- what to list -------------------------------------------------------------------------
c1, c2, c3, c4 = st.columns([2, 2, 1, 1])
where_text = c1.text_input(
    "Filter",
    key="runs-filter",
    placeholder="algo.clip_high>=0.24 final>40 tags=baseline",
    help="Conditions key op value (=, !=, >=, <=, >, <), apart by spaces or commas: any dotted "
    "config key, or a column (final and start in %, seed, status, arm, preset, tags, the "
    "metric column by its name). Values are read as JSON where they parse (0.28, true).",
)
search = c2.text_input("Search", key="runs-search", placeholder="sweep, arm or tag")
wanted_sweep = widgets.query_int("sweep")
sweep_names = dict(zip(index["sweep_id"].astype(int), index["sweep"], strict=True))
sweeps = c3.multiselect(
    "Sweeps",
    sorted(sweep_names, reverse=True),
    default=[wanted_sweep] if wanted_sweep in sweep_names else [],
    format_func=lambda i: f"#{i} {sweep_names[i]}",
    key="runs-sweeps",
)
every_attempt = c4.toggle(
    "Every attempt",
    key="runs-attempts",
    help="Off: the newest attempt of each (sweep, arm, seed), the one a rerun put in place.",
)
c5, c6, c7 = st.columns([2, 1, 1])
listed = index if every_attempt else index[index["latest"]]
if sweeps:
    listed = listed[listed["sweep_id"].isin(sweeps)]
logged = reads.metric_names(engine, [int(r) for r in listed["run_id"]])
metric_choice = c5.selectbox(
    "Metric column",
    ["(none)", *logged],
    key="runs-metric",
    format_func=lambda m: m if m == "(none)" else f"{metric_display.display(m).name} · {m}",
    help="Each run's last logged value of a metric, as a column to sort and filter by.",
)
metric = None if metric_choice == "(none)" else str(metric_choice)
sort_options = list(run_table.SORTS)
if metric is not None:
    sort_options += ["metric: highest first", "metric: lowest first"]
sort = c6.selectbox("Sort by", sort_options, key="runs-sort")
try:
    conditions = run_table.parse_conditions(where_text)
except ValueError as error:
    st.warning(str(error))
    conditions = []

if metric is not None:
    finals = run_index.final_values(engine, [int(r) for r in listed["run_id"]], metric)
    listed = listed.assign(
        **{metric: listed["run_id"].map(finals.set_index("run_id")["value"]).astype(float)}
    )
# a condition on the metric compares what the table shows (a share in percent)
shown_listed = (
    listed.assign(**{metric: listed[metric] * metric_display.scale(metric)})
    if metric is not None
    else listed
)
kept = run_table.apply_filters(shown_listed, configs, conditions, search=search)
listed = listed[listed["run_id"].isin(kept["run_id"])]
listed = run_table.sorted_runs(listed, sort, metric)
if listed.empty:
    st.info("No run matches: loosen the filter, the search or the sweeps.")
    st.stop()

# --- the table ----------------------------------------------------------------------------
frame = run_index.config_frame({int(r): configs.get(int(r), {}) for r in listed["run_id"]})
varying = run_index.varying_keys(frame, leave_out=("run.seed", "arm"))
config_keys = c7.multiselect(
    "Config columns",
    [c for c in frame.columns if c != "run_id"],
    default=varying[:MAX_CONFIG_COLUMNS],
    key="runs-columns",
    help="Config keys shown as columns; by default the ones that differ between the listed runs.",
)
# a grid's arms by what varies ("clip_high=0.24"), as on the sweep's own pages
ladders = reads.sweep_ladders(engine, sorted({int(s) for s in listed["sweep_id"]}))
arm_names = {
    (sweep_id, arm): label
    for sweep_id, ladder in ladders.items()
    for arm, label in grids.arm_labels(ladder).items()
}
shown = run_table.display_table(
    listed, {k: frame[k].tolist() for k in config_keys}, metric, arm_names
)
# progress of the running ones, in steps (db.live: a read per running run)
running_ids = [int(r) for r, s in zip(listed["run_id"], listed["status"], strict=True)
               if s == "running"]  # fmt: skip
steps = in_flight.run_progress(engine, running_ids)
shown.insert(
    6,
    "progress",
    listed["run_id"].map(steps.set_index("run_id")["fraction"]).astype(float).to_numpy()
    if not steps.empty
    else float("nan"),
)
columns = {
    "page": st.column_config.LinkColumn("run", display_text=r"run\?run=(\d+)", width=60),
    "sweep": st.column_config.TextColumn("sweep", width=130),
    "arm": st.column_config.TextColumn("arm", width=190, help="a grid's arm: what it varies"),
    "seed": st.column_config.NumberColumn("seed", format="%d", width=45),
    "attempt": st.column_config.NumberColumn("attempt", format="%d", width=60),
    "status": st.column_config.TextColumn("status", width=115),
    "progress": progress.progress_column(help="steps done of run.steps (running runs)"),
    "tags": st.column_config.TextColumn("tags", width=110),
    # numbers as text ("—" where there is none), right-aligned; the table sorts them as numbers
    "start": st.column_config.TextColumn(
        "start (%)",
        alignment="right",
        width=70,
        help="held-out avg@k of the starting model (step 0)",
    ),
    "final": st.column_config.TextColumn(
        "held-out (%)",
        alignment="right",
        width=90,
        help="held-out avg@k at the run's last evaluation (a running run: its latest)",
    ),
    "final_step": st.column_config.TextColumn("at step", alignment="right", width=60),
    "steps": st.column_config.TextColumn("steps", alignment="right", width=55),
}
if metric is not None:
    columns[metric] = st.column_config.TextColumn(metric_display.label(metric), alignment="right")
selection = st.dataframe(
    shown,
    hide_index=True,
    width="stretch",
    column_config=columns,
    on_select="rerun",
    selection_mode="multi-row",
    key="runs-table",
)
picked_rows = [
    int(r)
    for r in getattr(getattr(selection, "selection", None), "rows", []) or []
    if int(r) < len(listed)  # a pick made before the filter changed may point past the end
]
st.caption(
    f"{len(listed)} run(s)"
    + ("" if every_attempt else ", the newest attempt of each (sweep, arm, seed)")
    + ". Click a header to sort, a row's box to draw only the picked runs; scores in % as in "
    "the ablation table."
)

# --- curves -------------------------------------------------------------------------------
st.subheader("Curves")
# What a chart reads is bounded by what it draws: the picked rows, else the first
# MAX_PLOTTED of the table (its order), however many the store holds.
plotted = listed.iloc[picked_rows] if picked_rows else listed.head(MAX_PLOTTED)
group_keys = [run_table.NO_GROUP, *run_table.GROUP_FIELDS, *varying]
default_group = "arm" if len(plotted) > LINES_BY_DEFAULT else run_table.NO_GROUP
group_key = st.selectbox(
    "Group by",
    group_keys,
    index=group_keys.index(default_group),
    key="runs-group",
    help="Runs that share a value of this key are one line, their seeds folded into a band "
    "(W&B's group by); none: a line per run.",
)
if not picked_rows and len(listed) > MAX_PLOTTED:
    st.caption(
        f"The curves of the first {MAX_PLOTTED} of the {len(listed)} listed runs, in the "
        "table's order: narrow the filter, sort, or pick rows to draw others."
    )
# lines named as the table names the arms (a grid's by what varies)
plotted = plotted.assign(
    arm=[
        arm_names.get((int(w), str(a)), str(a))
        for w, a in zip(plotted["sweep_id"], plotted["arm"], strict=True)
    ]
)
line_of = run_table.group_of(plotted, configs, str(group_key))
run_curves.draw(engine, plotted, line_of, key="runs-curves")
with st.expander("Lines and their runs"):
    members = pd.DataFrame(
        {
            "line": plotted["run_id"].map(line_of),
            "run": plotted.apply(run_table.run_label, axis=1),
            "status": plotted["status"].map(shaping.status_badge),
        }
    )
    st.dataframe(members, hide_index=True, width="stretch")
