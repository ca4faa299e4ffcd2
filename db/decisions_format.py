"""The comparisons of a sweep (db.decisions) as text, Markdown and records: one row per Δ with
its exact p, minimum detectable effect, seeds needed, probability of improvement and verdict.
`dapo table` prints it under the ablation table; the dashboard and the Prefect artifact show
the same records."""

from __future__ import annotations

import math
from collections.abc import Sequence

from dapo_common.text import fit, hidden_note, wrapped
from db import power
from db.cells import MISSING, estimate_text, pct
from db.cells import aligned as _aligned
from db.cells import markdown as _markdown
from db.decisions import Comparison

CAPTION = (
    "Comparisons: Δ = A − B paired by seed, in pp [95% t-interval]; p = exact paired sign-flip "
    "test (every sign assignment; Monte Carlo beyond 16 seeds), * and 'real' when p < 0.05, "
    "which no test over fewer than 6 seeds can reach; MDE = the smallest |Δ| (pp) these seeds "
    "detect with 80% power at 5%, from the observed spread; seeds = paired seeds needed to "
    "detect the observed Δ so; P(A>B) = share of run pairs where A scores higher"
)
SEQUENTIAL_CAPTION = (
    "Until decided: the adaptive sweep's own decision, taken at its planned looks under a "
    "group-sequential design (db/sequential.py: O'Brien-Fleming spending, false positives at "
    "5% over all looks), with the Δ over the seeds of the deciding look; futile = the "
    "remaining seeds would very likely not have decided it"
)
_LEFT = {"comparison", "vs", "verdict", "until decided"}


def _mde(value: float, n: int) -> str:
    if math.isnan(value):
        return MISSING
    if math.isinf(value):
        return f"none below {power.exact_floor()}"
    return f"{100 * value:.1f}"


def _seeds(value: int | None, n: int) -> str:
    return MISSING if value is None or n < 2 else str(value)


def records(comps: Sequence[Comparison]) -> list[dict[str, str]]:
    """Display strings per comparison (the columns of CAPTION; one 'seeds for X pp' column
    when an effect was named)."""
    out = []
    for c in comps:
        d = c.delta
        row = {
            "comparison": c.name,
            "vs": c.kind,
            "n": str(d.n),
            "Δ": estimate_text(d, signed=True, bare_single=True),
            "p": MISSING if not d.tested else f"{d.p:.2g}" + ("" if d.exact else " (MC)"),
            "MDE": _mde(c.mde, d.n),
            "seeds": _seeds(c.needed, d.n),
        }
        if c.effect is not None:
            row[f"seeds for {100 * c.effect:g} pp"] = _seeds(c.needed_effect, d.n)
        row["P(A>B)"] = MISSING if math.isnan(c.p_improve) else f"{c.p_improve:.2f}"
        row["verdict"] = c.verdict()
        if any(x.looks for x in comps):
            row["until decided"] = c.sequential() or MISSING
        out.append(row)
    return out


def render(comps: Sequence[Comparison], fmt: str, *, width: int | None = None) -> str:
    """The comparisons in `fmt` (text or markdown) with their caption; '' when there are none."""
    rows = records(comps)
    if not rows:
        return ""
    caption = CAPTION + (f". {SEQUENTIAL_CAPTION}" if "until decided" in rows[0] else "")
    if fmt == "markdown":
        return f"{_markdown(rows, _LEFT)}\n\n*{caption}*\n"
    shown, hidden = fit(
        rows,
        width,
        drop=["vs", "P(A>B)", "MDE", "verdict"]
        if "until decided" in rows[0]
        else ["vs", "P(A>B)", "MDE"],
        shrink={"comparison": 16, "verdict": 12},
    )
    note = f"{hidden_note(hidden, width)}\n" if hidden else ""
    return f"{_aligned(shown, _LEFT)}\n{note}{wrapped(caption, width)}\n"


def headline_numbers(c: Comparison) -> str:
    """One line for a headline: '+4.9 pp [+0.1, +9.7], exact p = 0.062 over 8 seeds; MDE 6.6
    pp; 13 seeds for this Δ'."""
    d = c.delta
    if d.n == 0:
        return "no shared seed"
    parts = [f"{pct(d.mean, True)} pp"]
    if d.has_interval:
        parts[0] += f" [{pct(d.low, True)}, {pct(d.high, True)}]"
    if d.tested:
        parts.append(f"exact p = {d.p:.2g} over {d.n} seed{'s' if d.n != 1 else ''}")
    if not math.isnan(c.mde):
        parts.append(f"MDE {_mde(c.mde, d.n)} pp")
    if c.needed is not None:
        parts.append(f"{c.needed} seeds for this Δ")
    return "; ".join(parts)
