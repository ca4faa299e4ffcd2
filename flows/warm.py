"""The one-time phase before a sweep's arms start: each model the arms need made on this machine
once (the tiny model built and warm-started, the pinned real model converted; see
dapo_core.models.prepare_policy), in the sweep's own process, with its progress lines on the
sweep's terminal.

Done here, it is never part of an arm's time (its wall_s, the table's time column, the
orchestration line: `dapo sweep` starts that clock after it), and two arms never race to build
the same model (the cache's file lock would make one wait, inside its own timed run). It helps
only where the arms share this machine's cache: a local Ray instance, or a cluster whose
address is this machine; on another cluster each node still makes its own on first use.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlparse

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})


def on_this_machine(address: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the Ray cluster a sweep joins (`address`, else $RAY_ADDRESS, else a local
    instance started by the sweep) has its head on this machine."""
    env = os.environ if environ is None else environ
    given = address or env.get("RAY_ADDRESS") or ""
    if given in ("", "local", "auto"):
        return True
    host = urlparse(given if "://" in given else f"ray://{given}").hostname or ""
    if host in LOOPBACK or host.startswith("127."):
        return True
    try:
        name = socket.gethostname()
        mine = {name, socket.getfqdn(), *socket.gethostbyname_ex(name)[2]}
    except OSError:
        return False
    return host in mine


def prepare_models(
    configs: Iterable[Mapping[str, Any]],
    address: str | None,
    say: Callable[[str], None] | None,
    *,
    threads: int | None = None,
) -> int:
    """Make every model `configs` (experiment configs as dicts) need on this machine, once each,
    when the arms will run here (on_this_machine). Returns how many were made (0: all there).
    `say`: the progress lines (None: silent). `threads`: torch's threads for it, an arm's CPUs
    (what its actor would have built it with; see dapo_core.models.prepare_policy)."""
    if not on_this_machine(address):
        return 0
    from dapo_core.models import prepare_policy
    from dapo_core.setup.config import ExperimentConfig

    quiet: Callable[[str], None] = lambda _line: None  # noqa: E731
    made, seen = 0, set()
    for config in configs:
        model = dict(config.get("model") or {})
        key = json.dumps(model, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        made += prepare_policy(
            ExperimentConfig.from_dict(dict(config)).model, say=say or quiet, threads=threads
        )
    return made
