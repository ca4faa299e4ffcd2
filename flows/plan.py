"""The decisions of a sweep, as plain functions: which runs, where, resume or skip, how many at once.

The flows (flows/sweep.py, flows/arm.py) only carry these decisions out, so tests call this
module without Prefect, Ray or a store.
"""

from __future__ import annotations

import math
import os
import re
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dapo_core.arms import build_arm_config
from dapo_core.config import ExperimentConfig
from flows.params import Resources, SweepParams

RUNS_DIR_ENV = "DAPO_RUNS_DIR"
ACTOR_NAMESPACE = "dapo"
# checkpoints/latest names the newest complete checkpoint directory (dapo_core.checkpoint's
# layout, read here without importing torch).
_CHECKPOINTS, _LATEST, _STATE_FILE = "checkpoints", "latest", "trainer_state.pt"


def default_runs_dir() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("dapo-lab")) / "runs"


def runs_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where run directories (checkpoints) go: $DAPO_RUNS_DIR, else <user data dir>/dapo-lab/runs."""
    env = os.environ if environ is None else environ
    value = env.get(RUNS_DIR_ENV)
    return Path(value).expanduser().resolve() if value else default_runs_dir()


# --- what to run -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ArmJob:
    """One (arm, seed) of a sweep with its full config."""

    arm: str
    seed: int
    config: dict[str, Any]
    config_hash: str

    @property
    def label(self) -> str:
        return f"{self.arm} s{self.seed}"


def arm_config(params: SweepParams, arm: str, seed: int) -> ExperimentConfig:
    """The experiment config of (arm, seed) in a sweep; a bad combination raises ValueError."""
    try:
        return build_arm_config(arm, params.preset, params.config_overrides(seed))
    except ValueError as exc:
        raise ValueError(f"{arm} seed {seed}: {exc}") from None


def arm_job(params: SweepParams, arm: str, seed: int) -> ArmJob:
    cfg = arm_config(params, arm, seed)
    return ArmJob(arm=arm, seed=seed, config=cfg.to_dict(), config_hash=cfg.config_hash())


def sweep_jobs(params: SweepParams) -> list[ArmJob]:
    """Every (arm, seed) of the sweep, arms in ladder order then seeds; all configs are built
    (and so validated) before anything runs."""
    jobs = [arm_job(params, arm, seed) for arm in params.arms for seed in params.seeds]
    for job in jobs:
        check_local_paths(job.config)
    return jobs


def check_local_paths(config: Mapping[str, Any]) -> None:
    """A model or data value that looks like a path must exist (hub ids and data set names
    are left to the trainer)."""
    model = str(config["model"]["name_or_path"])
    data = config["data"]
    for what, value in (
        ("model", model),
        ("training data", data["train"]),
        ("eval data", data["eval"]),
    ):
        if looks_like_path(str(value)) and not Path(str(value)).expanduser().exists():
            raise FileNotFoundError(f"{what} path {value} does not exist")


def looks_like_path(value: str) -> bool:
    # A hub id is `org/name` (one slash); a data set name has no slash and no file suffix.
    return (
        value.startswith((".", "/", "~"))
        or value.count("/") > 1
        or value.endswith((".jsonl", ".json", ".parquet"))
    )


def concurrency(cluster: Mapping[str, float], resources: Resources, n_jobs: int) -> int:
    """How many arms can train at once on a cluster with these total resources.

    Ray queues an actor it cannot place, so this only keeps the flows from starting runs that
    would sit waiting; it is at least 1 (Ray then waits for resources other drivers hold).
    """
    fits = [math.floor(cluster.get("CPU", 0.0) / resources.cpus + 1e-9)]
    if resources.gpus > 0:
        fits.append(math.floor(cluster.get("GPU", 0.0) / resources.gpus + 1e-9))
    return max(1, min(min(fits), n_jobs))


def check_fits(cluster: Mapping[str, float], resources: Resources) -> None:
    """An arm that asks for more than the whole cluster has would wait forever: refuse it."""
    for key, want in (("CPU", resources.cpus), ("GPU", resources.gpus)):
        have = cluster.get(key, 0.0)
        if want > 0 and have + 1e-9 < want:
            raise ValueError(
                f"each arm asks for {want:g} {key}(s) but the Ray cluster has {have:g}: "
                f"lower resources.{key.lower()}s or join a bigger cluster"
            )


# --- resume, skip or start over ------------------------------------------------------------
Action = Literal["skip", "resume", "fresh"]


@dataclass(frozen=True)
class ArmDecision:
    action: Action
    reason: str
    """One line for the logs: why this action."""
    run_id: int | None = None
    """skip: the completed run; resume: the attempt whose checkpoint is resumed."""
    checkpoint_dir: str | None = None
    """resume: the directory to keep training in."""
    resume_step: int | None = None
    """resume: the checkpoint's rollout step."""


