"""The ablation table as text: aligned columns for a terminal, CSV, and Markdown.

Input is db.queries.ablation_table (fractions); everything printed is in percent, Δs in
percentage points. `ablation_records` gives the same cells as dicts of strings, for a Prefect
table artifact or any other place that shows the table.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported by the caller; `dapo --help` need not pay for it
    import pandas as pd

FORMATS = ("text", "csv", "markdown")
MISSING = "—"
# Columns whose cells are numbers (right-aligned in text and Markdown).
_LEFT = {"arm", "adds", "status"}


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def pct(value: Any, signed: bool = False) -> str:
    """A fraction as percent with one decimal ('43.0', '+5.0'), '—' when missing."""
    if _missing(value):
        return MISSING
    return f"{100.0 * float(value):{'+' if signed else ''}.1f}"


def mean_std(mean: Any, std: Any, n: int) -> str:
    """'32.0 ± 2.8' in percent; one seed has no spread, so only its mean."""
    if _missing(mean):
        return MISSING
    if n < 2 or _missing(std):
        return pct(mean)
    return f"{100.0 * float(mean):.1f} ± {100.0 * float(std):.1f}"


def count(value: Any) -> str:
    return MISSING if _missing(value) else f"{float(value):,.0f}"


def duration(seconds: Any) -> str:
    """'1h 02m', '3m 05s', '42s'."""
    if _missing(seconds):
        return MISSING
    total = round(float(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def seed_list(table: pd.DataFrame) -> list[int]:
    """Every seed with a score in some arm, sorted."""
    return sorted({int(s) for seeds in table["seeds"] for s in (seeds or [])})


def ablation_records(table: pd.DataFrame) -> list[dict[str, str]]:
    """One dict of display strings per arm, in the table's (ladder) order."""
    seeds = seed_list(table)
    records = []
    for row in table.to_dict("records"):
        per_seed = dict(zip(row["seeds"] or [], row["scores"] or [], strict=False))
        n = int(row["n_seeds"] or 0)
        record = {"arm": str(row["arm"]), "adds": str(row["adds"] or "")}
        for seed in seeds:
            record[f"seed {seed}"] = pct(per_seed.get(seed))
        record["mean ± std"] = mean_std(row["score_mean"], row["score_std"], n)
        record["best"] = mean_std(row["best_mean"], row["best_std"], n)
        record["Δ prev"] = pct(row["delta_prev"], signed=True)
        record["Δ base"] = pct(row["delta_base"], signed=True)
        paper = row["paper_score"]
        record["paper"] = MISSING if _missing(paper) else f"{float(paper):.1f}"
        record["steps"] = count(row["steps"])
        record["updates"] = count(row["grad_updates"])
        record["tokens"] = count(row["tokens"])
        record["time"] = duration(row["wall_s"])
        record["status"] = str(row["status"])
        records.append(record)
    return records


def caption(table: pd.DataFrame, sweep: Mapping[str, Any] | None = None) -> str:
    """One line saying what the numbers are (and of which sweep)."""
    dataset = next((d for d in table["eval_dataset"] if not _missing(d)), None)
    k = next((int(v) for v in table["eval_k"] if not _missing(v)), None)
    metric = f"{dataset} avg@{k}" if dataset is not None and k is not None else "avg@k"
    what = (
        f"final {metric} in %, mean ± std over seeds; best = best evaluation; "
        "Δ in percentage points; paper = Table 1 (AIME 2024 avg@32, Qwen2.5-32B)"
    )
    if sweep is None:
        return what
    return f"sweep {sweep['id']} '{sweep['name']}' (preset {sweep['preset']}, {sweep['status']}): {what}"


def _aligned(records: Sequence[Mapping[str, str]]) -> str:
    columns = list(records[0])
    widths = {c: max(len(c), *(len(r[c]) for r in records)) for c in columns}

    def line(cells: Mapping[str, str]) -> str:
        parts = [
            cells[c].ljust(widths[c]) if c in _LEFT else cells[c].rjust(widths[c]) for c in columns
        ]
        return "  ".join(parts).rstrip()

    header = line({c: c for c in columns})
    rule = "  ".join("-" * widths[c] for c in columns)
    return "\n".join([header, rule, *(line(r) for r in records)])


def _markdown(records: Sequence[Mapping[str, str]]) -> str:
    columns = list(records[0])

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    head = "| " + " | ".join(columns) + " |"
    align = "|" + "|".join(":---" if c in _LEFT else "---:" for c in columns) + "|"
    body = ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in records]
    return "\n".join([head, align, *body])


def _csv(table: pd.DataFrame) -> str:
    """Numbers for a spreadsheet: scores and Δs in percent (columns suffixed _pct)."""
    seeds = seed_list(table)
    buffer = io.StringIO()
    writer: Any = None
    for row in table.to_dict("records"):
        per_seed = dict(zip(row["seeds"] or [], row["scores"] or [], strict=False))
        per_seed_best = dict(zip(row["seeds"] or [], row["best_scores"] or [], strict=False))

        def p(value: Any) -> Any:
            return "" if _missing(value) else round(100.0 * float(value), 6)

        out: dict[str, Any] = {"arm": row["arm"], "adds": row["adds"] or ""}
        out["paper_score_pct"] = "" if _missing(row["paper_score"]) else row["paper_score"]
        for seed in seeds:
            out[f"score_seed{seed}_pct"] = p(per_seed.get(seed))
        for seed in seeds:
            out[f"best_seed{seed}_pct"] = p(per_seed_best.get(seed))
        for name in (
            "score_mean",
            "score_std",
            "best_mean",
            "best_std",
            "delta_prev",
            "delta_base",
        ):
            out[f"{name}_pct"] = p(row[name])
        out["n_seeds"] = row["n_seeds"]
        for name in ("steps", "grad_updates", "tokens", "wall_s"):
            value = row[name]
            out[name] = "" if _missing(value) else (round(float(value), 3))
        out["status"] = row["status"]
        out["eval_dataset"] = "" if _missing(row["eval_dataset"]) else row["eval_dataset"]
        out["eval_k"] = "" if _missing(row["eval_k"]) else int(row["eval_k"])
        if writer is None:
            writer = csv.DictWriter(buffer, fieldnames=list(out), lineterminator="\n")
            writer.writeheader()
        writer.writerow(out)
    return buffer.getvalue()


def render(table: pd.DataFrame, fmt: str, sweep: Mapping[str, Any] | None = None) -> str:
    """The table in `fmt` (text, csv or markdown); text and Markdown carry a caption line."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if table.empty:
        return "" if fmt == "csv" else "(no arms)\n"
    if fmt == "csv":
        return _csv(table)
    records = ablation_records(table)
    body = _aligned(records) if fmt == "text" else _markdown(records)
    note = caption(table, sweep)
    return f"{note}\n\n{body}\n" if fmt == "text" else f"{body}\n\n*{note}*\n"
