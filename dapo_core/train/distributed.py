"""One arm on N workers: torch.distributed, FSDP2, a rollout engine per worker, sharded checkpoints.

Every rank runs `train_worker`: the run's order is dapo_core.train.assembly's, as on one worker
(`runner.train`); its layout here, `Ranks`, differs in these steps:

    init_distributed    torch.distributed's default group: gloo on CPU, NCCL on GPU (and gloo
                        for CPU tensors with model.cpu_offload); objects and barriers go over a
                        gloo group that waits run.collective_timeout_s (open_collective)
    load the policy     float32 and whole, in host memory (from the checkpoint when resuming);
                        with the vllm engine on rank 0 only, the other ranks build it on the
                        meta device and receive their shards from rank 0 (shard_from_rank0)
    rollout copy        an unsharded copy in the compute dtype for this rank's engine (hf); the
                        engine's random stream is seeded per rank, so ranks sample differently
    shard_policy        FSDP2: fully_shard per decoder layer, then the LogprobModel root, with
                        MixedPrecisionPolicy(param_dtype=compute dtype, reduce_dtype=float32):
                        float32 masters and optimizer states, low-precision forward/backward,
                        float32 gradient reduction; CPU offload optional (model.cpu_offload)
    Trainer.step()      the same Algorithm 1: each rank generates whole groups for its share of
                        the prompts, the groups are gathered so every rank holds the global batch
                        and takes the same dynamic-sampling decisions; each mini-batch is split
                        by sequences with global normalisers (update.py). rollout.mode=async:
                        each rank's rollout worker (a thread, its engine on the rollout copy)
                        makes its share of every batch ahead, under the same gate on every rank;
                        the shares are gathered, and the staleness filter applied, when the
                        trainer takes the batch (every rank the same batches, in order)
    push_weights        after each update, every parameter is gathered in the compute dtype, one
                        at a time, as the engine's load_weights reads it (GatheredWeights);
                        async: gathered into a snapshot the worker loads between its batches
    checkpoints         sharded (checkpoint.save_sharded_checkpoint), resharded on resume

Only rank 0 writes metrics (through the sink its factory makes); the other metrics are already
global (every rank holds the same batch, update counts are all-reduced), plus each rank's own
`time/rank<r>/...` timings.

`launch_local` starts N such processes on this machine (`dapo train --workers N`); the flows
start them as Ray actors. `train_worker`'s arguments are plain picklable values, so an actor can
receive them: the sink is made inside the worker by `sink_factory`.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from dapo_common.util import free_port
from dapo_core.engines.base import EngineHost, RolloutEngine
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.assembly import Parts, Run, assemble_and_train
from dapo_core.train.collective import Collective, full_tensor, open_collective
from dapo_core.train.loop import TrainResult
from dapo_core.train.policy import LogprobModel, compute_dtype
from dapo_core.train.protocols import MetricsSink

if TYPE_CHECKING:
    from transformers import PreTrainedModel


log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1800.0
"""How long a collective waits for a missing rank before the job fails (torch's default)."""
VLLM_INIT_DIR = ".vllm-init"


def check_workers(cfg: ExperimentConfig, workers: int) -> None:
    """Refuse, before anything starts, what N workers cannot run (one line each)."""
    if workers < 1:
        raise ValueError(f"--workers {workers}: need at least 1 worker")
    if workers > 1 and cfg.algo.kl_coef > 0:
        raise ValueError(
            f"algo.kl_coef={cfg.algo.kl_coef}: the KL penalty's reference model is not supported "
            "on several workers yet; use --workers 1 or algo.kl_coef=0 (DAPO drops the KL term)"
        )


def engine_seed(seed: int, rank: int, step: int = 0) -> int:
    """Each rank's engine stream: rank 0 of a fresh run draws exactly one worker's stream; a
    rank that resumes without a saved stream of its own (more workers than wrote the
    checkpoint) starts a new one that depends on the step, so no step's samples repeat."""
    return seed + 1_000_003 * rank + 7_919 * step


# --- process group ------------------------------------------------------------------------------
def process_group_backend(device: str, *, cpu_offload: bool = False) -> str:
    """torch.distributed's backend for run.device resolved (`cpu` or `cuda`).

    With model.cpu_offload the FSDP2 shards, and so the gradient-norm reduction of clipping and
    the gathers of an export, are CPU tensors, which NCCL cannot reduce ("No backend type
    associated with device type cpu"): CPU tensors then go over gloo, CUDA tensors over NCCL."""
    if device != "cuda":
        return "gloo"
    return "cpu:gloo,cuda:nccl" if cpu_offload else "nccl"


def init_distributed(
    rank: int,
    world_size: int,
    init_method: str,
    *,
    device: str,
    local_rank: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    cpu_offload: bool = False,
) -> torch.device:
    """Join the default process group; returns this rank's compute device.

    `device` is run.device resolved (`cpu` or `cuda`): gloo on CPU, NCCL on GPU (plus gloo for
    CPU tensors with `cpu_offload`), where this rank uses GPU `local_rank` (default: rank modulo
    the GPUs it sees; a Ray actor sees its one)."""
    import torch.distributed as dist

    backend = process_group_backend(device, cpu_offload=cpu_offload)
    if device == "cuda":
        index = rank % torch.cuda.device_count() if local_rank is None else local_rank
        compute = torch.device("cuda", index)
        torch.cuda.set_device(compute)
    else:
        compute = torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return compute


# --- the policy on N workers ------------------------------------------------------------------
def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a causal LM (HF: model.model.layers; GPT-2: transformer.h)."""
    get_decoder = getattr(model, "get_decoder", None)
    body = get_decoder() if callable(get_decoder) else model
    for attr in ("layers", "h", "blocks"):
        blocks = getattr(body, attr, None)
        if isinstance(blocks, nn.ModuleList) and len(blocks):
            return list(blocks)
    raise ValueError(f"{type(model).__name__}: no decoder layers found to shard with FSDP2")


def shard_policy(
    model: nn.Module,
    *,
    dtype: torch.dtype,
    device: torch.device,
    cpu_offload: bool = False,
    group: Any | None = None,
) -> LogprobModel:
    """FSDP2 over the policy: each decoder layer is one unit (gathered for its forward and
    backward, then freed), the root LogprobModel holds the rest (embeddings, final norm, head).

    Parameters stay float32 shards (the masters the optimizer updates); FSDP casts the gathered
    ones to `dtype` for compute and reduces gradients in float32. With cpu_offload the shards
    and their optimizer states live in host memory and are copied to `device` when gathered.
    The shards spread over `group` (default: every rank of the default group).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if group is None:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    else:
        mesh = DeviceMesh.from_group(group, device.type)
    options: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32),
    }
    if cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    root = LogprobModel(model)
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(root, **options)
    return root


