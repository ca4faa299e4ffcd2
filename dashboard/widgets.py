"""Streamlit pieces shared by the pages: the store, the sweep and run pickers, the rerun box.

Pickers keep their choice in the URL's query parameters (`sweep`, `run`, ...) so that a view
can be bookmarked or linked to from another page.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import sqlalchemy as sa
import streamlit as st

from dashboard import rerun, source
from dashboard.shaping import status_badge
from db import queries
from db.errors import first_line

REFRESH_S = 5.0  # live refresh period of the sweep list and the ablation table

NO_SWEEPS = (
    "The store has no sweeps yet. Start one with `dapo sweep` (or from the Prefect UI) "
    "and it will show up here."
)


def store() -> sa.Engine:
    """The engine of the store this dashboard reads, or a one-line error and a stopped page."""
    url = source.store_url()
    try:
        engine = source.open_engine(url)
    except (ValueError, ConnectionError, OSError, sa.exc.SQLAlchemyError) as error:
        st.error(f"Cannot open the store {source.safe_url(url)}: {first_line(error)}")
        st.stop()
    st.sidebar.caption(f"Store: `{source.safe_url(url)}`")
    return engine


def query_int(name: str) -> int | None:
    """An integer query parameter, or None when absent; a malformed one is reported."""
    raw = st.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        st.warning(f"Ignoring `?{name}={raw}`: not a number.")
        return None


def live_refresh(*, running: bool) -> bool:
    """The live-refresh toggle: on by default while a sweep runs; `?live=0` or `?live=1` in the
    URL overrides the default (a wall screen, a static screenshot)."""
    wanted = st.query_params.get("live")
    default = running if wanted not in ("0", "1") else wanted == "1"
    return st.toggle(
        f"Live refresh (every {REFRESH_S:g} s)",
        value=default,
        key="live-refresh",
        help="Re-read the store while runs report; tables update in place.",
    )


def sweep_label(row: pd.Series) -> str:
    return f"#{row['sweep_id']} · {row['name']} · {row['status']}"


def pick_sweep(
    engine: sa.Engine,
    *,
    key: str = "sweep",
    param: str | None = "sweep",
    preferred: int | None = None,
) -> int | None:
    """A sweep selectbox (newest first) backed by the query parameter `param`.

    Without a sweep in the URL, `preferred` (else the newest sweep) is selected. Returns None,
    after telling the user, when the store has no sweeps.
    """
    sweeps = queries.list_sweeps(engine)
    if sweeps.empty:
        st.info(NO_SWEEPS)
        return None
    sweeps = sweeps.sort_values("sweep_id", ascending=False).reset_index(drop=True)
    ids = [int(s) for s in sweeps["sweep_id"]]
    labels = {int(r["sweep_id"]): sweep_label(r) for _, r in sweeps.iterrows()}
    wanted = query_int(param) if param else None
    if wanted is not None and wanted not in labels:
        st.warning(f"No sweep with id {wanted}; showing the newest sweep instead.")
        wanted = None
    if wanted is None and preferred in labels:
        wanted = preferred
    index = ids.index(wanted) if wanted is not None else 0
    chosen: int | None = st.selectbox(
        "Sweep", ids, index=index, format_func=lambda i: labels[i], key=key
    )
    if chosen is None:  # only when the list is empty, which returned above
        return None
    if param:
        st.query_params[param] = str(chosen)
    return int(chosen)


def run_label(row: pd.Series) -> str:
    return (
        f"{row['arm']} · seed {row['seed']} · attempt {row['attempt']} · "
        f"{status_badge(row['status'])} (run {row['run_id']})"
    )


def pick_run(
    engine: sa.Engine, *, key: str, param: str, label: str = "Run", index_hint: int = 0
) -> int | None:
    """Pick a sweep, then one of its runs (newest attempt first); backed by query param `param`.

    A run id in the URL wins and selects its sweep. Returns None when there is nothing to pick.
    """
    wanted = query_int(param)
    wanted_sweep: int | None = None
    if wanted is not None:
        try:
            wanted_sweep = queries.run_details(engine, wanted)["sweep_id"]
        except ValueError:
            st.warning(f"No run with id {wanted}; pick one below.")
            wanted = None
    sweep_id = pick_sweep(engine, key=f"{key}-sweep", param=None, preferred=wanted_sweep)
    if sweep_id is None:
        return None
    runs = queries.runs_of_sweep(engine, sweep_id)
    if runs.empty:
        st.info(f"Sweep {sweep_id} has no runs yet.")
        return None
    runs = runs.sort_values(["arm", "seed", "attempt"], ascending=[True, True, False])
    order = _ladder_rank(engine, sweep_id)
    runs = runs.assign(_rank=runs["arm"].map(order).fillna(len(order))).sort_values(
        ["_rank", "seed", "attempt"], ascending=[True, True, False]
    )
    ids = [int(r) for r in runs["run_id"]]
    labels = {int(r["run_id"]): run_label(r) for _, r in runs.iterrows()}
    index = ids.index(wanted) if wanted in labels else min(index_hint, len(ids) - 1)
    chosen: int | None = st.selectbox(
        label, ids, index=index, format_func=lambda i: labels[i], key=key
    )
    if chosen is None:  # only when the list is empty, which returned above
        return None
    st.query_params[param] = str(chosen)
    return int(chosen)


def _ladder_rank(engine: sa.Engine, sweep_id: int) -> dict[str, int]:
    table = queries.ablation_table(engine, sweep_id)
    return {str(arm): i for i, arm in enumerate(table["arm"])}


def show_flow_run_link(flow_run_id: str | None) -> None:
    url = rerun.flow_run_url(flow_run_id)
    if url:
        st.markdown(f"Prefect flow run: [{flow_run_id}]({url})")
    elif flow_run_id:
        st.markdown(f"Prefect flow run: `{flow_run_id}` (set PREFECT_UI_URL to link to it)")
    else:
        st.caption("No Prefect flow run recorded for this run.")


def rerun_box(sweep_id: int, arm: str, seed: int, *, key: str) -> None:
    """The "rerun this arm" button and what came of the last request (state, link)."""
    state_key = f"{key}-result"
    if st.button(f"Rerun {arm} (seed {seed})", key=key, icon=":material/replay:"):
        with st.spinner("Asking Prefect for a flow run ..."):
            st.session_state[state_key] = rerun.request_rerun(sweep_id, arm, seed)
    result: Any = st.session_state.get(state_key)
    if result is None:
        st.caption(
            f"Creates a flow run of the Prefect deployment `{rerun.DEPLOYMENT}` with "
            f"force=True; the table updates in place as the run reports."
        )
        return
    if not result.ok:
        st.warning(result.message)
        return
    st.success(result.message)
    if result.url:
        st.markdown(f"[Open the flow run in Prefect]({result.url})")
    if st.button("Refresh its state", key=f"{key}-state") and result.flow_run_id:
        fresh = rerun.flow_run_state(result.flow_run_id)
        (st.info if fresh.ok else st.warning)(fresh.message)
