"""The `dapo` command as the flow tests run it: the executable, small arms, an environment with
its own store and runs directory, and a ladder file of one's own.

Imported by bare name (`from dapo_cli import ...`), like the other shared test modules.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DAPO = str(Path(sys.executable).parent / "dapo")

# Small batches keep each arm to seconds on 2 cores, as a sweep's stored overrides ...
SMALL_OVERRIDES = {
    "batch.train_batch_size": 4,
    "batch.gen_batch_size": 4,
    "batch.mini_batch_size": 2,
    "rollout.group_size": 4,
    "run.checkpoint_every": 1,
}
# ... and as `dapo sweep` arguments, with a small evaluation.
SMALL = [
    *(arg for key, value in SMALL_OVERRIDES.items() for arg in ("--set", f"{key}={value}")),
    *("--eval-problems", "8", "--eval-k", "2"),
]

LADDER_FILE = """\
name = "mine"

[[arms]]
name = "base"
from = "grpo"

[[arms]]
name = "eps28"
set = { "algo.clip_high" = 0.28 }

[[arms]]
name = "no_std"
from = "base"
set = { "algo.scale_adv_by_std" = false }
"""


def store_env(
    tmp: Path, base: Mapping[str, str] | None = None, *, own_prefect: bool = False, **extra: str
) -> dict[str, str]:
    """`base` (default: this process's environment) with a store and a runs directory of their
    own under `tmp`, Prefect's database in $PREFECT_HOME (else one kept in .cache/, so that only
    the first run on a machine pays its set-up) and the session's Prefect server
    (conftest.shared_prefect_server), or with `own_prefect` none: each command then starts its
    own temporary one. `extra` is added last."""
    env = {
        **(os.environ if base is None else base),
        "DAPO_DB_URL": f"sqlite:///{tmp / 'dapo.db'}",
        "DAPO_RUNS_DIR": str(tmp / "runs"),
        "PREFECT_HOME": os.environ.get("PREFECT_HOME")
        or str(ROOT / ".cache" / "test-prefect-home"),
        **extra,
    }
    if own_prefect:
        env.pop("PREFECT_API_URL", None)
    return env


def dapo(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`dapo ARGS...` run to its end from the repository's root, its output captured."""
    return subprocess.run(
        [DAPO, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def stored_sweep(store: Any, params: Any, name: str) -> int:
    """A sweep row for `params` (flows.params.SweepParams) as `dapo sweep` stores one, on grpo's
    tiny config and the paper's ladder; returns its id."""
    from dapo_core.setup.ladders import paper_ladder

    return store.create_sweep(  # type: ignore[no-any-return]
        name=name,
        preset="tiny",
        arms=params.arms,
        seeds=params.seeds,
        base_config=paper_ladder().config("grpo", "tiny").to_dict(),
        ladder=paper_ladder().rows(),
        params=params.model_dump(),
    )