def load_policy_once(
    cfg: ExperimentConfig, coll: Collective, *, weights: Path | None = None
) -> tuple[PreTrainedModel, Any, dict[str, torch.Tensor] | None]:
    """The policy, read from storage by rank 0 only: (model, tokenizer, rank 0's full state dict).

    Rank 0 loads the float32 masters whole in host memory (then `weights`, a one-worker
    checkpoint, over them) and returns their state dict; every other rank builds the same
    model on the meta device (no memory) and gets None. shard_from_rank0 then shards them and
    fills every rank's shards from rank 0: at 7B one float32 model (~28 GiB) per node instead
    of one per rank. The tokenizer is every rank's own (from the same place as the model)."""
    from dapo_core.train.checkpoint import load_model_weights
    from dapo_core.train.runner import load_masters, meta_masters

    loaded: list[tuple[PreTrainedModel, Any]] = []

    def load() -> None:
        model, tokenizer = load_masters(cfg, "cpu")
        if weights is not None:
            load_model_weights(model, weights)  # one worker's checkpoint: its float32 model/
        loaded.append((model, tokenizer))

    # Rank 0's failure (a missing model, a bad checkpoint) is raised on every rank, which
    # would otherwise wait for its shards until the collective timeout.
    _on_rank0(coll, load)
    if coll.rank == 0:
        model, tokenizer = loaded[0]
        return model, tokenizer, model.state_dict()
    model, tokenizer = meta_masters(cfg)
    return model, tokenizer, None


