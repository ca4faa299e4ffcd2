"""Checkpoints: everything a killed run needs to continue as if it had never stopped.

Layout under a run's out_dir:

    checkpoints/
      latest                  text file naming the newest complete checkpoint ("step_8")
      best.json               the checkpoint of the best held-out avg@k so far ({"step", "score"})
      step_8/
        model/                save_pretrained: weights, config, tokenizer (loadable on its own)
        trainer_state.pt      optimizer, LR schedule, RNG streams, data position,
                              carried-over groups, progress counters
        config.json           the experiment config that wrote it

N workers write a sharded checkpoint instead (save_sharded_checkpoint):

      step_8/
        model/                HF-format export in the compute dtype (for `dapo eval`, serving),
                              written at the end of a run, and for any other checkpoint on
                              demand from dcp/ (ensure_export)
        dcp/                  torch.distributed.checkpoint: the float32 masters and the AdamW
                              states, keyed by the causal LM's own parameter names
        ranks/rank_<r>.pt     each worker's random streams (its process and its engine)
        trainer_state.pt      the rest, shared by every rank (no optimizer inside)
        config.json

The two kinds interoperate: torch.distributed.checkpoint reshards on load, so a sharded
checkpoint resumes on any number of workers, one included (a plain process reads it without a
process group); one worker's checkpoint resumes on N workers from its float32 `model/` and its
optimizer state, renamed from positions to parameter names and sharded on load
(load_full_optimizer).

A checkpoint is written to a temporary sibling directory and renamed into place, and `latest`
is replaced atomically after that, so a kill at any moment leaves the previous checkpoint intact.
Only then are old ones deleted (retain_checkpoints): run.keep_checkpoints most recent, the best
evaluation's, and never the one `latest` names or the one this start resumed from.
`trainer_state.pt` holds tensors, numbers, strings, lists and dicts only and is loaded with
`torch.load(weights_only=True)`, and `dcp/` is read through dapo_core.train.safe_dcp (an
allow-list for its metadata, weights_only for its byte items): a crafted file cannot run code.
The layout and the rules for
following `latest` are in dapo_core.train.run_dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dapo_core.train import safe_dcp
from dapo_core.train.collective import Collective, full_tensor
from dapo_core.train.run_dir import (
    CHECKPOINTS,
    CONFIG_FILE,
    LATEST,
    MODEL_DIR,
    RANKS_DIR,
    SHARDS_DIR,
    STATE_FILE,
    checkpoint_step,
    has_export,
    latest_checkpoint,
    write_atomic,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from dapo_core.setup.config import ModelConfig

__all__ = [
    "check_checkpoint",
    "checkpoint_step",
    "ensure_export",
    "is_sharded",
    "latest_checkpoint",
    "load_checkpoint_config",
    "load_full_optimizer",
    "load_model_weights",
    "load_rank_state",
    "load_sharded_model",
    "load_sharded_optimizer",
    "load_trainer_state",
    "resolve_checkpoint",
    "retain_checkpoints",
    "save_checkpoint",
    "save_sharded_checkpoint",
]


def save_checkpoint(
    out_dir: Path,
    step: int,
    *,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    trainer_state: dict[str, Any],
    config: dict[str, Any],
) -> Path:
    """Write out_dir/checkpoints/step_<step> and point `latest` at it; returns its path."""
    root = Path(out_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}.", dir=root))
    try:
        _save_quietly(model, tmp / MODEL_DIR)
        tokenizer.save_pretrained(tmp / MODEL_DIR)
        torch.save(trainer_state, tmp / STATE_FILE)
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
        if final.exists():  # a replayed step after a resume: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic(root / LATEST, final.name)
    return final


BEST = "best.json"
"""In checkpoints/: the step and held-out avg@k of the best evaluated checkpoint so far."""


def retain_checkpoints(
    saved: Path,
    *,
    keep: int,
    score: float | None = None,
    resumed_from: Path | None = None,
) -> list[Path]:
    """After checkpoint `saved` is in place (and `latest` names it), delete the older ones that
    nothing needs; returns the deleted. One process calls it (rank 0 of N).

    `score` is the held-out avg@k of an evaluation at saved's step (None: not evaluated there);
    when it beats the best so far (checkpoints/best.json, kept across resumes), saved becomes
    the best. Kept: the `keep` most recent step_N (0: every one), the best's, the one `latest`
    names, and `resumed_from` (a resume never deletes what it started from)."""
    root = Path(saved).parent
    best = _read_best(root)
    step = checkpoint_step(saved)
    if score is not None and (best is None or score > best[1] or best[0] == step):
        write_atomic(root / BEST, json.dumps({"step": step, "score": score}))
        best = (step, score)
    if keep <= 0:
        return []
    steps = sorted(
        (checkpoint_step(p), p)
        for p in root.iterdir()
        if _is_step_dir(p)  # never a temporary .step_N.* of a save in progress
    )
    protected = {p.name for _, p in steps[-keep:]} | {Path(saved).name}
    if best is not None:
        protected.add(f"step_{best[0]}")
    if resumed_from is not None:
        protected.add(Path(resumed_from).name)
    with contextlib.suppress(OSError):
        protected.add((root / LATEST).read_text().strip())
    deleted = [p for _, p in steps if p.name not in protected]
    for path in deleted:
        shutil.rmtree(path)
    return deleted


def _is_step_dir(path: Path) -> bool:
    try:
        checkpoint_step(path)
    except ValueError:
        return False
    return path.is_dir() and not path.is_symlink()


def _read_best(root: Path) -> tuple[int, float] | None:
    try:
        found = json.loads((root / BEST).read_text())
        return int(found["step"]), float(found["score"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet (or unreadable: the next evaluation writes it anew)


def _save_quietly(model: PreTrainedModel, path: Path) -> None:
    from dapo_core.cache import quiet_progress

    with quiet_progress():
        model.save_pretrained(path)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a run directory, its checkpoints/ folder, or step_N itself."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"checkpoint path {p} does not exist")
    if (p / STATE_FILE).exists():
        return p
    for root in (p, p.parent) if p.name == CHECKPOINTS else (p,):
        found = latest_checkpoint(root)
        if found is not None:
            return found
    raise FileNotFoundError(
        f"{p} holds no checkpoint: give a run directory, its checkpoints/ folder or a step_N folder"
    )


def load_checkpoint_config(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / CONFIG_FILE).read_text())


def load_trainer_state(ckpt: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The trainer state, unpickled with weights_only=True (tensors and plain data only)."""
    path = Path(ckpt) / STATE_FILE
    try:
        return dict(torch.load(path, map_location=map_location, weights_only=True))
    except pickle.UnpicklingError as exc:
        first = (str(exc).strip().splitlines() or ["unsafe content"])[0]
        raise ValueError(f"{path} holds more than tensors and plain data ({first})") from None


