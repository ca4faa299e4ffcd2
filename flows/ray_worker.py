"""Ray: join or start a cluster, and the actor that trains (or evaluates) one arm.

`connect()` joins `ray_address` / $RAY_ADDRESS when given, else starts a local instance with
this machine's CPUs. `ArmTrainer` is an actor that asks for the arm's resources, sets torch's
threads to the CPUs Ray granted, opens the store's sink for its run and calls
`dapo_core.runner.train`, which resumes from the run directory's latest checkpoint. The actor
is threaded (two calls at once) so that the flow can ask for its progress while it trains.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

if "ray" not in sys.modules:
    # Token auth is Ray's default; declaring it silences the warning every joining driver
    # prints. Ray reads the variable once at import: set after that, the cluster it starts
    # would ask for a token its own driver does not send.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
import ray

from flows import plan
from flows.params import Resources

log = logging.getLogger(__name__)

# Environment the trainer reads: Ray workers get the driver's values (a local instance started
# by another process, e.g. `dapo serve`, would otherwise give them its own).
FORWARDED_ENV = (
    "DAPO_CACHE_DIR",
    "DAPO_DATA_DIR",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)
LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024  # configs and small dicts only travel through it
PROBE_TIMEOUT_S = 3.0
PROGRESS_POLL_S = 1.0


class ActorLost(RuntimeError):
    """The actor training an arm died (killed, node lost): the arm task is retried."""


class Interrupted(RuntimeError):
    """This process is shutting down (Ctrl-C, a cancelled sweep): the actor was stopped."""


# Set when this process stops its work (a Ctrl-C in `dapo sweep`): every wait below kills its
# actor and raises Interrupted instead of waiting for training to end.
STOP = threading.Event()


class TrainingFailed(RuntimeError):
    """train() raised inside the actor; `remote_traceback` keeps the actor's traceback."""

    def __init__(self, message: str, remote_traceback: str) -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


# --- the cluster ---------------------------------------------------------------------------
def connect(address: str | None = None, *, num_cpus: int | None = None) -> dict[str, float]:
    """Join `address` (or $RAY_ADDRESS), else start a local Ray; returns the cluster's totals.

    An address that does not answer fails in seconds with ConnectionError (ray.init itself
    would retry for a minute).
    """
    if ray.is_initialized():
        return dict(ray.cluster_resources())
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and address not in ("auto", "local"):
        probe(address)
    check_working_dir()
    kwargs: dict[str, Any] = {
        "logging_level": logging.WARNING,
        "runtime_env": {"env_vars": forwarded_env()},
    }
    # ray.init replaces the SIGTERM handler with one that exits; Prefect's handler (a
    # cancelled flow run gets SIGTERM) must stay, or a cancellation is recorded as a crash.
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        if address and address != "local":
            ray.init(address=address, **kwargs)
        else:
            ray.init(
                num_cpus=num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                **kwargs,
            )
    except ConnectionError as exc:
        raise ConnectionError(
            f"cannot join the Ray cluster at {address}: {plan.first_line(exc)}"
        ) from None
    finally:
        if main and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    return dict(ray.cluster_resources())


def probe(address: str) -> None:
    """A TCP connect to a Ray address (host:port or ray://host:port); one line if it fails."""
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    host, port = parsed.hostname, parsed.port
    if not host or not port:
        raise ValueError(f"Ray address {address!r} is not host:port (or ray://host:port)")
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return
    except OSError as exc:
        raise ConnectionError(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} "
            "(start one with `ray start --head`, or leave ray_address empty for a local one)"
        ) from None