def shard_from_rank0(
    model: nn.Module,
    full_state: dict[str, torch.Tensor] | None,
    coll: Collective,
    *,
    dtype: torch.dtype,
    device: torch.device,
    cpu_offload: bool = False,
) -> LogprobModel:
    """shard_policy over load_policy_once's models, every rank's shards filled from rank 0's
    `full_state` (a collective: every rank calls it; `full_state` is None but on rank 0, which
    may drop it afterwards: its whole tensors are then freed).

    Rank 0's model holds real weights; the others' are on the meta device until sharded, then
    get empty shards (where FSDP2 keeps them: host memory with cpu_offload, else `device`),
    which set_model_state_dict fills, parameter by parameter, from rank 0's broadcast. The
    buffers (rotary tables) are sent whole: the non-persistent ones are in no state dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    root = shard_policy(model, dtype=dtype, device=device, cpu_offload=cpu_offload)
    if coll.rank != 0:
        model.to_empty(device=torch.device("cpu") if cpu_offload else device)
    # Buffers stay whole on `device` (FSDP2 moved rank 0's there; it never offloads them).
    # Every alias of a shared buffer is named (remove_duplicate=False), so each is replaced.
    buffers: dict[str, torch.Tensor] = {}
    if coll.rank == 0:
        buffers = {name: b.cpu() for name, b in model.named_buffers(remove_duplicate=False)}
    for name, value in coll.broadcast_object(buffers).items():
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, value.to(device))
    set_model_state_dict(
        model,
        cast(dict[str, Any], full_state if full_state is not None else {}),
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    return root


class GatheredWeights(Mapping[str, torch.Tensor]):
    """The policy's parameters, each whole and cast to `dtype` when it is read: a Mapping an
    engine's load_weights consumes like a state dict, one parameter in memory at a time.

    Reading a value is a collective (an all-gather over the ranks): every rank must read the
    same names in the same order, once, as load_weights does by iterating items(). Names are
    the state dict's: a tied parameter under each of its names (lm_head.weight beside
    model.embed_tokens.weight), gathered once. Without the tied name, vLLM's layer-wise reload
    left the model on the weights it started with."""

    def __init__(self, policy: nn.Module, *, dtype: torch.dtype, device: torch.device) -> None:
        self._params = dict(policy.named_parameters(remove_duplicate=False))
        self.dtype, self.device = dtype, device
        # A tied parameter's whole tensor, for its other names (as long as this mapping lives:
        # one push, or a snapshot whose names then share it).
        self._tied: dict[int, torch.Tensor | None] = {}
        seen: set[int] = set()
        for param in self._params.values():
            if id(param) in seen:
                self._tied[id(param)] = None
            seen.add(id(param))

    def __getitem__(self, name: str) -> torch.Tensor:
        param = self._params[name]
        whole = self._tied.get(id(param))
        if whole is None:
            whole = full_tensor(param, dtype=self.dtype, device=self.device)
            if id(param) in self._tied:
                self._tied[id(param)] = whole
        return whole

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)


def push_weights(
    policy: nn.Module, engine: RolloutEngine, *, dtype: torch.dtype, device: torch.device
) -> None:
    """Hand `engine` the policy's current weights (a collective: every rank calls it), gathered
    parameter by parameter: a rank never holds a whole copy of the model beyond its engine's
    own, and the float32 masters are never gathered (each shard is cast before the gather)."""
    engine.load_weights(GatheredWeights(policy, dtype=dtype, device=device))


# --- one worker of N --------------------------------------------------------------------------
def train_worker(
    rank: int,
    world_size: int,
    init_method: str,
    config: ExperimentConfig | Mapping[str, Any],
    out_dir: str | Path,
    sink_factory: Callable[[], MetricsSink] | None = None,
    owner: Mapping[str, Any] | None = None,
    *,
    resume: bool = True,
    progress: Callable[[dict[str, Any]], None] | None = None,
    local_rank: int | None = None,
    num_threads: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    engine_host: EngineHost | None = None,
) -> TrainResult:
    """Rank `rank` of a `world_size`-worker training job of one arm; every rank calls it with
    the same arguments but its rank, and every rank returns the same TrainResult.

    Args:
        init_method: torch.distributed rendezvous, e.g. `tcp://<rank 0's address>:<free port>`.
        config: the experiment config (or its to_dict(), as a Ray actor receives it).
        out_dir: the run directory, on storage every rank sees (checkpoints are written by all).
        sink_factory: called on rank 0 only, in the worker, to make the metrics sink (closed at
            the end); None logs nothing.
        owner: the job that owns out_dir (run_dir.claim); None: `dapo train`'s default.
        progress: called on rank 0 after each step (the dict `runner.train` reports).
        local_rank: the GPU index on this host (default: rank modulo the visible GPUs).
        num_threads: torch CPU threads of this worker (default: run.num_threads or torch's).
        timeout_s: how long a tensor collective waits for a missing rank before failing
            (object collectives and barriers: run.collective_timeout_s).
        engine_host: where this rank's rollout engine lives (dapo_core.engines.base.EngineHost,
            e.g. a Ray actor of its own); by default it is built in this process.
    """
    import torch.distributed as dist

    from dapo_core.train.runner import run_resources, setup_torch

    cfg = (
        config if isinstance(config, ExperimentConfig) else ExperimentConfig.from_dict(dict(config))
    )
    check_workers(cfg, world_size)
    t_start = time.perf_counter()
    device_name = setup_torch(cfg)
    if num_threads:
        torch.set_num_threads(num_threads)
    device = init_distributed(
        rank,
        world_size,
        init_method,
        device=device_name,
        local_rank=local_rank,
        timeout_s=timeout_s,
        cpu_offload=cfg.model.cpu_offload,
    )
    try:
        # The rank's engine is closed (vllm: before the process group goes) and its device
        # memory released however the run ends: a pooled Ray actor trains the next arm here.
        with run_resources() as cleanup:
            coll = open_collective(cfg.run.collective_timeout_s)
            result = assemble_and_train(
                cfg,
                Ranks(coll, device, sink_factory, engine_host=engine_host),
                out_dir=Path(out_dir),
                resume=resume,
                owner=owner,
                progress=progress,
                t_start=t_start,
                cleanup=cleanup,
            )
            # Every rank finished: meet before any tears the group down, so that no rank
            # closes its sockets while a peer still receives the last collective (gloo then
            # aborts that peer). Not on failure: a missing rank would make it wait.
            if dist.is_initialized():
                coll.barrier()
            return result
    finally:
        if dist.is_initialized():  # an engine's shutdown may have destroyed it already (vllm)
            dist.destroy_process_group()


@dataclass
class Ranks:
    """The assembly's layout for one rank of N: rank 0 claims the directory and reads the
    policy, FSDP2 shards it, each rank rolls out with its own engine, checkpoints are sharded,
    and rank 0 alone owns a sink (from `sink_factory`, made in this process)."""

    dist: Collective
    device: torch.device
    sink_factory: Callable[[], MetricsSink] | None
    own_streams: dict[str, Any] | None = None
    """This rank's random streams from a sharded checkpoint (build reads, restore loads)."""
    engine_host: EngineHost | None = None

    def claim(self, run: Run) -> Path | None:
        from dapo_core.train.runner import open_run_dir

        # Rank 0 claims the directory and picks the checkpoint; a refusal reaches every rank.
        name = _on_rank0(
            self.dist,
            lambda: _as_str(open_run_dir(run.cfg, run.out_dir, resume=run.resume, owner=run.owner)),
        )
        return Path(name) if name else None

    def build(self, run: Run, ckpt: Path | None) -> Parts:
        from dapo_core.models import TINY_TASKS, tiny_model_dir
        from dapo_core.train.checkpoint import (
            checkpoint_step,
            is_sharded,
            load_model_weights,
            load_rank_state,
            load_sharded_model,
        )
        from dapo_core.train.runner import load_masters
        from dapo_core.train.trainer import Trainer

        cfg, coll, device, rank = run.cfg, self.dist, self.device, self.dist.rank
        dtype = compute_dtype(cfg.model.dtype)
        sharded = ckpt is not None and is_sharded(ckpt)
        if cfg.model.name_or_path in TINY_TASKS:
            # Built (once per machine) by rank 0: save_pretrained writes nothing on other ranks.
            _on_rank0(coll, lambda: str(tiny_model_dir(cfg.model)))
        full_state: dict[str, torch.Tensor] | None = None
        if cfg.rollout.engine == "vllm":
            # Read once, by rank 0; the other ranks' shards come from it (shard_from_rank0). The
            # hf engine needs the whole model on every rank anyway (its rollout copy).
            model, tokenizer, full_state = load_policy_once(
                cfg, coll, weights=ckpt if ckpt is not None and not sharded else None
            )
        else:
            # Whole and float32 in host memory first; FSDP moves each rank's shards to `device`.
            model, tokenizer = load_masters(cfg, "cpu")
            if ckpt is not None and not sharded:
                load_model_weights(model, ckpt)  # one worker's checkpoint: its float32 model/
        self.own_streams = load_rank_state(ckpt, rank) if sharded and ckpt is not None else None
        fresh_stream = ckpt is not None and self.own_streams is None and rank > 0
        step = checkpoint_step(ckpt) if fresh_stream and ckpt else 0
        seed = engine_seed(cfg.run.seed, rank, step)
        engine = _make_rank_engine(
            cfg, model, tokenizer, device, coll, run.out_dir, seed=seed, host=self.engine_host
        )
        run.cleanup.callback(engine.close)

        if cfg.rollout.engine == "vllm":
            root = shard_from_rank0(
                model,
                full_state,
                coll,
                dtype=dtype,
                device=device,
                cpu_offload=cfg.model.cpu_offload,
            )
            full_state = None  # rank 0's last reference to the whole tensors: the shards hold them
        else:
            root = shard_policy(
                model, dtype=dtype, device=device, cpu_offload=cfg.model.cpu_offload
            )
        if sharded and ckpt is not None:
            load_sharded_model(model, ckpt)  # resharded to this many workers

        def sync() -> None:
            push_weights(model, engine, dtype=dtype, device=device)

        def snapshot() -> dict[str, torch.Tensor]:
            # Async: the worker's weights, gathered whole in the compute dtype (a collective);
            # each gathered tensor is new, so the shards may move on in the next update.
            return dict(GatheredWeights(model, dtype=dtype, device=device))

        trainer = Trainer(
            cfg,
            root,
            tokenizer,
            engine,
            run.problems,
            dist=coll,
            autocast=False,  # FSDP2's MixedPrecisionPolicy casts
            sync_weights=sync,
            snapshot_weights=snapshot,
            device=device,
        )
        run.cleanup.callback(trainer.close)  # the rollout worker stops before its engine closes
        if cfg.rollout.engine == "vllm" and ckpt is None:
            sync()  # the engine started on dummy weights; a resume syncs in load_state_dict
        # Evaluations sample through the trainer's engine: async, the worker's, seeded.
        return Parts(model, tokenizer, trainer.engine, trainer)

    def restore(self, parts: Parts, ckpt: Path, state: dict[str, Any]) -> None:
        from dapo_core.train.checkpoint import (
            is_sharded,
            load_full_optimizer,
            load_sharded_optimizer,
        )

        trainer = parts.trainer
        if is_sharded(ckpt):
            load_sharded_optimizer(parts.model, trainer.optimizer, ckpt)
        else:
            load_full_optimizer(parts.model, trainer.optimizer, state["optimizer"])
        trainer.load_state_dict(state, optimizer=False, streams=False)
        streams = self.own_streams
        if streams is None and self.dist.rank == 0:
            streams = {"rng": state["rng"], "engine": state["engine"]}  # one worker's
        if streams is not None:
            trainer.load_rank_state(streams)

    def save(self, run: Run, parts: Parts) -> Path:
        from dapo_core.train.checkpoint import save_sharded_checkpoint

        trainer, cfg = parts.trainer, run.cfg
        return save_sharded_checkpoint(
            run.out_dir,
            trainer.rollout_step,
            policy=parts.model,
            optimizer=trainer.optimizer,
            tokenizer=parts.tokenizer,
            trainer_state=trainer.state_dict(optimizer=False),
            rank_state=trainer.rank_state(),
            config=cfg.to_dict(),
            dist=self.dist,
            export_dtype=compute_dtype(cfg.model.dtype),
            # The HF export at the end only: at 7B it is a whole-model gather and ~14 GiB a
            # checkpoint, and `dapo eval` of an earlier checkpoint reads its dcp/ instead.
            export=trainer.rollout_step >= cfg.run.steps,
        )

    def sink(self, run: Run) -> MetricsSink:
        from dapo_core.train.sinks import NullSink

        if self.dist.rank != 0 or self.sink_factory is None:
            return NullSink()
        made = self.sink_factory()
        run.cleanup.callback(made.close)  # before the engine's close: the stack unwinds in reverse
        return made


