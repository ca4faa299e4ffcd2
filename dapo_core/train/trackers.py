"""Trackers beside the store: MLflow, W&B, TensorBoard and Trackio as metrics sinks.

The store is the record; a tracker is a copy for the tools researchers already live in. Each
tracker here is an adapter of the MetricsSink protocol (dapo_core.train.protocols), named in
`run.loggers` with verl's `trainer.logger` spelling, and its library is imported only when a run
names it (optional extras: `pip install 'dapo-lab[trackers]'` for MLflow's skinny client, W&B
and TensorBoard; `'dapo-lab[trackio]'` for Trackio, whose pillow<13 .venv's lock cannot hold).

`with_trackers(primary, cfg, out_dir, tags)` returns `primary` itself when the config names no
tracker, else a FanoutSink: every call goes to the primary sink first (its errors are the run's
errors, as before), then to each tracker. A tracker whose library is missing, that cannot start,
or that raises later is dropped with ONE warning line: training goes on and the store keeps
every row.

What a tracker receives, per run: a name and tags (arm, seed, preset, config hash, and where the
caller knows them sweep, ladder, parent, store run id), the config as flat dotted keys, every
metric at its rollout step, each evaluation as `eval/<dataset>/<avg|pass|cons>_at_<k>` scalars,
and the step's rollouts as a table (W&B Table, MLflow `log_table`, Trackio Table; TensorBoard:
a markdown text summary).

A run that resumes in the same directory continues the same tracker run: the ids are kept in
`<out_dir>/trackers.json`.

Which trackers a run reached is part of its record: every evaluation the primary sink gets
carries `trackers` (TRACKERS_KEY): per tracker its state (reached, missing, failed, dropped),
the tracker's run id and where to find it (a URL, a TensorBoard log directory, a W&B offline
directory), or the one line of why not. The store keeps it in the evaluation's `extra`, where
the sweep summary, `dapo table` and the dashboard's Run page read it (db/tracker_status.py).

`check_trackers(config)` (dapo_core/setup/tracker_backends.py, torch-free) is the check
before anything is written: a backend the tracker's own library refuses (MLflow 3.17's file
store without MLFLOW_ALLOW_FILE_STORE=true, a URI scheme MLflow has no store for) is one line
(ConfigError). A local SQLite MLflow store that several arms open at once is created and
migrated once, under a file lock beside it: MLflow migrates a fresh database on first open,
and two processes doing so at once collide ("duplicate column name: step").

TensorBoard's event files of a sweep's run go to `<sweep dir>/tensorboard/<arm>-s<seed>` (the
sweep dir holds the sweep's run directories), so that `tensorboard --logdir <sweep
dir>/tensorboard` names each run like the table does; a run outside a sweep (`dapo train`)
keeps them in `<out_dir>/tensorboard`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_common.samples import SAMPLE_FIELDS
from dapo_common.util import flatten
from dapo_core.setup.config import LOGGERS, ExperimentConfig
from dapo_core.train.protocols import MetricsSink

log = logging.getLogger(__name__)

IDS_FILE = "trackers.json"
"""Tracker run ids of a run directory, so that a resumed run continues its tracker runs."""
DEFAULT_PROJECT = "dapo-lab"
"""W&B / Trackio project and MLflow experiment unless $WANDB_PROJECT, $TRACKIO_PROJECT or
$MLFLOW_EXPERIMENT_NAME say otherwise."""
SAMPLE_COLUMNS = ("step", *SAMPLE_FIELDS)
"""The columns of a step's sample table: the step, then the sample record's fields."""
TRACKERS_KEY = "trackers"
"""The key of an evaluation's result (the store's `extra`) that says which trackers the run
reached: {name: {"state": ..., "run_id"?, "url"?, "logdir"?, "dir"?, "error"?}}."""
REACHED, MISSING, FAILED, DROPPED = "reached", "missing", "failed", "dropped"
"""A tracker's state in a run: logging there; its library not installed; refused at the start;
dropped after an error while the run went on."""


def install_hint(name: str) -> str:
    """How to get a tracker's library, said when it is missing: the `trackers` extra (MLflow's
    skinny client, W&B, TensorBoard), or Trackio's own (it cannot share .venv's pins)."""
    return f"pip install 'dapo-lab[{'trackio' if name == 'trackio' else 'trackers'}]'"


@dataclass(frozen=True)
class TrackedRun:
    """Who a run is, for a tracker."""

    name: str
    """The tracker run's display name, e.g. `dapo s0 (sweep 3)`."""
    out_dir: Path
    """The run directory: local tracker files go under it."""
    config: Mapping[str, Any]
    """The experiment config as flat dotted keys."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """arm, seed, preset, config_hash, and where known sweep, ladder, parent, run_id, store."""
    mlflow_uri: str = ""
    """run.mlflow_uri (empty: $MLFLOW_TRACKING_URI, else out_dir/mlruns)."""
    mlflow_artifacts: str = ""
    """Where a new MLflow experiment keeps its artifacts (empty: the tracking store decides)."""


def tracked_run(
    config: Mapping[str, Any], out_dir: str | Path, tags: Mapping[str, Any] | None = None
) -> TrackedRun:
    """A TrackedRun of an experiment config (`cfg.to_dict()`) and what the caller knows of it;
    `tags` override and extend the ones the config gives (None values are left out)."""
    flat = flatten(dict(config))
    run = config.get("run", {})
    known: dict[str, Any] = {
        "arm": config.get("arm"),
        "preset": config.get("preset"),
        "seed": run.get("seed"),
        "config_hash": _config_hash(config),
    }
    known.update(tags or {})
    clean = {k: str(v) for k, v in known.items() if v is not None and v != ""}
    name = f"{clean.get('arm', 'run')} s{clean.get('seed', 0)}"
    if "sweep" in clean:
        name += f" (sweep {clean['sweep']})"
    return TrackedRun(
        name=name,
        out_dir=Path(out_dir),
        config=flat,
        tags=clean,
        mlflow_uri=str(run.get("mlflow_uri") or ""),
    )


def _config_hash(config: Mapping[str, Any]) -> str | None:
    try:
        return ExperimentConfig.from_dict(dict(config)).config_hash()
    except (ValueError, TypeError):
        return None


# --- the fan-out -----------------------------------------------------------------------------
class FanoutSink:
    """The primary sink first, then each tracker; a tracker that raises is dropped with one
    warning line (the primary's errors propagate: the store is the record).

    `opener`, when given, starts more trackers at the first call that reaches them: by then the
    run has claimed its directory and loaded its data and model, so a run refused at the start
    (another run's directory, a bad data file) never opens, or resumes, a tracker run."""

    def __init__(
        self,
        primary: MetricsSink,
        trackers: Mapping[str, MetricsSink] | None = None,
        *,
        opener: Callable[[], Mapping[str, MetricsSink]] | None = None,
        status: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.primary = primary
        self.trackers: dict[str, MetricsSink] = dict(trackers or {})
        self._opener = opener
        self.status: dict[str, dict[str, Any]] = status if status is not None else {}
        """Per tracker name, where the run stands with it (TRACKERS_KEY); `opener` fills it."""
        for name, tracker in self.trackers.items():
            self.status.setdefault(name, {"state": REACHED, **where_of(tracker)})

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.primary.log_metrics(step, metrics)
        self._each("log_metrics", lambda t: t.log_metrics(step, metrics), step)

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self.primary.log_samples(step, samples)
        self._each("log_samples", lambda t: t.log_samples(step, samples), step)

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        # The trackers are opened first, so that the primary's record of this evaluation says
        # which of them the run reached (the first evaluation is the run's first call).
        self._open()
        recorded = {**result, TRACKERS_KEY: self.report()} if self.status else result
        self.primary.log_evaluation(step, recorded)
        self._each("log_evaluation", lambda t: t.log_evaluation(step, result), step)

    def report(self) -> dict[str, dict[str, Any]]:
        """A copy of `status`, for a record."""
        return {name: dict(record) for name, record in self.status.items()}

    def close(self) -> None:
        self._opener = None  # nothing was logged: no tracker run to open only to close it
        try:
            self.primary.close()
        finally:
            self._each("close", lambda t: t.close(), None)
            self.trackers.clear()

    def _open(self) -> None:
        if self._opener is not None:
            opener, self._opener = self._opener, None
            self.trackers.update(opener())

    def _each(self, what: str, call: Callable[[MetricsSink], None], step: int | None) -> None:
        self._open()
        for name, tracker in list(self.trackers.items()):
            try:
                call(tracker)
            except Exception as exc:
                del self.trackers[name]
                _warn(name, f"{what} failed", exc)
                self.status[name] = {
                    **self.status.get(name, {}),
                    "state": DROPPED,
                    "error": f"{what} failed"
                    + ("" if step is None else f" at step {step}")
                    + f" ({_reason(exc)})",
                }
                if what != "close":
                    try:
                        tracker.close()
                    except Exception:  # a broken tracker's close is no news
                        log.debug("closing the dropped %s tracker failed", name, exc_info=True)

    def __enter__(self) -> FanoutSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reason(exc: BaseException) -> str:
    """`Type: first line` of an exception (its first line cut to 300 characters)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(text) > 300:
        text = text[:299] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _warn(name: str, what: str, exc: BaseException) -> None:
    log.warning(
        "tracker %s: %s (%s); dropped, the run goes on and the store keeps every number",
        name,
        what,
        _reason(exc),
    )


def where_of(tracker: MetricsSink) -> dict[str, str]:
    """Where a tracker keeps the run (its `where`: run id, URL, log directory), if it says."""
    found = getattr(tracker, "where", None)
    return {str(k): str(v) for k, v in dict(found).items() if v} if found else {}


def open_trackers(
    names: Sequence[str], run: TrackedRun, status: dict[str, dict[str, Any]] | None = None
) -> dict[str, MetricsSink]:
    """The trackers `names` for `run`, each started now; one that cannot start (its library is
    missing, its server refuses) is left out with one warning line. `status` gets each name's
    state (REACHED with where the tracker keeps the run, MISSING, FAILED with the reason)."""
    opened: dict[str, MetricsSink] = {}
    status = {} if status is None else status
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"unknown tracker {name!r} (use any of {', '.join(LOGGERS)})")
        try:
            opened[name] = TRACKERS[name](run)
        except ImportError as exc:
            missing = getattr(exc, "name", None) or name
            log.warning(
                "tracker %s: its library is not installed (no module %r; %s); the run goes on "
                "with the store only",
                name,
                missing,
                install_hint(name),
            )
            status[name] = {"state": MISSING, "error": f"not installed: {install_hint(name)}"}
        except Exception as exc:
            _warn(name, "could not start", exc)
            status[name] = {"state": FAILED, "error": f"could not start ({_reason(exc)})"}
        else:
            status[name] = {"state": REACHED, **where_of(opened[name])}
    return opened


def with_trackers(
    primary: MetricsSink,
    config: Mapping[str, Any],
    out_dir: str | Path,
    tags: Mapping[str, Any] | None = None,
) -> MetricsSink:
    """`primary` alone when config's run.loggers is empty, else a FanoutSink over the trackers
    it names, started at the first call (see FanoutSink and the module docstring)."""
    names = list(config.get("run", {}).get("loggers") or ())
    if not names:
        return primary
    run = tracked_run(config, out_dir, tags)
    status: dict[str, dict[str, Any]] = {}
    return FanoutSink(primary, opener=lambda: open_trackers(names, run, status), status=status)


def tracker_hints(
    config: Mapping[str, Any], out_dir: str | Path, *, sweep: bool = False
) -> list[str]:
    """Where to look at a run's trackers while it trains, one line each (TensorBoard's log
    directory, MLflow's store), for `dapo train` (`out_dir`: the run directory) and `dapo
    sweep` (`sweep`: `out_dir` is the sweep's folder of run directories)."""
    run = config.get("run", {})
    names = list(run.get("loggers") or ())
    out = Path(out_dir)
    lines = []
    if "tensorboard" in names:
        lines.append(f"TensorBoard: tensorboard --logdir {out / TENSORBOARD_DIR}")
    if "mlflow" in names:
        uri = str(run.get("mlflow_uri") or os.environ.get("MLFLOW_TRACKING_URI") or "")
        if not uri and sweep:
            lines.append(
                f"MLflow: a SQLite store in each run directory under {out} ({MLFLOW_DIR}/"
                "mlflow.db; set run.mlflow_uri or MLFLOW_TRACKING_URI for one store of all)"
            )
        else:
            if not uri:
                uri = f"sqlite:///{(out / MLFLOW_DIR / 'mlflow.db').absolute()}"
            shown = _safe_uri(uri)
            lines.append(
                f"MLflow: mlflow ui --backend-store-uri {shown}"
                if shown.startswith("sqlite:")
                else f"MLflow: {shown}"
            )
    return lines


def open_with_trackers(
    primary: Callable[[], MetricsSink],
    config: Mapping[str, Any],
    out_dir: str | Path,
    tags: Mapping[str, Any] | None = None,
) -> MetricsSink:
    """with_trackers(primary(), ...): a sink factory that pickles (functools.partial of it), for
    rank 0 of N workers, which makes its sink in its own process."""
    return with_trackers(primary(), config, out_dir, tags)


# --- what every tracker shares ---------------------------------------------------------------
def finite(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics as floats, NaN / inf left out (the store keeps them as null; most trackers
    refuse or mis-plot them)."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            x = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x):
            out[str(name)] = x
    return out


def evaluation_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """One evaluation as scalars: eval/<dataset>/avg_at_<k> (and pass, cons)."""
    prefix = f"eval/{result.get('dataset', 'eval')}"
    k = result.get("k")
    return finite(
        {
            f"{prefix}/{score}_at_{k}": result[f"{score}_at_k"]
            for score in ("avg", "pass", "cons")
            if result.get(f"{score}_at_k") is not None
        }
    )


def sample_rows(step: int, samples: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """The step's rollouts as table rows in SAMPLE_COLUMNS' order (text as text, numbers as
    numbers; a missing key is None)."""
    rows = []
    for sample in samples:
        row: list[Any] = [int(step)]
        for column in SAMPLE_COLUMNS[1:]:
            value: Any = sample.get(column)
            if hasattr(value, "item"):  # torch / numpy scalars
                value = value.item()
            row.append(value)
        rows.append(row)
    return rows


def _load_ids(out_dir: Path) -> dict[str, str]:
    try:
        data = json.loads((out_dir / IDS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _save_id(out_dir: Path, tracker: str, run_id: str) -> None:
    ids = _load_ids(out_dir)
    if ids.get(tracker) == run_id:
        return
    ids[tracker] = run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{IDS_FILE}.tmp"
    tmp.write_text(json.dumps(ids, indent=2, sort_keys=True))
    tmp.replace(out_dir / IDS_FILE)


# --- TensorBoard -----------------------------------------------------------------------------
TENSORBOARD_DIR = "tensorboard"
TENSORBOARD_OWNER = ".dapo-run"
"""In a sweep's TensorBoard folder of one run: the run directory it belongs to."""


def tensorboard_dirs(run: TrackedRun) -> tuple[Path, Path]:
    """(the log directory to point `tensorboard --logdir` at, this run's event folder).

    A run of a sweep (its directory `.../sweep-<id>/<arm>-s<seed>-<hash>-run<id>`) writes to
    `.../sweep-<id>/tensorboard/<arm>-s<seed>`: TensorBoard names a run by its folder below the
    log directory, so the sweep's runs read `grpo-s0`, `dapo-s0`, as in the table. The folder
    records its run directory (TENSORBOARD_OWNER): a resumed run continues it; another attempt
    of the same arm and seed, started over in a directory of its own, gets `<arm>-s<seed>-run<id>`
    instead of writing into the first one's curves. Any other run: `<out_dir>/tensorboard`."""
    sweep = run.tags.get("sweep")
    if not sweep or run.out_dir.parent.name != f"sweep-{sweep}":
        own = run.out_dir / TENSORBOARD_DIR
        return own, own
    root = run.out_dir.parent / TENSORBOARD_DIR
    base = f"{run.tags.get('arm', 'run')}-s{run.tags.get('seed', 0)}"
    mine = str(run.out_dir.resolve())
    names = [base, *([f"{base}-run{run.tags['run_id']}"] if "run_id" in run.tags else [])]
    for name in [*names, f"{base}-{run.out_dir.name}"]:
        folder = root / name
        owner = folder / TENSORBOARD_OWNER
        try:
            taken = owner.read_text(encoding="utf-8").strip() != mine
        except OSError:
            taken = folder.exists() and any(folder.iterdir())
        if not taken:
            folder.mkdir(parents=True, exist_ok=True)
            owner.write_text(mine + "\n", encoding="utf-8")
            return root, folder
    own = run.out_dir / TENSORBOARD_DIR  # unreachable: the last name is the run directory's
    return own, own


class TensorBoardSink:
    """Event files for TensorBoard (torch's SummaryWriter; needs the `tensorboard` package),
    where tensorboard_dirs says. Rollouts are a markdown table in a text summary per step."""

    def __init__(self, run: TrackedRun) -> None:
        import tensorboard  # noqa: F401  (torch's writer needs it; say so by its name)
        from torch.utils.tensorboard import SummaryWriter

        root, self.log_dir = tensorboard_dirs(run)
        self.where = {"logdir": str(root), "run": self.log_dir.name if root != self.log_dir else ""}
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        tags = "\n".join(f"| {k} | {v} |" for k, v in sorted(run.tags.items()))
        self.writer.add_text("run/tags", f"| tag | value |\n|---|---|\n{tags}", 0)
        config = "\n".join(f"| {k} | {_cell(v)} |" for k, v in sorted(run.config.items()))
        self.writer.add_text("run/config", f"| key | value |\n|---|---|\n{config}", 0)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in finite(metrics).items():
            self.writer.add_scalar(name, value, int(step))
        self.writer.flush()

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        header = "| " + " | ".join(SAMPLE_COLUMNS) + " |\n|" + "---|" * len(SAMPLE_COLUMNS)
        body = "\n".join(
            "| " + " | ".join(_cell(v) for v in row) + " |" for row in sample_rows(step, samples)
        )
        self.writer.add_text("samples", f"{header}\n{body}", int(step))

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        for name, value in evaluation_metrics(result).items():
            self.writer.add_scalar(name, value, int(step))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _cell(value: Any) -> str:
    """A markdown table cell: one line, pipes escaped, long text cut."""
    text = "" if value is None else str(value)
    text = text.replace("|", "\\|").replace("\n", " ⏎ ")
    return text if len(text) <= 300 else text[:297] + "..."


# --- MLflow ----------------------------------------------------------------------------------
MLFLOW_DIR = "mlruns"
MLFLOW_PARAM_CHARS = 6000  # MLflow refuses longer param values


def mlflow_uri(run: TrackedRun) -> tuple[str, str | None]:
    """The tracking URI (run.mlflow_uri, else $MLFLOW_TRACKING_URI, else a local SQLite store in
    <out_dir>/mlruns) and, for that local store, where its artifacts go (<out_dir>/mlruns/
    artifacts; a server or a URI of the user's own decides for itself: None)."""
    if run.mlflow_uri:
        return run.mlflow_uri, run.mlflow_artifacts or None
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], None
    return local_mlflow(run.out_dir / MLFLOW_DIR)


def local_mlflow(directory: Path) -> tuple[str, str]:
    """A local MLflow store in `directory`: its tracking URI and its artifacts' location. MLflow
    3 refuses its old file store (plain files in `./mlruns`) unless told otherwise; SQLite is its
    recommended local backend (`mlflow ui --backend-store-uri sqlite:///.../mlflow.db`)."""
    local = directory.resolve()
    local.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{local / 'mlflow.db'}", (local / "artifacts").as_uri()


class MlflowSink:
    """One MLflow run per run directory, through MlflowClient (no fluent global state: Ray's
    pooled actors and tests open several runs in one process). Params are the flat config, tags
    the run's tags, rollouts a `samples/step_<n>.json` table per step (`log_table`)."""

    def __init__(self, run: TrackedRun) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri, artifacts = mlflow_uri(run)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        with sqlite_lock(uri):  # the store's creation and migration, and the experiment's
            self.client = MlflowClient(tracking_uri=uri)
            experiment_id = _experiment_id(self.client, experiment, artifacts)
        previous = _load_ids(run.out_dir).get("mlflow")
        self.run_id = ""
        if previous:
            try:
                self.client.get_run(previous)
                self.run_id = previous
                self.client.update_run(previous, status="RUNNING")
            except Exception:  # another tracking store, or the run was deleted: start anew
                self.run_id = ""
        if not self.run_id:
            # The run's tags once, by their own names (arm, seed, ...), as `dapo export` does.
            created = self.client.create_run(
                experiment_id, run_name=run.name, tags=dict(sorted(run.tags.items()))
            )
            self.run_id = created.info.run_id
            params = [Param(k, _param(v)) for k, v in sorted(run.config.items())]
            for i in range(0, len(params), 100):  # log_batch takes at most 100 params a call
                self.client.log_batch(self.run_id, params=params[i : i + 100])
            _save_id(run.out_dir, "mlflow", self.run_id)
        self.where = {
            "run_id": self.run_id,
            "uri": _safe_uri(uri),
            "url": mlflow_run_url(uri, experiment_id, self.run_id) or "",
        }

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._log(step, finite(metrics))

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        rows = sample_rows(step, samples)
        table = {c: [row[i] for row in rows] for i, c in enumerate(SAMPLE_COLUMNS)}
        self.client.log_table(
            self.run_id, data=table, artifact_file=f"samples/step_{step:06d}.json"
        )

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        self._log(step, evaluation_metrics(result))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)

    def _log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, int(step)) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # log_batch's cap
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])


