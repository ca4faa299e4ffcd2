"""A run directory's layout and who owns it. Imports nothing heavy (no torch), so the flows read
it freely.

    <run dir>/
      OWNER.json              who may write and resume here (see claim)
      config.json             the experiment config of the latest start
      checkpoints/
        latest                text file naming the newest complete checkpoint ("step_8")
        step_8/               one checkpoint (see dapo_core.train.checkpoint): one worker's, or
                              N workers' sharded one (SHARDS_DIR and RANKS_DIR inside)

Only a `latest` that names a `step_<N>` directory inside `checkpoints/` is followed: a crafted
pointer (`../../elsewhere`) or a symlink out of the run directory is refused, so a checkpoint
path taken from the store can never make a run load files from outside its own directory. A
`latest` that cannot be read, or names a checkpoint that is not there or not whole, is said in
one line (ValueError), never taken for "no checkpoint": that would start the run over silently
and its new curve would overwrite the old one's steps.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CHECKPOINTS = "checkpoints"
LATEST = "latest"
MODEL_DIR = "model"
STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "config.json"
SHARDS_DIR = "dcp"  # torch.distributed.checkpoint of a sharded checkpoint: masters + optimizer
RANKS_DIR = "ranks"  # rank_<r>.pt: each worker's random streams
OWNER_FILE = "OWNER.json"
_STEP_NAME = re.compile(r"step_(\d+)")
# What a damaged `latest` pointer's line goes on to say.
_DAMAGED = (
    "the run's checkpoints are damaged; point it at a whole step_<N> checkpoint, or remove it "
    "to start the run over"
)


class NotOwner(ValueError):
    """The run directory belongs to another run (another store, another arm or seed)."""


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a reader sees the old or the new file, never half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint `latest` names under run_dir, or None when there is none yet.

    Raises ValueError when the pointer names anything but a step_<N> directory of this run, or
    when checkpoints/ itself is a symlink out of the run directory."""
    root = Path(run_dir) / CHECKPOINTS
    if root.is_symlink() and not root.resolve().is_relative_to(Path(run_dir).resolve()):
        raise ValueError(
            f"{root} is a symlink to {root.resolve()}, outside the run directory {run_dir}: "
            "refusing to resume from it"
        )
    pointer = root / LATEST
    try:
        name = pointer.read_text().strip()
    except FileNotFoundError:
        return None  # no checkpoint written yet
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ValueError(f"{pointer} cannot be read ({reason}): {_DAMAGED}") from None
    if not _STEP_NAME.fullmatch(name):
        raise ValueError(
            f"{pointer} names {name[:80]!r}, not a step_<N> checkpoint of this run: {_DAMAGED}"
        )
    path = root / name
    if path.is_symlink() or not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{path} leads outside the run directory {run_dir}: refusing to load it")
    if not path.is_dir():
        raise ValueError(f"{pointer} names {name}, which is not there: {_DAMAGED}")
    if not (path / STATE_FILE).is_file():
        raise ValueError(f"{pointer} names {name}, which has no {STATE_FILE}: {_DAMAGED}")
    return path


def checkpoint_step(ckpt: str | Path) -> int:
    """N of a step_N directory."""
    match = _STEP_NAME.fullmatch(Path(ckpt).name)
    if match is None:
        raise ValueError(f"{ckpt} is not a step_<N> checkpoint directory")
    return int(match.group(1))


def latest_step(run_dir: str | Path | None) -> int | None:
    """The rollout step of the newest complete checkpoint under a run directory, or None when
    it has none yet. ValueError (one line) for a pointer that cannot be followed, as
    latest_checkpoint: a damaged run is said, not started over."""
    if not run_dir:
        return None
    ckpt = latest_checkpoint(run_dir)
    return None if ckpt is None else checkpoint_step(ckpt)


def check_checkpoint_files(ckpt: str | Path) -> None:
    """A sharded checkpoint must hold every shard file its DCP metadata names (a copy that
    lost one would fail deep inside torch's loader, after the run started writing): ValueError
    naming the missing shard. Imports torch (the metadata is pickled), so only when there is a
    sharded checkpoint to check."""
    shards = Path(ckpt) / SHARDS_DIR
    if not shards.is_dir():
        return
    from dapo_core.train import safe_dcp

    safe_dcp.read_metadata(shards)


def read_owner(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / OWNER_FILE
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise NotOwner(f"{path} is unreadable ({exc}): this directory's owner is unknown") from None


def check_resumable_dir(
    run_dir: str | Path, owner: Mapping[str, Any], runs_dir: str | Path
) -> Path:
    """A run directory recorded in the store, checked before anything in it is read for a
    resume: it must lie inside `runs_dir` (a store row cannot point a resume at files elsewhere)
    and name `owner` in its OWNER.json. Returns it resolved; NotOwner otherwise."""
    path, root = Path(run_dir).resolve(), Path(runs_dir).resolve()
    if not path.is_relative_to(root):
        raise NotOwner(
            f"the checkpoint directory {path} is outside the runs directory {root} "
            "($DAPO_RUNS_DIR): refusing to resume from it (--force starts the arm over)"
        )
    found = read_owner(path)
    mine = {str(k): v for k, v in owner.items()}
    if found != mine:
        raise NotOwner(
            f"{path} does not belong to this run (its {OWNER_FILE}: {found}): refusing to resume "
            "from it (--force starts the arm over)"
        )
    ckpt = latest_checkpoint(path)
    if ckpt is not None:
        check_checkpoint_files(ckpt)  # before the resume writes its first row
    return path


def claim(run_dir: str | Path, owner: Mapping[str, Any]) -> None:
    """Make `owner` the run directory's owner, or check that it already is.

    `owner` names the job: the store's id and the (sweep, arm, seed, config hash) for a sweep's
    run, or {"kind": "train", ...} for `dapo train`. Attempts of one job share its directory
    (a retry resumes there); anything else, or a directory that holds checkpoints but names no
    owner, is refused before a byte is read from it.
    """
    run_dir = Path(run_dir)
    mine = {str(k): v for k, v in owner.items()}
    found = read_owner(run_dir)
    if found is None:
        if (run_dir / CHECKPOINTS).exists():
            raise NotOwner(
                f"{run_dir} holds checkpoints but no {OWNER_FILE}: it was not made for this run; "
                "choose another directory"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / OWNER_FILE, json.dumps(mine, indent=2, sort_keys=True))
        return
    if found != mine:
        differ = sorted(k for k in found.keys() | mine.keys() if found.get(k) != mine.get(k))
        raise NotOwner(
            f"{run_dir} belongs to another run ({', '.join(f'{k}={found.get(k)!r}' for k in differ)}"
            f"; this one has {', '.join(f'{k}={mine.get(k)!r}' for k in differ)}): refusing to "
            "write or resume there"
        )


def has_export(ckpt: Path) -> bool:
    """Whether the checkpoint holds HF-format weights in model/ (one worker's always does)."""
    return any((Path(ckpt) / MODEL_DIR).glob("*.safetensors"))
