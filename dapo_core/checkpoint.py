"""Checkpoints: everything a killed run needs to continue as if it had never stopped.

Layout under a run's out_dir:

    checkpoints/
      latest                  text file naming the newest complete checkpoint ("step_8")
      step_8/
        model/                save_pretrained: weights, config, tokenizer (loadable on its own)
        trainer_state.pt      optimizer, LR schedule, RNG streams, data position,
                              carried-over groups, progress counters
        config.json           the experiment config that wrote it

A checkpoint is written to a temporary sibling directory and renamed into place, and `latest`
is replaced atomically after that, so a kill at any moment leaves the previous checkpoint intact.
`trainer_state.pt` is a pickle: load only checkpoints you wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

CHECKPOINTS = "checkpoints"
LATEST = "latest"
MODEL_DIR = "model"
STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "config.json"


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
    _write_atomic(root / LATEST, final.name)
    return final


def _save_quietly(model: PreTrainedModel, path: Path) -> None:
    # transformers draws a "Writing model shards" bar per save; every few steps it would cut
    # into the per-step progress lines (and into `--quiet` output).
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The checkpoint `latest` names under out_dir, or None when there is none yet."""
    pointer = Path(out_dir) / CHECKPOINTS / LATEST
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / STATE_FILE).exists() else None


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


def checkpoint_step(ckpt: Path) -> int:
    """N of a step_N directory."""
    return int(Path(ckpt).name.removeprefix("step_"))


def load_checkpoint_config(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / CONFIG_FILE).read_text())


def load_trainer_state(ckpt: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    # weights_only=False: the state holds python / numpy RNG states and the carried-over groups.
    return torch.load(Path(ckpt) / STATE_FILE, map_location=map_location, weights_only=False)


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
