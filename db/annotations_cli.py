"""`dapo tag`, `dapo note`, `dapo sweep hide|unhide`: annotate sweeps and runs (db.annotations).

    dapo tag --sweep 3 baseline paper-fig2     tag a sweep (`--run ID`: one run)
    dapo tag --sweep 3 --remove baseline       take a tag off
    dapo tag --sweep 3                         print its tags
    dapo note --run 17 "lr too high after step 40"   set a run's note (`--clear` removes it)
    dapo sweep hide 4 / dapo sweep unhide 4    leave a trial sweep out of the dashboard

`hide` and `unhide` are `dapo sweep` actions, registered by dapo_lab.cli's list of them. Bad input (an unknown sweep or run, a tag with a space) is one line and
exit 2, by the dispatcher, before anything is written.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dapo_common.cli_args import positive_int
from db.cli import store_argument


def _target_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--sweep", type=positive_int, metavar="ID", help="a sweep's id")
    which.add_argument("--run", type=positive_int, metavar="ID", help="a run's id (one attempt)")
    store_argument(parser)


def register(subparsers: Any) -> None:
    """Add `tag` and `note`."""
    tag = subparsers.add_parser(
        "tag",
        help="tag a sweep or a run (or list, or remove, its tags)",
        description="Add tags to a sweep (--sweep ID) or one run (--run ID); with --remove, "
        "take them off; with no tag, print the tags it has. A tag is one word of letters, "
        "digits and _ . : + - /. The dashboard shows tags in its sweep list and run tables.",
    )
    _target_arguments(tag)
    tag.add_argument("tags", nargs="*", metavar="TAG", help="tags to add (or remove)")
    tag.add_argument("--remove", action="store_true", help="remove the tags instead of adding")
    tag.set_defaults(func=cmd_tag)

    note = subparsers.add_parser(
        "note",
        help="set, print or clear the note of a sweep or a run",
        description="Set the note of a sweep (--sweep ID) or one run (--run ID): free text, "
        "replacing the note it had; without text, print it; --clear removes it. Use - as the "
        "text to read it from standard input.",
    )
    _target_arguments(note)
    note.add_argument("text", nargs="?", default=None, metavar="TEXT", help="the note")
    note.add_argument("--clear", action="store_true", help="remove the note")
    note.set_defaults(func=cmd_note)


def register_sweep_actions(actions: Any) -> None:
    """Add `hide` and `unhide` to `dapo sweep`'s actions (the group dapo_lab.cli made)."""
    for name, hidden, text in (
        ("hide", True, "leave a (trial) sweep out of the dashboard's lists; deletes nothing"),
        ("unhide", False, "show a hidden sweep in the dashboard again"),
    ):
        action = actions.add_parser(
            name,
            help=text,
            description=f"{text[0].upper()}{text[1:]}. The dashboard lists hidden sweeps "
            "only with its 'show hidden sweeps' switch on; a link to one still opens it.",
        )
        action.add_argument("sweep_id", type=positive_int, metavar="ID", help="the sweep's id")
        store_argument(action)
        action.set_defaults(func=cmd_hide, hide=hidden)


def _engine(args: argparse.Namespace) -> tuple[Any, str]:
    """The store's engine (a missing SQLite file is an error, not a new empty store)."""
    from db import engine as db_engine
    from db.cli import existing_store

    url = db_engine.resolve_url(args.store)
    existing_store(url)
    return db_engine.get_engine(url), url


def _target(engine: Any, args: argparse.Namespace) -> Any:
    from db import annotations

    if args.run is not None:
        return annotations.run_target(engine, args.run)
    return annotations.sweep_target(engine, args.sweep)


def cmd_tag(args: argparse.Namespace) -> int:
    from db import annotations
    from db.cli import _explained

    if args.remove and not args.tags:
        raise ValueError("--remove needs the tags to remove")
    tags = args.tags if args.remove else annotations.clean_tags(args.tags)  # checked first
    engine, url = _engine(args)
    absent: list[str] = []
    with _explained(url):
        target = _target(engine, args)
        if not tags:
            now = annotations.read(engine, target)
        elif args.remove:
            had = annotations.read(engine, target).tags
            absent = [t for t in dict.fromkeys(str(t).strip() for t in tags) if t not in had]
            if len(absent) == len(set(tags)):  # nothing to take off: a typo, say so
                names = ", ".join(repr(t) for t in absent)
                raise ValueError(
                    f"{target} has no tag {names} (its tags: "
                    f"{annotations.tags_text(had) or 'none'}); nothing removed"
                )
            now = annotations.remove_tags(engine, target, tags)
        else:
            now = annotations.add_tags(engine, target, tags)
    shown = annotations.tags_text(now.tags) or "no tags"
    missing = f" (it had no tag {', '.join(repr(t) for t in absent)})" if absent else ""
    print(f"{target}: {shown}{missing}")
    return 0


def cmd_note(args: argparse.Namespace) -> int:
    from db import annotations
    from db.cli import _explained

    if args.clear and args.text is not None:
        raise ValueError("give the note's text or --clear, not both")
    text = sys.stdin.read() if args.text == "-" else args.text
    if text is not None and annotations.clean_note(text) is None:
        raise ValueError("the note is empty: use --clear to remove a note")
    engine, url = _engine(args)
    with _explained(url):
        target = _target(engine, args)
        if args.clear:
            annotations.set_note(engine, target, None)
            print(f"{target}: note removed")
            return 0
        now = (
            annotations.read(engine, target)
            if text is None
            else annotations.set_note(engine, target, text)
        )
    if now.note is None:
        print(f"{target}: no note")
    else:
        print(f"{target}: {now.note}")
    return 0


def cmd_hide(args: argparse.Namespace) -> int:
    from db import annotations
    from db.cli import _explained

    engine, url = _engine(args)
    with _explained(url):
        changed = annotations.set_hidden(engine, args.sweep_id, args.hide)
    state = "hidden" if args.hide else "shown"
    print(f"sweep {args.sweep_id}: {state}" + ("" if changed else " (it already was)"))
    return 0
