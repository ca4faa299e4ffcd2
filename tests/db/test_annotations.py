"""Tags and notes on sweeps and runs, and hidden sweeps (db.annotations, migration 0006):
the store round trip on SQLite and PostgreSQL, and `dapo tag` / `dapo note` / `dapo sweep
hide|unhide` run as a user runs them (the console script in a subprocess)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from dapo_cli import dapo
from store_runs import new_attempt

from db import annotations as ann
from db import cleanup
from db.annotations import Annotations, Target
from db.errors import NotFound
from db.models import ANNOTATIONS
from db.store import Store

ROOT = Path(__file__).resolve().parents[2]
LADDER = [{"arm": "grpo", "adds": "baseline"}, {"arm": "clip_higher", "adds": "clip"}]


def new_sweep(store: Store, name: str = "ladder") -> int:
    return store.create_sweep(
        name=name,
        preset="tiny",
        arms=["grpo", "clip_higher"],
        seeds=[0],
        base_config={"algo": {"clip_high": 0.2}},
        ladder=LADDER,
    )


def new_run(store: Store, sweep_id: int, arm: str = "grpo") -> int:
    return new_attempt(store, sweep_id, arm, 0, config={"arm": arm}, config_hash=f"h-{arm}")


def rows(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(ANNOTATIONS)).scalar_one())


# --- the store ---------------------------------------------------------------------------------


def test_tags_notes_and_hidden_round_trip(store_url: str) -> None:
    store = Store(store_url)
    engine = store.engine
    sweep_id, other = new_sweep(store), new_sweep(store, "trial")
    run_id = new_run(store, sweep_id)
    sweep, run = ann.sweep_target(engine, sweep_id), ann.run_target(engine, run_id)
    assert run == Target(sweep_id, run_id) and str(run) == f"run {run_id}"
    assert ann.read(engine, sweep) == Annotations()

    # tagging twice is one tag (ON CONFLICT on the partial unique index), sorted on the way out
    assert ann.add_tags(engine, sweep, ["paper", "baseline"]).tags == ("baseline", "paper")
    assert ann.add_tags(engine, sweep, ["baseline", " paper "]).tags == (
        "baseline",
        "paper",
    )
    # the same tag on the run is the run's own, not the sweep's
    assert ann.add_tags(engine, run, ["baseline", "lr-bug"]).tags == ("baseline", "lr-bug")
    assert ann.read(engine, sweep).tags == ("baseline", "paper")
    assert ann.remove_tags(engine, sweep, ["paper", "not-there"]).tags == ("baseline",)
    assert ann.set_tags(engine, run, ["x1", "lr-bug"]).tags == ("lr-bug", "x1")

    # one note per target, replaced in place; blank text removes it
    assert ann.set_note(engine, sweep, "  first try\nlr 1e-5  ").note == "first try\nlr 1e-5"
    assert ann.set_note(engine, sweep, "second").note == "second"
    assert ann.set_note(engine, run, "diverged at step 40").note == "diverged at step 40"
    assert rows(store) == 1 + 2 + 1 + 1  # sweep: a tag, a note; run: two tags, a note

    assert ann.hidden_sweeps(engine) == set()
    assert ann.set_hidden(engine, other) is True
    assert ann.set_hidden(engine, other) is False  # already hidden: nothing changes
    assert ann.hidden_sweeps(engine) == {other}
    assert ann.read(engine, Target(other)) == Annotations(hidden=True)

    frame = ann.sweep_annotations(engine)
    assert frame.to_dict("records") == [
        {"sweep_id": sweep_id, "tags": ("baseline",), "note": "second", "hidden": False},
        {"sweep_id": other, "tags": (), "note": None, "hidden": True},
    ]
    runs = ann.run_annotations(engine, sweep_id)
    assert runs.to_dict("records") == [
        {
            "run_id": run_id,
            "sweep_id": sweep_id,
            "tags": ("lr-bug", "x1"),
            "note": "diverged at step 40",
        }
    ]

    assert ann.set_note(engine, sweep, "   ").note is None
    assert ann.set_hidden(engine, other, False) is True
    assert ann.hidden_sweeps(engine) == set()


def test_deleting_a_sweep_takes_its_annotations(store_url: str) -> None:
    store = Store(store_url)
    keep, gone = new_sweep(store), new_sweep(store, "trial")
    run_id = new_run(store, gone)
    ann.add_tags(store.engine, Target(keep), ["keep"])
    ann.add_tags(store.engine, Target(gone), ["trial"])
    ann.set_note(store.engine, Target(gone, run_id), "noise")
    ann.set_hidden(store.engine, gone)
    cleanup.delete_sweep(store.engine, gone)  # the foreign keys cascade
    assert rows(store) == 1
    assert ann.read(store.engine, Target(keep)).tags == ("keep",)


def test_bad_tags_notes_and_targets_are_one_line(store_url: str) -> None:
    store = Store(store_url)
    engine = store.engine
    sweep_id = new_sweep(store)
    for bad, why in (
        ("two words", "one word"),
        ("a,b", "one word"),
        ("-lead", "starting with a letter or digit"),
        ("", "cannot be empty"),
        ("x" * 65, "at most 64"),
    ):
        with pytest.raises(ValueError, match=why):
            ann.add_tags(engine, Target(sweep_id), ["fine", bad])
    assert rows(store) == 0  # checked before anything is written
    with pytest.raises(ValueError, match="at most 10,000 characters"):
        ann.set_note(engine, Target(sweep_id), "x" * 10_001)
    with pytest.raises(NotFound, match=r"^no sweep with id 99 in "):
        ann.sweep_target(engine, 99)
    with pytest.raises(NotFound, match=r"^no run with id 99 in "):
        ann.run_target(engine, 99)
    with pytest.raises(NotFound):
        ann.set_hidden(engine, 99)
    assert ann.split_tags("baseline, lr-bug  paper-fig2,") == [
        "baseline",
        "lr-bug",
        "paper-fig2",
    ]


def test_a_run_cannot_be_hidden(store_url: str) -> None:
    """Hiding is for sweeps: the table's check constraint says so too."""
    store = Store(store_url)
    sweep_id = new_sweep(store)
    run_id = new_run(store, sweep_id)
    now = ann.utcnow()
    with pytest.raises(sa.exc.IntegrityError), store.engine.begin() as conn:
        conn.execute(
            sa.insert(ANNOTATIONS).values(
                sweep_id=sweep_id,
                run_id=run_id,
                kind="hidden",
                tag="",
                created_at=now,
                updated_at=now,
            )
        )


