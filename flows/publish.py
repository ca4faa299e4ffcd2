"""A sweep's ablation table, out to Prefect (a table artifact and a markdown summary) and to the
terminal. Numbers come from db.ablation.ablation_table and cells from
db.table_format.ablation_records, so the Prefect UI, the dashboard and `dapo table` show the
same columns; the summary's headline names a best arm only when its lead is significant.

The artifacts put the key columns first (table_format.artifact_records, and mechanisms.render's
`artifact` order for the mechanism table), so that they read on a 1440 px screen, where
Prefect's UI leaves a table about 880 px; every other column follows, a scroll away.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dapo_common.util import first_line
from flows import plan, progress


def ablation(url: str, sweep_id: int) -> tuple[Any, dict[str, Any]]:
    """(db.ablation.ablation_table, sweep details) of one sweep."""
    from db.ablation import ablation_table
    from db.engine import get_engine
    from db.reads import sweep_details

    engine = get_engine(url)
    return ablation_table(engine, sweep_id), sweep_details(engine, sweep_id)


def text(url: str, sweep_id: int) -> str:
    from db.engine import get_engine
    from db.report import extras
    from db.table_format import render

    table, sweep = ablation(url, sweep_id)
    return render(table, "text", sweep, **extras(get_engine(url), sweep_id, table))


def publish_sweep(url: str, sweep_id: int, *, note: str | None = None) -> list[dict[str, str]]:
    """Publish a new version of the sweep's table and summary artifacts; returns the table rows."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    from db.table_format import ablation_records, artifact_records, caption

    table, sweep = ablation(url, sweep_id)
    # One seed: bare numbers; the description says once that n=1 has no interval (caption).
    rows = artifact_records(ablation_records(table, bare_single=True)) if not table.empty else []
    create_table_artifact(
        table=rows,
        key=plan.artifact_key("ablation-table", sweep_id),
        description=f"Ablation table of sweep {sweep_id} ({sweep.get('name')}): " + caption(table),
    )
    from db import decisions, decisions_format
    from db.engine import get_engine
    from db.report import extras

    extra = extras(get_engine(url), sweep_id, table)
    if not table.empty:
        # Every Δ with its exact p, MDE, seeds needed and verdict: the same rows as `dapo table`.
        comps = decisions.comparisons(
            table,
            planned=extra.get("planned", ()),
            sequential=extra.get("sequential"),
            running=bool(extra.get("running")),
        )
        create_table_artifact(
            table=decisions_format.records(comps),
            key=plan.artifact_key("comparisons", sweep_id),
            description=f"How sure each difference of sweep {sweep_id} is: "
            + decisions_format.CAPTION
            + f". {extra['protocol']}",
        )
    from db import tracker_status

    create_markdown_artifact(
        markdown=summary_markdown(
            table, sweep, note, extra, trackers=tracker_status.of_sweep(get_engine(url), sweep_id)
        ),
        key=plan.artifact_key("ablation-summary", sweep_id),
        description=f"Summary of sweep {sweep_id}",
    )
    try:
        mechanisms = mechanisms_markdown(url, sweep_id)
    except Exception as error:  # the sweep's outcome is recorded; a missing extra is one line
        progress.say(f"sweep {sweep_id}: no mechanism table artifact ({first_line(error)})")
    else:
        create_markdown_artifact(
            markdown=mechanisms,
            key=plan.artifact_key("mechanism-table", sweep_id),
            description=f"Mechanism table of sweep {sweep_id}",
        )
    return rows


def mechanisms_markdown(url: str, sweep_id: int) -> str:
    """`dapo table --mechanisms --format markdown` of the sweep: the same metrics (the
    default of db.mechanisms, with the eligible share and the decision entropy where logged),
    the same window and the same cells, the key columns first."""
    from db import mechanisms, reads
    from db.cli import mechanism_window
    from db.engine import get_engine
    from db.mechanism_table import mechanism_table

    engine = get_engine(url)
    steps = reads.runs_of_sweep(engine, sweep_id)["steps"]
    frame = mechanism_table(engine, sweep_id, window=mechanism_window(None, steps, sweep_id))
    return mechanisms.render(frame, "markdown", focus_only=True, artifact=True)


def summary_markdown(
    table: Any,
    sweep: Mapping[str, Any],
    note: str | None,
    extra: Mapping[str, Any] | None = None,
    *,
    trackers: Sequence[str] = (),
) -> str:
    """Title, what ran, the note (an error) if any, then the table with its headline, its
    comparisons (exact p, MDE, seeds needed; an adaptive sweep's decisions) and its protocol
    (`extra`: db.report.extras); last, which trackers the runs reached (`trackers`:
    db.tracker_status.of_sweep's lines)."""
    from db.table_format import render

    arms, seeds = list(sweep.get("arms") or []), list(sweep.get("seeds") or [])
    lines = [
        f"# Sweep {sweep.get('id', sweep.get('sweep_id'))}: {sweep.get('name')}",
        "",
        f"Preset `{sweep.get('preset')}`; {len(arms)} arm(s) × {len(seeds)} seed(s) {seeds}; "
        f"status **{sweep.get('status')}**.",
    ]
    if note:
        lines += ["", f"**{note}**"]
    lines += ["", render(table, "markdown", dict(sweep), artifact=True, **dict(extra or {}))]
    if trackers:
        lines += ["", *(f"- {line}" for line in trackers)]
    return "\n".join(lines)
