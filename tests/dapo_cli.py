"""The `dapo` command as the tests run it, and what the flow tests share around it.

- `dapo(*args)`: the command run to its end as a user types it (the console script, its own
  process), its output captured; the one helper every test module uses for that.
- `store_env(tmp)`: an environment with a store and a runs directory of its own, the session's
  Prefect server (conftest.shared_prefect_server) and, given `ray=`, the session's warm Ray
  (conftest.warm_ray): each test keeps its own store and runs directory on shared servers.
- SMALL / SMALL_OVERRIDES / FAST: arms small enough to train in seconds on 2 cores; the tiny
  model itself (and so its cached warm start) stays the preset's.
- LADDER_FILE, stored_sweep: a ladder file of one's own; a sweep row as `dapo sweep` stores one.
- alive(pid): whether a process still runs (a zombie does not).

Imported by bare name (`from dapo_cli import ...`), like the other shared test modules.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray_cluster import RayCluster

ROOT = Path(__file__).resolve().parents[1]
DAPO = str(Path(sys.executable).parent / "dapo")
# Ceilings that only a hang reaches. A 2-arm, 1-step sweep through served deployments was not
# final within a fixed 180 s at a load of 6-9 on 2 cores (2026-11-28); every wait on a flow,
# a command or a training run in the flow tests is bounded by these instead.
COMMAND_TIMEOUT_S = 600.0
FLOW_TIMEOUT_S = 1500.0
# pytest-timeout for a flow test (pyproject's 600 s is for one test, not a module's sweep).
FLOW_TEST_TIMEOUT_S = 2400

# Small batches keep each arm to seconds on 2 cores, as a sweep's stored overrides ...
SMALL_OVERRIDES = {
    "batch.train_batch_size": 4,
    "batch.gen_batch_size": 4,
    "batch.mini_batch_size": 2,
    "rollout.group_size": 4,
    "run.checkpoint_every": 1,
}
# ... as `dapo sweep` arguments, with a small evaluation ...
SMALL = [
    *(arg for key, value in SMALL_OVERRIDES.items() for arg in ("--set", f"{key}={value}")),
    *("--eval-problems", "8", "--eval-k", "2"),
]
# ... and as the overrides a Prefect form (or the API) sends, evaluation and samples included.
FAST = {
    **SMALL_OVERRIDES,
    "data.eval_problems": 8,
    "data.eval_k": 2,
    "run.samples_per_step": 2,
}

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


def dapo(
    *args: str,
    env: Mapping[str, str] | None = None,
    url: str | None = None,
    cwd: Path | str = ROOT,
    stdin: str | None = None,
    columns: int | None = None,
    timeout: float = COMMAND_TIMEOUT_S,
    **extra: str,
) -> subprocess.CompletedProcess[str]:
    """`dapo ARGS...` run to its end in `cwd` (the repository's root), output captured.

    `env` is the whole environment (default: this process's); `url` the store
    ($DAPO_DB_URL), `columns` the terminal width ($COLUMNS, else none, as without a
    terminal), and `extra` more variables, added last. $DAPO_DEBUG is dropped: the tests see
    the one line a user sees, not the traceback it asks for."""
    environ = dict(os.environ if env is None else env)
    for name in ("DAPO_DEBUG", "COLUMNS", "LINES"):
        environ.pop(name, None)
    if columns is not None:
        environ["COLUMNS"] = str(columns)
    if url is not None:
        environ["DAPO_DB_URL"] = url
    environ.update(extra)
    return subprocess.run(
        [DAPO, *args],
        env=environ,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def store_env(
    tmp: Path,
    base: Mapping[str, str] | None = None,
    *,
    own_prefect: bool = False,
    ray: RayCluster | None = None,
    **extra: str,
) -> dict[str, str]:
    """`base` (default: this process's environment) with a store and a runs directory of their
    own under `tmp`, Prefect's database in $PREFECT_HOME (else one kept in .cache/, so that only
    the first run on a machine pays its set-up) and the session's Prefect server
    (conftest.shared_prefect_server), or with `own_prefect` none: each command then starts its
    own temporary one. `ray`: the Ray to join (RAY_ADDRESS and its token), else none is
    named and a command starts a local one. `extra` is added last."""
    env = {
        **(os.environ if base is None else base),
        "DAPO_DB_URL": f"sqlite:///{tmp / 'dapo.db'}",
        "DAPO_RUNS_DIR": str(tmp / "runs"),
        "PREFECT_HOME": os.environ.get("PREFECT_HOME")
        or str(ROOT / ".cache" / "test-prefect-home"),
    }
    env.pop("RAY_ADDRESS", None)
    if ray is not None:
        env.update(ray.client_env())
    if own_prefect:
        env.pop("PREFECT_API_URL", None)
    env.update(extra)
    return env


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


def alive(pid: int) -> bool:
    """Whether process `pid` still runs: a killed process that its parent has not reaped yet
    stays a zombie (state Z), dead all the same."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