def probe_if_remote(address: str | None) -> None:
    """probe() the address a connect() would join, when it names one."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and address not in ("auto", "local"):
        probe(address)


def check_working_dir() -> None:
    """Ray puts the driver's working directory on its workers' import path; run from the temp
    directory, its `ray/` session folder shadows the ray package. Move to a safe directory."""
    cwd = Path.cwd()
    if cwd == Path(tempfile.gettempdir()) or (cwd / "ray").is_dir():
        safe = plan.runs_dir()
        safe.mkdir(parents=True, exist_ok=True)
        log.warning("working directory %s would shadow the ray package; using %s", cwd, safe)
        os.chdir(safe)


def forwarded_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: env[k] for k in FORWARDED_ENV if env.get(k)}


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


def actor_alive(run_id: int) -> bool:
    """Whether a live actor is training store run `run_id` on this cluster."""
    try:
        ray.get_actor(plan.actor_name(run_id), namespace=plan.ACTOR_NAMESPACE)
    except ValueError:
        return False
    return True


# --- the actor -----------------------------------------------------------------------------
@ray.remote(max_concurrency=2)
class ArmTrainer:
    """Trains one store run in its own process with the resources Ray granted it."""

    def __init__(self) -> None:
        self._progress: dict[str, Any] | None = None
        self._threads = _set_threads()

    def train(
        self, config: dict[str, Any], store_url: str, run_id: int, out_dir: str
    ) -> dict[str, Any]:
        from dapo_core.config import ExperimentConfig
        from dapo_core.runner import train
        from db.store import Store

        cfg = ExperimentConfig.from_dict(config)
        resumed_from = plan.checkpoint_step(out_dir)
        sink = Store(store_url).sink(run_id)
        try:
            result = train(
                cfg, sink=sink, out_dir=Path(out_dir), resume=True, progress=self._on_progress
            )
        finally:
            sink.close()
        return {
            "steps": result.steps,
            "grad_updates": result.grad_updates,
            "tokens": result.tokens,
            "wall_s": result.wall_s,
            "final_eval": result.final_eval,
            "checkpoint_dir": result.checkpoint_dir,
            "resumed_from": resumed_from,
            "host": socket.gethostname(),
            "threads": self._threads,
        }

    def evaluate(
        self, config: dict[str, Any], checkpoint: str, store_url: str, run_id: int
    ) -> dict[str, Any]:
        """Evaluate a checkpoint with `config`'s data.eval / eval_k and log it to the store run."""
        from dapo_core.checkpoint import checkpoint_step, resolve_checkpoint
        from dapo_core.config import ExperimentConfig
        from dapo_core.runner import evaluate_policy, load_checkpoint_policy, setup_torch
        from db.store import Store

        cfg = ExperimentConfig.from_dict(config)
        ckpt = resolve_checkpoint(checkpoint)
        device = setup_torch(cfg)
        model, tokenizer = load_checkpoint_policy(ckpt, cfg, device)
        step = checkpoint_step(ckpt)
        t0 = time.perf_counter()
        result = evaluate_policy(cfg, model, tokenizer, step=step)
        sink = Store(store_url).sink(run_id)
        try:
            sink.log_evaluation(step, result)
        finally:
            sink.close()
        return {**result, "step": step, "checkpoint": str(ckpt), "wall_s": time.perf_counter() - t0}

    def progress(self) -> dict[str, Any] | None:
        return self._progress

    def _on_progress(self, update: dict[str, Any]) -> None:
        self._progress = dict(update)


def _set_threads() -> int:
    """torch threads = the CPUs Ray granted this actor (at least 1)."""
    import torch

    granted = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    threads = max(1, int(granted))
    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.WARNING)
    try:  # save/load progress bars are noise in the flow logs
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    return threads


def _actor(run_id: int, resources: Resources) -> Any:
    return ArmTrainer.options(  # type: ignore[attr-defined]
        name=plan.actor_name(run_id),
        namespace=plan.ACTOR_NAMESPACE,
        num_cpus=resources.cpus,
        num_gpus=resources.gpus,
        # A crashed worker process restarts once and Ray replays the call, which resumes from
        # the checkpoint; an actor killed on purpose (ray.kill) does not restart: the flow's
        # task retry starts a new one.
        max_restarts=1,
        max_task_retries=1,
    ).remote()


def run_training(
    *,
    run_id: int,
    config: dict[str, Any],
    store_url: str,
    out_dir: str,
    resources: Resources,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Train store run `run_id` in a new actor and wait; progress updates go to `on_progress`.

    Raises ActorLost when the actor dies, TrainingFailed when train() raised.
    """
    actor = _actor(run_id, resources)
    try:
        return _wait(actor, actor.train.remote(config, store_url, run_id, out_dir), on_progress)
    finally:
        ray.kill(actor)  # frees its CPUs/GPUs now rather than when the handle is collected


def run_evaluation(
    *, run_id: int, config: dict[str, Any], checkpoint: str, store_url: str, resources: Resources
) -> dict[str, Any]:
    actor = ArmTrainer.options(num_cpus=resources.cpus, num_gpus=resources.gpus).remote()  # type: ignore[attr-defined]
    try:
        return _wait(actor, actor.evaluate.remote(config, checkpoint, store_url, run_id), None)
    finally:
        ray.kill(actor)


def _wait(
    actor: Any, ref: Any, on_progress: Callable[[dict[str, Any]], None] | None
) -> dict[str, Any]:
    last_step = None
    while True:
        if STOP.is_set():
            ray.kill(actor)
            raise Interrupted("stopped: this process is shutting down")
        done, _ = ray.wait([ref], timeout=PROGRESS_POLL_S)
        if on_progress is not None:
            update = _poll(actor)
            if update is not None and update.get("step") != last_step:
                last_step = update.get("step")
                on_progress(update)
        if done:
            break
    try:
        return dict(ray.get(ref))
    except ray.exceptions.RayActorError as exc:
        raise ActorLost(f"the Ray actor died: {plan.first_line(exc)}") from None
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        if isinstance(cause, ValueError | FileNotFoundError):
            # A user mistake (bad data file, bad model path): keep its class and its one line.
            try:
                mistake = type(cause)(str(cause))
            except TypeError:
                mistake = ValueError(str(cause))
            mistake.remote_traceback = str(exc)  # type: ignore[attr-defined]
            raise mistake from None
        raise TrainingFailed(plan.first_line(cause), str(exc)) from None


def _poll(actor: Any) -> dict[str, Any] | None:
    try:
        return ray.get(actor.progress.remote(), timeout=PROGRESS_POLL_S)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None
