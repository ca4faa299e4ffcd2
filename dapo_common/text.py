"""Text for a terminal: tables that fit its width, and scores in percent.

One set of rules for every aligned table the `dapo` commands print (`dapo table`, its mechanism
table, `dapo arms`) and for the progress lines: a table fits the terminal ($COLUMNS, else the
terminal's width, else DEFAULT_WIDTH for a pipe or a log) by hiding its least telling columns
first, and says which it hid; a score is a percentage with one decimal everywhere, as the
ablation table shows it. Standard library only (see dapo_common).
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_WIDTH = 120  # a terminal's width when there is none to ask (a pipe, a file, CI logs)
CLIPPED = "…"  # ends a cell cut to fit


def terminal_width() -> int:
    """The width a text table fits: $COLUMNS, else the terminal's, else DEFAULT_WIDTH."""
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def clip(text: str, width: int) -> str:
    """`text` cut to `width` characters, the last one '…' when anything was cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + CLIPPED


def wrapped(text: str, width: int | None) -> str:
    """A caption or note broken into lines of at most `width` characters (None: one line)."""
    return text if width is None else textwrap.fill(text, width, break_on_hyphens=False)


def fit(
    records: Sequence[Mapping[str, str]],
    width: int | None,
    *,
    drop: Sequence[str],
    shrink: Mapping[str, int] | None = None,
    gap: int = 2,
) -> tuple[list[dict[str, str]], list[str]]:
    """The records cut to aligned text of at most `width` characters a line (None: all of
    them), and the columns hidden to get there, in the order they went.

    A column of `shrink` (name -> its narrowest) is cut short with '…' when that alone makes
    the rest fit; otherwise the next column of `drop` (least telling first) is hidden and the
    test repeated. Columns named in neither always stay, so a line may still be longer when
    they alone are: a number cut in half would mislead. `gap`: spaces between columns."""
    if not records:
        return [], []
    columns = list(records[0])
    widths = {c: max(len(c), *(len(r[c]) for r in records)) for c in columns}
    kept, hidden = list(columns), []
    queue = [c for c in drop if c in widths]
    narrowest = {c: max(n, len(c)) for c, n in (shrink or {}).items() if c in widths}

    def total() -> int:
        return sum(widths[c] for c in kept) + gap * (len(kept) - 1)

    while width is not None and total() > width:
        excess = total() - width
        room = [c for c in kept if c in narrowest and widths[c] - excess >= narrowest[c]]
        if room:
            widths[room[0]] -= excess
            break
        if not queue:
            break
        column = queue.pop(0)
        kept.remove(column)
        hidden.append(column)
    return [{c: clip(r[c], widths[c]) for c in kept} for r in records], hidden


def hidden_note(hidden: Sequence[str], width: int | None) -> str:
    """The one line that says which columns a fitted table left out, and how to see them."""
    return f"(hidden to fit {width} columns: {', '.join(hidden)}; --wide shows all)"


def percent(fraction: Any, *, signed: bool = False) -> str:
    """A score (a fraction) as a percentage with one decimal, '41.2%'; '-' when unknown."""
    if fraction is None or fraction != fraction:  # NaN is unequal to itself
        return "-"
    return f"{100.0 * float(fraction):{'+' if signed else ''}.1f}%"