def load_model_weights(model: nn.Module, ckpt: Path) -> None:
    """Load the checkpoint's weights into an already-built model of the same architecture.

    save_pretrained stores a tied weight once, so the keys it leaves out must be exactly
    parameters that share storage with a loaded one (e.g. lm_head tied to embed_tokens).
    """
    from safetensors.torch import load_file

    files = sorted((Path(ckpt) / MODEL_DIR).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{ckpt / MODEL_DIR} holds no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(
            f"checkpoint {ckpt} does not match the model: unexpected {result.unexpected_keys[:3]}"
        )
    loaded = {model.get_parameter(k).data_ptr() for k in state if _is_param(model, k)}
    untied = [
        k
        for k in result.missing_keys
        if not _is_param(model, k) or model.get_parameter(k).data_ptr() not in loaded
    ]
    if untied:
        raise ValueError(f"checkpoint {ckpt} does not match the model: missing {untied[:3]}")


def _is_param(model: nn.Module, name: str) -> bool:
    try:
        model.get_parameter(name)
    except AttributeError:
        return False
    return True


def check_checkpoint(ckpt: Path, name_or_path: str, *, chat: bool) -> None:
    """What `dapo eval` checks before it loads anything: the checkpoint's Hugging Face export
    (model/, what the engines read) is a usable model directory; a sharded checkpoint without
    one is exported from the run's model, so that model is checked instead. One line
    (real_model.ModelSetupError) for a model that is not usable."""
    from dapo_core.real_model import check_model, check_model_dir

    ckpt = Path(ckpt)
    if has_export(ckpt):
        check_model_dir(ckpt / MODEL_DIR, chat=chat)
    else:
        check_model(name_or_path, chat=chat)


# --- sharded checkpoints (N workers) ----------------------------------------------------------
def is_sharded(ckpt: Path) -> bool:
    """Whether N workers wrote this checkpoint (torch.distributed.checkpoint inside)."""
    return (Path(ckpt) / SHARDS_DIR).is_dir()


def ensure_export(ckpt: Path, model_cfg: ModelConfig) -> Path:
    """The checkpoint's model/ (HF format, compute dtype), written now from its dcp/ when N
    workers left it out (they export a run's last checkpoint only): the on-demand export that
    `dapo eval` and serving read. `model_cfg` is the run's (its architecture and tokenizer)."""
    ckpt = Path(ckpt)
    if not is_sharded(ckpt) or has_export(ckpt):
        return ckpt / MODEL_DIR
    from dapo_core.models import load_policy

    model, tokenizer = load_policy(model_cfg, "cpu", dtype="float32")
    load_sharded_model(model, ckpt)
    nn.Module.to(model, getattr(torch, model_cfg.dtype))
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR}.", dir=ckpt))
    try:
        _save_quietly(model, tmp)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(ckpt / MODEL_DIR, ignore_errors=True)  # a partial one (no weights)
        os.replace(tmp, ckpt / MODEL_DIR)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ckpt / MODEL_DIR


