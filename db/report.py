"""What a sweep's table says beyond its rows, read from the store once for every reader
(`dapo table`, the Prefect artifact, the dashboard): the comparisons an adaptive sweep planned,
its stored looks, whether it may still look again, and the evaluation protocol line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from db import looks
from db.decisions import parse_pairs
from db.protocol import protocol_line

if TYPE_CHECKING:
    import pandas as pd


def extras(engine: sa.Engine, sweep_id: int, table: pd.DataFrame) -> dict[str, Any]:
    """db.table_format.render's keyword arguments for the sweep behind `table`."""
    from db.reads import sweep_details

    sweep = sweep_details(engine, sweep_id)
    params = sweep.get("params") or {}
    out: dict[str, Any] = {
        "protocol": protocol_line(engine, sweep_id, table),
        "sequential": looks.of_sweep(engine, sweep_id),
        "running": sweep.get("status") in ("pending", "running"),
    }
    if looks.is_adaptive(params):
        arms = [str(a) for a in table["arm"]]
        asked = [p for p in (params.get("adaptive") or {}).get("compare") or []]
        try:
            out["planned"] = parse_pairs(asked, arms)
        except ValueError:  # an arm since removed from the table: its pair has no row
            out["planned"] = []
    return out
