"""`dapo export --to mlflow|wandb|tensorboard|trackio --sweep ID`: a finished sweep, replayed from
the store into a tracker; and the tags a store run carries into the trackers it trains with.

The store is the record: a sweep run without trackers (or whose tracker was down) can be sent to
one afterwards. Each (arm, seed)'s latest attempt becomes one tracker run with the same config,
tags, metrics, evaluations and rollouts that `run.loggers` would have sent while it trained
(dapo_core.train.trackers). Files go under --out (default `dapo-export/sweep-<ID>`): a
TensorBoard log directory per run, one MLflow store (`mlruns`) for the whole sweep unless
--mlflow-uri or $MLFLOW_TRACKING_URI names another, W&B run directories; Trackio writes to its
own store ($TRACKIO_DIR).

Reads go through db.reads; torch is imported only by the TensorBoard writer.
"""

from __future__ import annotations

import argparse
import logging
import os
import tomllib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dapo_core.setup.config import LOGGERS

log = logging.getLogger(__name__)

EXPORT_TARGETS: tuple[str, ...] = LOGGERS


def register(subparsers: Any) -> None:
    """Add `export` to the `dapo` dispatcher."""
    from db.cli import store_argument

    p = subparsers.add_parser(
        "export",
        help="replay a sweep from the store into MLflow, W&B, TensorBoard or Trackio",
        description="Replay a sweep from the store into a tracker: one tracker run per (arm, "
        "seed), its latest attempt, with the config (dotted keys), tags (sweep, arm, seed, "
        "ladder, parent, ...), every metric at its step, the evaluations and the rollouts (a "
        "table where the tracker has one). W&B honours $WANDB_MODE=offline.",
    )
    p.add_argument("--to", required=True, choices=EXPORT_TARGETS, help="the tracker")
    p.add_argument("--sweep", type=int, default=None, help="sweep id (default: the newest)")
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="where the tracker's local files go (default dapo-export/sweep-ID); must not exist "
        "or be empty",
    )
    p.add_argument(
        "--mlflow-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else DIR/mlruns)",
    )
    store_argument(p)
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from db import engine as db_engine
    from db import reads
    from db.cli import _existing, _explained

    url = db_engine.resolve_url(args.store)
    _existing(url)
    engine = db_engine.get_engine(url, read_only=True)
    with _explained(url):
        sweep_id = args.sweep if args.sweep is not None else reads.latest_sweep_id(engine)
        if sweep_id is None:
            raise ValueError(f"the store {db_engine.safe_url(url)} has no sweeps to export")
        sweep = reads.sweep_details(engine, sweep_id)
        runs = reads.runs_of_sweep(engine, sweep_id)
    if runs.empty:
        raise ValueError(f"sweep {sweep_id} has no runs to export")
    out = Path(args.out or f"dapo-export/sweep-{sweep_id}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not empty: choose another or remove it")
    uri = args.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
    artifacts = ""
    if args.to == "mlflow" and not uri:  # one local store for the whole sweep
        from dapo_core.train.trackers import MLFLOW_DIR, local_mlflow

        uri, artifacts = local_mlflow(out / MLFLOW_DIR)
    latest = runs.sort_values("attempt").groupby(["arm", "seed"], sort=False).tail(1)
    latest = latest.sort_values(["arm", "seed"])
    exported = 0
    for _, row in latest.iterrows():
        with _explained(url):
            steps = replay_run(
                engine, int(row["run_id"]), args.to, out, sweep, mlflow=(uri, artifacts)
            )
        exported += 1
        print(f"{row['arm']} s{row['seed']} (run {row['run_id']}): {steps} steps -> {args.to}")
    where = uri if args.to == "mlflow" else str(out)
    print(f"exported sweep {sweep_id}: {exported} run(s) to {args.to} ({where})")
    return 0


