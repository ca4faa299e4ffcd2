"""Tags and notes on sweeps and runs, and hidden (trial) sweeps: the `annotations` table.

What a researcher says about a result, kept beside it: a few short tags ("baseline", "lr-bug",
"paper-fig2") on a sweep or on one run, one free-text note each (edited in place, not a log),
and, for a sweep, that it is hidden: a trial sweep the dashboard leaves out of its pickers and
lists unless "show hidden" is on. Hiding deletes nothing (`dapo sweep rm` does that).

Written by `dapo tag`, `dapo note`, `dapo sweep hide|unhide` (db.annotations_cli) and by the
dashboard; every write is one transaction keyed by what it means (ON CONFLICT on the table's
partial unique indexes, db.models.Annotation), so tagging twice is one tag and two writers
setting a note at once leave one note.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import sqlalchemy as sa

from db.engine import safe_url
from db.errors import NotFound
from db.models import ANNOTATIONS, RUNS, SWEEPS, utcnow
from db.sink import upsert
from db.transactions import retrying, write_transaction

TAG_MAX = 64  # the tag column's width
NOTE_MAX = 10_000  # characters: a note, not a report (a longer one is refused, not cut)
# A tag is one word: letters, digits and `_ . : + - /` (no spaces or commas, so that
# `dapo tag 3 a b` and the dashboard's comma-separated box split tags one way only).
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+/-]*")
SWEEP_COLUMNS = ["sweep_id", "tags", "note", "hidden"]
RUN_COLUMNS = ["run_id", "sweep_id", "tags", "note"]

_a = ANNOTATIONS.c


@dataclass(frozen=True)
class Target:
    """What an annotation is about: a sweep (run_id None) or one run of a sweep."""

    sweep_id: int
    run_id: int | None = None

    def __str__(self) -> str:
        return f"sweep {self.sweep_id}" if self.run_id is None else f"run {self.run_id}"


@dataclass(frozen=True)
class Annotations:
    """One target's annotations: its tags (sorted), its note (None: none) and, for a sweep,
    whether it is hidden."""

    tags: tuple[str, ...] = ()
    note: str | None = None
    hidden: bool = False


def clean_tag(text: str) -> str:
    """A tag as stored (surrounding blanks dropped), or ValueError in one line saying why."""
    tag = str(text).strip()
    if not tag:
        raise ValueError("a tag cannot be empty")
    if len(tag) > TAG_MAX:
        raise ValueError(f"tag {tag[:20]!r}...: at most {TAG_MAX} characters")
    if not TAG_RE.fullmatch(tag):
        raise ValueError(
            f"tag {tag!r}: one word of letters, digits and _ . : + - / (no spaces or commas), "
            "starting with a letter or digit"
        )
    return tag


def clean_tags(texts: Iterable[str]) -> list[str]:
    """Tags as stored, each once, in the order given."""
    return list(dict.fromkeys(clean_tag(t) for t in texts))


def split_tags(text: str) -> list[str]:
    """'baseline, lr-bug  paper' -> the tags (commas or blanks separate them), checked."""
    return clean_tags(t for t in re.split(r"[,\s]+", text) if t)


def clean_note(text: str | None) -> str | None:
    """A note as stored: None (no note) for None or blank text; ValueError when too long."""
    if text is None or not text.strip():
        return None
    note = text.strip()
    if len(note) > NOTE_MAX:
        raise ValueError(f"a note holds at most {NOTE_MAX:,} characters, this one {len(note):,}")
    return note


# --- targets -------------------------------------------------------------------------------


def sweep_target(engine: sa.Engine, sweep_id: int) -> Target:
    """The sweep as a target; NotFound (one line, naming the store) when there is none."""
    with engine.connect() as conn:
        found = conn.execute(sa.select(SWEEPS.c.id).where(SWEEPS.c.id == int(sweep_id))).first()
    if found is None:
        raise NotFound(f"no sweep with id {sweep_id} in {safe_url(engine.url)}")
    return Target(int(sweep_id))


def run_target(engine: sa.Engine, run_id: int) -> Target:
    """The run (one attempt) as a target, with its sweep; NotFound when there is none."""
    with engine.connect() as conn:
        sweep = conn.execute(sa.select(RUNS.c.sweep_id).where(RUNS.c.id == int(run_id))).scalar()
    if sweep is None:
        raise NotFound(f"no run with id {run_id} in {safe_url(engine.url)}")
    return Target(int(sweep), int(run_id))


def _of(target: Target) -> sa.ColumnElement[bool]:
    if target.run_id is None:
        return sa.and_(_a.sweep_id == target.sweep_id, _a.run_id.is_(None))
    return _a.run_id == target.run_id


def _key(target: Target) -> dict[str, Any]:
    """The ON CONFLICT target: which of the two partial unique indexes the row falls under."""
    if target.run_id is None:
        return {"index_elements": ["sweep_id", "kind", "tag"], "index_where": _a.run_id.is_(None)}
    return {"index_elements": ["run_id", "kind", "tag"], "index_where": _a.run_id.isnot(None)}


def _insert(
    conn: sa.Connection, engine: sa.Engine, target: Target, kind: str, tag: str, body: Any
) -> None:
    """One row, or (same target, kind and tag) the row already there with the new body."""
    now = utcnow()
    stmt = upsert(engine, ANNOTATIONS).values(
        sweep_id=target.sweep_id,
        run_id=target.run_id,
        kind=kind,
        tag=tag,
        body=body,
        created_at=now,
        updated_at=now,
    )
    conn.execute(
        stmt.on_conflict_do_update(
            **_key(target), set_={"body": stmt.excluded.body, "updated_at": now}
        )
    )


def _write(engine: sa.Engine, work: Callable[[sa.Connection], None]) -> None:
    """One transaction, retried on a lock or serialization conflict (db.transactions)."""

    def once() -> None:
        with write_transaction(engine) as conn:
            work(conn)

    retrying(once)


# --- writes --------------------------------------------------------------------------------


def add_tags(engine: sa.Engine, target: Target, tags: Iterable[str]) -> Annotations:
    """Tag the target (a tag it has already is kept once); returns its annotations after."""
    wanted = clean_tags(tags)

    def work(conn: sa.Connection) -> None:
        for tag in wanted:
            _insert(conn, engine, target, "tag", tag, None)

    _write(engine, work)
    return read(engine, target)


def remove_tags(engine: sa.Engine, target: Target, tags: Iterable[str]) -> Annotations:
    """Take tags off the target (one it does not have is no error); its annotations after."""
    gone = [str(t).strip() for t in tags]

    def work(conn: sa.Connection) -> None:
        conn.execute(sa.delete(ANNOTATIONS).where(_of(target), _a.kind == "tag", _a.tag.in_(gone)))

    _write(engine, work)
    return read(engine, target)


def set_tags(engine: sa.Engine, target: Target, tags: Iterable[str]) -> Annotations:
    """Make the target's tags exactly `tags` (the dashboard's editor), in one transaction."""
    wanted = clean_tags(tags)

    def work(conn: sa.Connection) -> None:
        conn.execute(
            sa.delete(ANNOTATIONS).where(_of(target), _a.kind == "tag", _a.tag.notin_(wanted))
        )
        for tag in wanted:
            _insert(conn, engine, target, "tag", tag, None)

    _write(engine, work)
    return read(engine, target)


def set_note(engine: sa.Engine, target: Target, text: str | None) -> Annotations:
    """Replace the target's note; None or blank text removes it."""
    note = clean_note(text)

    def work(conn: sa.Connection) -> None:
        if note is None:
            conn.execute(sa.delete(ANNOTATIONS).where(_of(target), _a.kind == "note"))
        else:
            _insert(conn, engine, target, "note", "", note)

    _write(engine, work)
    return read(engine, target)


