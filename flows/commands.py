"""`dapo sweep`, `dapo arm`, `dapo serve`: the flows from the terminal.

`dapo sweep` and `dapo arm` check their input first (flows/checks.py: one line and exit 2 for a
mistake, nothing written), then run the same Prefect flows as the served deployments in this
process, against a temporary Prefect server that dies with the command (flows/local_server.py;
$PREFECT_API_URL names a server of your own instead) and a local Ray unless RAY_ADDRESS is set,
and print progress in words; `dapo serve` serves the deployments to a Prefect server (see
flows/serve.py). Prefect and Ray are imported inside the commands so that `dapo --help` stays
fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from dapo_common.cli_args import non_negative_float, non_negative_int, number, positive_int
from dapo_core.cli import add_field_arguments
from dapo_core.setup.ladders import BUILTIN_LADDERS
from dapo_core.setup.presets import PRESETS
from dapo_core.setup.sweep_fields import SWEEP_FIELDS
from flows import progress

ENV_HELP = """\
where things go:
  run directories (checkpoints)  $DAPO_RUNS_DIR, default {runs}
  the experiment store           --store, else $DAPO_DB_URL, else a SQLite file (`dapo db current`)
  Prefect                        $PREFECT_API_URL, else a temporary server of this command
                                 whose database is in $PREFECT_HOME, default {prefect}
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
        help="run an ablation ladder (arms × seeds) through Prefect and Ray, then print the table",
        description="Run an ablation sweep: one training run per arm × seed, as many at once as "
        "Ray's resources allow, recorded in the store; then print the ablation table. The arms "
        "come from a ladder (--ladder: the paper's by default, another built-in one or a TOML "
        "file; `dapo arms --ladder FILE` checks one) or from a grid around one arm (--grid). "
        "Arms already completed in the sweep (--sweep) with the same config are skipped unless "
        "--force.",
        epilog=_env_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset", default="tiny", help=f"base config: {', '.join(PRESETS)} (default tiny)"
    )
    p.add_argument(
        "--ladder",
        metavar="NAME_OR_FILE",
        help=f"the ladder: {', '.join(BUILTIN_LADDERS)} or a .toml file (default paper)",
    )
    p.add_argument(
        "--arms",
        nargs="+",
        metavar="ARM",
        help="arms of the ladder to run (default: all; `dapo arms --ladder L` lists them); "
        "with --grid, the one base arm (default: the ladder's last); commas work too",
    )
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="SECTION.FIELD=V1,V2",
        help="sweep a config field around the base arm, e.g. --grid algo.clip_high=0.24,0.28,0.32 "
        "(repeatable: the cartesian product; each point is an arm whose parent is the base)",
    )
    p.add_argument(
        "--seeds",
        nargs="+",
        type=_seeds,
        metavar="SEED",
        help="seeds (default: 0); commas work too",
    )
    add_field_arguments(p, [f.name for f in SWEEP_FIELDS], default_from="the preset")
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
    _submit_arg(p, default="actors")
    p.add_argument("--name", help="a name for the sweep")
    p.add_argument(
        "--sweep",
        type=positive_int,
        metavar="ID",
        help="run an existing sweep again with its stored parameters (other config flags are ignored)",
    )
    adaptive = p.add_argument_group(
        "adding seeds until decided",
        "Seeds run in rounds; after each, every comparison that matters is tested under a "
        "group-sequential design that keeps false positives at 5% over all looks, and the arms "
        "whose comparisons are decided (real, or futile) stop.",
    )
    adaptive.add_argument(
        "--until-decided",
        action="store_true",
        help="add seeds in rounds until the comparisons are decided; --seeds is the first "
        "round, filled up to 6 seeds (the fewest the exact test can decide on)",
    )
    adaptive.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="A:B",
        help="a comparison that matters, A − B (repeatable; default: each arm against its "
        "parent, and the last arm against the first)",
    )
    adaptive.add_argument(
        "--max-seeds", type=positive_int, default=16, help="the most seeds (default 16)"
    )
    adaptive.add_argument(
        "--seeds-per-round", type=positive_int, default=2, help="seeds a round adds (default 2)"
    )
    adaptive.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="MINUTES",
        help="start no round that would pass this much wall time (default: no limit)",
    )
    adaptive.add_argument(
        "--spending",
        choices=("obrien-fleming", "pocock"),
        default="obrien-fleming",
        help="how the 5%% is spent over the looks (default obrien-fleming: nearly all at the "
        "last look)",
    )
    adaptive.add_argument(
        "--futility",
        type=float,
        default=0.1,
        metavar="P",
        help="stop a comparison when the chance that more seeds decide it falls below P "
        "(default 0.1; 0: never)",
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
    p.add_argument("--arm", required=True, help="an arm of the sweep's ladder (see `dapo table`)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed (default 0)")
    p.add_argument(
        "--force", action="store_true", help="retrain even if completed with the same config"
    )
    p.add_argument(
        "--extend",
        action="store_true",
        help="add this arm or seed to the sweep when it is not one of the sweep's (without it, "
        "that is refused: the table compares arms over the same seeds)",
    )
    _resource_args(p, default_cpus=None, default_gpus=None)
    _location_args(p)
    _submit_arg(p, default=None)
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
    from db.cli import store_argument

    store_argument(p)  # the forms' default store: a run whose form names none writes here
    p.set_defaults(func=cmd_serve)


def _resource_args(
    p: argparse.ArgumentParser, *, default_cpus: float | None, default_gpus: float | None
) -> None:
    p.add_argument(
        "--cpus",
        type=_positive_cpus,
        default=default_cpus,
        help="CPUs per arm (per worker with --workers); torch gets that many threads"
        + (f" (default {default_cpus:g})" if default_cpus else " (default: the sweep's)"),
    )
    p.add_argument(
        "--gpus",
        type=non_negative_float,
        default=default_gpus,
        help="GPUs per arm (per worker with --workers)"
        + (" (default 0)" if default_gpus is not None else " (default: the sweep's)"),
    )
    sweep = default_cpus is not None
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1 if sweep else None,
        help="workers per arm: N Ray actors in one placement group (FSDP2), each with --cpus "
        "and --gpus" + (" (default 1)" if sweep else " (default: the sweep's)"),
    )
    p.add_argument(
        "--spread",
        action="store_true",
        default=False if sweep else None,
        help="spread an arm's workers over the cluster's nodes (default: pack them on as few "
        "nodes as possible)",
    )
    p.add_argument(
        "--rollout-actor",
        action="store_true",
        default=False if sweep else None,
        help="each worker's rollout engine on a Ray actor of its own, with --rollout-cpus and "
        "--rollout-gpus (with --set rollout.mode=async: generation beside the update)",
    )
    p.add_argument(
        "--rollout-cpus",
        type=_positive_cpus,
        default=1.0 if sweep else None,
        help="CPUs of each rollout engine's actor"
        + (" (default 1)" if sweep else " (default: the sweep's)"),
    )
    p.add_argument(
        "--rollout-gpus",
        type=non_negative_float,
        default=0.0 if sweep else None,
        help="GPUs of each rollout engine's actor"
        + (" (default 0)" if sweep else " (default: the sweep's)"),
    )
    p.add_argument(
        "--rollout-resource",
        default="" if sweep else None,
        metavar="NAME",
        help="a custom Ray resource of the node(s) the rollout engines go to (`ray start "
        "--resources '{\"NAME\": 1}'`)",
    )


