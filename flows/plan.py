"""The decisions of a sweep, as plain functions: which runs, where, resume or skip, how many at once.

The flows (flows/sweep.py, flows/arm.py) only carry these decisions out, so tests call this
module without Prefect, Ray or a store.
"""

from __future__ import annotations

import math
import os
import re
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dapo_common.util import first_line, flatten
from dapo_core.setup.config import ExperimentConfig, is_local_path
from flows.params import Resources, SweepParams

RUNS_DIR_ENV = "DAPO_RUNS_DIR"
ACTOR_NAMESPACE = "dapo"
# How many characters of the store id name the store's folder of run directories (8 hex
# digits of a UUID4: two stores collide with odds 1 in 4 billion, and claim() still refuses).
STORE_ID_CHARS = 8


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


def arm_job(params: SweepParams, arm: str, seed: int) -> ArmJob:
    cfg = params.arm_config(arm, seed)
    return ArmJob(arm=arm, seed=seed, config=cfg.to_dict(), config_hash=cfg.config_hash())


def sweep_jobs(params: SweepParams) -> list[ArmJob]:
    """Every (arm, seed) of the sweep, arms in ladder order then seeds; all configs are built
    (and so validated) before anything runs."""
    jobs = [arm_job(params, arm, seed) for arm in params.arms for seed in params.seeds]
    for job in jobs:
        check_local_paths(job.config)
    check_overrides_keep_arms(params)
    return jobs


def check_overrides_keep_arms(params: SweepParams) -> None:
    """An override that undoes what an arm adds (e.g. `--set algo.clip_high=0.2` on the paper
    ladder's clip_higher) would train its parent's config again under the arm's name, and the
    table would show a Δ of noise as the arm's effect: refused, naming the arm and the key."""
    ladder = params.parsed_ladder
    overrides = params.config_overrides(params.seeds[0])
    for name in params.arms:
        arm = ladder.arm(name)
        if arm.parent is None or not set(arm.changes) & set(overrides):
            continue
        mine, parents = (
            _flat_without_arm(params.arm_config(a, params.seeds[0])) for a in (name, arm.parent)
        )
        if mine == parents:
            keys = ", ".join(k for k in arm.changes if k in overrides)
            raise ValueError(
                f"the override of {keys} undoes what arm {name!r} adds ({arm.adds}): it would "
                f"train the same config as its parent {arm.parent!r}; drop the override or the arm"
            )


def _flat_without_arm(cfg: ExperimentConfig) -> dict[str, Any]:
    flat = flatten(cfg.to_dict())
    flat.pop("arm", None)
    return flat


def estimated_work(config: Mapping[str, Any]) -> float:
    """A rough cost of one arm's training, for ordering only: rollout steps × sequences a
    step generates × the token budget, dynamic sampling counted at its expected extra
    generation (a quarter more, as measured on the tiny preset)."""
    rollout, batch, algo = config["rollout"], config["batch"], config["algo"]
    sequences = batch["gen_batch_size"] * rollout["group_size"]
    extra = 1.25 if algo.get("dynamic_sampling") else 1.0
    return float(config["run"]["steps"]) * sequences * rollout["max_response_len"] * extra


def longest_first(jobs: Sequence[ArmJob]) -> list[int]:
    """Indices of `jobs`, the most work first (ties keep the ladder's order)."""
    return sorted(range(len(jobs)), key=lambda i: -estimated_work(jobs[i].config))


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
    """A model or data value that names a local file: a path (see is_local_path), or a data
    file by its suffix (a data set name has none)."""
    return is_local_path(value) or value.endswith((".jsonl", ".json", ".parquet"))


def per_worker(resources: Resources) -> dict[str, float]:
    """What each of an arm's workers holds: its own CPUs and GPUs, and its rollout engine's
    actor's when the engine has one (resources.rollout_actor)."""
    cpus, gpus = resources.cpus, resources.gpus
    if resources.rollout_actor:
        cpus, gpus = cpus + resources.rollout_cpus, gpus + resources.rollout_gpus
    return {"CPU": cpus, "GPU": gpus}


