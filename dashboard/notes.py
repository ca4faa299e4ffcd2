"""Tags, notes and hidden sweeps on the dashboard (db.annotations): the filter, the editor.

Hidden sweeps (`dapo sweep hide ID`, or the editor's checkbox) are trial runs a researcher
wants out of the way: every sweep list and picker leaves them out unless the sidebar's
"Show hidden sweeps" switch is on. A link to a hidden sweep (`?sweep=ID`) still opens it, so
nothing a page links to disappears. Besides "rerun this arm", the editor is the dashboard's
only write: tags and a note, never a number.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd
import sqlalchemy as sa
import streamlit as st

from dapo_common.util import first_line
from db import annotations as ann

SHOW_HIDDEN_KEY = "show-hidden"


def hidden_switch() -> None:
    """The sidebar's "Show hidden sweeps" switch, drawn once per page run by app.py (a widget
    key may be drawn only once, and several pickers on a page read it)."""
    st.sidebar.toggle(
        "Show hidden sweeps",
        key=SHOW_HIDDEN_KEY,
        help="Hidden sweeps (`dapo sweep hide ID`, or a sweep's tags-and-note editor) are left "
        "out of every sweep list unless this is on. Hiding deletes nothing.",
    )


def show_hidden() -> bool:
    """Whether the switch is on (off on a page that runs without app.py, e.g. in a test)."""
    return bool(st.session_state.get(SHOW_HIDDEN_KEY, False))


def visible(
    ids: Iterable[int], hidden: set[int], *, show: bool, keep: Sequence[int] = ()
) -> list[int]:
    """The ids to list: all with `show`, else those not hidden, plus `keep` (a sweep the URL
    names, the sweep of a run picked elsewhere), in the order given."""
    kept = {int(k) for k in keep}
    return [int(i) for i in ids if show or int(i) not in hidden or int(i) in kept]


def tag_cell(tags: Iterable[str] | None) -> str:
    """Tags as one table cell: 'baseline, lr-bug' ('' for none)."""
    return ann.tags_text(tags or ())


def note_cell(note: str | None, width: int = 80) -> str:
    """A note's first line, cut to `width` characters, for a table cell."""
    if not note:
        return ""
    line = note.strip().splitlines()[0]
    return line if len(line) <= width else f"{line[: width - 1]}…"


def with_sweep_annotations(sweeps: pd.DataFrame, engine: sa.Engine) -> pd.DataFrame:
    """ablation.list_sweeps' frame with `tags`, `note` and `hidden` columns."""
    notes = ann.sweep_annotations(engine)
    by_id = {int(r.sweep_id): r for r in notes.itertuples()}
    ids = [int(s) for s in sweeps["sweep_id"]]
    return sweeps.assign(
        tags=[tag_cell(by_id[i].tags) if i in by_id else "" for i in ids],
        note=[note_cell(by_id[i].note) if i in by_id else "" for i in ids],
        hidden=[bool(by_id[i].hidden) if i in by_id else False for i in ids],
    )


def with_run_annotations(runs: pd.DataFrame, engine: sa.Engine, sweep_id: int) -> pd.DataFrame:
    """reads.runs_of_sweep's frame with the runs' `tags` and `note`."""
    notes = ann.run_annotations(engine, sweep_id)
    by_id = {int(r.run_id): r for r in notes.itertuples()}
    ids = [int(r) for r in runs["run_id"]]
    return runs.assign(
        tags=[tag_cell(by_id[i].tags) if i in by_id else "" for i in ids],
        note=[note_cell(by_id[i].note) if i in by_id else "" for i in ids],
    )


def show(engine: sa.Engine, target: ann.Target) -> ann.Annotations:
    """The target's tags and note as a line under a page's title; returns them."""
    now = ann.read(engine, target)
    parts = []
    if now.hidden:
        parts.append("**hidden**")
    if now.tags:
        parts.append("tags " + " ".join(f"`{t}`" for t in now.tags))
    if now.note:
        parts.append(f"note: {note_cell(now.note, 200)}")
    if parts:
        st.markdown(" · ".join(parts))
    return now


def editor(engine: sa.Engine, target: ann.Target, *, key: str) -> None:
    """A form to edit the target's tags and note (and hide a sweep). Saved in one go; a bad
    tag is one warning line and nothing is written."""
    now = ann.read(engine, target)
    key = f"{key}-{'s' if target.run_id is None else 'r'}{target.run_id or target.sweep_id}"
    if st.session_state.pop(f"{key}-saved", False):
        st.success(f"Saved the tags and note of {target}.")
    with st.form(key=f"{key}-form", border=False):
        tags = st.text_input(
            "Tags",
            value=ann.tags_text(now.tags),
            key=f"{key}-tags",
            placeholder="baseline, lr-bug",
            help="Words separated by commas or spaces (letters, digits and _ . : + - /).",
        )
        note = st.text_area(
            "Note",
            value=now.note or "",
            key=f"{key}-note",
            height=90,
            max_chars=ann.NOTE_MAX,
        )
        hide = (
            st.checkbox(
                "Hide this sweep from the lists (a trial run)", value=now.hidden, key=f"{key}-hide"
            )
            if target.run_id is None
            else None
        )
        saved = st.form_submit_button("Save tags and note", key=f"{key}-save")
    if not saved:
        return
    try:
        wanted = ann.split_tags(tags)
        ann.clean_note(note)  # checked before anything is written
    except ValueError as error:
        st.warning(first_line(error))
        return
    ann.set_tags(engine, target, wanted)
    ann.set_note(engine, target, note)
    if hide is not None:
        ann.set_hidden(engine, target.sweep_id, bool(hide))
    # Again from the top, so the lists and the line under the title show what was saved.
    st.session_state[f"{key}-saved"] = True
    st.rerun()
