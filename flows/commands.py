"""`dapo sweep`, `dapo arm`, `dapo serve`: the flows from the terminal.

`dapo sweep` and `dapo arm` run the same Prefect flows as the served deployments, in this
process (ephemeral Prefect, a local Ray unless RAY_ADDRESS is set), and print progress in
words; `dapo serve` serves the deployments to a Prefect server (see flows/serve.py). Prefect and
Ray are imported inside the commands so that `dapo --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from dapo_core.arms import ARM_NAMES
from dapo_core.cli import non_negative_int, positive_int
from dapo_core.presets import PRESETS

ENV_HELP = """\
where things go:
  run directories (checkpoints)  $DAPO_RUNS_DIR, default {runs}
  the experiment store           --store, else $DAPO_DB_URL, else a SQLite file (`dapo db current`)
  Prefect's local database       $PREFECT_HOME, default {prefect}
  Ray                            --ray-address, else $RAY_ADDRESS, else a local instance
                                 with this machine's CPUs"""


def _env_help() -> str:
    from flows.plan import default_runs_dir

    return ENV_HELP.format(runs=default_runs_dir(), prefect=default_prefect_home())


def default_prefect_home() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("dapo-lab")) / "prefect"


def register(subparsers: Any) -> None:
    """Add `sweep`, `arm` and `serve` to the `dapo` dispatcher."""
    p = subparsers.add_parser(
        "sweep",
        help="run the ablation ladder (arms × seeds) through Prefect and Ray, then print the table",
        description="Run an ablation sweep: one training run per arm × seed, as many at once as "
        "Ray's resources allow, recorded in the store; then print the ablation table. Arms "
        "already completed in the sweep (--sweep) with the same config are skipped unless --force.",
        epilog=_env_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset", default="tiny", help=f"base config: {', '.join(PRESETS)} (default tiny)"
    )
    p.add_argument(
        "--arms",
        nargs="+",
        metavar="ARM",
        help=f"ladder arms (default: all): {', '.join(ARM_NAMES)}; commas work too",
    )
    p.add_argument(
        "--seeds",
        nargs="+",
        type=_seeds,
        metavar="SEED",
        help="seeds (default: 0); commas work too",
    )
    p.add_argument(
        "--steps", type=positive_int, help="rollout steps per arm (default: the preset's)"
    )
    p.add_argument("--model", help="`tiny`, a local model directory or a hub name")
    p.add_argument("--data", help="training data: a data set name or a .jsonl/.parquet path")
    p.add_argument("--eval", help="evaluation set: a data set name or a path")
    p.add_argument("--eval-k", type=positive_int, help="samples per eval problem (avg@k, pass@k)")
    p.add_argument(
        "--eval-problems", type=non_negative_int, help="evaluate on the first N problems (0: all)"
    )
    _resource_args(p, default_cpus=1.0, default_gpus=0.0)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field of every arm, e.g. --set batch.train_batch_size=8 (repeatable)",
    )
    _location_args(p)
    p.add_argument(
        "--force", action="store_true", help="retrain arms already completed with the same config"
    )
    p.add_argument("--name", help="a name for the sweep")
    p.add_argument(
        "--sweep",
        type=positive_int,
        metavar="ID",
        help="run an existing sweep again with its stored parameters (other config flags are ignored)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the table")
    p.set_defaults(func=cmd_sweep)

    p = subparsers.add_parser(
        "arm",
        help="(re)run one arm × seed of a sweep: a new attempt that resumes its checkpoint",
        description="Run one arm × seed of an existing sweep as a new attempt. An attempt that "
        "did not complete is resumed from its checkpoint; a completed one is skipped unless "
        "--force, which starts it over.",
        epilog=_env_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--sweep", type=positive_int, metavar="ID", help="sweep id (default: the latest sweep)"
    )
    p.add_argument("--arm", required=True, help=f"ladder arm: {', '.join(ARM_NAMES)}")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed (default 0)")
    p.add_argument(
        "--force", action="store_true", help="retrain even if completed with the same config"
    )
    _resource_args(p, default_cpus=None, default_gpus=None)
    _location_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the table")
    p.set_defaults(func=cmd_arm)

    p = subparsers.add_parser(
        "serve",
        help="serve the dapo-sweep, dapo-arm and dapo-eval deployments to a Prefect server",
        description="Serve the deployments so that the Prefect UI shows them with parameter "
        "forms. Uses the Prefect server at $PREFECT_API_URL, or starts one (bound to --host). "
        "Flow runs execute in this process's machine and join --ray-address / $RAY_ADDRESS, "
        "else a local Ray instance started here. Stop with Ctrl-C.",
        epilog=_env_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="where a started server listens (default 127.0.0.1)"
    )
    p.add_argument("--port", type=positive_int, default=4200, help="its port (default 4200)")
    p.add_argument(
        "--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else a local one)"
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        help="most flow runs at once (default: no limit; sweeps pace their arms)",
    )
    p.set_defaults(func=cmd_serve)