def replay_run(
    engine: Any,
    run_id: int,
    to: str,
    out: Path,
    sweep: Mapping[str, Any],
    *,
    mlflow: tuple[str, str] = ("", ""),
) -> int:
    """One store run into a new tracker run under out/<arm>-s<seed>-run<id> (MLflow: into the
    store `mlflow` names, its tracking URI and artifact location); returns the number of steps
    replayed. A tracker that cannot start is a one-line error (asked for by name)."""
    import dataclasses

    from dapo_core.train.trackers import TRACKERS, install_hint, tracked_run
    from db import reads

    run = reads.run_details(engine, run_id)
    tags = tags_of(run, sweep)
    run_dir = out / f"{run['arm']}-s{run['seed']}-run{run_id}"
    tracked = dataclasses.replace(
        tracked_run(run["config"], run_dir, tags), mlflow_uri=mlflow[0], mlflow_artifacts=mlflow[1]
    )
    try:
        sink = TRACKERS[to](tracked)
    except ImportError as exc:
        raise ValueError(
            f"--to {to}: its library is not installed (no module {exc.name!r}; {install_hint(to)})"
        ) from None

    metrics = reads.metric_curves(engine, [run_id])
    evals = reads.evaluations(engine, run_id)
    samples = reads.samples(engine, run_id, limit=None)
    by_step: dict[int, dict[str, float]] = {}
    for name, step, value in zip(metrics["name"], metrics["step"], metrics["value"], strict=True):
        by_step.setdefault(int(step), {})[str(name)] = float(value)
    steps = sorted(
        set(by_step) | {int(s) for s in evals["step"]} | {int(s) for s in samples["step"]}
    )
    try:
        for step in steps:
            # The trainer's order within a step: evaluation, metrics, rollouts.
            for record in evals[evals["step"] == step].to_dict("records"):
                sink.log_evaluation(step, record)
            if step in by_step:
                sink.log_metrics(step, by_step[step])
            rollouts = samples[samples["step"] == step].to_dict("records")
            if rollouts:
                sink.log_samples(step, rollouts)
    finally:
        sink.close()
    return len(by_step)


# --- tags ------------------------------------------------------------------------------------
def tags_of(run: Mapping[str, Any], sweep: Mapping[str, Any]) -> dict[str, Any]:
    """A store run's tracker tags: sweep, arm, seed, attempt, run id, ladder, parent arm."""
    from db import reads

    arm = str(run["arm"])
    view = types.SimpleNamespace(ladder=sweep.get("ladder") or [], arms=sweep.get("arms") or [])
    order = reads.arm_order(view)
    parent = reads.parents(view, order).get(arm) if arm in order else None
    return {
        "sweep": run.get("sweep_id"),
        "arm": arm,
        "seed": run.get("seed"),
        "attempt": run.get("attempt"),
        "run_id": run.get("run_id", run.get("id")),
        "ladder": ladder_name(sweep),
        "parent": parent,
        "sweep_name": sweep.get("name"),
    }


def ladder_name(sweep: Mapping[str, Any]) -> str | None:
    """The sweep's ladder: a built-in name, or the `name` of the TOML text it was given."""
    text = str((sweep.get("params") or {}).get("ladder") or "").strip()
    if not text:
        return None
    if "\n" not in text and "=" not in text:
        return text
    try:
        name = tomllib.loads(text).get("name")
    except tomllib.TOMLDecodeError:
        return None
    return str(name) if name else None


def run_tags(store_url: str, run_id: int, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """tags_of a store run read from the store (for a run that trains with run.loggers); the
    owner's sweep, arm and seed alone when the store cannot be read now (it is the record, the
    trackers' tags are a convenience)."""
    from db.store import Store

    base = {k: v for k, v in (owner or {}).items() if k in ("sweep", "arm", "seed", "store")}
    base["run_id"] = run_id
    try:
        store = Store(store_url, outage_s=10.0)  # a tag is not worth a long wait
        run = store.get_run(run_id)
        return {**base, **tags_of(run, store.get_sweep(int(run["sweep_id"])))}
    except Exception as exc:
        log.warning("tracker tags of run %s: the store did not answer (%s)", run_id, exc)
        return base