def _make_rank_engine(
    cfg: ExperimentConfig,
    model: PreTrainedModel,
    tokenizer: Any,
    device: torch.device,
    coll: Collective,
    out_dir: Path,
    *,
    seed: int,
    host: EngineHost | None = None,
) -> RolloutEngine:
    """This rank's engine, made before the policy is sharded: hf copies the whole weights;
    vllm reads only the config (the model may be on the meta device) and gets its weights from
    the shards by the first sync. `host` places it (built here without one)."""
    from dapo_core.engines import make_engine
    from dapo_core.engines.hf import rollout_copy

    dtype = compute_dtype(cfg.model.dtype)
    if cfg.rollout.engine == "vllm":
        # vLLM builds its model from a skeleton (config and tokenizer, written once by rank 0)
        # with dummy weights; each rank then pushes the weights gathered from its shards
        # (Ranks.build, once sharded). Writing the whole float32 model for vLLM's loader cost
        # ~28 GiB of disk and a read per rank at 7B.
        from dapo_core.engines import write_skeleton

        init_dir: Path | None = None
        if host is None:
            init_dir = shared = out_dir / VLLM_INIT_DIR
            if coll.rank == 0:
                shutil.rmtree(shared, ignore_errors=True)
                write_skeleton(model, tokenizer, shared)
            coll.barrier()
        else:
            # A hosted engine writes its own skeleton on its node (no runs directory shared
            # across nodes needed), from a weightless model: rank 0's real weights would
            # travel to the actor for nothing.
            from dapo_core.models import load_policy_skeleton

            model = load_policy_skeleton(cfg.model, dtype="float32")[0]
        recipe = functools.partial(
            make_engine,
            "vllm",
            model,
            tokenizer,
            cfg,
            seed=seed,
            init_dir=init_dir,
            sync_first=False,
        )
    else:
        # Async: the engine samples on the worker's thread, with a tokenizer of its own. A
        # hosted engine's copy goes on the CPU (its recipe is pickled to wherever it runs) and
        # moves to that process's device there.
        own = copy.deepcopy(tokenizer) if cfg.rollout.mode == "async" else tokenizer
        where = torch.device("cpu") if host is not None else device
        recipe = functools.partial(
            make_engine,
            "hf",
            rollout_copy(model, dtype, where),
            own,
            cfg,
            seed=seed,
            device="auto" if host is not None else None,
        )
    return recipe() if host is None else host(recipe)


