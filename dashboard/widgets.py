"""Streamlit pieces shared by the pages: the store, the sweep and run pickers, the rerun box.

Pickers keep their choice in the URL's query parameters (`sweep`, `run`, ...) so that a view
can be bookmarked or linked to from another page.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import sqlalchemy as sa
import streamlit as st

from dapo_common.util import first_line
from dashboard import notes, rerun, source
from dashboard.shaping import status_badge
from db import ablation, reads

REFRESH_S = 5.0  # live refresh period of the sweep list and the ablation table

# The evaluations' scores (percentages) as the run pages show them: avg@k, pass@k, cons@k.
EVAL_SCORE_COLUMNS = {
    c: st.column_config.NumberColumn(c.replace("_at_", "@") + " (%)", format="%.1f")
    for c in ("avg_at_k", "pass_at_k", "cons_at_k")
}

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
    """'#3 · ladder · completed', then its tags and whether it is hidden, when it has any."""
    label = f"#{row['sweep_id']} · {row['name']} · {row['status']}"
    if row.get("tags"):
        label += f" · [{row['tags']}]"
    return label + (" · hidden" if row.get("hidden") else "")


def pick_sweep(
    engine: sa.Engine,
    *,
    key: str = "sweep",
    param: str | None = "sweep",
    preferred: int | None = None,
) -> int | None:
    """A sweep selectbox (newest first) backed by the query parameter `param`.

    Without a sweep in the URL, `preferred` (else the newest sweep) is selected. Hidden sweeps
    are left out unless the sidebar's switch shows them (dashboard.notes), except the one the
    URL or `preferred` names. Returns None, after telling the user, when there is nothing to pick.
    """
    # the picker's columns only: list_sweeps computes every sweep's table (issue 27)
    sweeps = ablation.sweep_choices(engine)
    if sweeps.empty:
        st.info(NO_SWEEPS)
        return None
    sweeps = notes.with_sweep_annotations(sweeps, engine)
    sweeps = sweeps.sort_values("sweep_id", ascending=False).reset_index(drop=True)
    wanted = query_int(param) if param else None
    hidden = {int(s) for s, h in zip(sweeps["sweep_id"], sweeps["hidden"], strict=True) if h}
    shown = notes.show_hidden()
    keep = [s for s in (wanted, preferred) if s is not None]
    ids = notes.visible(sweeps["sweep_id"], hidden, show=shown, keep=keep)
    if not ids:
        st.info(
            f"Every sweep of this store is hidden ({len(hidden)}): switch on *Show hidden "
            "sweeps* in the sidebar, or `dapo sweep unhide ID`."
        )
        return None
    labels = {int(r["sweep_id"]): sweep_label(r) for _, r in sweeps.iterrows()}
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

    A run id in the URL wins and selects its sweep; else `?sweep=` (a link from a sweep's
    pages) selects the sweep. Returns None when there is nothing to pick.
    """
    wanted = query_int(param)
    wanted_sweep: int | None = None
    if wanted is not None:
        try:
            wanted_sweep = reads.run_details(engine, wanted)["sweep_id"]
        except ValueError:
            st.warning(f"No run with id {wanted}; pick one below.")
            wanted = None
    if wanted is None:
        wanted_sweep = query_int("sweep")
    sweep_id = pick_sweep(engine, key=f"{key}-sweep", param=None, preferred=wanted_sweep)
    if sweep_id is None:
        return None
    runs = reads.runs_of_sweep(engine, sweep_id)
    if runs.empty:
        st.info(f"Sweep {sweep_id} has no runs yet.")
        return None
    runs = runs.sort_values(["arm", "seed", "attempt"], ascending=[True, True, False])
    order = _ladder_rank(engine, sweep_id, runs)
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


def _ladder_rank(engine: sa.Engine, sweep_id: int, runs: pd.DataFrame) -> dict[str, int]:
    """Each arm's row in the ablation table (its ladder order), without scoring the table."""
    with engine.connect() as conn:
        sweep = reads.sweep_row(conn, engine, sweep_id)
    return {arm: i for i, arm in enumerate(reads.arm_order(sweep, runs))}


