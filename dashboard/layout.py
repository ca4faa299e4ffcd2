"""Column orders and widths of the dashboard's wide tables, so they read on a 1440 px laptop.

At 1440 px the sidebar and Streamlit's margins leave a table about 980 px; the ablation table
has 16+ columns and the mechanism signature 8 long ones. Rather than shrink every column,
each table shows its key columns first, at widths that fit together (what the row is, its
result and its Δs, its status), and the rest follow, a scroll away. The browser test
(tests/dashboard/test_dashboard_layout.py) checks in Chromium at 1440 px that the KEY columns are
whole on screen. Only the order and the widths change: the data (and its CSV) keep every column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import streamlit as st

from dashboard import progress

# --- the ablation table ---------------------------------------------------------------------
# key columns first: which arm, what it adds, its score and the two Δs, whether it is done
ABLATION_KEY = ["arm", "adds", "final", "Δ parent", "Δ base", "status"]
# after them, in this order; then the per-seed columns and whatever else the table has
ABLATION_REST = ["gain", "start", "n", "parent", "paper", "steps", "updates", "tokens", "time"]
_ABLATION_WIDTHS = {
    "arm": 125,
    "adds": 170,
    "final": 150,
    "Δ parent": 160,
    "Δ base": 160,
    "status": 110,
}


def ablation_order(columns: Sequence[str]) -> list[str]:
    """The ablation table's display order: ABLATION_KEY, ABLATION_REST, then the seeds and
    any column neither names, as the table has them."""
    present = list(columns)
    first = [c for c in [*ABLATION_KEY, *ABLATION_REST] if c in present]
    seeds = [c for c in present if c.startswith("seed ") and c not in first]
    others = [c for c in present if c not in first and c not in seeds]
    head = [c for c in first if c in ABLATION_KEY or c == "gain"]
    tail = [c for c in first if c not in head]
    return [*head, *seeds, *tail, *others]


def ablation_columns(number_columns: Sequence[str]) -> dict[str, Any]:
    """Column configs: numbers right-aligned, the key columns at widths that fit together."""
    config: dict[str, Any] = {
        c: st.column_config.TextColumn(c, alignment="right", width=_ABLATION_WIDTHS.get(c))
        for c in number_columns
    }
    config["arm"] = st.column_config.TextColumn("arm", pinned=True, width=_ABLATION_WIDTHS["arm"])
    config["adds"] = st.column_config.TextColumn(
        "adds", width=_ABLATION_WIDTHS["adds"], help="what the arm changes (hover: all of it)"
    )
    config["status"] = st.column_config.TextColumn("status", width=_ABLATION_WIDTHS["status"])
    return config


# --- the sweep list -------------------------------------------------------------------------
SWEEP_KEY = ["open", "sweep_id", "name", "tags", "status", "progress", "best_arm"]
SWEEP_ORDER = [*SWEEP_KEY, "runs", "created_at", "preset", "headline", "note"]
# the headers the key columns show (the browser test looks for these)
SWEEP_KEY_HEADERS = ["table", "sweep", "name", "tags", "status", "progress", "best arm"]


def sweep_columns() -> dict[str, Any]:
    return {
        "open": st.column_config.LinkColumn("table", display_text="open", width=55),
        "sweep_id": st.column_config.NumberColumn("sweep", format="%d", width=60),
        "name": st.column_config.TextColumn("name", width=160),
        "tags": st.column_config.TextColumn("tags", width=150, help="`dapo tag --sweep ID TAG`"),
        "status": st.column_config.TextColumn("status", width=115),
        # in steps (db.live.sweep_fraction), in a colour that does not read as failure
        "progress": progress.progress_column(
            width=140,
            help="(arm, seed) pairs done + the steps the running runs have trained, over the "
            "sweep's arms × seeds",
        ),
        "best_arm": st.column_config.TextColumn("best arm", width=110),
        "runs": st.column_config.TextColumn(
            "runs done", help="(arm, seed) pairs done / arms × seeds, and how many run now"
        ),
        "created_at": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm"),
        "preset": "preset",
        "headline": st.column_config.TextColumn("which arm leads", width="large"),
        "note": st.column_config.TextColumn("note", width="large"),
    }


# --- the mechanism signature ----------------------------------------------------------------
SIGNATURE_KEY = ["arm", "metric", "Δ parent, first", "Δ parent, last"]  # column prefixes
_SIGNATURE_WIDTHS = {"arm": 125, "metric": 240}


def signature_order(columns: Sequence[str]) -> list[str]:
    """arm, metric, the Δs (first window, then last, as in every table of them), the windows'
    values (first, then last), then the rest (parent, changes): what moved comes before what
    it is measured from."""
    present = list(columns)
    deltas = sorted((c for c in present if c.startswith("Δ parent")), key=lambda c: ", last" in c)
    firsts = [c for c in present if c.startswith("first ")]
    lasts = [c for c in present if c.startswith("last ")]
    head = ["arm", "metric", *deltas, *firsts, *lasts]
    return [c for c in head if c in present] + [c for c in present if c not in head]


def signature_key(columns: Sequence[str]) -> list[str]:
    """The signature's key columns by their names in this table (the windows' lengths vary)."""
    return [next((c for c in columns if c.startswith(k)), k) for k in SIGNATURE_KEY]


def signature_columns(columns: Sequence[str]) -> dict[str, Any]:
    config: dict[str, Any] = {
        c: st.column_config.TextColumn(c, width=_SIGNATURE_WIDTHS.get(c, 165))
        for c in columns
        if c.startswith(("Δ parent", "last ", "first "))
    }
    config["arm"] = st.column_config.TextColumn("arm", pinned=True, width=125)
    config["metric"] = st.column_config.TextColumn("metric", width=_SIGNATURE_WIDTHS["metric"])
    config["changes"] = st.column_config.TextColumn("changes", width="medium")
    return config


def wide_order(columns: Sequence[str]) -> list[str]:
    """The every-metric table: arm, the metrics, and what the arm changes last (it is the
    widest text and the signature table above shows it)."""
    present = list(columns)
    return [c for c in present if c != "changes"] + (["changes"] if "changes" in present else [])
