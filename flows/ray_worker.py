"""Ray: join or start a cluster, and the actors that train (or evaluate) one arm.

`connect()` joins `ray_address` / $RAY_ADDRESS when given, else starts a local instance with
this machine's CPUs, listening on 127.0.0.1 only. `ArmTrainer` is an actor that asks for the
arm's resources, sets torch's threads to the CPUs Ray granted and trains. The actor is threaded
(two calls at once) so that the flow can ask for its progress while it trains.

One worker (`run_training` with resources.workers == 1): one actor calls
`dapo_core.train.runner.train` with the store's sink; it claims the run directory for its owner
(store, sweep, arm, seed, config) and resumes from its latest checkpoint. These actors are kept
in a pool for the life of the driver process: an arm that finishes hands its actor (a process
that has already imported torch and transformers, some 4 s of start-up) to the next arm with
the same resources, and `prewarm` starts a sweep's actors while its other set-up runs. An actor
whose arm failed or died is never reused.

N workers: N actors in ONE placement group (a bundle of {CPU: cpus, GPU: gpus} per worker,
PACK or SPREAD), each calling `dapo_core.train.distributed.train_worker` with its rank. Actor 0
names the rendezvous (its node's address and a port free there); rank 0 opens the store's sink
and reports progress. The actors do not restart (a restarted rank cannot rejoin its process
group): when one dies or fails, the others are killed at once (they would otherwise wait in a
collective), the whole try ends with ActorLost (the flow's task retries it, resuming from the
last checkpoint) or with the failing rank's own one line, and the placement group is removed
whatever happens. A group Ray cannot place within $DAPO_PLACEMENT_WAIT_S (default 30 min; a
node lost, so that N GPUs are no longer there) ends the try with PlacementTimeout, one line
naming the bundles and what the cluster has free.
"""

from __future__ import annotations

import contextlib
import contextvars
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
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlparse

if "ray" not in sys.modules:
    # Token auth is Ray's default; declaring it silences the warning every joining driver
    # prints. Ray reads the variable once at import: set after that, the cluster it starts
    # would ask for a token its own driver does not send.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    # A local instance listens on 127.0.0.1 only. Ray 2.60 has no supported switch for that:
    # ray.init(_node_ip_address="127.0.0.1") and `ray start --node-ip-address 127.0.0.1` both
    # turn the loopback address back into the machine's own (services.resolve_ip_for_localhost).
    # With this variable off, Ray takes this machine for a single-node setup and binds every
    # server (GCS, raylet, workers, agents) to the loopback address. Read once at import and
    # inherited by the processes Ray starts; a driver with it still joins a cluster at the
    # machine's own address ($RAY_ADDRESS), which tests/flows/test_flows_ray.py checks.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # No metrics exporter: nothing here scrapes it, and it slows a local start by about 1 s.
    os.environ.setdefault("RAY_enable_metrics_collection", "0")
import ray

from dapo_common.util import first_line, free_port
from flows import cluster, plan
from flows.params import Resources
from flows.rollout_actor import RolloutPlacement, host_for, placement_of

if TYPE_CHECKING:
    from dapo_core.engines.base import EngineHost

log = logging.getLogger(__name__)

# Environment the trainer reads: Ray workers get the driver's values (a local instance started
# by another process, e.g. `dapo serve`, would otherwise give them its own).
FORWARDED_ENV = (
    "DAPO_CACHE_DIR",
    "DAPO_DATA_DIR",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "DAPO_STORE_OUTAGE_S",
    "DAPO_PLACEMENT_WAIT_S",  # a rollout engine's actor is placed from the training actor
    # run.loggers' trackers (dapo_core/train/trackers.py). Not their API keys: runtime_env
    # values show in Ray's dashboard; log the cluster's nodes in (`wandb login`) instead.
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME",
    "WANDB_MODE",
    "WANDB_PROJECT",
    "WANDB_ENTITY",
    "TRACKIO_DIR",
    "TRACKIO_PROJECT",
)
LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024  # configs and small dicts only travel through it
PROBE_TIMEOUT_S = 3.0
PROGRESS_POLL_S = 1.0
# After a rank fails only because a peer vanished (its collective saw the connection close),
# how long to wait for Ray to report which actor died before calling the try lost anyway.
PEER_LOSS_GRACE_S = 30.0
# A call cut by a broken connection (ActorUnavailableError) comes back before Ray has decided
# whether the actor or its whole node is gone: a node is declared dead only after its missed
# health checks (about 15-30 s with Ray's defaults). How long to wait for that word.
LOST_VERDICT_WAIT_S = 30.0
VERDICT_POLL_S = 0.5
# How long an arm of N workers waits for Ray to place its group (other arms may hold the
# resources for a while) before it gives up: after a node loss, a retry that can never place N
# GPUs would otherwise wait forever. Read when an arm starts; 0 waits without limit.
PLACEMENT_WAIT_ENV = "DAPO_PLACEMENT_WAIT_S"
DEFAULT_PLACEMENT_WAIT_S = 1800.0


