"""Which trackers each run reached, read back from the store for every reader (the sweep's
summary in the terminal and in Prefect, `dapo table`, the dashboard's Run page).

A run that names trackers (run.loggers) records, with each evaluation, where it stands with
each of them (dapo_core/train/trackers.py: the evaluation's `trackers`, kept in the store's
`evaluations.extra`): reached (with the tracker's run id and where to look), missing (library
not installed), failed (refused at the start) or dropped (an error later; the run went on). The
newest evaluation that says it speaks for the run. db imports nothing from dapo_core: the
key and states are spelled here too, and tests/dapo_core/test_tracker_reach.py ties them together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from db.models import EVALUATIONS

KEY = "trackers"
REACHED = "reached"
ORDER = ("mlflow", "wandb", "tensorboard", "trackio")
"""run.loggers' names in the order they are listed (others follow, by name)."""

Status = dict[str, dict[str, Any]]
"""One run's trackers: {name: {"state", "run_id"?, "url"?, "uri"?, "logdir"?, "dir"?, "error"?}}."""


def of_runs(engine: sa.Engine, run_ids: Iterable[int]) -> dict[int, Status]:
    """Each run's newest recorded tracker status (runs that name no tracker are left out)."""
    ids = sorted({int(r) for r in run_ids})
    if not ids:
        return {}
    e = EVALUATIONS.c
    query = (
        sa.select(e.run_id, e.step, e.extra)
        .where(e.run_id.in_(ids), e.extra.is_not(None))
        .order_by(e.run_id, e.step)
    )
    out: dict[int, Status] = {}
    with engine.connect() as conn:
        for run_id, _step, extra in conn.execute(query):
            found = extra.get(KEY) if isinstance(extra, Mapping) else None
            if isinstance(found, Mapping) and found:
                out[int(run_id)] = {
                    str(k): dict(v) for k, v in found.items() if isinstance(v, Mapping)
                }
    return out


def _names(statuses: Iterable[Status]) -> list[str]:
    seen = {name for status in statuses for name in status}
    return [n for n in ORDER if n in seen] + sorted(seen - set(ORDER))


def where_text(name: str, record: Mapping[str, Any]) -> str:
    """Where a tracker keeps one run, in words: a URL, the command that shows it, its id."""
    if record.get("url"):
        return str(record["url"])
    if name == "tensorboard" and record.get("logdir"):
        run = f" (run {record['run']})" if record.get("run") else ""
        return f"tensorboard --logdir {record['logdir']}{run}"
    if name == "mlflow" and record.get("uri"):
        uri = str(record["uri"])
        shown = f"mlflow ui --backend-store-uri {uri}" if uri.startswith("sqlite:") else uri
        return f"run {record.get('run_id', '?')} in {shown}"
    if name == "wandb" and record.get("dir"):
        return f"run {record.get('run_id', '?')}, offline: wandb sync {record['dir']}"
    if record.get("run_id"):
        return f"run {record['run_id']}"
    return ""


def run_line(status: Status, *, markdown: bool = False) -> str:
    """One run's trackers in a line: `mlflow ✓ (run … in …) · tensorboard ✓ (…) · trackio ✗
    missing: …`; `markdown`: a URL as a link, a command as code."""
    parts = []
    for name in _names([status]):
        record = status[name]
        if record.get("state") == REACHED:
            where = where_text(name, record)
            if markdown and where:
                url = str(record.get("url") or "")
                where = f"[{url}]({url})" if where == url else f"`{where}`"
            parts.append(f"{name} ✓" + (f" ({where})" if where else ""))
        else:
            parts.append(
                f"{name} ✗ {record.get('state', '?')}: {record.get('error', '')}".rstrip(": ")
            )
    return " · ".join(parts)


def sweep_lines(labelled: Sequence[tuple[str, Status]]) -> list[str]:
    """One line per tracker over a sweep's runs (`labelled`: each run's label, e.g. `grpo s0`,
    and its status): how many of the runs that name it reached it, where to look (one place
    shown once), and each run that did not, with why."""
    lines = []
    for name in _names(status for _, status in labelled):
        named = [(label, status[name]) for label, status in labelled if name in status]
        reached = [(label, r) for label, r in named if r.get("state") == REACHED]
        places = sorted({where_text(name, r) for _, r in reached} - {""})
        if name == "tensorboard":
            places = sorted(
                {f"tensorboard --logdir {r['logdir']}" for _, r in reached if r.get("logdir")}
            )
        where = ""
        if len(places) == 1:
            where = f": {places[0]}"
        elif places:
            where = f": {len(places)} places, e.g. {places[0]}"
        line = f"tracker {name}: {len(reached)} of {len(named)} run(s) reached{where}"
        missed = [(label, r) for label, r in named if r.get("state") != REACHED]
        if missed:
            label, first = missed[0]
            more = f" (and {len(missed) - 1} more)" if len(missed) > 1 else ""
            line += f"; not {label}: {first.get('state')}, {first.get('error', '')}{more}"
        lines.append(line)
    return lines


def of_sweep(engine: sa.Engine, sweep_id: int) -> list[str]:
    """sweep_lines of the sweep's newest attempt of each arm × seed (none: no tracker named)."""
    from db.reads import latest_attempts, runs_of_sweep

    runs = latest_attempts(runs_of_sweep(engine, sweep_id))
    if runs.empty:
        return []
    runs = runs.sort_values(["arm", "seed"])
    status = of_runs(engine, runs["run_id"])
    labelled = [
        (f"{row.arm} s{int(row.seed)}", status[int(row.run_id)])
        for row in runs.itertuples()
        if int(row.run_id) in status
    ]
    return sweep_lines(labelled)