def concurrency(cluster: Mapping[str, float], resources: Resources, n_jobs: int) -> int:
    """How many arms can train at once on a cluster with these total resources.

    Ray queues an actor it cannot place, so this only keeps the flows from starting runs that
    would sit waiting; it is at least 1 (Ray then waits for resources other drivers hold).
    """
    # An arm of N workers is N bundles of (cpus, gpus), and N engines' with rollout actors.
    n, each = resources.workers, per_worker(resources)
    fits = [math.floor(cluster.get("CPU", 0.0) / (each["CPU"] * n) + 1e-9)]
    if each["GPU"] > 0:
        fits.append(math.floor(cluster.get("GPU", 0.0) / (each["GPU"] * n) + 1e-9))
    return max(1, min(min(fits), n_jobs))


def check_fits(cluster: Mapping[str, float], resources: Resources) -> None:
    """An arm that asks for more than the whole cluster has would wait forever: refuse it."""
    n, each = resources.workers, per_worker(resources)
    engines = " (its workers' and its rollout engines')" if resources.rollout_actor else ""
    for key, want in each.items():
        have = cluster.get(key, 0.0)
        if want > 0 and have + 1e-9 < want * n:
            per = f"{n} workers × {want:g}" if n > 1 else f"{want:g}"
            raise ValueError(
                f"each arm asks for {per} {key}(s){engines} but the Ray cluster "
                f"has {have:g}: lower resources.{key.lower()}s"
                + (f" or resources.rollout_{key.lower()}s" if engines else "")
                + (" or resources.workers" if n > 1 else "")
                + " or join a bigger cluster"
            )
    if resources.rollout_actor and resources.rollout_resource:
        name = resources.rollout_resource
        if cluster.get(name, 0.0) <= 0:
            raise ValueError(
                f"resources.rollout_resource={name!r}: no node of the Ray cluster offers it "
                f"(start one with `ray start --resources '{{\"{name}\": 1}}'`)"
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


def fresh_run_dir(
    root: Path, store_id: str, sweep_id: int, arm: str, seed: int, config_hash: str, run_id: int
) -> Path:
    """A new attempt's own directory, `<root>/<store id>/sweep-<id>/<arm>-s<seed>-<hash>-run<id>`:
    never shared with an older attempt (starting over never overwrites another attempt's
    checkpoints), nor with another store (whose sweep and run ids also start at 1)."""
    store = store_id.replace("-", "")[:STORE_ID_CHARS]
    return root / store / f"sweep-{sweep_id}" / f"{arm}-s{seed}-{config_hash}-run{run_id}"


def run_owner(store_id: str, sweep_id: int, job: ArmJob) -> dict[str, Any]:
    """Who owns an arm's run directory (dapo_core.train.run_dir.claim): attempts of the same
    (store, sweep, arm, seed, config) may resume there, nothing else may."""
    return {
        "store": store_id,
        "sweep": int(sweep_id),
        "arm": job.arm,
        "seed": int(job.seed),
        "config_hash": job.config_hash,
    }


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


def error_text(exc: BaseException, remote_traceback: str | None = None) -> str:
    """What the store's error column keeps: one line, then the traceback."""
    tb = remote_traceback or "".join(traceback.format_exception(exc))
    return f"{first_line(exc, with_type=True)}\n{_ANSI.sub('', tb)}"


def sweep_outcome(results: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """The sweep's status from its arms' results (each {label, status, error?})."""
    failed = [r for r in results if r.get("status") not in ("completed", "skipped")]
    if not failed:
        return "completed", None
    named = "; ".join(f"{r['label']}: {r.get('error') or r.get('status')}" for r in failed[:3])
    more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
    return "failed", f"{len(failed)} of {len(results)} arm runs failed: {named}{more}"


def artifact_key(kind: str, sweep_id: int) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes. None holds an arm's name
    (which may hold `_ . =`): one that ever does must pass it through ladders.artifact_slug."""
    return f"{kind}-sweep-{sweep_id}"


def arm_flow_run_name(arm: str, seed: int, sweep_id: int) -> str:
    """An arm's flow run name (as flows/arm.py's template writes it). Prefect bans only
    `/ % & > <` in names, none of which an arm name may hold (ladders.NAME_RE)."""
    return f"{arm}-s{seed}-sweep{sweep_id}"
