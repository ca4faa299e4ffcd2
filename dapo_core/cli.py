"""`dapo arms`, `dapo train`, `dapo eval`, `dapo plan`: the trainer's subcommands.

dapo_lab/cli.py's dispatcher calls `register(subparsers)`; each command raises ValueError /
FileNotFoundError for bad input and the dispatcher prints it as one line (exit 2).
Heavy imports (torch, transformers) happen inside the commands, so `dapo --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dapo_common.cli_args import non_negative_int, positive_float, positive_int
from dapo_common.text import percent, terminal_width
from dapo_common.util import duration, num
from dapo_core.setup.config import ENGINES, ExperimentConfig, is_local_path
from dapo_core.setup.ladders import BUILTIN_LADDERS, expand_grid, paper_ladder, resolve_ladder
from dapo_core.setup.overrides import parse_grid, parse_sets
from dapo_core.setup.presets import PRESETS
from dapo_core.setup.sweep_fields import SWEEP_FIELD, SWEEP_FIELDS, field_overrides


def register(subparsers: Any) -> None:
    """Add `arms`, `train` and `eval` to the `dapo` dispatcher."""
    p = subparsers.add_parser(
        "arms",
        help="print and check an ablation ladder (arm, what it adds, paper score)",
        description="Print an ablation ladder after validating every arm's config on the preset: "
        "the paper's (default), a built-in one, or a TOML file of your own; with --grid, the "
        "arms a grid sweep would run. A bad file ends with one line naming the file and the arm.",
    )
    p.add_argument(
        "--ladder",
        metavar="NAME_OR_FILE",
        help=f"a built-in ladder ({', '.join(BUILTIN_LADDERS)}; default paper) or a .toml file",
    )
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="SECTION.FIELD=V1,V2,...",
        help="sweep a field from the base arm, e.g. --grid algo.clip_high=0.24,0.28,0.32 "
        "(repeatable: the cartesian product)",
    )
    p.add_argument("--arm", help="the grid's base arm (default: the ladder's last arm)")
    p.add_argument(
        "--preset",
        default="tiny",
        help=f"validate the configs on this preset: {', '.join(PRESETS)} (default tiny)",
    )
    p.add_argument("--toml", action="store_true", help="print the ladder as a ladder file")
    p.add_argument(
        "--wide",
        action="store_true",
        help="one line per arm, however long (default: fit $COLUMNS, else the terminal, else "
        "120 characters, wrapping what each arm adds)",
    )
    p.set_defaults(func=cmd_arms)

    p = subparsers.add_parser(
        "train",
        help="train one arm of the ladder in this process",
        description="Train one arm of the DAPO ablation ladder. Resumes from the output "
        "directory's latest checkpoint unless --no-resume.",
    )
    _arm_args(p)
    p.add_argument(
        "--preset", default="tiny", help=f"base config: {', '.join(PRESETS)} (default tiny)"
    )
    add_field_arguments(p, [f.name for f in SWEEP_FIELDS], default_from="the preset")
    p.add_argument("--seed", type=non_negative_int, help="random seed (run.seed)")
    p.add_argument(
        "--out", type=Path, help="output directory (default runs/<arm>-<preset>-s<seed>-<hash>)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override any config field, e.g. --set algo.clip_high=0.3 (repeatable)",
    )
    p.add_argument(
        "--no-resume", action="store_true", help="start over even if a checkpoint exists"
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="processes training this arm on this machine, the policy sharded across them "
        "(FSDP2; default 1: one plain process). A resource, not part of the config: a run "
        "may resume on another number",
    )
    p.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser(
        "eval",
        help="evaluate a checkpoint (avg@k, pass@k, cons@k)",
        description="Evaluate a checkpoint: a run directory, its checkpoints/ folder or a step_N folder.",
    )
    p.add_argument("--ckpt", required=True, type=Path, help="checkpoint or run directory")
    add_field_arguments(p, ["eval_data", "eval_k", "eval_problems"], default_from="the run")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), help="device (default: the run's)")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help="rollout engine that samples the answers (default: the run's rollout.engine); on a "
        "GPU the evaluation's memory plan is checked first",
    )
    p.set_defaults(func=cmd_eval)

    p = subparsers.add_parser(
        "plan",
        help="the GPU memory one worker of an arm needs, item by item, and whether it fits",
        description="Plan the memory of one worker of an arm (dapo_core.setup.plan): weights, "
        "fp32 masters, gradients, AdamW states, activations, the log-prob head and the vLLM "
        "engine's share; then `fits` (exit 0) or `does not fit: needs at least K workers of G "
        "GiB` (exit 2). Offline: the architecture comes from the model directory, the Hugging "
        "Face cache or a table of known models.",
    )
    p.add_argument(
        "--preset", default="tiny", help=f"base config: {', '.join(PRESETS)} (default tiny)"
    )
    _arm_args(p)
    add_field_arguments(p, ["model"], default_from="the preset")
    p.add_argument(
        "--workers",
        type=positive_int,
        help="FSDP2 workers (GPUs) per arm (default: the preset's, else 1)",
    )
    p.add_argument(
        "--gpu-memory",
        type=positive_float,
        metavar="GiB",
        help="memory of one GPU in GiB (default: the preset's GPU, else 79 for an 80 GB GPU)",
    )
    p.add_argument(
        "--rollout-actor",
        action="store_true",
        help="the rollout engine on a GPU of its own (`dapo sweep --rollout-actor --rollout-gpus "
        "1`): the trainer's GPU without the engine, then the engine's GPU",
    )
    p.add_argument(
        "--rollout-gpu-memory",
        type=positive_float,
        metavar="GiB",
        help="memory of the engine's GPU with --rollout-actor (default: --gpu-memory's)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override any config field, e.g. --set batch.micro_batch_size=2 (repeatable)",
    )
    p.set_defaults(func=cmd_plan)


# --- commands ------------------------------------------------------------------------------
def cmd_arms(args: argparse.Namespace) -> int:
    ladder = resolve_ladder(args.ladder or "paper", preset=args.preset)
    if args.grid:
        base = args.arm or ladder.arms[-1].name
        ladder.arm(base)  # an unknown base is the first error, ahead of a bad --grid
        grids = parse_grid(ExperimentConfig, args.grid)
        ladder = expand_grid(ladder, grids, arm=base, preset=args.preset)
    elif args.arm:
        raise ValueError("--arm names the base of a --grid: add --grid key=v1,v2")
    if args.toml:
        print(ladder.to_toml(), end="")
        return 0
    if args.ladder or args.grid:
        print(f"{ladder.name}: {len(ladder.arms)} arms, valid on preset {args.preset}")
    print(ladder.format(width=None if args.wide else terminal_width()))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    out = args.out or default_out_dir(cfg)
    _check_model_path(cfg.model.name_or_path)
    from dapo_core.real_model import check_model, needs_chat_template

    # Converted, tokenizer files, chat template, vocabulary: one line, before anything is written.
    check_model(cfg.model.name_or_path, chat=needs_chat_template(cfg.data.prompt_template))
    from dapo_core.setup.tracker_backends import check_trackers
    from dapo_core.train.trackers import tracker_hints

    check_trackers(cfg.to_dict())  # a backend a tracker refuses: one line, nothing written
    _logging()

    import functools

    from dapo_core.train.distributed import check_workers, launch_local
    from dapo_core.train.sinks import JsonlSink
    from dapo_core.train.trackers import open_with_trackers

    ladder = resolve_ladder(args.ladder, args.preset)
    tags = {"ladder": ladder.name, "parent": ladder.arm(cfg.arm).parent}
    workers = int(getattr(args, "workers", 1) or 1)
    check_workers(cfg, workers)
    from dapo_core.setup.plan import check_fits

    check_fits(cfg, workers)  # a GPU run that cannot fit stops here, with the plan's advice
    on = f", {workers} workers" if workers > 1 else ""
    from dapo_core.models import prepare_policy

    # The one-time phase (the tiny model's warm start, the real model's conversion) before the
    # run and its clock start: never part of the run's time.
    prepare_policy(
        cfg.model,
        say=(lambda _: None) if args.quiet else _say,
        threads=cfg.run.num_threads or None,  # what the run's own torch set-up would use
    )
    print(
        f"training arm {cfg.arm} on preset {cfg.preset} ({cfg.run.steps} steps{on}) -> {out}",
        flush=True,
    )
    for line in tracker_hints(cfg.to_dict(), out):
        print(line, flush=True)
    with _removed_if_left_empty(out):
        result = launch_local(
            cfg,
            out_dir=out,
            workers=workers,
            # run.loggers: the trackers beside the run's JSON lines (none: JsonlSink alone).
            sink_factory=functools.partial(
                open_with_trackers, functools.partial(JsonlSink, out), cfg.to_dict(), out, tags
            ),
            resume=not args.no_resume,
            progress=None if args.quiet else print_progress,
        )
    ev = result.final_eval or {}
    print(
        f"done: {result.steps} steps, {result.grad_updates} gradient updates, "
        f"{result.tokens} tokens in {duration(result.wall_s)}; "
        + (
            f"{ev['dataset']} avg@{ev['k']} {percent(ev['avg_at_k'])} pass@{ev['k']} "
            f"{percent(ev['pass_at_k'])} cons@{ev['k']} {percent(ev['cons_at_k'])}; "
            if ev
            else ""
        )
        + f"checkpoint {result.checkpoint_dir}",
        flush=True,
    )
    return 0


@contextlib.contextmanager
def _removed_if_left_empty(out: Path) -> Iterator[None]:
    """A run that fails before it writes anything (a data set that does not exist, a model that
    does not load) leaves no directory behind: the directories this run made for `out` (it
    and any parents that were not there), removed only while empty, deepest first."""
    made = [d for d in (out, *out.parents) if not d.exists()]
    try:
        yield
    except BaseException:
        for directory in made:  # deepest first; rmdir refuses one with anything in it
            try:
                directory.rmdir()
            except OSError:
                break
        raise


def cmd_eval(args: argparse.Namespace) -> int:
    from dapo_core.train.checkpoint import (
        check_checkpoint,
        load_checkpoint_config,
        resolve_checkpoint,
    )

    ckpt = resolve_checkpoint(args.ckpt)
    overrides = field_overrides(args)
    if args.device:
        overrides["run.device"] = args.device
    if getattr(args, "engine", None):
        overrides["rollout.engine"] = args.engine
    cfg = ExperimentConfig.from_dict(load_checkpoint_config(ckpt)).with_overrides(overrides)
    from dapo_core.real_model import needs_chat_template

    # The same model check as `dapo train` and `dapo sweep`, on what this command loads (the
    # checkpoint's export): one line, before a 500 MB model is read.
    check_checkpoint(
        ckpt, cfg.model.name_or_path, chat=needs_chat_template(cfg.data.prompt_template)
    )
    _logging()

    from dapo_core.train.runner import evaluate_checkpoint

    result = evaluate_checkpoint(ckpt, cfg)
    print(json.dumps({"checkpoint": str(ckpt), **result}, indent=2))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from dapo_core.setup.plan import (
        DEFAULT_GPU_GIB,
        format_engine_plan,
        format_plan,
        plan_memory,
        plan_rollout_engine,
    )
    from dapo_core.setup.presets import HARDWARE

    cfg = config_from_args(args)
    hardware = HARDWARE.get(cfg.preset)
    workers = args.workers or (hardware.workers if hardware else 1)
    gib = args.gpu_memory or (hardware.gpu_memory_gib if hardware else DEFAULT_GPU_GIB)
    if args.rollout_gpu_memory and not args.rollout_actor:
        raise ValueError("--rollout-gpu-memory plans the engine's own GPU: add --rollout-actor")
    plan = plan_memory(cfg, workers, gib, engine_apart=args.rollout_actor)
    print(format_plan(plan, cfg))
    if not args.rollout_actor:
        return 0 if plan.fits else 2
    engine = plan_rollout_engine(cfg, workers, args.rollout_gpu_memory or gib)
    print()
    print(format_engine_plan(engine, cfg))
    return 0 if plan.fits and engine.fits else 2


# --- config from the command line -----------------------------------------------------------
def _arm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--arm",
        default=None,
        help=f"an arm of the ladder: {', '.join(paper_ladder().names)} in the paper's (default: the "
        "ladder's last arm, dapo in the paper's)",
    )
    p.add_argument(
        "--ladder",
        metavar="NAME_OR_FILE",
        default="paper",
        help=f"the ladder --arm belongs to: {', '.join(BUILTIN_LADDERS)} or a .toml file "
        "(default paper)",
    )


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """The arm's config on the preset, with the flags and --set overrides applied."""
    ladder = resolve_ladder(args.ladder, args.preset)
    args.arm = args.arm or ladder.arms[-1].name
    ladder.arm(args.arm)  # an unknown arm is the first error, ahead of a bad --set
    overrides = parse_sets(ExperimentConfig, args.set)
    # The named flags win over --set; each command has those of the table it added (a missing
    # one is not given), and `dapo train` a seed.
    overrides.update(field_overrides(args))
    if getattr(args, "seed", None) is not None:
        overrides["run.seed"] = args.seed
    return ladder.config(args.arm, args.preset, overrides)


