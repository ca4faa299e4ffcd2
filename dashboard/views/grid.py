"""Grid: the eval score (and a metric) against the swept value, one point per grid arm."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dapo_common import metric_display
from dashboard import grids, widgets
from db import ablation, reads, table_format
from db.grids import grid_keys, grid_table

NO_METRIC = "(none)"

st.title("Grid")
engine = widgets.store()
sweep_id = widgets.pick_sweep(engine)
if sweep_id is None:
    st.stop()

keys = grid_keys(engine, sweep_id)
if not keys:
    st.info(
        f"Sweep {sweep_id} is not a grid. A grid sweep expands arms from a base arm, e.g. "
        "`dapo sweep --arms dapo --grid algo.clip_high=0.24,0.28,0.32`; its arms then show "
        "here against the swept value."
    )
    st.stop()

runs = reads.runs_of_sweep(engine, sweep_id)
logged = reads.metric_names(engine, [int(r) for r in runs["run_id"]])
# Each point by what varies ("clip_high=0.24"), not by arm names that share a long prefix.
labels = grids.arm_labels(reads.sweep_details(engine, sweep_id)["ladder"])
c1, c2, c3, c4 = st.columns([1, 2, 1, 1])
x_key = str(c1.selectbox("x: swept key", keys, key="grid-x"))
metric_choice = c2.selectbox(
    "Also plot a training metric",
    [NO_METRIC, *logged],
    key="grid-metric",
    format_func=lambda m: m if m == NO_METRIC else f"{metric_display.display(m).name} · {m}",
)
window = int(
    c3.number_input(
        "Window (rollout steps)",
        min_value=1,
        max_value=10_000,
        value=10,
        key="grid-window",
        help="The metric is each seed's mean over the last this many rollout steps.",
    )
)
zoom = c4.toggle(
    "Zoom y to the points",
    key="grid-zoom",
    help="Off: the score's axis spans 0-100 %, a training metric's starts at 0. On: the "
    "points and their 95% whiskers, a share's never narrower than 10 pp.",
)
metric = None if metric_choice == NO_METRIC else str(metric_choice)
grid = grid_table(engine, sweep_id, metric=metric, window=window)
others = [k for k in keys if k != x_key]
k = grid["eval_k"].dropna()
score_label = metric_display.held_out(int(k.iloc[0]) if len(k) else None)
datasets = grid["eval_dataset"].dropna()
dataset = f"{datasets.iloc[0]} " if len(datasets) else ""
st.caption(
    "One point per grid arm: mean over seeds with its 95% t-interval over seeds (no whisker "
    "for n=1); diamond = the base arm the points branch from"
    + (f"; one line per value of {', '.join(others)}" if others else "")
    + ". The score's axis spans 0-100 % and a metric's starts at 0: zoomed to the points, a gap "
    "of a point or two fills the chart and reads as a trend (Zoom shows the points with their "
    "whiskers, never under 10 pp for a share). Each arm's Δ to its parent (the base) is in the "
    "ablation table."
)


def point_table(frame: pd.DataFrame, x_key: str, value: str, unit: str) -> None:
    """The points as a table: what each is, its x, its series where there are several, the
    mean and interval formatted, n, its role; the arm's own name last."""
    columns = ["label", "x", "series", "mean", "low", "high", "text", "n", "role", "arm"]
    shown = frame[columns].rename(columns={"x": x_key})
    if shown["series"].nunique() <= 1:  # one line: a column that says nothing
        shown = shown.drop(columns="series")
    number = "%.1f" if unit == "%" else "%.4g"
    suffix = f" ({unit})" if unit else ""
    st.dataframe(
        shown,
        hide_index=True,
        width="stretch",
        column_config={
            "label": st.column_config.TextColumn("point", width="medium"),
            "mean": st.column_config.NumberColumn(f"mean{suffix}", format=number),
            "low": st.column_config.NumberColumn("95% low", format=number),
            "high": st.column_config.NumberColumn("95% high", format=number),
            "text": st.column_config.TextColumn(f"{value} [95% interval]"),
            "arm": st.column_config.TextColumn("arm", width="medium"),
        },
    )


scores = grids.plot_frame(grid, x_key, labels=labels)
if scores.empty:
    st.info("No grid arm has a completed, evaluated run yet.")
else:
    st.altair_chart(
        grids.grid_chart(
            scores,
            x_key,
            score_label,
            f"Final {dataset}{score_label} against {x_key}",
            domain=grids.y_domain(scores, score=True, share=True, zoom=zoom),
        ),
        width="stretch",
    )
    point_table(scores, x_key, "final (%)", "%")

if metric is not None:
    values = grids.plot_frame(grid, x_key, "metric", metric=metric, labels=labels)
    label = metric_display.label(metric)
    if values.empty:
        st.info(f"No completed grid run logged `{metric}`.")
    else:
        st.altair_chart(
            grids.grid_chart(
                values,
                x_key,
                label,
                f"{metric_display.display(metric).name}, mean of the last {window} steps, "
                f"against {x_key}",
                domain=grids.y_domain(
                    values, score=False, share=metric_display.is_share(metric), zoom=zoom
                ),
                number=metric_display.number_format(metric),
            ),
            width="stretch",
        )
        point_table(values, x_key, label, metric_display.unit(metric))

with st.expander("Δ to the base, per arm (the ablation table)"):
    table = ablation.ablation_table(engine, sweep_id)
    records = table_format.ablation_records(table)
    st.dataframe(
        [
            {
                "point": labels.get(r["arm"], r["arm"]),
                **{c: r[c] for c in ("arm", "n", "final")},
                "Δ parent": r["Δ parent"],
            }
            for r in records
        ],
        hide_index=True,
        width="stretch",
    )
