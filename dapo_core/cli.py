"""`dapo arms`, `dapo train`, `dapo eval`: the trainer's subcommands.

flows/cli.py's dispatcher calls `register(subparsers)`; each command raises ValueError /
FileNotFoundError for bad input and the dispatcher prints it as one line (exit 2).
Heavy imports (torch, transformers) happen inside the commands, so `dapo --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from dapo_core.arms import ARM_NAMES, build_arm_config, format_ladder
from dapo_core.config import ExperimentConfig, flatten
from dapo_core.presets import PRESETS


def register(subparsers: Any) -> None:
    """Add `arms`, `train` and `eval` to the `dapo` dispatcher."""
    p = subparsers.add_parser(
        "arms", help="print the ablation ladder (arm, what it adds, paper score)"
    )
    p.set_defaults(func=cmd_arms)

    p = subparsers.add_parser(
        "train",
        help="train one arm of the ladder in this process",
        description="Train one arm of the DAPO ablation ladder. Resumes from the output "
        "directory's latest checkpoint unless --no-resume.",
    )
    p.add_argument(
        "--arm", default="dapo", help=f"ladder arm: {', '.join(ARM_NAMES)} (default dapo)"
    )
    p.add_argument(
        "--preset", default="tiny", help=f"base config: {', '.join(PRESETS)} (default tiny)"
    )
    p.add_argument("--steps", type=positive_int, help="rollout steps (run.steps)")
    p.add_argument("--seed", type=non_negative_int, help="random seed (run.seed)")
    p.add_argument(
        "--model", help="`tiny`, a local model directory or a hub name (model.name_or_path)"
    )
    p.add_argument("--data", help="training data: a data set name or a .jsonl/.parquet path")
    p.add_argument("--eval", help="evaluation data: a data set name or a path")
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
    p.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser(
        "eval",
        help="evaluate a checkpoint (avg@k, pass@k, cons@k)",
        description="Evaluate a checkpoint: a run directory, its checkpoints/ folder or a step_N folder.",
    )
    p.add_argument("--ckpt", required=True, type=Path, help="checkpoint or run directory")
    p.add_argument("--eval", help="evaluation data (default: the run's data.eval)")
    p.add_argument(
        "--k", type=positive_int, help="samples per problem (default: the run's data.eval_k)"
    )
    p.add_argument("--problems", type=non_negative_int, help="first N problems (0: all)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), help="device (default: the run's)")
    p.set_defaults(func=cmd_eval)


# --- commands ------------------------------------------------------------------------------
def cmd_arms(args: argparse.Namespace) -> int:
    print(format_ladder())
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    out = args.out or default_out_dir(cfg)
    _check_model_path(cfg.model.name_or_path)
    _logging()

    from dapo_core.runner import train
    from dapo_core.sinks import JsonlSink

    print(
        f"training arm {cfg.arm} on preset {cfg.preset} ({cfg.run.steps} steps) -> {out}",
        flush=True,
    )
    printer = None if args.quiet else _progress_printer()
    with JsonlSink(out) as sink:
        result = train(cfg, sink=sink, out_dir=out, resume=not args.no_resume, progress=printer)
    ev = result.final_eval or {}
    print(
        f"done: {result.steps} steps, {result.grad_updates} gradient updates, "
        f"{result.tokens} tokens in {_duration(result.wall_s)}; "
        + (
            f"{ev['dataset']} avg@{ev['k']} {ev['avg_at_k']:.3f} pass@{ev['k']} "
            f"{ev['pass_at_k']:.3f} cons@{ev['k']} {ev['cons_at_k']:.3f}; "
            if ev
            else ""
        )
        + f"checkpoint {result.checkpoint_dir}",
        flush=True,
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from dapo_core.checkpoint import load_checkpoint_config, resolve_checkpoint

    ckpt = resolve_checkpoint(args.ckpt)
    overrides: dict[str, Any] = {}
    if args.eval:
        overrides["data.eval"] = args.eval
    if args.k:
        overrides["data.eval_k"] = args.k
    if args.problems is not None:
        overrides["data.eval_problems"] = args.problems
    if args.device:
        overrides["run.device"] = args.device
    cfg = ExperimentConfig.from_dict(load_checkpoint_config(ckpt)).with_overrides(overrides)
    _logging()

    from dapo_core.runner import evaluate_policy, load_checkpoint_policy, setup_torch

    device = setup_torch(cfg)
    model, tokenizer = load_checkpoint_policy(ckpt, cfg, device)
    from dapo_core.checkpoint import checkpoint_step

    result = evaluate_policy(cfg, model, tokenizer, step=checkpoint_step(ckpt))
    print(json.dumps({"checkpoint": str(ckpt), **result}, indent=2))
    return 0


# --- config from the command line -----------------------------------------------------------
def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """The arm's config on the preset, with the flags and --set overrides applied."""
    base = build_arm_config(args.arm, args.preset)
    overrides = parse_sets(args.set, base)
    for flag, key in (
        ("steps", "run.steps"),
        ("seed", "run.seed"),
        ("model", "model.name_or_path"),
        ("data", "data.train"),
        ("eval", "data.eval"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    return build_arm_config(args.arm, args.preset, overrides)


def parse_sets(items: list[str], base: ExperimentConfig) -> dict[str, Any]:
    """["algo.clip_high=0.3", ...] → {"algo.clip_high": 0.3}, each value parsed as the type of
    the field it sets (so a bad number fails here with the field's name)."""
    current = flatten(base.to_dict())
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected section.field=value")
        if key not in current:
            section = key.partition(".")[0]
            fields = sorted(k.partition(".")[2] for k in current if k.startswith(section + "."))
            hint = f" ({section} has: {', '.join(fields)})" if fields else ""
            raise ValueError(f"--set {key}: no such config field{hint}")
        out[key] = _coerce(key, raw.strip(), current[key])
    return out


def _coerce(key: str, raw: str, like: Any) -> Any:
    try:
        if isinstance(like, bool):
            if raw.lower() in ("true", "1", "yes", "on"):
                return True
            if raw.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if isinstance(like, int):
            return int(raw)
        if isinstance(like, float) or (like is None and key == "algo.clip_c"):
            if like is None and raw.lower() in ("none", "null", ""):
                return None
            return float(raw)
        if isinstance(like, list | tuple):
            values = json.loads(raw) if raw.startswith("[") else raw.split(",")
            return [float(v) for v in values]
    except (ValueError, json.JSONDecodeError):
        kind = type(like).__name__ if like is not None else "number or none"
        raise ValueError(f"--set {key}={raw!r}: expected a {kind}") from None
    return raw


def default_out_dir(cfg: ExperimentConfig) -> Path:
    return Path("runs") / f"{cfg.arm}-{cfg.preset}-s{cfg.run.seed}-{cfg.config_hash()}"


def _check_model_path(name: str) -> None:
    """A value that looks like a path must exist (a hub name has one slash and no dot prefix)."""
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1
    if name != "tiny" and looks_local and not Path(name).expanduser().exists():
        raise FileNotFoundError(f"model path {name} does not exist")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, else one clear error line."""
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return value


def integer(text: str) -> int:
    """argparse type: an integer (the message names the text, not a Python exception)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


# --- output ------------------------------------------------------------------------------------
def _logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _progress_printer() -> Any:
    def show(p: dict[str, Any]) -> None:
        def f(x: Any, fmt: str) -> str:
            return "-" if x is None or x != x else format(x, fmt)

        line = (
            f"step {p['step']}/{p['steps']}  reward {f(p['reward'], '+.3f')}  acc {f(p['acc'], '.3f')}"
            f"  entropy {f(p['entropy'], '.3f')}  length {f(p['response_length'], '.1f')}"
            f"  {f(p['tokens_per_s'], '.0f')} tok/s  ETA {_duration(p['eta_s'])}"
        )
        print(line, flush=True)

    return show