def _submit_arg(p: argparse.ArgumentParser, *, default: str | None) -> None:
    from flows.params import SUBMIT_DOC

    p.add_argument(
        "--submit",
        choices=("actors", "ray-jobs"),
        default=default,
        help=SUBMIT_DOC.replace("%", "%%")
        + (f" (default {default})" if default else " (default: the sweep's)"),
    )


def _location_args(p: argparse.ArgumentParser) -> None:
    from db.cli import store_argument

    store_argument(p)
    p.add_argument(
        "--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else a local one)"
    )


# --- commands ------------------------------------------------------------------------------
def cmd_sweep(args: argparse.Namespace) -> int:
    prepare_terminal()
    from flows import checks, ray_worker

    # The ladder file is read here, and a grid expanded, so that the flow gets text (it may
    # run on another machine) and a mistake in either is one line before anything starts.
    ladder, arms = checks.sweep_ladder(
        args.ladder, args.grid, _split(args.arms) if args.arms else None, args.preset
    )
    raw = sweep_raw(args, ladder, arms)
    if args.sweep is None:  # an arm bigger than this machine: before the store is opened
        from flows.params import Resources, validate

        check_local_fit(raw["ray_address"], validate(Resources, raw["resources"]))
    # The same checks the flow makes, here first: a user mistake costs no Prefect start-up,
    # writes nothing, and is one line with exit 2.
    params, store, jobs = checks.prepare_sweep(raw, args.sweep)
    check_local_fit(params.ray_address, params.resources)
    ray_worker.probe_if_remote(params.ray_address)
    from flows.cluster import preflight

    if params.resources.gpus > 0:  # the plan needs the cluster's GPU memory
        ray_worker.connect(params.ray_address)
    preflight(params.ray_address, params.resources, [job.config for job in jobs])
    check_cluster_fit(params.ray_address, params.resources)
    from flows import warm

    # The one-time phase (the tiny model's warm start, the real model's conversion), here and
    # once, before the arms start: never part of an arm's time or of the orchestration line.
    warm.prepare_models(
        [job.config for job in jobs],
        params.ray_address,
        _say(args.quiet),
        threads=arm_threads(params.resources),
    )
    # The wall time the orchestration line accounts for starts here, Prefect's start included.
    t0 = time.perf_counter()
    start_services(
        params.ray_address, params.resources, len(jobs), actors=params.submit != "ray-jobs"
    )
    from flows.sweep import ablation_sweep

    display = Display(quiet=args.quiet, hints=_tracker_hints(store, jobs))
    state = _run_flow(ablation_sweep, display, **raw, sweep_id=args.sweep)
    wall = time.perf_counter() - t0
    sweep_id = args.sweep or display.sweep_id
    if sweep_id is not None:
        print_table(params.store_url, sweep_id, failed=not state.is_completed())
        print_trackers(params.store_url, sweep_id)
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
    ran = len(results.get("results", [])) if results else len(jobs)
    print(f"sweep {sweep_id} completed in {progress.duration(wall)} ({ran} arm run(s))", flush=True)
    return 0


