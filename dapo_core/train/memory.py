"""Peak GPU memory per phase of a step, for comparison with `dapo plan`'s items for that phase.

The plan says what each phase (rollout, the old log-prob pass, the update, the weight sync) holds
on top of the resident state; the only way to know whether it is right is to measure the same
phases on a GPU. `PhaseMemory.phase(name)` resets torch's peak counter when a phase starts and
reads `max_memory_allocated` when it ends. Off CUDA it does nothing: CPU processes have no such
counter, and the metrics would only say 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from dapo_common import metric_names as M

GIB = float(1 << 30)


class PhaseMemory:
    """Per-phase peaks of torch.cuda.max_memory_allocated, in GiB, collected until `metrics()`.

    `cuda` is the torch.cuda module (a test passes a recorder in its place)."""

    def __init__(self, device: torch.device | str, cuda: Any = None) -> None:
        self.device = torch.device(device)
        self.enabled = self.device.type == "cuda"
        self.cuda = cuda if cuda is not None else torch.cuda
        self.peaks: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure `name` (one of metric_names.MEMORY_PHASES). A phase entered twice in one step
        (several generation batches) keeps its larger peak."""
        key = M.peak_mem(name)  # an unknown phase fails here, on CPU as well as on GPU
        if not self.enabled:
            yield
            return
        self.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            peak = self.cuda.max_memory_allocated(self.device) / GIB
            self.peaks[key] = max(self.peaks.get(key, 0.0), peak)

    def metrics(self) -> dict[str, float]:
        """The peaks since the last call (then forgotten: each step reports its own)."""
        out, self.peaks = self.peaks, {}
        return out