def set_hidden(engine: sa.Engine, sweep_id: int, hidden: bool = True) -> bool:
    """Hide (or show again) a sweep; returns whether that changed anything. NotFound for a
    sweep the store does not hold."""
    target = sweep_target(engine, sweep_id)
    before = read(engine, target).hidden
    if before == hidden:
        return False

    def work(conn: sa.Connection) -> None:
        if hidden:
            _insert(conn, engine, target, "hidden", "", None)
        else:
            conn.execute(sa.delete(ANNOTATIONS).where(_of(target), _a.kind == "hidden"))

    _write(engine, work)
    return True


# --- reads ---------------------------------------------------------------------------------


def _fold(rows: Sequence[Any]) -> Annotations:
    tags = sorted(str(r.tag) for r in rows if r.kind == "tag")
    notes = [str(r.body) for r in rows if r.kind == "note" and r.body]
    return Annotations(
        tags=tuple(tags),
        note=notes[0] if notes else None,
        hidden=any(r.kind == "hidden" for r in rows),
    )


def read(engine: sa.Engine, target: Target) -> Annotations:
    """The target's tags, note and (a sweep) hidden flag."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(_a.kind, _a.tag, _a.body).where(_of(target))).all()
    return _fold(rows)


def hidden_sweeps(engine: sa.Engine) -> set[int]:
    """The ids of the hidden sweeps."""
    query = sa.select(_a.sweep_id).where(_a.kind == "hidden", _a.run_id.is_(None))
    with engine.connect() as conn:
        return {int(s) for s in conn.execute(query).scalars()}


def sweep_annotations(engine: sa.Engine, sweep_ids: Sequence[int] | None = None) -> pd.DataFrame:
    """One row per sweep that has any annotation (SWEEP_COLUMNS: tags a tuple, note or None,
    hidden), of the sweeps given or of every sweep."""
    query = sa.select(_a.sweep_id, _a.kind, _a.tag, _a.body).where(_a.run_id.is_(None))
    if sweep_ids is not None:
        query = query.where(_a.sweep_id.in_([int(s) for s in sweep_ids]))
    with engine.connect() as conn:
        rows = conn.execute(query.order_by(_a.sweep_id)).all()
    out = []
    for sweep_id in dict.fromkeys(int(r.sweep_id) for r in rows):
        folded = _fold([r for r in rows if int(r.sweep_id) == sweep_id])
        out.append((sweep_id, folded.tags, folded.note, folded.hidden))
    # object columns, so a missing note stays None (pandas would infer text and make it NaN)
    frame = pd.DataFrame(out, columns=SWEEP_COLUMNS, dtype=object)
    return frame.astype({"sweep_id": int, "hidden": bool})


def run_annotations(engine: sa.Engine, sweep_id: int) -> pd.DataFrame:
    """One row per run of the sweep that has a tag or a note (RUN_COLUMNS)."""
    query = sa.select(_a.run_id, _a.kind, _a.tag, _a.body).where(
        _a.sweep_id == int(sweep_id), _a.run_id.isnot(None)
    )
    with engine.connect() as conn:
        rows = conn.execute(query.order_by(_a.run_id)).all()
    out = []
    for run_id in dict.fromkeys(int(r.run_id) for r in rows):
        folded = _fold([r for r in rows if int(r.run_id) == run_id])
        out.append((run_id, int(sweep_id), folded.tags, folded.note))
    frame = pd.DataFrame(out, columns=RUN_COLUMNS, dtype=object)
    return frame.astype({"run_id": int, "sweep_id": int})


def tags_text(tags: Iterable[str]) -> str:
    """Tags as one line: 'baseline, lr-bug' ('' for none)."""
    return ", ".join(tags)
