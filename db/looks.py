"""The looks of adaptive sweeps in the store (table `sequential_looks`, db.sequential).

A look is written once: `record` inserts it unless the (sweep, comparison, look) row exists and
returns whichever row is stored, so a resumed sweep, or one whose arm was rerun since, reads
the decision it took then instead of testing the same look again (its α is spent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from db.models import SEQUENTIAL_LOOKS, utcnow
from db.sink import number, upsert
from db.transactions import write_transaction

_l = SEQUENTIAL_LOOKS.c


def is_adaptive(params: Any) -> bool:
    """Whether a sweep's stored parameters ask for seeds until decided: such a sweep's arms
    may stop at different seed counts, so only the (arm, seed)s it attempted are its own."""
    adaptive = (params or {}).get("adaptive") if isinstance(params, dict) else None
    return bool(isinstance(adaptive, dict) and adaptive.get("until_decided"))


def key(arm: str, other: str) -> str:
    """How a comparison arm − other is named in the store: 'arm:other'."""
    return f"{arm}:{other}"


@dataclass(frozen=True)
class StoredLook:
    """A look as stored (db.sequential.Look, with its comparison and seeds)."""

    comparison: str
    look: int
    n: int
    seeds: tuple[int, ...]
    mean: float
    p: float
    nominal: float
    conditional_power: float
    decision: str


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _stored(row: sa.Row) -> StoredLook:
    return StoredLook(
        comparison=str(row.comparison),
        look=int(row.look),
        n=int(row.n),
        seeds=tuple(int(s) for s in row.seeds or []),
        mean=_nan(row.mean),
        p=_nan(row.p),
        nominal=_nan(row.nominal),
        conditional_power=_nan(row.conditional_power),
        decision=str(row.decision),
    )


def record(
    engine: sa.Engine,
    sweep_id: int,
    comparison: str,
    *,
    look: int,
    seeds: Sequence[int],
    mean: float,
    p: float,
    nominal: float,
    conditional_power: float,
    decision: str,
) -> StoredLook:
    """Store one look unless it is stored already; the stored row either way."""
    values = {
        "sweep_id": int(sweep_id),
        "comparison": comparison,
        "look": int(look),
        "n": len(seeds),
        "seeds": [int(s) for s in seeds],
        "mean": number(mean),
        "p": number(p),
        "nominal": number(nominal),
        "conditional_power": number(conditional_power),
        "decision": decision,
        "created_at": utcnow(),
    }
    with write_transaction(engine) as conn:
        conn.execute(upsert(engine, SEQUENTIAL_LOOKS).values(**values).on_conflict_do_nothing())
        row = conn.execute(
            sa.select(SEQUENTIAL_LOOKS).where(
                _l.sweep_id == int(sweep_id), _l.comparison == comparison, _l.look == int(look)
            )
        ).one()
    return _stored(row)


def of_sweep(engine: sa.Engine, sweep_id: int) -> dict[str, list[StoredLook]]:
    """comparison -> its looks in order (empty for a sweep that is not adaptive)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(SEQUENTIAL_LOOKS)
            .where(_l.sweep_id == int(sweep_id))
            .order_by(_l.comparison, _l.look)
        ).all()
    out: dict[str, list[StoredLook]] = {}
    for row in rows:
        out.setdefault(str(row.comparison), []).append(_stored(row))
    return out