def add_field_arguments(p: argparse.ArgumentParser, names: list[str], *, default_from: str) -> None:
    """One flag per named row of dapo_core/setup/sweep_fields.py, spelled after the field
    (`--train-data` stores `args.train_data`, the config's data.train) so that a command line
    reads like the Prefect form; `default_from` says whose value a flag left out keeps ("the
    preset", "the run"). The row's older spellings (`--data`, `--k`) are accepted too, and
    left out of --help so that it teaches one name."""
    for name in names:
        row = SWEEP_FIELD[name]
        # An int row is a count (minimum 1) or a number of items (minimum 0, meaning all); the
        # argparse types refuse anything less in one line.
        kind: Any = str
        if row.type is int:
            kind = positive_int if row.minimum == 1 else non_negative_int
        p.add_argument(
            row.flag, dest=row.name, type=kind, metavar=row.metavar, help=row.describe(default_from)
        )
        for alias in row.aliases:
            p.add_argument(alias, dest=row.name, type=kind, help=argparse.SUPPRESS)


def default_out_dir(cfg: ExperimentConfig) -> Path:
    return Path("runs") / f"{cfg.arm}-{cfg.preset}-s{cfg.run.seed}-{cfg.config_hash()}"


def _check_model_path(name: str) -> None:
    """A value that looks like a path must exist (a hub name has one slash and no dot prefix)."""
    if name != "tiny" and is_local_path(name) and not Path(name).expanduser().exists():
        raise FileNotFoundError(f"model path {name} does not exist")


# --- output ------------------------------------------------------------------------------------
def _say(line: str) -> None:
    print(line, flush=True)


def _logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)


def print_progress(p: dict[str, Any]) -> None:
    """One line per step (module-level, so a spawned worker can be handed it)."""
    workers = int(p.get("workers", 1))
    line = (
        f"step {p['step']}/{p['steps']}  reward {num(p['reward'], '+.3f')}"
        f"  acc {percent(p['acc'])}  entropy {num(p['entropy'], '.3f')}"
        f"  length {num(p['response_length'], '.1f')}"
        f"  {num(p['tokens_per_s'], '.0f')} tok/s  ETA {duration(p['eta_s'])}"
        + (f"  [{workers} workers]" if workers > 1 else "")
    )
    print(line, flush=True)