def decide_arm(
    *,
    config_hash: str,
    force: bool,
    completed_run_id: int | None,
    latest: Mapping[str, Any] | None,
    latest_checkpoint_step: int | None,
) -> ArmDecision:
    """What a new flow run of (sweep, arm, seed) does.

    - completed before with this config hash and not forced → skip;
    - the latest attempt has this hash, did not complete and left a checkpoint → resume it
      (a rerun from the dashboard is always forced: force only matters for a completed arm);
    - otherwise → start fresh in a new directory (a forced rerun of a completed arm, a changed
      config, or nothing to resume).
    """
    if completed_run_id is not None and not force:
        return ArmDecision(
            "skip",
            f"already completed with config {config_hash} as run {completed_run_id}",
            run_id=completed_run_id,
        )
    if (
        latest is not None
        and latest.get("config_hash") == config_hash
        and latest.get("status") != "completed"
        and latest.get("checkpoint_dir")
        and latest_checkpoint_step is not None
    ):
        return ArmDecision(
            "resume",
            f"resuming run {latest['run_id']} ({latest.get('status')}) from its checkpoint at "
            f"step {latest_checkpoint_step}",
            run_id=int(latest["run_id"]),
            checkpoint_dir=str(latest["checkpoint_dir"]),
            resume_step=latest_checkpoint_step,
        )
    if latest is None:
        why = "first attempt"
    elif latest.get("status") == "completed":
        why = "forced rerun of a completed arm: starting over"
    elif latest.get("config_hash") != config_hash:
        why = f"config changed ({latest.get('config_hash')} → {config_hash}): starting over"
    else:
        why = f"run {latest['run_id']} left no checkpoint: starting over"
    return ArmDecision("fresh", why)


def checkpoint_step(run_dir: str | Path | None) -> int | None:
    """The rollout step of the newest complete checkpoint under a run directory, or None."""
    if not run_dir:
        return None
    pointer = Path(run_dir) / _CHECKPOINTS / _LATEST
    try:
        name = pointer.read_text().strip()
    except OSError:
        return None
    if not (pointer.parent / name / _STATE_FILE).exists():
        return None
    try:
        return int(name.removeprefix("step_"))
    except ValueError:
        return None


def fresh_run_dir(
    root: Path, sweep_id: int, arm: str, seed: int, config_hash: str, run_id: int
) -> Path:
    """A new attempt's own directory: never shared with an older attempt, so starting over
    never overwrites another attempt's checkpoints."""
    return root / f"sweep-{sweep_id}" / f"{arm}-s{seed}-{config_hash}-run{run_id}"


def actor_name(run_id: int) -> str:
    """The Ray actor training a store run (namespace ACTOR_NAMESPACE); one at a time per run."""
    return f"dapo-run-{run_id}"


# --- outcomes --------------------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFECT_PREFIXES = ("Flow run encountered an exception: ", "Task run encountered an exception ")


def state_line(message: str | None) -> str:
    """The first line of a Prefect state message, without Prefect's preamble."""
    text = (message or "").strip()
    for prefix in _PREFECT_PREFIXES:
        text = text.removeprefix(prefix)
    return text.splitlines()[0] if text else ""


_STOP_SIGNALS = ("KeyboardInterrupt", "TerminationSignal", "Interrupted")


def is_stop(exc: BaseException) -> bool:
    """Whether `exc` comes from stopping the work (Ctrl-C, a cancelled flow run's SIGTERM)
    rather than from the work failing; the signal may arrive wrapped (e.g. inside Ray's wait)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(cls.__name__ in _STOP_SIGNALS for cls in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def error_text(exc: BaseException, remote_traceback: str | None = None) -> str:
    """What the store's error column keeps: one line, then the traceback."""
    tb = remote_traceback or "".join(traceback.format_exception(exc))
    return f"{first_line(exc)}\n{_ANSI.sub('', tb)}"


def sweep_outcome(results: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """The sweep's status from its arms' results (each {label, status, error?})."""
    failed = [r for r in results if r.get("status") not in ("completed", "skipped")]
    if not failed:
        return "completed", None
    named = "; ".join(f"{r['label']}: {r.get('error') or r.get('status')}" for r in failed[:3])
    more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
    return "failed", f"{len(failed)} of {len(results)} arm runs failed: {named}{more}"


def artifact_key(kind: str, sweep_id: int) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes."""
    return f"{kind}-sweep-{sweep_id}"


def table_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """JSON-safe rows for a Prefect table artifact (NaN and NaT become None)."""
    out: list[dict[str, Any]] = []
    for record in records:
        row: dict[str, Any] = {}
        for key, value in record.items():
            if hasattr(value, "item"):  # numpy scalars
                value = value.item()
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            elif value is not None and not isinstance(value, str | int | float | bool):
                value = None if str(value) in ("NaT", "nan", "None") else str(value)
            row[str(key)] = value
        out.append(row)
    return out