class ActorLost(RuntimeError):
    """The actor training an arm died (killed, node lost): the arm task is retried."""


class Interrupted(RuntimeError):
    """This process is shutting down (Ctrl-C, a cancelled sweep): the actor was stopped."""


# Set when this process stops its work (a Ctrl-C in `dapo sweep`): every wait below kills its
# actor and raises Interrupted instead of waiting for training to end.
STOP = threading.Event()


class LeaseLost(RuntimeError):
    """Another process took over the run this driver trained (its lease went stale: no
    heartbeat for db.models.RUN_LEASE_S): the actors were stopped (never retried)."""


# The `cancel` event of the run_training call in progress in this context (one arm's thread):
# set, its waits stop the arm's actors and raise LeaseLost; the other arms go on.
_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "dapo_cancel", default=None
)


def _stopping() -> bool:
    cancel = _CANCEL.get()
    return STOP.is_set() or (cancel is not None and cancel.is_set())


class PlacementTimeout(RuntimeError):
    """Ray could not place an arm's workers within the placement wait (not retried: what the
    cluster lacks will not come back by itself)."""


def placement_wait_s(environ: Mapping[str, str] | None = None) -> float:
    """$DAPO_PLACEMENT_WAIT_S, or the default; 0 (or less) waits without limit."""
    raw = (os.environ if environ is None else environ).get(PLACEMENT_WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_PLACEMENT_WAIT_S
    try:
        return float(raw)
    except ValueError:
        raise ValueError(
            f"{PLACEMENT_WAIT_ENV}={raw!r} is not a number of seconds (0 waits without limit)"
        ) from None


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
            _start_local(num_cpus or os.cpu_count() or 1, kwargs)
    except ConnectionError as exc:
        raise ConnectionError(
            f"cannot join the Ray cluster at {address}: {first_line(exc, with_type=True)}"
        ) from None
    finally:
        if main and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    return dict(ray.cluster_resources())


# Ray waits a fixed 30 s for a new node's raylet to register; on a loaded machine (seen at a
# load of 18 on 2 cores) that is not enough, and what it raises is a bare Exception.
LOCAL_START_TRIES = 2


def _start_local(num_cpus: int, kwargs: dict[str, Any]) -> None:
    """A local Ray instance of our own, tried again once if its node was slow to register."""
    for attempt in range(1, LOCAL_START_TRIES + 1):
        try:
            ray.init(
                # "local": a new instance of our own. Without it, ray.init joins the cluster
                # /tmp/ray/ray_current_cluster names (the last `ray start` on this machine,
                # anyone's) and then refuses num_cpus.
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                **kwargs,
            )
            return
        except Exception as exc:  # Ray raises a plain Exception for this one
            if "timed out during startup" not in str(exc):
                raise
            ray.shutdown()  # the half-started processes of this try
            if attempt == LOCAL_START_TRIES:
                raise TimeoutError(
                    f"the local Ray instance did not start ({LOCAL_START_TRIES} tries): its node "
                    "did not register within Ray's 30 s, which happens on an overloaded machine; "
                    "try again when the load is lower, or start Ray yourself (`ray start --head`) "
                    "and pass --ray-address"
                ) from None
            log.warning("the local Ray instance was slow to start (machine loaded): trying again")


def place_arm(
    address: str | None, resources: Resources, configs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Join (or start) the cluster and check that an arm with `resources` fits on it: more
    than the whole cluster has (plan.check_fits), a worker no live node can hold, or a model
    that does not fit its GPUs is one line before anything is written. Returns the live
    nodes (for the warnings of cluster.runs_dir_warning / unplanned_warning)."""
    plan.check_fits(connect(address), resources)
    return cluster.check_placement(resources, configs)


def resources_text(resources: Resources) -> str:
    """`1 CPU`, `2 workers × (1 CPU, 1 GPU), SPREAD`, `1 CPU; rollout engine: 1 CPU`."""

    def devices(cpus: float, gpus: float) -> str:
        return f"{cpus:g} CPU" + (f", {gpus:g} GPU" if gpus else "")

    each = devices(resources.cpus, resources.gpus)
    text = each
    if resources.workers > 1:
        text = f"{resources.workers} workers × ({each}), {resources.placement}"
    if resources.rollout_actor:
        where = f" on {resources.rollout_resource} nodes" if resources.rollout_resource else ""
        per = " each" if resources.workers > 1 else ""
        engine = devices(resources.rollout_cpus, resources.rollout_gpus)
        text += f"; rollout engine{per}: an actor of {engine}{where}"
    return text


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
        _POOL.clear()
        ray.shutdown()


def training_actor(run_id: int, probe_timeout_s: float = PROBE_TIMEOUT_S) -> Any | None:
    """The actor training store run `run_id`: rank 0 of a multi-worker group (named after the
    run), or a pooled single-worker actor of any driver (pooled actors are named `dapo-slot-*`
    and say which run they train); None when no live actor trains it, or when none answered
    within `probe_timeout_s` (a training actor on a loaded machine can take longer than the
    default's few seconds)."""
    with contextlib.suppress(ValueError):
        return ray.get_actor(plan.actor_name(run_id), namespace=plan.ACTOR_NAMESPACE)
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name, namespace = str(entry.get("name")), entry.get("namespace")
        if namespace != plan.ACTOR_NAMESPACE or not name.startswith(SLOT_PREFIX):
            continue
        with contextlib.suppress(Exception):
            actor = ray.get_actor(name, namespace=plan.ACTOR_NAMESPACE)
            if ray.get(actor.current_run.remote(), timeout=probe_timeout_s) == run_id:
                return actor
    return None


# --- the actor -----------------------------------------------------------------------------
@ray.remote(max_concurrency=2)
class ArmTrainer:
    """Trains one store run (or one rank of it) in its own process with the resources Ray
    granted it."""

    def __init__(self) -> None:
        self._progress: dict[str, Any] | None = None
        self._run_id: int | None = None
        self._sink: Any = None
        self._threads = _set_threads()
        # The first arm would pay for these imports; a pooled actor pays once, at start-up,
        # while the driver is busy elsewhere.
        import dapo_core.train.runner  # noqa: F401
        import db.store  # noqa: F401

    def current_run(self) -> int | None:
        """The store run this actor is training now (None: idle)."""
        return self._run_id

    def where(self) -> dict[str, Any]:
        """This actor's node id, address and host name."""
        return cluster.here()

    def rendezvous(self) -> str:
        """torch.distributed's init method for a job whose rank 0 is this actor: this node's
        address and a port free on it now (the TCP store binds it a moment later)."""
        ip = ray.util.get_node_ip_address()
        port = free_port(ip)
        return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"

    def train(
        self,
        config: dict[str, Any],
        store_url: str,
        run_id: int,
        out_dir: str,
        owner: dict[str, Any],
        rollout: RolloutPlacement | None = None,
    ) -> dict[str, Any]:
        """`rollout`: the engine on an actor of its own (flows/rollout_actor.py)."""
        self._progress, self._run_id = None, run_id
        try:
            result = train_one_worker(
                TrainJob(config, store_url, run_id, out_dir, owner),
                self._set_progress,
                engine_host=host_for(rollout, config, wait_s=placement_wait_s()),
            )
        finally:
            self._run_id = None
        # Where it ran at the end: a restarted actor (max_restarts) may be on another node.
        return {**result, "host": cluster.describe([cluster.here()])}

    def train_rank(
        self,
        rank: int,
        world_size: int,
        init_method: str,
        config: dict[str, Any],
        store_url: str,
        run_id: int,
        out_dir: str,
        owner: dict[str, Any],
        gpu: bool,
        rollout: RolloutPlacement | None = None,
        group: Any = None,
    ) -> dict[str, Any]:
        """Rank `rank` of `world_size` (see the module docstring); every rank returns the same
        result. With `rollout`, the rank's engine goes on an actor of its own, in bundle
        world_size + rank of the arm's placement group `group`."""
        from dapo_core.train.distributed import train_worker

        # Rank 0 speaks for the job; the other ranks' warnings would repeat its own.
        logging.getLogger().setLevel(logging.WARNING if rank == 0 else logging.ERROR)
        result = train_worker(
            rank,
            world_size,
            init_method,
            config,
            out_dir,
            (lambda: self._open_sink(store_url, run_id, out_dir, config, owner))
            if rank == 0
            else None,
            owner,
            resume=True,
            progress=self._on_progress if rank == 0 else None,
            # Ray shows a GPU actor only the GPU(s) it granted: its device 0.
            local_rank=0 if gpu else None,
            num_threads=self._threads,
            engine_host=host_for(
                rollout,
                config,
                wait_s=placement_wait_s(),
                group=group,
                bundle_index=world_size + rank,
            ),
        )
        return self._result(result)

    def evaluate(
        self, config: dict[str, Any], checkpoint: str, store_url: str, run_id: int
    ) -> dict[str, Any]:
        """Evaluate a checkpoint with `config`'s data.eval / eval_k and log it to the store run."""
        from dapo_core.setup.config import ExperimentConfig
        from dapo_core.train.checkpoint import checkpoint_step, resolve_checkpoint
        from dapo_core.train.runner import evaluate_checkpoint

        cfg = ExperimentConfig.from_dict(config)
        ckpt = resolve_checkpoint(checkpoint)
        step = checkpoint_step(ckpt)
        t0 = time.perf_counter()
        # The run's own engine and, on a GPU, the evaluation's memory plan first; the engine is
        # closed and the device memory released however it ends (a pooled actor trains next).
        result = evaluate_checkpoint(ckpt, cfg)
        sink = open_sink(store_url, run_id, None)
        try:
            sink.log_evaluation(step, result)
        finally:
            sink.close()
        return {**result, "step": step, "checkpoint": str(ckpt), "wall_s": time.perf_counter() - t0}

    def progress(self) -> dict[str, Any] | None:
        return self._progress

    def _set_progress(self, update: dict[str, Any]) -> None:
        self._progress = update

    def _on_progress(self, update: dict[str, Any]) -> None:
        # With the store's outage waits so far: the driver leaves them out of the wall time
        # even when this actor dies before it can return them.
        self._progress = {**update, "store_wait_s": store_wait_s(self._sink)}

    def _open_sink(self, *args: Any) -> Any:
        """open_sink, kept so that its outage waits can be reported (rank 0 of N: called in
        this process by train_worker, never pickled)."""
        self._sink = open_sink(*args)
        return self._sink

    def _result(self, result: Any) -> dict[str, Any]:
        """The result of train(), and the seconds its sink waited on a store that was down
        (store_wait_s: 0 on ranks without a sink)."""
        waited, self._sink = store_wait_s(self._sink), None
        return {**_result_dict(result), "store_wait_s": waited}


def train_one_worker(
    job: TrainJob,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    *,
    engine_host: EngineHost | None = None,
) -> dict[str, Any]:
    """One worker trains store run `job.run_id` in this process: a pooled Ray actor's
    (ArmTrainer.train) or a Ray job's entrypoint (flows/job_entry.py). The store's sink (with
    the trackers the config names) spills what a store outage holds back into the run
    directory; the run resumes from its latest checkpoint there, claimed for `job.owner`.
    Progress updates and the result carry the seconds the sink waited on a store that was down
    (store_wait_s), which the driver leaves out of the try's wall time. The caller adds where it
    ran ("host")."""
    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.train.runner import train

    cfg = ExperimentConfig.from_dict(job.config)  # a bad config fails before the sink opens
    sink = open_sink(job.store_url, job.run_id, job.out_dir, job.config, job.owner)

    def report(update: dict[str, Any]) -> None:
        if on_progress is not None:
            on_progress({**update, "store_wait_s": store_wait_s(sink)})

    try:
        result = train(
            cfg,
            sink=sink,
            out_dir=Path(job.out_dir),
            resume=True,
            progress=report,
            owner=job.owner,
            engine_host=engine_host,
        )
    finally:
        sink.close()
    return {**_result_dict(result), "store_wait_s": store_wait_s(sink)}


def store_wait_s(sink: Any) -> float:
    """Seconds a run's store sink (db.sink.SqlSink.waited_s, also behind the trackers' fan-out)
    has waited on the store while it was down."""
    primary = getattr(sink, "primary", sink)
    return float(getattr(primary, "waited_s", 0.0) or 0.0)


def open_sink(
    store_url: str,
    run_id: int,
    spill_dir: str | None,
    config: Mapping[str, Any] | None = None,
    owner: Mapping[str, Any] | None = None,
) -> Any:
    """The store's metrics sink of a run (module level: a worker's sink factory is pickled),
    fanned out to the trackers config's run.loggers names, tagged from the store (sweep, arm,
    seed, ladder, parent)."""
    from db.store import Store

    sink = Store(store_url).sink(run_id, spill_dir=spill_dir)
    if config is None or spill_dir is None or not config.get("run", {}).get("loggers"):
        return sink
    from dapo_core.train.trackers import with_trackers
    from flows.export import run_tags

    return with_trackers(sink, config, spill_dir, run_tags(store_url, run_id, owner))


def _result_dict(result: Any) -> dict[str, Any]:
    return {
        "steps": result.steps,
        "grad_updates": result.grad_updates,
        "tokens": result.tokens,
        "wall_s": result.wall_s,
        "final_eval": result.final_eval,
        "checkpoint_dir": result.checkpoint_dir,
    }


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


SLOT_PREFIX = "dapo-slot-"


class _Pool:
    """Idle single-worker actors of this driver process, by the resources they hold."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[float, float], list[Any]] = {}

    def take(self, resources: Resources) -> Any:
        """The actor idle longest (first in, first out): arms that follow one another rotate
        over the warm actors, and so over their nodes, instead of piling onto the one that was
        just given back."""
        with self._lock:
            idle = self._idle.get((resources.cpus, resources.gpus))
            if idle:
                return idle.pop(0)
        return _new_actor(resources)

    def give(self, resources: Resources, actor: Any) -> None:
        with self._lock:
            self._idle.setdefault((resources.cpus, resources.gpus), []).append(actor)

    def prewarm(self, resources: Resources, n: int) -> None:
        """Start up to n idle actors now (their start-up overlaps the caller's set-up)."""
        with self._lock:
            idle = self._idle.setdefault((resources.cpus, resources.gpus), [])
            missing = max(0, n - len(idle))
        for _ in range(missing):
            actor = _new_actor(resources)
            actor.current_run.remote()  # a first call: Ray starts the process now
            self.give(resources, actor)

    def clear(self) -> None:
        with self._lock:
            actors = [a for idle in self._idle.values() for a in idle]
            self._idle.clear()
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)


_POOL = _Pool()


def prewarm(resources: Resources, n: int) -> None:
    """Start n single-worker actors for an arm's resources before the arms need them."""
    if resources.workers == 1 and n > 0:
        _POOL.prewarm(resources, n)


def _new_actor(resources: Resources) -> Any:
    import uuid

    return ArmTrainer.options(  # type: ignore[attr-defined]
        name=f"{SLOT_PREFIX}{uuid.uuid4().hex[:12]}",
        namespace=plan.ACTOR_NAMESPACE,
        num_cpus=resources.cpus,
        num_gpus=resources.gpus,
        # A crashed worker process restarts once and Ray replays the call, which resumes from
        # the checkpoint; an actor killed on purpose (ray.kill) does not restart: the flow's
        # task retry starts a new one.
        max_restarts=1,
        max_task_retries=1,
    ).remote()


Placed = Callable[[list[dict[str, Any]]], None]
"""Called once an arm's actors are placed, with each worker's {rank, node_id, ip, hostname}."""


class TrainJob(NamedTuple):
    """Which store run an arm's actors train, where and for whom: ArmTrainer.train's
    arguments, in its order (train_rank takes them after rank, world size and init method)."""

    config: dict[str, Any]
    store_url: str
    run_id: int
    out_dir: str
    owner: dict[str, Any]


def run_training(
    *,
    run_id: int,
    config: dict[str, Any],
    store_url: str,
    out_dir: str,
    owner: dict[str, Any],
    resources: Resources,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    on_placed: Placed | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Train store run `run_id` on resources.workers actors and wait; progress updates go to
    `on_progress`, where the actors landed to `on_placed`. Setting `cancel` (the run's lease
    was lost) stops the actors and raises LeaseLost.

    `owner` names who may use out_dir (plan.run_owner): a directory owned by another store,
    arm or seed is refused before anything in it is resumed. Raises ActorLost when an actor
    dies, TrainingFailed when training raised (a user mistake keeps its own class).
    """
    token = _CANCEL.set(cancel)
    try:
        return _run_training(
            TrainJob(config, store_url, run_id, out_dir, owner), resources, on_progress, on_placed
        )
    finally:
        _CANCEL.reset(token)


def _run_training(
    job: TrainJob,
    resources: Resources,
    on_progress: Callable[[dict[str, Any]], None] | None,
    on_placed: Placed | None,
) -> dict[str, Any]:
    if resources.workers > 1:
        return run_group(job, resources, on_progress, on_placed)
    actor = _POOL.take(resources)
    reusable = False
    try:
        place = _gather([actor.where.remote()], [actor])[0]
        if on_placed is not None:
            on_placed([{**place, "rank": 0}])
        call = actor.train.remote(*job, placement_of(resources))
        result = _wait(actor, call, on_progress)
        reusable = True
        return result
    finally:
        if reusable:
            _POOL.give(resources, actor)
        else:  # failed, died or stopped: never hand a doubtful process to another arm
            with contextlib.suppress(Exception):
                ray.kill(actor)


def run_group(
    job: TrainJob,
    resources: Resources,
    on_progress: Callable[[dict[str, Any]], None] | None,
    on_placed: Placed | None,
) -> dict[str, Any]:
    """run_training on N > 1 workers: N actors in one placement group (module docstring)."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    n, rollout = resources.workers, placement_of(resources)
    bundle: dict[str, float] = {"CPU": resources.cpus}
    if resources.gpus > 0:
        bundle["GPU"] = resources.gpus
    # Bundles 0..N-1 hold the workers, N..2N-1 their engines' actors (with rollout_actor).
    engines = [rollout.bundle() for _ in range(n)] if rollout is not None else []
    group = placement_group(
        [dict(bundle) for _ in range(n)] + engines,
        strategy=resources.placement,
        name=f"{plan.actor_name(job.run_id)}-workers",
    )
    actors: list[Any] = []
    try:
        # Ray queues a group it cannot place yet (other arms hold the resources): wait, but
        # let a stop interrupt the wait, and give up after the placement wait.
        wait_s = placement_wait_s()
        if not _gather([group.ready()], [], timeout_s=wait_s if wait_s > 0 else None):
            raise PlacementTimeout(_unplaced(n, bundle, resources.placement, wait_s))
        actors = [
            ArmTrainer.options(  # type: ignore[attr-defined]
                # Rank 0 carries the run's actor name: training_actor() finds a training arm.
                name=plan.actor_name(job.run_id) + (f"-rank{rank}" if rank else ""),
                namespace=plan.ACTOR_NAMESPACE,
                num_cpus=resources.cpus,
                num_gpus=resources.gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=rank
                ),
                # A restarted rank could not rejoin its process group: a lost actor ends the
                # try, and the flow's task retry starts all N again from the checkpoint.
                max_restarts=0,
                max_task_retries=0,
            ).remote()
            for rank in range(n)
        ]
        places = [
            {**place, "rank": rank}
            for rank, place in enumerate(_gather([a.where.remote() for a in actors], actors))
        ]
        if on_placed is not None:
            on_placed(places)
        init_method = _gather([actors[0].rendezvous.remote()], actors)[0]
        calls = [
            actor.train_rank.remote(rank, n, init_method, *job, resources.gpus > 0, rollout, group)
            for rank, actor in enumerate(actors)
        ]
        results = _wait_group(actors, calls, places, on_progress)
        return {**results[0], "host": cluster.describe(places)}
    finally:
        for actor in actors:  # the survivors of a failed rank would wait in a collective
            with contextlib.suppress(Exception):
                ray.kill(actor)
        with contextlib.suppress(Exception):
            remove_placement_group(group)


def run_evaluation(
    *, run_id: int, config: dict[str, Any], checkpoint: str, store_url: str, resources: Resources
) -> dict[str, Any]:
    actor = ArmTrainer.options(num_cpus=resources.cpus, num_gpus=resources.gpus).remote()  # type: ignore[attr-defined]
    try:
        return _wait(actor, actor.evaluate.remote(config, checkpoint, store_url, run_id), None)
    finally:
        ray.kill(actor)


def _stop(actors: list[Any]) -> None:
    # Without a Ray of ours there is nothing to kill, and ray.kill would start or join one:
    # ray.init() with no address joins whatever cluster this machine last `ray start`ed.
    for actor in actors if ray.is_initialized() else []:
        with contextlib.suppress(Exception):
            ray.kill(actor)
    if STOP.is_set():
        raise Interrupted("stopped: this process is shutting down")
    raise LeaseLost(
        "stopped: another process took this run over (its lease had no heartbeat for too long)"
    )


def _gather(refs: list[Any], actors: list[Any], *, timeout_s: float | None = None) -> list[Any]:
    """ray.get(refs), a stop allowed while waiting; a dead actor is ActorLost. With timeout_s,
    [] when they are not all done by then."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if _stopping():
            _stop(actors)
        poll = PROGRESS_POLL_S
        if deadline is not None:
            poll = max(0.0, min(poll, deadline - time.monotonic()))
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=poll)
        if len(done) == len(refs):
            break
        if deadline is not None and time.monotonic() >= deadline:
            return []
    try:
        return list(ray.get(refs))
    except ray.exceptions.RayActorError as exc:
        raise ActorLost(
            f"the Ray actor died before training: {first_line(exc, with_type=True)}"
        ) from None


def _unplaced(n: int, bundle: Mapping[str, float], strategy: str, wait_s: float) -> str:
    """One line: the group that Ray could not place, and what the cluster has free now."""

    def show(resources: Mapping[str, float]) -> str:
        return ", ".join(f"{k} {resources.get(k, 0.0):g}" for k in ("CPU", "GPU") if k in bundle)

    try:
        free, total = ray.available_resources(), ray.cluster_resources()
        now = f"the cluster has {show(free)} free of {show(total)}"
    except Exception:  # the report must not hide the timeout behind another error
        now = "the cluster's resources are unknown"
    return (
        f"could not place {n} workers × {{{show(bundle)}}} ({strategy}) within {wait_s:g} s: "
        f"{now} (a node lost, or other arms holding it); {PLACEMENT_WAIT_ENV} sets the wait"
    )


def _wait(
    actor: Any, ref: Any, on_progress: Callable[[dict[str, Any]], None] | None
) -> dict[str, Any]:
    last_step = None
    while True:
        if _stopping():
            _stop([actor])
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
    except ray.exceptions.RayTaskError as exc:
        # First: a task that raised an actor error of its own (its rollout engine's actor was
        # lost) is a RayTaskError and, by its cause's class, a RayActorError too.
        raise _task_error(exc) from None
    except ray.exceptions.RayActorError as exc:
        raise ActorLost(f"the Ray actor died: {first_line(exc, with_type=True)}") from None


def _itself_lost(exc: BaseException) -> bool:
    """The actor (or its node) died, rather than its task raising, e.g. because an actor it
    called (its rollout engine's) died: that error is a RayTaskError as well."""
    return isinstance(exc, ray.exceptions.RayActorError) and not isinstance(
        exc, ray.exceptions.RayTaskError
    )


def _task_error(exc: Any) -> Exception:
    """What a RayTaskError (train() raised in the actor) becomes here."""
    from dapo_common.cli_args import USER_ERRORS

    cause = exc.cause if isinstance(exc.cause, BaseException) else exc
    if isinstance(cause, ray.exceptions.RayActorError):
        # The run's rollout engine actor (flows/rollout_actor.py) or its node was lost: the
        # try ends as a lost actor does, and the flow's retry resumes from the checkpoint.
        return ActorLost(f"the rollout engine's Ray actor died: {first_line(cause)}")
    if isinstance(cause, USER_ERRORS):
        # A user mistake (bad data file, bad model path, a directory of another run or one
        # that cannot be written) or a store that stayed down: keep its class and its line.
        try:
            mistake = type(cause)(str(cause))
        except TypeError:
            mistake = ValueError(str(cause))
        setattr(mistake, "remote_traceback", str(exc))  # noqa: B010 (read by flows/arm.py)
        return mistake
    return TrainingFailed(first_line(cause, with_type=True), str(exc))


def _peer_gone(exc: BaseException) -> bool:
    """A rank's error that only says that another rank went away (its collective broke)."""
    from dapo_core.train.distributed import is_peer_gone

    return is_peer_gone(str(getattr(exc, "cause", None) or exc))


def _wait_group(
    actors: list[Any],
    calls: list[Any],
    places: list[dict[str, Any]],
    on_progress: Callable[[dict[str, Any]], None] | None,
) -> list[dict[str, Any]]:
    """Wait for every rank; on the first failure decide what it was (see _group_failure)."""
    n = len(calls)
    pending = list(calls)
    results: dict[int, dict[str, Any]] = {}
    failed: dict[int, BaseException] = {}
    last_step = None
    peer_loss_since: float | None = None
    while True:
        if _stopping():
            _stop(actors)
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=PROGRESS_POLL_S)
        for ref in done:
            pending.remove(ref)
            rank = calls.index(ref)
            try:
                results[rank] = dict(ray.get(ref))
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                failed[rank] = exc
        if on_progress is not None and 0 not in failed:
            update = _poll(actors[0])
            if update is not None and update.get("step") != last_step:
                last_step = update.get("step")
                on_progress(update)
        if not failed:
            if not pending:
                return [results[r] for r in range(n)]
            continue
        # A failure: every rank but the lost or failing one waits in a collective, so the
        # outcome is decided now; run_group's finally kills what is left.
        lost = [r for r, e in failed.items() if _itself_lost(e)]
        if lost:
            rank = lost[0]
            raise _lost(rank, n, places[rank], failed[rank], actors[rank])
        own = [r for r, e in failed.items() if not _peer_gone(e)]
        if own:
            raise _task_error(failed[own[0]])
        # Only "a peer went away": Ray names the actor that died once it knows (a lost node is
        # declared dead after its missed health checks); past the grace, call it lost anyway.
        now = time.monotonic()
        peer_loss_since = peer_loss_since or now
        if not pending or now - peer_loss_since > PEER_LOSS_GRACE_S:
            rank = min(failed)
            raise ActorLost(
                f"worker {rank} of {n} lost its peers (a worker or its node went away): "
                f"{first_line(failed[rank], with_type=True)}"
            )


def _lost(rank: int, n: int, place: dict[str, Any], exc: BaseException, actor: Any) -> ActorLost:
    """One line naming the lost worker, its node, and whether Ray declared the node dead."""
    why = _loss_cause(str(place.get("node_id")), exc, actor)
    return ActorLost(
        f"worker {rank} of {n} on node {cluster.node_label(place)} was lost ({why}): "
        f"{first_line(exc, with_type=True)}"
    )


def _loss_cause(node_id: str, exc: BaseException, actor: Any) -> str:
    """Ray's word on a lost worker: "its node died" once Ray counts the node dead, else "its
    actor died". An actor that is only unavailable (its connection closed) is asked again until
    Ray says it is dead or its node is; past LOST_VERDICT_WAIT_S the node is taken as alive."""
    deadline = time.monotonic() + LOST_VERDICT_WAIT_S
    while True:
        alive = None
        with contextlib.suppress(Exception):
            alive = cluster.node_alive(node_id)
        if alive is False:
            return "its node died"
        unknown = isinstance(exc, ray.exceptions.ActorUnavailableError)
        if not unknown or time.monotonic() > deadline or _stopping():
            return "its actor died"
        try:
            ray.get(actor.progress.remote(), timeout=PROGRESS_POLL_S)
        except ray.exceptions.RayActorError as again:
            exc = again  # ActorDiedError: Ray has decided; its node is asked once more above
        except ray.exceptions.GetTimeoutError:
            pass
        if isinstance(exc, ray.exceptions.ActorUnavailableError):
            time.sleep(VERDICT_POLL_S)


def _poll(actor: Any) -> dict[str, Any] | None:
    try:
        return ray.get(actor.progress.remote(), timeout=PROGRESS_POLL_S)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None
