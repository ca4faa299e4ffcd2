"""Attempts put into a test's store the way production opens them: Store.resume_attempt, the one
call that claims an (arm, seed) and opens its new attempt (flows/arm.py), so that a test's rows
carry a lease and a run directory as a real driver's do.

    run_id = new_attempt(store, sweep_id, "grpo", 0)                  # held by this process
    stale = new_attempt(store, sweep_id, "grpo", 0, holder=killed())  # its driver was killed

A second attempt of the same (arm, seed) while the first still runs is refused (RunHeld), as
it is in production, unless the first one's holder was killed().
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Mapping
from typing import Any

from db.store import Holder, Store

_GONE_PIDS = itertools.count(2**31 - 1, -1)


def killed() -> Holder:
    """A holder on this machine whose process is gone, as a SIGKILLed driver's: its lease is
    free at once, and the next claim of its (arm, seed) takes its attempt over. No process has
    its pid (Linux's pid_max is at most 2**22); each call gives another, since a claimant never
    counts its own pid's lease as free."""
    return Holder(socket.gethostname(), next(_GONE_PIDS))


def new_attempt(
    store: Store,
    sweep_id: int,
    arm: str = "grpo",
    seed: int = 0,
    *,
    config: Mapping[str, Any] | None = None,
    config_hash: str = "h",
    checkpoint_dir: str | None = None,
    flow_run_id: str | None = None,
    holder: Holder | None = None,
    resume_step: int | None = None,
) -> int:
    """A new attempt of (sweep, arm, seed), status "running", planned on its newest attempt;
    returns its run id. `holder` holds its lease (default: this process); `checkpoint_dir`
    defaults to /runs/run<id>, a directory of its own; `resume_step` resumes the newest
    attempt from its checkpoint at that step (its curve copied up to it)."""
    newest = store.latest_attempt(sweep_id, arm, seed)
    return store.resume_attempt(
        sweep_id=sweep_id,
        arm=arm,
        seed=seed,
        config=dict(config or {}),
        config_hash=config_hash,
        after=None if newest is None else int(newest["run_id"]),
        resume_step=resume_step,
        checkpoint_dir=(lambda run_id: f"/runs/run{run_id}")
        if checkpoint_dir is None
        else checkpoint_dir,
        flow_run_id=flow_run_id,
        holder=holder,
    ).run_id