def save_sharded_checkpoint(
    out_dir: Path,
    step: int,
    *,
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokenizer: PreTrainedTokenizerBase,
    trainer_state: dict[str, Any],
    rank_state: dict[str, Any],
    config: dict[str, Any],
    dist: Collective,
    export_dtype: torch.dtype,
    export: bool = True,
) -> Path:
    """Every rank calls this together; rank 0 writes the shared files and renames the
    checkpoint into place. `policy` is the causal LM whose parameters are FSDP2 DTensors;
    `trainer_state` is Trainer.state_dict(optimizer=False), `rank_state` Trainer.rank_state().
    `export` adds model/, the HF-format weights in `export_dtype` (a gather of the whole model
    and ~2 bytes a parameter on disk: the run's last checkpoint has it, the others need not)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    root = Path(out_dir) / CHECKPOINTS
    final = root / f"step_{step}"
    tmp_name = ""
    if dist.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        tmp_name = tempfile.mkdtemp(prefix=f".step_{step}.", dir=root)
    tmp = Path(dist.broadcast_object(tmp_name))
    try:
        # Each rank writes its own shards; DCP's metadata names who holds which slice.
        state: dict[str, Any] = {"model": policy.state_dict()}
        if optimizer.state:  # before the first update there is nothing to keep (and asking
            # for the state dict would create one with a zero step, shifting AdamW's count)
            state["optim"] = get_optimizer_state_dict(policy, optimizer)
        # DCP's own planning is object collectives: on the collective's gloo group (if it has
        # one), not the default group, which is NCCL on GPUs.
        objects = getattr(dist, "objects", None)
        dcp.save(state, checkpoint_id=str(tmp / SHARDS_DIR), process_group=objects)
        (tmp / RANKS_DIR).mkdir(exist_ok=True)
        torch.save(rank_state, tmp / RANKS_DIR / f"rank_{dist.rank}.pt")
        if export:
            weights = _gather_export(policy, export_dtype, keep=dist.rank == 0)
            if dist.rank == 0:
                _write_hf_export(policy, tokenizer, weights, export_dtype, tmp / MODEL_DIR)
            del weights
        if dist.rank == 0:
            torch.save(trainer_state, tmp / STATE_FILE)
            (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
        dist.barrier()  # every rank's files are on disk before the rename
        if dist.rank == 0:
            if final.exists():  # a replayed step after a resume: replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
            write_atomic(root / LATEST, final.name)
    except BaseException:
        if dist.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()  # nobody reads `latest` before it names this checkpoint
    return final


def _gather_export(policy: nn.Module, dtype: torch.dtype, *, keep: bool) -> dict[str, torch.Tensor]:
    """The full weights in `dtype`, gathered parameter by parameter (a collective: every rank
    calls it); only the rank with keep=True holds them, in host memory. Tied parameters appear
    once (named_parameters), as save_pretrained stores them; persistent buffers are included."""
    out: dict[str, torch.Tensor] = {}
    persistent = set(policy.state_dict().keys())
    for name, p in policy.named_parameters():
        whole = full_tensor(p, dtype=dtype)
        if keep:
            out[name] = whole.cpu()
        del whole
    if keep:
        for name, b in policy.named_buffers():
            if name in persistent:
                out[name] = b.detach().cpu()
    return out


def _write_hf_export(
    policy: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    weights: dict[str, torch.Tensor],
    dtype: torch.dtype,
    path: Path,
) -> None:
    """A save_pretrained-style directory from gathered weights (the sharded model cannot save
    itself): safetensors, config (with the export's dtype), generation config, tokenizer."""
    import copy

    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in weights.items()},
        str(path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config: Any = copy.deepcopy(getattr(policy, "config"))  # noqa: B009 (any causal LM's)
    config.dtype = dtype
    config.save_pretrained(path)
    generation = getattr(policy, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(path)
    tokenizer.save_pretrained(path)


def load_sharded_model(policy: nn.Module, ckpt: Path) -> None:
    """Load a sharded checkpoint's float32 masters into `policy` in place, whatever its layout:
    FSDP2 DTensors on any number of ranks, or plain tensors in one process (no process group)."""
    state = {"model": policy.state_dict()}
    _dcp_load(state, ckpt)
    _check_loaded_in_place(policy, state["model"], ckpt)


def _check_loaded_in_place(policy: nn.Module, state: dict[str, torch.Tensor], ckpt: Path) -> None:
    # DCP fills the state dict's tensors in place; they share storage with the parameters,
    # unless a layout made a copy (then copy back).
    own = policy.state_dict()
    with torch.no_grad():
        for name, value in state.items():
            target = own.get(name)
            if target is None:
                raise ValueError(f"checkpoint {ckpt} holds {name}, which the model lacks")
            if _storage(target) != _storage(value):
                target.copy_(value)


def _storage(t: torch.Tensor) -> int:
    local = getattr(t, "to_local", None)  # a DTensor's own storage is its local shard's
    return int((local() if local is not None else t).data_ptr())


def load_sharded_optimizer(policy: nn.Module, optimizer: torch.optim.Optimizer, ckpt: Path) -> None:
    """Load a sharded checkpoint's optimizer states into `optimizer` (over policy's parameters),
    resharded to this process's layout."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    metadata = safe_dcp.read_metadata(Path(ckpt) / SHARDS_DIR)
    if not any(k.startswith("optim.") for k in metadata.state_dict_metadata):
        return  # saved before the first update: a fresh optimizer is the right one
    # The template is created with zero gradients at lr 0 (no weight moves), then overwritten.
    state = {"optim": get_optimizer_state_dict(policy, optimizer)}
    _dcp_load(state, ckpt)
    set_optimizer_state_dict(policy, optimizer, state["optim"])


def _dcp_load(state: dict[str, Any], ckpt: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        # One process reading N workers' shards is the intent here, not an accident.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        safe_dcp.load(state, Path(ckpt) / SHARDS_DIR)


def load_full_optimizer(
    policy: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """One worker's `optimizer.state_dict()` (states keyed by parameter position) into an
    optimizer over the same parameters sharded any way: positions become the parameter names
    (make_optimizer takes the trainable parameters in named_parameters order), then
    set_optimizer_state_dict shards the full tensors."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not state["state"]:
        return  # saved before the first update
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    by_name: dict[str, Any] = {
        "state": {names[int(i)]: v for i, v in state["state"].items()},
        "param_groups": [
            {**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(
        policy, optimizer, by_name, options=StateDictOptions(full_state_dict=True)
    )


def load_rank_state(ckpt: Path, rank: int) -> dict[str, Any] | None:
    """Rank `rank`'s random streams from a sharded checkpoint (weights_only), or None when the
    checkpoint was written by fewer workers (or by one)."""
    path = Path(ckpt) / RANKS_DIR / f"rank_{rank}.pt"
    if not path.is_file():
        return None
    return dict(torch.load(path, map_location="cpu", weights_only=True))