def cmd_arm(args: argparse.Namespace) -> int:
    prepare_terminal()
    from db.store import RunHeld, Store
    from flows import checks, plan, ray_worker
    from flows.params import ArmParams, validate

    store = Store(args.store, open_wait_s=0)
    sweep_id = args.sweep or latest_sweep_id(store.url)
    resources = None
    given = {
        "cpus": args.cpus,
        "gpus": args.gpus,
        "workers": args.workers,
        "placement": "SPREAD" if args.spread else None,
        "rollout_actor": args.rollout_actor,
        "rollout_cpus": args.rollout_cpus,
        "rollout_gpus": args.rollout_gpus,
        "rollout_resource": args.rollout_resource,
    }
    if any(v is not None for v in given.values()):
        # What is not given stays the sweep's (e.g. --workers 1 keeps the sweep's CPUs).
        stored = (store.get_sweep(sweep_id).get("params") or {}).get("resources") or {}
        resources = {**stored, **{k: v for k, v in given.items() if v is not None}}
    raw = {
        "sweep_id": sweep_id,
        "arm": args.arm,
        "seed": args.seed,
        "force": args.force,
        "resources": resources,
        "store_url": args.store,
        "ray_address": args.ray_address,
        "publish": True,
        "extend": args.extend,
        "submit": args.submit,
    }
    p = validate(ArmParams, raw)
    # The checks the flow makes, here first (one line, exit 2, nothing written): an arm or
    # seed outside the sweep without --extend, a config or data file that does not work.
    sweep_params = checks.arm_in_sweep(store.get_sweep(p.sweep_id), p.arm, p.seed, extend=p.extend)
    job = plan.arm_job(sweep_params, p.arm, p.seed)
    config = job.config
    checks.check_inputs([config])
    # Another process training this arm (its lease is live) is named before anything starts.
    lease = store.lease_of(p.sweep_id, p.arm, p.seed)
    if lease is not None:
        raise RunHeld(lease.line(f"{job.label} of sweep {p.sweep_id}"), lease)
    address = p.ray_address or sweep_params.ray_address
    resources = p.resources or sweep_params.resources
    check_local_fit(address, resources)
    ray_worker.probe_if_remote(p.ray_address)
    from flows.cluster import preflight

    if resources.gpus > 0:  # the plan needs the cluster's GPU memory
        ray_worker.connect(address)
    preflight(address, resources, [config])
    check_cluster_fit(address, resources)
    from flows import warm

    # As cmd_sweep: before the arm, with the threads its actor gets.
    warm.prepare_models([config], address, _say(args.quiet), threads=arm_threads(resources))
    start_services(
        p.ray_address or sweep_params.ray_address,
        p.resources or sweep_params.resources,
        1,
        actors=(p.submit or sweep_params.submit) != "ray-jobs",
    )
    from flows.arm import ablation_arm

    display = Display(quiet=args.quiet)
    state = _run_flow(ablation_arm, display, **raw)
    if not state.is_completed():
        lost = _exception_of(state)
        if isinstance(lost, RunHeld):  # another command claimed the arm first: its one line
            raise lost
    print_table(args.store, sweep_id, failed=not state.is_completed())
    print_trackers(args.store, sweep_id)
    if not state.is_completed():
        print(
            f"error: arm {args.arm} seed {args.seed} {state.name.lower()}: {_state_line(state)}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from flows.serve import serve

    if args.store:
        # Opened now (a bad URL or a foreign database is one line before anything is served),
        # then handed to the served flow runs, which start in this process's environment.
        from db.engine import ENV_VAR
        from db.store import Store

        os.environ[ENV_VAR] = Store(args.store, open_wait_s=0).url
    prepare_terminal(quiet_prefect=False)
    return serve(host=args.host, port=args.port, ray_address=args.ray_address, limit=args.limit)


def sweep_raw(args: argparse.Namespace, ladder: str, arms: list[str] | None) -> dict[str, Any]:
    """SweepParams' fields, in its order, from `dapo sweep`'s arguments: a field is the flag
    of its name (`--train-data` for train_data), except those made of several flags below. A
    field added to SweepParams without a flag is an AttributeError here, which a test meets."""
    from flows.params import SweepParams

    made = {
        "ladder": ladder,
        "arms": arms or [],
        "seeds": [s for group in args.seeds for s in group] if args.seeds is not None else [0],
        "resources": {
            "cpus": args.cpus,
            "gpus": args.gpus,
            "workers": args.workers,
            "placement": "SPREAD" if args.spread else "PACK",
            "rollout_actor": args.rollout_actor,
            "rollout_cpus": args.rollout_cpus,
            "rollout_gpus": args.rollout_gpus,
            "rollout_resource": args.rollout_resource,
        },
        "overrides": _overrides(args.set),
        "store_url": args.store,
        "adaptive": {
            "until_decided": args.until_decided,
            "compare": args.compare,
            "max_seeds": args.max_seeds,
            "seeds_per_round": args.seeds_per_round,
            "budget_minutes": args.budget,
            "spending": args.spending,
            "futility": args.futility,
        },
    }
    # The table's text fields name a model or a data set, or a path: relative to this
    # directory, which the flow (maybe on another machine) does not share.
    for row in SWEEP_FIELDS:
        if row.type is str:
            made[row.name] = _absolute(getattr(args, row.name))
    return {
        name: made[name] if name in made else getattr(args, name)
        for name in SweepParams.model_fields
    }


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
    # Should anything still start Prefect's own ephemeral server (a flow called from Python in
    # this process without use_temporary_server), its first start on a new machine creates and
    # migrates a database: Prefect's 20 s are not enough for that on a loaded machine.
    os.environ.setdefault(
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(int(local_server_timeout()))
    )
    if quiet_prefect:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
        # The run's errors reach this screen as one line (Display, the final state line);
        # Prefect's console copy of them is a traceback. Its server still keeps every record.
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
    if quiet_prefect and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
        # Other libraries' warnings are worth a line here; Prefect's records are not: the
        # flows' own say them on this screen already (Display), a failure ends with its one
        # line, and Prefect's copies carry tracebacks. Its server keeps them all.
        for handler in logging.getLogger().handlers:
            handler.addFilter(lambda record: not record.name.startswith("prefect"))
    for name in ("ray", "filelock", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from flows import ray_worker

    ray_worker.check_working_dir()


def local_server_timeout() -> float:
    from flows.local_server import START_TIMEOUT_S

    return START_TIMEOUT_S


def start_services(
    ray_address: str | None, resources: Any, arms: int, *, actors: bool = True
) -> None:
    """Prefect, Ray and the arms' actors, started side by side: the temporary Prefect server
    boots in its own process while this one joins (or starts) Ray and starts the actors the
    first arms will train in (each imports torch and transformers: seconds of start-up)."""
    from flows import plan, ray_worker

    server = use_temporary_server(wait=False)
    cluster = ray_worker.connect(ray_address)
    # Before any actor asks for them: an arm bigger than the cluster is the user's mistake (one
    # line, exit 2), not a flow that fails after Ray's autoscaler has complained.
    plan.check_fits(cluster, resources)
    if actors:  # arms as Ray jobs (--submit ray-jobs) train in processes of their own
        ray_worker.prewarm(resources, plan.concurrency(cluster, resources, arms))
    if server is not None:
        server.wait_ready()


def check_cluster_fit(address: str | None, resources: Any) -> None:
    """An arm bigger than the Ray cluster the command joins (--ray-address or $RAY_ADDRESS):
    one line before the one-time phase, which can take minutes (a tiny model's first warm
    start on a loaded machine took 10), not after it (start_services checks again, for the
    local instance it starts)."""
    if not (address or os.environ.get("RAY_ADDRESS")):
        return  # a local instance: check_local_fit, then start_services once Ray has counted
    from flows import plan, ray_worker

    plan.check_fits(ray_worker.connect(address), resources)


def check_local_fit(address: str | None, resources: Any) -> None:
    """An arm bigger than this machine, when the command would start a local Ray instance (no
    --ray-address, no $RAY_ADDRESS): one line before Ray starts (its start takes seconds, half
    a minute on a loaded machine). The local instance gets this machine's CPUs; its GPUs are
    checked once Ray has counted them (start_services)."""
    if address or os.environ.get("RAY_ADDRESS"):
        return
    from flows import plan

    cpus = float(os.cpu_count() or 1)
    try:
        plan.check_fits({"CPU": cpus, "GPU": float("inf")}, resources)
    except ValueError as exc:
        if "rollout_resource" in str(exc):
            raise  # a local instance offers no custom resource: the line says how to get one
        n, want = resources.workers, plan.per_worker(resources)["CPU"]
        each = f"{n} workers × {want:g}" if n > 1 else f"{want:g}"
        raise ValueError(
            f"each arm asks for {each} CPU(s) but this machine has {cpus:g} (a local Ray "
            "instance gets them all): lower --cpus"
            + (" or --rollout-cpus" if resources.rollout_actor else "")
            + (" or --workers" if n > 1 else "")
            + ", or join a bigger cluster (--ray-address)"
        ) from None


def use_temporary_server(*, wait: bool = True) -> Any:
    """Point this process's flows at a temporary Prefect server of its own (which dies with
    it), unless $PREFECT_API_URL names one; returns the server, or None. Call it after the
    input is checked (a mistake then starts nothing) and before Prefect is imported."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    from flows import local_server

    server = local_server.start()
    os.environ["PREFECT_API_URL"] = server.api_url
    if wait:
        server.wait_ready()
    return server


class Display:
    """The terminal view of a sweep: one timestamped line per event. `hints`: the lines that
    say where to watch the trackers of a sweep, once its id is known (_tracker_hints)."""

    def __init__(self, *, quiet: bool, hints: Any = None) -> None:
        self.quiet = quiet
        self.sweep_id: int | None = None
        self.slots: int | None = None
        self.t0 = time.perf_counter()
        self._hints = hints

    def __call__(self, message: str, data: dict[str, Any]) -> None:
        if "sweep_id" in data:
            self.sweep_id = int(data["sweep_id"])
        if "slots" in data:
            self.slots = int(data["slots"])
        if not self.quiet:
            print(f"[{progress.duration(time.perf_counter() - self.t0)}] {message}", flush=True)
        elif message.startswith("warning: "):  # not progress: --quiet keeps it, on stderr
            print(message, file=sys.stderr, flush=True)
        if self._hints is not None and self.sweep_id is not None:
            hints, self._hints = self._hints, None
            for line in hints(self.sweep_id):
                print(line, flush=True)


# Prefect's own setting for a flow run's heartbeats: honoured when the user sets it.
HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"


def _run_flow(fn: Any, display: Display, **params: Any) -> Any:
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    from flows import ray_worker

    progress.set_listener(display)
    # The server use_temporary_server chose, also for a Prefect that was imported before.
    api_url = os.environ.get("PREFECT_API_URL")
    updates: dict[Any, Any] = {PREFECT_API_URL: api_url} if api_url else {}
    if HEARTBEAT_ENV not in os.environ:
        # No heartbeats from a terminal's flow runs. Each flow run (every arm is a subflow)
        # starts a heartbeat thread that sleeps in 1 s steps, and its end waits for that thread:
        # 0.5-1 s per arm (bench/bench_grid.py, 2026-11-25), for heartbeats nothing reads here:
        # only the automation of `dapo deploy` does, for its deployments' runs (flows/deploy.py),
        # and those get their frequency from the worker's environment, not from this process.
        updates[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
    try:
        with temporary_settings(updates=updates):
            return fn(**params, return_state=True)
    finally:
        progress.set_listener(None)
        ray_worker.shutdown()


def print_table(store_url: str | None, sweep_id: int, *, failed: bool = False) -> None:
    """The sweep's table. After a failed run the store may be what failed: then the table is
    left out (the error line that follows says why) rather than a second error printed."""
    import sqlalchemy as sa

    from db.engine import explain, resolve_url
    from flows.publish import text

    url = resolve_url(store_url)
    try:
        table = text(url, sweep_id)
    except (sa.exc.SQLAlchemyError, ConnectionError) as error:
        if failed:
            return
        raise explain(error, url) from error
    print(f"\n{table}", flush=True)


def print_trackers(store_url: str | None, sweep_id: int) -> None:
    """Which trackers the sweep's runs reached (db.tracker_status), under its table; nothing
    when its runs name none, or the store cannot say."""
    import sqlalchemy as sa

    from db import tracker_status
    from db.engine import get_engine, resolve_url

    try:
        lines = tracker_status.of_sweep(get_engine(resolve_url(store_url)), sweep_id)
    except (sa.exc.SQLAlchemyError, ConnectionError, LookupError):
        return
    for line in lines:
        print(line, flush=True)


def _tracker_hints(store: Any, jobs: list[Any]) -> Any:
    """A function of a sweep's id: the lines that say where to watch the trackers its arms
    name (dapo_core.train.trackers.tracker_hints, for the sweep's folder of run directories);
    None when no arm names one."""
    configs = [job.config for job in jobs if job.config.get("run", {}).get("loggers")]
    if not configs:
        return None
    from dapo_core.train.trackers import tracker_hints
    from flows import plan

    def hints(sweep_id: int) -> list[str]:
        # The folder plan.fresh_run_dir puts the sweep's run directories in.
        folder = plan.fresh_run_dir(plan.runs_dir(), store.store_id, sweep_id, "a", 0, "h", 0)
        return tracker_hints(configs[0], folder.parent, sweep=True)

    return hints


def latest_sweep_id(url: str) -> int:
    from db import reads
    from db.engine import get_engine

    found = reads.latest_sweep_id(get_engine(url))
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
    d = progress.duration
    return (
        f"time: wall {d(wall_s)}; train() {d(sum(trained))} over {len(trained)} arm run(s), "
        f"{concurrency} at a time ≈ {d(training)}; orchestration ≈ {100 * share:.0f}% of the wall time"
    )


def _exception_of(state: Any) -> BaseException | None:
    """The exception a failed flow run's state holds (None when it holds none)."""
    try:
        found = state.result(raise_on_failure=False)
    except Exception:
        return None
    return found if isinstance(found, BaseException) else None


def _state_line(state: Any) -> str:
    from flows.plan import state_line

    return state_line(getattr(state, "message", None)) or str(state.name)


def arm_threads(resources: Any) -> int:
    """The torch threads an arm's actor gets: its CPUs, at least 1 (ray_worker._set_threads)."""
    return max(1, int(min(float(resources.cpus), float(os.cpu_count() or 1))))


def _say(quiet: bool) -> Any:
    """Where the one-time phase's progress lines go: this screen, unless --quiet."""
    return None if quiet else (lambda line: print(line, flush=True))


def _split(items: list[str]) -> list[str]:
    return [x.strip() for item in items for x in item.split(",") if x.strip()]


def _absolute(value: str | None) -> str | None:
    """A relative path means the caller's directory (the flows may run elsewhere)."""
    from flows.plan import looks_like_path

    if value and looks_like_path(value) and not value.startswith(("/", "~")):
        return str(Path(value).resolve())
    return value


def _overrides(items: list[str]) -> dict[str, Any]:
    """`--set` values typed like the config's fields."""
    if not items:
        return {}
    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.setup.overrides import parse_sets

    return parse_sets(ExperimentConfig, items)


def _seeds(text: str) -> list[int]:
    """`0`, or `0,1,2` (like --arms)."""
    return [non_negative_int(part) for part in _split([text])] or [non_negative_int(text)]


def _positive_cpus(text: str) -> float:
    """--cpus: a number > 0 (unlike dapo_common.cli_args.positive_float, inf passes here)."""
    value = number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value