# --- the commands ------------------------------------------------------------------------------


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, exactly one line on stderr (`error: ...` or argparse's own), no traceback."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_tag_note_hide_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(url)
    sweep_id = new_sweep(store)
    run_id = new_run(store, sweep_id)

    done = dapo("tag", "--sweep", str(sweep_id), "baseline", "paper-fig2", url=url)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"sweep {sweep_id}: baseline, paper-fig2\n"
    assert dapo("tag", "--sweep", str(sweep_id), url=url).stdout == (
        f"sweep {sweep_id}: baseline, paper-fig2\n"
    )
    done = dapo("tag", "--sweep", str(sweep_id), "--remove", "paper-fig2", url=url)
    assert done.stdout == f"sweep {sweep_id}: baseline\n"
    assert dapo("tag", "--run", str(run_id), url=url).stdout == f"run {run_id}: no tags\n"

    done = dapo("note", "--run", str(run_id), "lr too high after step 40", url=url)
    assert done.returncode == 0 and done.stdout == f"run {run_id}: lr too high after step 40\n"
    assert dapo("note", "--run", str(run_id), url=url).stdout == (
        f"run {run_id}: lr too high after step 40\n"
    )
    done = dapo("note", "--sweep", str(sweep_id), "-", url=url, stdin="from stdin\n")
    assert done.stdout == f"sweep {sweep_id}: from stdin\n"
    done = dapo("note", "--run", str(run_id), "--clear", url=url)
    assert done.stdout == f"run {run_id}: note removed\n"
    assert ann.read(store.engine, Target(sweep_id, run_id)).note is None

    done = dapo("sweep", "hide", str(sweep_id), url=url)
    assert done.returncode == 0 and done.stdout == f"sweep {sweep_id}: hidden\n"
    assert dapo("sweep", "hide", str(sweep_id), url=url).stdout == (
        f"sweep {sweep_id}: hidden (it already was)\n"
    )
    assert ann.hidden_sweeps(store.engine) == {sweep_id}
    assert dapo("sweep", "unhide", str(sweep_id), url=url).stdout == f"sweep {sweep_id}: shown\n"
    assert ann.hidden_sweeps(store.engine) == set()


def test_bad_input_to_the_commands_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(url)
    sweep_id = new_sweep(store)
    cases = [
        (("tag", "--sweep", str(sweep_id), "two words"), "error: tag 'two words': one word"),
        (("tag", "--sweep", "99", "x"), "error: no sweep with id 99 in sqlite:///"),
        (("tag", "--run", "99", "x"), "error: no run with id 99 in "),
        (("tag", "--sweep", str(sweep_id), "--remove"), "error: --remove needs the tags"),
        (("tag", "x"), "one of the arguments --sweep --run is required"),
        (("tag", "--sweep", "1", "--run", "1", "x"), "not allowed with argument"),
        (("tag", "--sweep", "zero", "x"), "'zero' is not an integer"),
        (("note", "--sweep", str(sweep_id), "text", "--clear"), "error: give the note's text"),
        (("note", "--sweep", str(sweep_id), "  "), "error: the note is empty"),
        (("sweep", "hide", "99"), "error: no sweep with id 99 in "),
        (("sweep", "unhide", "0"), "'0' is not a positive integer"),
    ]
    for args, message in cases:
        line = one_error_line(dapo(*args, url=url))
        assert message in line, (args, line)
    assert rows(store) == 0
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    line = one_error_line(dapo("sweep", "hide", "1", url=missing))
    assert line.startswith("error: no store at ")
    assert not (tmp_path / "missing.db").exists()  # a mistyped URL creates no store