def _resource_args(
    p: argparse.ArgumentParser, *, default_cpus: float | None, default_gpus: float | None
) -> None:
    p.add_argument(
        "--cpus",
        type=_positive_float,
        default=default_cpus,
        help="CPUs per arm; torch gets that many threads"
        + (f" (default {default_cpus:g})" if default_cpus else " (default: the sweep's)"),
    )
    p.add_argument(
        "--gpus",
        type=_non_negative_float,
        default=default_gpus,
        help="GPUs per arm"
        + (" (default 0)" if default_gpus is not None else " (default: the sweep's)"),
    )


def _location_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store", metavar="URL", help="store URL (default: $DAPO_DB_URL, else the SQLite file)"
    )
    p.add_argument(
        "--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else a local one)"
    )


# --- commands ------------------------------------------------------------------------------
def cmd_sweep(args: argparse.Namespace) -> int:
    prepare_terminal()
    arms = _split(args.arms) if args.arms else list(ARM_NAMES)
    raw: dict[str, Any] = {
        "preset": args.preset,
        "arms": arms,
        "seeds": [s for group in args.seeds for s in group] if args.seeds is not None else [0],
        "steps": args.steps,
        "model": _absolute(args.model),
        "train_data": _absolute(args.data),
        "eval_data": _absolute(args.eval),
        "eval_k": args.eval_k,
        "eval_problems": args.eval_problems,
        "resources": {"cpus": args.cpus, "gpus": args.gpus},
        "overrides": _overrides(args.set, args.preset, arms),
        "store_url": args.store,
        "ray_address": args.ray_address,
        "force": args.force,
        "name": args.name,
    }
    from flows import plan, ray_worker
    from flows.params import SweepParams, validate

    if args.sweep is None:  # a typo fails here, before Prefect and the store are opened
        plan.sweep_jobs(validate(SweepParams, raw))
    from flows.sweep import ablation_sweep, prepare

    # The same checks the flow makes, here first: a user mistake costs no Prefect start-up.
    params, _store, jobs = prepare(raw, args.sweep)
    if params.ray_address or os.environ.get("RAY_ADDRESS"):
        ray_worker.probe_if_remote(params.ray_address)
    display = Display(quiet=args.quiet)
    t0 = time.perf_counter()
    state = _run_flow(ablation_sweep, display, **raw, sweep_id=args.sweep)
    wall = time.perf_counter() - t0
    sweep_id = args.sweep or display.sweep_id
    if sweep_id is not None:
        print_table(params.store_url, sweep_id)
    results = state.result(raise_on_failure=False) if state.is_completed() else None
    if results:
        print(
            orchestration_line(results.get("results", []), wall, params.resources, display.slots),
            flush=True,
        )
    if not state.is_completed():
        print(
            f"error: sweep {'' if sweep_id is None else sweep_id} {state.name.lower()}: {_state_line(state)}",
            file=sys.stderr,
        )
        return 1
    print(f"sweep {sweep_id} completed in {_duration(wall)} ({len(jobs)} arm run(s))", flush=True)
    return 0


