"""The evaluation protocol behind a sweep's table, in one line under every table.

A score means nothing without how it was taken: which eval set and how many problems, k and
the sampling temperature, the grader, which checkpoint is reported, and where it ran (CPU and
GPU kinds round differently: the same seed gives other digits on another kind, see
docs/results-tiny.md). The trainer records the grader, the device and torch's version with each
evaluation (`extra`); stores written before it did say "not recorded".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd
import sqlalchemy as sa

from db.models import EVALUATIONS, RUNS

DEFAULT_GRADER = "math_score (DAPO-Math: the last 'Answer:' line, normalized, as a string)"


def _values(items: Iterable[Any]) -> list[str]:
    return sorted({str(v) for v in items if v is not None and v == v})


def _one_or_all(values: list[str], missing: str) -> str:
    if not values:
        return missing
    return values[0] if len(values) == 1 else " / ".join(values) + " (differs between runs)"


def protocol_line(engine: sa.Engine, sweep_id: int, table: pd.DataFrame) -> str:
    """'protocol: eval aime2024 (30 problems), avg@4 at temperature 1.0; grader ...; reported:
    each run's final-step checkpoint (step 150); device ...; torch ...' for the runs behind
    `table` (db.ablation.ablation_table of the sweep), read from their final evaluations."""
    run_ids = sorted({int(r) for ids in table.get("run_ids", []) for r in (ids or [])})
    dataset = next((d for d in table.get("eval_dataset", []) if isinstance(d, str)), None)
    k = next((int(v) for v in table.get("eval_k", []) if v == v and v is not None), None)
    if not run_ids or dataset is None or k is None:
        return "protocol: no evaluation yet"
    e, r = EVALUATIONS.c, RUNS.c
    with engine.connect() as conn:
        last = (
            sa.select(e.run_id, sa.func.max(e.step).label("step"))
            .join_from(EVALUATIONS, RUNS, r.id == e.run_id)
            .where(e.run_id.in_(run_ids), e.dataset == dataset, e.k == k, r.status == "completed")
            .group_by(e.run_id)
            .subquery()
        )
        rows = conn.execute(
            sa.select(e.step, e.n_problems, e.extra, r.config)
            .join(last, sa.and_(e.run_id == last.c.run_id, e.step == last.c.step))
            .join(RUNS, r.id == e.run_id)
            .where(e.dataset == dataset, e.k == k)
        ).all()
    extras = [row.extra or {} for row in rows]
    configs = [row.config or {} for row in rows]
    problems = _one_or_all(_values(row.n_problems for row in rows), "? problems")
    temperature = _one_or_all(
        _values((c.get("data") or {}).get("eval_temperature") for c in configs), "?"
    )
    steps = sorted({int(row.step) for row in rows})
    grader = _one_or_all(_values(x.get("grader") for x in extras), DEFAULT_GRADER)
    device = _one_or_all(_values(x.get("device") for x in extras), "not recorded")
    torch = _one_or_all(_values(x.get("torch") for x in extras), "not recorded")
    step_text = str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}" if steps else "?"
    return (
        f"protocol: eval {dataset} ({problems} problems), avg@{k} at temperature {temperature}; "
        f"grader {grader}; reported: each run's final evaluated checkpoint (step {step_text}); "
        f"device {device}; torch {torch}"
    )
