"""`dapo sweep rm ID`: delete a sweep's rows from the store and its run directories from disk.

It says what it would delete first, and deletes only with --yes: without it the command is a
dry run (exit 0) that ends by saying nothing was deleted. The rows go through db.cleanup (db
owns every query); a run directory goes only when it is this sweep's, as its OWNER.json says
(dapo_core.train.run_dir: store id and sweep id) and inside the runs directory
($DAPO_RUNS_DIR), so that a path in the store never makes the command delete anything else.

A sub-action of `dapo sweep` (flows.commands), registered by dapo_lab.cli's list of them.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunDir:
    """A stored run directory and what `dapo sweep rm` does with it (`why`: when kept)."""

    path: str
    remove: bool
    why: str = ""


def register_sweep_actions(actions: Any) -> None:
    """Add `rm` to `dapo sweep`'s actions (the group dapo_lab.cli made)."""
    from dapo_common.cli_args import positive_int
    from db.cli import store_argument

    rm = actions.add_parser(
        "rm",
        help="delete a sweep: its rows in the store and its run directories (with --yes)",
        description="Delete a sweep from the store (its runs, metrics, evaluations and samples) "
        "and its run directories (checkpoints) from disk. Without --yes, print what would be "
        "deleted and delete nothing. A sweep with a run still running is refused; a run "
        "directory outside $DAPO_RUNS_DIR, or whose OWNER.json names another store or sweep, is "
        "kept and listed as kept.",
    )
    rm.add_argument("sweep_id", type=positive_int, metavar="ID", help="the sweep's id")
    rm.add_argument("--yes", action="store_true", help="delete (default: only list)")
    store_argument(rm)
    rm.set_defaults(func=cmd_sweep_rm)


def classify(paths: tuple[str, ...], *, root: Path, store_id: str, sweep_id: int) -> list[RunDir]:
    """Which stored run directories `dapo sweep rm` may delete: those inside `root` whose
    owner record names this store and sweep. Missing ones are listed, with nothing to do."""
    from dapo_core.train.run_dir import read_owner

    out = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            out.append(RunDir(raw, False, "already gone"))
            continue
        resolved = path.resolve()
        if resolved == root or root not in resolved.parents:
            out.append(RunDir(raw, False, f"kept: not inside the runs directory {root}"))
            continue
        try:
            owner = read_owner(resolved)
        except (OSError, ValueError):
            owner = None
        if not owner or owner.get("store") != store_id or owner.get("sweep") != sweep_id:
            out.append(RunDir(raw, False, "kept: its OWNER.json does not name this sweep"))
            continue
        out.append(RunDir(raw, True))
    return out


def cmd_sweep_rm(args: argparse.Namespace) -> int:
    from db import cleanup
    from db import engine as db_engine
    from db.cli import existing_store
    from db.store import Store
    from flows.plan import runs_dir

    url = db_engine.resolve_url(args.store)
    existing_store(url)  # a mistyped URL must not create an empty store to delete from
    store = Store(url, open_wait_s=0)
    footprint = cleanup.sweep_footprint(store.engine, args.sweep_id)
    if footprint.live_runs:
        runs = ", ".join(str(r) for r in footprint.live_runs)
        raise ValueError(
            f"sweep {args.sweep_id} has runs still running ({runs}): cancel them (or wait) "
            "before removing it"
        )
    dirs = classify(
        footprint.run_dirs,
        root=runs_dir().resolve(),
        store_id=store.store_id,
        sweep_id=args.sweep_id,
    )
    folder = sweep_folder(runs_dir().resolve(), store.store_id, args.sweep_id)
    boards = tensorboard_folders(folder, [d.path for d in dirs if d.remove])
    verb = "deleting" if args.yes else "would delete"
    print(f"{verb} from {db_engine.safe_url(url)}: {footprint.summary()}")
    for d in dirs:
        print(f"  {d.path}" + ("" if d.remove else f"  ({d.why})"))
    for board in boards:
        print(f"  {board}  (TensorBoard)")
    if not args.yes:
        print("nothing deleted: run again with --yes to delete it")
        return 0
    cleanup.delete_sweep(store.engine, args.sweep_id)
    removed, failed = 0, []
    for d in dirs:
        if not d.remove:
            continue
        try:
            shutil.rmtree(d.path)
            removed += 1
        except OSError as error:  # the rows are gone; say what is left on disk
            failed.append(f"{d.path} ({error.strerror or error})")
    for board in boards:
        shutil.rmtree(board, ignore_errors=True)
    from dapo_core.train.trackers import TENSORBOARD_DIR

    remove_if_empty(folder / TENSORBOARD_DIR, folder, folder.parent)
    print(f"deleted sweep {args.sweep_id} and {removed} run directories")
    if failed:
        raise PermissionError(f"could not remove {len(failed)} run directories: {failed[0]}")
    return 0


def sweep_folder(root: Path, store_id: str, sweep_id: int) -> Path:
    """The folder a sweep's run directories are made in (flows.plan.fresh_run_dir's parent)."""
    from flows.plan import fresh_run_dir

    return fresh_run_dir(root, store_id, sweep_id, "arm", 0, "hash", 0).parent


def tensorboard_folders(folder: Path, removed: list[str]) -> list[Path]:
    """The sweep's TensorBoard folders (dapo_core.train.trackers.tensorboard_dirs) of the run
    directories in `removed`, by the run directory each names; a folder that names another
    directory, or none, is kept."""
    from dapo_core.train.trackers import TENSORBOARD_DIR, TENSORBOARD_OWNER

    gone = {str(Path(p).resolve()) for p in removed}
    found = []
    board = folder / TENSORBOARD_DIR
    for child in sorted(board.iterdir()) if board.is_dir() else []:
        try:
            owner = (child / TENSORBOARD_OWNER).read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if owner in gone:
            found.append(child)
    return found


def remove_if_empty(*folders: Path) -> None:
    """rmdir each folder in turn while it is empty (a sweep's folder, then its store's: other
    sweeps' run directories keep theirs)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty, or not there
            continue
