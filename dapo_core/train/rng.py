"""Random streams of a process as tensors, numbers and lists, so that a checkpoint holding them
loads with `torch.load(weights_only=True)` (numpy's state array travels as a tensor)."""

from __future__ import annotations

import random
from typing import Any

import torch


def rng_state() -> dict[str, Any]:
    """torch, python and numpy random streams as tensors and numbers (weights_only-safe)."""
    version, internal, gauss = random.getstate()
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
    }
    if torch.cuda.is_available():
        # This process's own device only: get_rng_state_all() would initialise every visible
        # GPU (a context on each, in a process that trains on one), and a checkpoint holding
        # N devices' states could not be restored where fewer are visible.
        out["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
        keys = np.asarray(keys)
        out["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    except ImportError:  # pragma: no cover - numpy ships with torch's usual installs
        pass
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        _set_cuda_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))


def _set_cuda_rng_state(saved: torch.Tensor | list[torch.Tensor]) -> None:
    """The current device's CUDA stream from a checkpoint: one state (this module's format), or
    the list of every visible device's that older checkpoints hold, of which the entry of this
    process's device index is used when it exists (a resume on fewer GPUs skips the stream,
    which changes sampling on the GPU only, never what a run may resume)."""
    device = torch.cuda.current_device()
    if isinstance(saved, list | tuple):
        if device >= len(saved):
            return
        saved = saved[device]
    torch.cuda.set_rng_state(saved, device)