def cmd_arm(args: argparse.Namespace) -> int:
    prepare_terminal()
    from db.store import Store
    from flows import plan, ray_worker
    from flows.arm import ablation_arm
    from flows.params import ArmParams, SweepParams, validate

    store = Store(args.store)
    sweep_id = args.sweep or latest_sweep_id(store.url)
    resources = None
    if args.cpus is not None or args.gpus is not None:
        resources = {"cpus": args.cpus or 1.0, "gpus": args.gpus or 0.0}
    raw = {
        "sweep_id": sweep_id,
        "arm": args.arm,
        "seed": args.seed,
        "force": args.force,
        "resources": resources,
        "store_url": args.store,
        "ray_address": args.ray_address,
        "publish": True,
    }
    p = validate(ArmParams, raw)
    sweep = store.get_sweep(p.sweep_id)
    plan.arm_job(validate(SweepParams, dict(sweep.get("params") or {})), p.arm, p.seed)
    ray_worker.probe_if_remote(p.ray_address)
    display = Display(quiet=args.quiet)
    state = _run_flow(ablation_arm, display, **raw)
    print_table(args.store, sweep_id)
    if not state.is_completed():
        print(
            f"error: arm {args.arm} seed {args.seed} {state.name.lower()}: {_state_line(state)}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from flows.serve import serve

    prepare_terminal(quiet_prefect=False)
    return serve(host=args.host, port=args.port, ray_address=args.ray_address, limit=args.limit)


# --- terminal plumbing -----------------------------------------------------------------------
def prepare_terminal(*, quiet_prefect: bool = True) -> None:
    """Environment for flows run from a terminal; must run before prefect is imported."""
    if "prefect" not in sys.modules:
        # Prefect's database survives between commands: its first set-up costs ~30 s.
        os.environ.setdefault("PREFECT_HOME", str(default_prefect_home()))
        # Prefect creates its home without parents and only warns when it cannot.
        Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray's own INFO lines ("Started a local Ray instance", worker logs) are not for this screen.
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # The ephemeral server's telemetry job races the flows for its SQLite file ("database is locked").
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if quiet_prefect:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    if quiet_prefect and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
    for name in ("ray", "filelock", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from flows import ray_worker

    ray_worker.check_working_dir()


class Display:
    """The terminal view of a sweep: one timestamped line per event."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.sweep_id: int | None = None
        self.slots: int | None = None
        self.t0 = time.perf_counter()

    def __call__(self, message: str, data: dict[str, Any]) -> None:
        if "sweep_id" in data:
            self.sweep_id = int(data["sweep_id"])
        if "slots" in data:
            self.slots = int(data["slots"])
        if not self.quiet:
            print(f"[{_duration(time.perf_counter() - self.t0)}] {message}", flush=True)


def _run_flow(fn: Any, display: Display, **params: Any) -> Any:
    from flows import progress, ray_worker

    progress.set_listener(display)
    try:
        return fn(**params, return_state=True)
    finally:
        progress.set_listener(None)
        ray_worker.shutdown()


def print_table(store_url: str | None, sweep_id: int) -> None:
    from db.engine import resolve_url
    from flows.publish import text

    print(f"\n{text(resolve_url(store_url), sweep_id)}", flush=True)


def latest_sweep_id(url: str) -> int:
    from db import queries
    from db.engine import get_engine

    found = queries.latest_sweep_id(get_engine(url))
    if found is None:
        raise ValueError("the store holds no sweep yet: run `dapo sweep` first, or pass --sweep ID")
    return found


def orchestration_line(
    results: list[dict[str, Any]], wall_s: float, resources: Any, slots: int | None
) -> str:
    """Share of the wall time not spent inside train(): Prefect, Ray, store, start-up."""
    trained = [float(r["wall_s"]) for r in results if r.get("wall_s")]
    if not trained:
        return "orchestration: no arm trained in this sweep"
    concurrency = max(1, min(slots or 1, len(trained)))
    training = sum(trained) / concurrency
    share = max(0.0, 1.0 - training / wall_s)
    return (
        f"time: wall {_duration(wall_s)}; train() {_duration(sum(trained))} over {len(trained)} arm run(s), "
        f"{concurrency} at a time ≈ {_duration(training)}; orchestration ≈ {100 * share:.0f}% of the wall time"
    )


def _state_line(state: Any) -> str:
    from flows.plan import state_line

    return state_line(getattr(state, "message", None)) or str(state.name)


def _split(items: list[str]) -> list[str]:
    return [x.strip() for item in items for x in item.split(",") if x.strip()]


def _absolute(value: str | None) -> str | None:
    """A relative path means the caller's directory (the flows may run elsewhere)."""
    from flows.plan import looks_like_path

    if value and looks_like_path(value) and not value.startswith(("/", "~")):
        return str(Path(value).resolve())
    return value


def _overrides(items: list[str], preset: str, arms: list[str]) -> dict[str, Any]:
    if not items:
        return {}
    from dapo_core.arms import build_arm_config
    from dapo_core.cli import parse_sets

    base_arm = arms[0] if arms and arms[0] in ARM_NAMES else ARM_NAMES[0]
    return parse_sets(
        items,
        build_arm_config(base_arm, preset) if preset in PRESETS else build_arm_config(base_arm),
    )


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _seeds(text: str) -> list[int]:
    """`0`, or `0,1,2` (like --arms)."""
    return [non_negative_int(part) for part in _split([text])] or [non_negative_int(text)]


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _positive_float(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _non_negative_float(text: str) -> float:
    value = _float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number")
    return value