def sqlite_lock(uri: str) -> Any:
    """A file lock beside a SQLite tracking store (`<db>.lock`), held while MLflow creates and
    migrates it: two arms opening a fresh store at once would both migrate it ("duplicate
    column name: step"); any other URI: no lock (a server or a database server serialises)."""
    import contextlib

    prefix = "sqlite:///"
    if not uri.startswith(prefix) or uri == f"{prefix}:memory:":
        return contextlib.nullcontext()
    from filelock import FileLock

    db = Path(uri[len(prefix) :].split("?", 1)[0])
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db.with_name(db.name + ".lock")))


def _experiment_id(client: Any, name: str, artifacts: str | None) -> str:
    """The experiment's id, created when missing; another process creating it first (a server
    store has no lock of ours) is read back instead of failing."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name, artifact_location=artifacts))
    except MlflowException:
        again = client.get_experiment_by_name(name)
        if again is None:
            raise
        return str(again.experiment_id)


def mlflow_run_url(uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page in an MLflow server's UI (http/https tracking URIs); None for a store
    read by `mlflow ui` (its address is whatever that command serves)."""
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _safe_uri(uri: str) -> str:
    """A tracking URI without a password (postgresql://user:secret@host/db)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _param(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, list | tuple | dict) else str(value)
    return text[:MLFLOW_PARAM_CHARS]


# --- Weights & Biases ------------------------------------------------------------------------
class WandbSink:
    """A W&B run with its files under <out_dir>/wandb; honours $WANDB_MODE (offline: no server,
    `wandb sync` uploads later), $WANDB_PROJECT and $WANDB_ENTITY. The run's tags are W&B tags
    (`arm:dapo`, `seed:0`, ...) and config keys (`dapo/arm`, ...); rollouts a wandb.Table."""

    def __init__(self, run: TrackedRun) -> None:
        import wandb

        self._wandb = wandb
        run.out_dir.mkdir(parents=True, exist_ok=True)
        run_id = _load_ids(run.out_dir).get("wandb") or uuid.uuid4().hex[:12]
        config = {**run.config, **{f"dapo/{k}": v for k, v in run.tags.items()}}
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            name=run.name,
            id=run_id,
            resume="allow",
            dir=str(run.out_dir),
            config=config,
            tags=[f"{k}:{v}"[:64] for k, v in sorted(run.tags.items())],
            group=f"sweep {run.tags['sweep']}" if "sweep" in run.tags else None,
            job_type=run.tags.get("arm"),
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off"),
        )
        _save_id(run.out_dir, "wandb", run_id)
        offline = bool(getattr(self.run, "offline", False))
        self.where = {
            "run_id": run_id,
            "url": "" if offline else str(getattr(self.run, "url", "") or ""),
            # An offline run's folder: `wandb sync <dir>` uploads it.
            "dir": str(self.run.settings.sync_dir) if offline else "",
        }

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(finite(metrics), step=int(step))

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        table = self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=sample_rows(step, samples))
        self.run.log({"samples": table}, step=int(step))

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        self.run.log(evaluation_metrics(result), step=int(step))

    def close(self) -> None:
        self.run.finish()


# --- Trackio ---------------------------------------------------------------------------------
class TrackioSink:
    """A Trackio run in its local store ($TRACKIO_DIR, default ~/.cache/huggingface/trackio;
    project $TRACKIO_PROJECT or dapo-lab), grouped by sweep; rollouts a trackio.Table."""

    def __init__(self, run: TrackedRun) -> None:
        import trackio

        self._trackio = trackio
        # Trackio resumes a run by its name: the name, with the config hash, is the run's id.
        default = f"{run.name} {run.tags.get('config_hash', '')}".strip()
        name = _load_ids(run.out_dir).get("trackio") or default
        config = {**run.config, **{f"dapo/{k}": v for k, v in run.tags.items()}}
        self.run = trackio.init(
            project=os.environ.get("TRACKIO_PROJECT") or DEFAULT_PROJECT,
            name=name,
            group=f"sweep {run.tags['sweep']}" if "sweep" in run.tags else None,
            config=config,
            resume="allow",
            auto_log_gpu=False,  # no sampling threads in a training process
            auto_log_cpu=False,
        )
        _save_id(run.out_dir, "trackio", name)
        self.where = {
            "run_id": name,
            "project": os.environ.get("TRACKIO_PROJECT") or DEFAULT_PROJECT,
        }

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(finite(metrics), step=int(step))

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        table = self._trackio.Table(columns=list(SAMPLE_COLUMNS), data=sample_rows(step, samples))
        self.run.log({"samples": table}, step=int(step))

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        self.run.log(evaluation_metrics(result), step=int(step))

    def close(self) -> None:
        self.run.finish()


TRACKERS: dict[str, Callable[[TrackedRun], MetricsSink]] = {
    "mlflow": MlflowSink,
    "wandb": WandbSink,
    "tensorboard": TensorBoardSink,
    "trackio": TrackioSink,
}
"""By run.loggers name (config.LOGGERS); tests add failing ones."""