def show_flow_run_link(flow_run_id: str | None) -> None:
    url = rerun.flow_run_url(flow_run_id)
    if url:
        st.markdown(f"Prefect flow run: [{flow_run_id}]({url})")
    elif flow_run_id:
        st.markdown(f"Prefect flow run: `{flow_run_id}` (set PREFECT_UI_URL to link to it)")
    else:
        st.caption("No Prefect flow run recorded for this run.")


def rerun_box(
    sweep_id: int, arm: str, seed: int, *, key: str, engine: sa.Engine | None = None
) -> None:
    """The "rerun this arm" button, its confirmation and what came of the last request.

    The button only opens a confirmation that says what the rerun will do (rerun.describe_rerun:
    a new attempt, resumed from step k or started over). Confirming sends one request with the
    idempotency key drawn when the confirmation opened, so a double click, or the page running
    again before the answer is drawn, gets the same flow run back from Prefect, not a second."""
    pending_key, result_key = f"{key}-pending", f"{key}-result"
    target = (int(sweep_id), str(arm), int(seed))
    pending = st.session_state.get(pending_key)
    if pending is not None and pending["target"] != target:  # another arm picked meanwhile
        pending = st.session_state[pending_key] = None
    # The button is drawn only while nothing is pending: it opens the confirmation.
    if pending is None and st.button(
        f"Rerun {arm} (seed {seed}) …", key=key, icon=":material/replay:"
    ):
        pending = {"target": target, "token": rerun.new_token()}
        st.session_state[pending_key] = pending
        st.session_state.pop(result_key, None)  # the last rerun's answer is not this one's
    if pending is not None:
        _confirm_rerun(engine, target, pending, key=key, pending_key=pending_key)
    result: Any = st.session_state.get(result_key)
    if result is None or result.get("target") != target:
        if pending is None:
            st.caption(
                f"Asks for a confirmation, then creates a flow run of the Prefect deployment "
                f"`{rerun.DEPLOYMENT}` with force=True; the table updates in place as the run "
                "reports."
            )
        return
    answer: rerun.RerunResult = result["answer"]
    if not answer.ok:
        st.warning(answer.message)
        return
    st.success(answer.message)
    if answer.url:
        st.markdown(f"[Open the flow run in Prefect]({answer.url})")
    if st.button("Refresh its state", key=f"{key}-state") and answer.flow_run_id:
        fresh = rerun.flow_run_state(answer.flow_run_id)
        (st.info if fresh.ok else st.warning)(fresh.message)


def _confirm_rerun(
    engine: sa.Engine | None,
    target: tuple[int, str, int],
    pending: dict[str, Any],
    *,
    key: str,
    pending_key: str,
) -> None:
    """The confirmation: what will happen, then Confirm (one request, keyed) or Cancel."""
    sweep_id, arm, seed = target
    engine = engine if engine is not None else source.open_engine(source.store_url())
    runs = reads.runs_of_sweep(engine, sweep_id)
    mine = runs[(runs["arm"] == arm) & (runs["seed"] == seed)] if not runs.empty else runs
    plan = rerun.describe_rerun(mine.to_dict("records"), sweep_id, arm, seed)
    st.info(f"**Rerun {arm}, seed {seed}?** {plan}", icon=":material/help:")
    confirm, cancel = st.columns(2)
    if cancel.button("Cancel", key=f"{key}-cancel"):
        st.session_state[pending_key] = None
        st.rerun()
    if confirm.button("Confirm rerun", key=f"{key}-confirm", type="primary"):
        with st.spinner("Asking Prefect for a flow run ..."):
            answer = rerun.request_rerun(
                sweep_id,
                arm,
                seed,
                idempotency_key=rerun.idempotency_key(sweep_id, arm, seed, pending["token"]),
            )
        st.session_state[f"{key}-result"] = {"target": target, "answer": answer}
        # Only a request that reached Prefect closes the confirmation: after a failure (no
        # server, a timeout) Confirm asks again with the same key, so if the first did create
        # a flow run after all, Prefect hands that one back.
        if answer.ok:
            st.session_state[pending_key] = None
        st.rerun()
