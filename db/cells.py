"""The cells every table of db/ writes the same way: a fraction in percent, a mean or a
paired difference with its interval and significance mark, and records laid out as aligned text
or Markdown. Below table_format (the ablation table) and decisions_format (the comparisons
under it), which both write with them."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from db import stats

MISSING = "—"
SIGNIFICANT = "*"  # after a difference the exact paired sign-flip test calls real at 5%
# What the mark means, in every caption: the exact test, not the t-interval, decides it, and it
# cannot fire below 6 seeds (smallest p 2/2^n: 0.0625 at 5).
SIGNIFICANT_RULE = f"{SIGNIFICANT} = exact paired sign-flip p < 0.05 (possible from 6 seeds on)"
# Columns whose cells are text, left-aligned in text and Markdown (the rest, numbers, right).
LEFT = {"arm", "adds", "parent", "status"}


def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def pct(value: Any, signed: bool = False) -> str:
    """A fraction as percent with one decimal ('43.0', '+5.0'), '—' when missing."""
    if missing(value):
        return MISSING
    return f"{100.0 * float(value):{'+' if signed else ''}.1f}"


def estimate_text(
    estimate: stats.Estimate | None,
    *,
    signed: bool = False,
    n_expected: int | None = None,
    number: Callable[[float], str] | None = None,
    bare_single: bool = False,
) -> str:
    """A mean and its 95% interval in percent: '43.0 [38.2, 47.8]'; a difference also gets
    ' *' when the exact paired test calls it real ('+5.0 [+1.2, +8.8] *', Estimate.significant). One value: '44.0 (n=1, no
    interval)', so a single seed never reads as a certain number; with `bare_single` (a table
    that says SINGLE_NOTE once) just '44.0'. When fewer values went in than the row has seeds
    (a difference over the seeds two arms share), '(n=2)' says so, bare or not.
    `number` writes each value (default: a fraction in percent, signed when `signed`)."""
    if estimate is None or estimate.n == 0 or missing(estimate.mean):
        return MISSING
    num = number or (lambda x: pct(x, signed))
    value = num(estimate.mean)
    if bare_single and estimate.n == 1:
        fewer = n_expected is not None and n_expected != 1
        return f"{value} (n=1)" if fewer else value
    if not estimate.has_interval:
        return f"{value} (n={estimate.n}, no interval)"
    text = f"{value} [{num(estimate.low)}, {num(estimate.high)}]"
    if signed and estimate.significant:
        text += f" {SIGNIFICANT}"
    if n_expected is not None and estimate.n != n_expected:
        text += f" (n={estimate.n})"
    return text


def aligned(records: Sequence[Mapping[str, str]], left: Collection[str] = LEFT) -> str:
    columns = list(records[0])
    widths = {c: max(len(c), *(len(r[c]) for r in records)) for c in columns}

    def line(cells: Mapping[str, str]) -> str:
        parts = [
            cells[c].ljust(widths[c]) if c in left else cells[c].rjust(widths[c]) for c in columns
        ]
        return "  ".join(parts).rstrip()

    header = line({c: c for c in columns})
    rule = "  ".join("-" * widths[c] for c in columns)
    return "\n".join([header, rule, *(line(r) for r in records)])


def escape(text: str) -> str:
    """Markdown-safe: the significance mark '*' must not open or close emphasis."""
    return text.replace("*", "\\*")


def markdown(records: Sequence[Mapping[str, str]], left: Collection[str] = LEFT) -> str:
    columns = list(records[0])

    def cell(text: str) -> str:
        return escape(text).replace("|", "\\|")

    head = "| " + " | ".join(columns) + " |"
    align = "|" + "|".join(":---" if c in left else "---:" for c in columns) + "|"
    body = ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in records]
    return "\n".join([head, align, *body])