def _on_rank0(coll: Collective, fn: Callable[[], Any]) -> Any:
    """fn() on rank 0, its result (or its exception, raised on every rank) broadcast."""
    outcome: tuple[str, Any] = ("ok", None)
    if coll.rank == 0:
        try:
            outcome = ("ok", fn())
        except Exception as exc:  # re-raised below on every rank, rank 0 included
            outcome = ("error", exc)
    kind, value = coll.broadcast_object(outcome)
    if kind == "error":
        raise value
    return value


def _as_str(path: Path | None) -> str | None:
    return str(path) if path is not None else None


# --- N processes on this machine -------------------------------------------------------------
def launch_local(
    cfg: ExperimentConfig,
    *,
    out_dir: Path,
    workers: int,
    sink_factory: Callable[[], MetricsSink] | None,
    resume: bool = True,
    owner: Mapping[str, Any] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TrainResult:
    """Train one arm with `workers` processes on this machine (`dapo train --workers N`).

    One worker is the plain single-process `runner.train`. Otherwise N processes are spawned,
    joined through a free localhost port; `sink_factory` and `progress` must be picklable
    (module-level functions, functools.partial of classes). A worker's error is raised here
    with the same type when it is a user error (one line on the command line), else as a
    RuntimeError naming the rank; its traceback travels in the exception's notes.
    """
    import torch.multiprocessing as mp

    from dapo_core.train.runner import open_run_dir, resolve_device, train

    check_workers(cfg, workers)
    if workers == 1:
        sink = sink_factory() if sink_factory is not None else _null_sink()
        try:
            return train(
                cfg, sink=sink, out_dir=out_dir, resume=resume, progress=progress, owner=owner
            )
        finally:
            sink.close()
    cuda = resolve_device(cfg.run.device) == "cuda"
    if cuda and torch.cuda.device_count() < workers:
        raise ValueError(
            f"--workers {workers} on this machine needs {workers} GPUs (one per worker); "
            f"{torch.cuda.device_count()} visible"
        )
    devices = rank_devices(workers) if cuda and cfg.rollout.engine == "vllm" else None
    # The usual refusals (another run's directory, a changed config) before any process starts.
    open_run_dir(cfg, Path(out_dir), resume=resume, owner=owner)
    threads = cfg.run.num_threads or max(1, (os.cpu_count() or 1) // workers)
    report = Path(tempfile.mkdtemp(prefix="dapo-workers-"))
    args = (
        workers,
        f"tcp://127.0.0.1:{free_port()}",
        cfg.to_dict(),
        str(out_dir),
        sink_factory,
        dict(owner) if owner is not None else None,
        resume,
        progress,
        threads,
        timeout_s,
        str(report),
        os.getpid(),
        devices,
    )
    try:
        try:
            mp.spawn(_spawn_entry, args=args, nprocs=workers, join=True)
        except Exception as exc:
            raise _worker_error(report, workers) from exc
        return TrainResult(**json.loads((report / "result.json").read_text()))
    finally:
        shutil.rmtree(report, ignore_errors=True)


def rank_devices(workers: int) -> list[str]:
    """Each local rank's GPU as CUDA_VISIBLE_DEVICES names it: the r-th of this process's own
    list (indices or UUIDs) when it has one, else r."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [d.strip() for d in visible.split(",") if d.strip()][:workers]
    return [str(r) for r in range(workers)]


def _null_sink() -> MetricsSink:
    from dapo_core.train.sinks import NullSink

    return NullSink()


def _spawn_entry(
    rank: int,
    world_size: int,
    init_method: str,
    config: dict[str, Any],
    out_dir: str,
    sink_factory: Callable[[], MetricsSink] | None,
    owner: dict[str, Any] | None,
    resume: bool,
    progress: Callable[[dict[str, Any]], None] | None,
    threads: int,
    timeout_s: float,
    report: str,
    parent_pid: int,
    devices: list[str] | None = None,
) -> None:
    """One spawned worker: train_worker, its result or error written where the parent looks.

    `devices` (vllm on GPUs): this rank is shown only devices[rank], before CUDA starts in the
    process, and uses it as its device 0, as a Ray actor does. vLLM's single-process executor
    puts its engine on device 0 of what it sees, whatever torch.cuda.set_device says: with
    every GPU visible, every rank's engine (and then its FSDP shards) lands on GPU 0. The hf
    engine keeps every GPU visible (NCCL's peer-to-peer paths between them stay open)."""
    import faulthandler

    # A rank killed by a signal in native code (a SIGSEGV of rank 0 was seen once, in a CI
    # rehearsal on 2026-11-29) prints its Python stack on stderr. Where a handler is on
    # already (a test runs this entry inside pytest, whose plugin owns it), it stays as it is.
    if not faulthandler.is_enabled():
        faulthandler.enable()
    local_rank = rank
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[rank]
        local_rank = 0
    _exit_with_parent(parent_pid)
    # Rank 0 speaks for the job; the other ranks' warnings would repeat its own.
    logging.basicConfig(
        level=logging.WARNING if rank == 0 else logging.ERROR,
        format="warning: %(message)s",
    )
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    try:
        result = train_worker(
            rank,
            world_size,
            init_method,
            config,
            out_dir,
            sink_factory,
            owner,
            resume=resume,
            progress=progress,
            local_rank=local_rank,
            num_threads=threads,
            timeout_s=timeout_s,
        )
    except BaseException as exc:
        (Path(report) / f"error_{rank}.json").write_text(
            json.dumps(
                {
                    "type": type(exc).__name__,
                    "message": str(exc),
                    "traceback": traceback.format_exc(),
                }
            )
        )
        raise
    if rank == 0:
        (Path(report) / "result.json").write_text(json.dumps(asdict(result)))


def _exit_with_parent(parent_pid: int) -> None:
    """A worker whose launcher died (killed, not interrupted) would wait in a collective for
    half an hour; it leaves as soon as its parent is gone instead."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


# What a rank's collective says when another rank went away (its connection closed, reset or
# refused, a receive timed out): the cause is elsewhere. Lower case, matched case-blind.
PEER_GONE = (
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "connection refused",
    "timed out",
)


def is_peer_gone(message: str) -> bool:
    """Whether a rank's error only says that another rank went away."""
    text = message.lower()
    return any(marker in text for marker in PEER_GONE)


def _worker_error(report: Path, workers: int) -> Exception:
    """The exception to raise for a failed job: the first rank's own error, not the connection
    errors the other ranks saw when it left."""
    from dapo_core.setup.config import ConfigError
    from dapo_core.train.loop import TrainingDiverged
    from dapo_core.train.run_dir import NotOwner

    errors = []
    for r in range(workers):
        path = report / f"error_{r}.json"
        if path.is_file():
            errors.append((r, json.loads(path.read_text())))
    if not errors:
        return RuntimeError(f"a worker of {workers} died without a word (killed? out of memory?)")
    errors.sort(key=lambda e: is_peer_gone(e[1]["message"]))
    rank, err = errors[0]
    known: dict[str, type[Exception]] = {
        "ValueError": ValueError,
        "FileNotFoundError": FileNotFoundError,
        "NotADirectoryError": NotADirectoryError,
        "PermissionError": PermissionError,
        "ConfigError": ConfigError,
        "NotOwner": NotOwner,
        "TrainingDiverged": TrainingDiverged,
    }
    kind = known.get(err["type"])
    exc = (
        kind(err["message"])
        if kind is not None
        else RuntimeError(f"worker {rank} of {workers} failed: {err['type']}: {err['message']}")
    )
    exc.add_note(f"worker {rank}'s traceback:\n{err['traceback']}")
    return exc
