"""The tiny model's warm start is a function of its cache key alone: the weights do not depend on
how many torch threads the building process had. A cache is shared by every run on a machine and
whichever process builds first fills it (a `dapo sweep` with --cpus 2 built on two threads, the
demo and the tests on one), and on this CPU two threads summed differently from one: a 600-step
build ended at a loss of 0.2315 against 0.2382 and other weights (2026-11-29)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dapo_core.models import tiny_model_dir, torch_threads
from dapo_core.setup.config import ModelConfig


def build(cache: Path, threads: int, monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setenv("DAPO_CACHE_DIR", str(cache))
    with torch_threads(threads):
        model_dir = tiny_model_dir(ModelConfig(warm_start_steps=12))
        assert torch.get_num_threads() == threads  # the caller's count is given back
    return (model_dir / "model.safetensors").read_bytes()


def test_the_warm_start_weights_do_not_depend_on_the_callers_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = build(tmp_path / "one", 1, monkeypatch)
    two = build(tmp_path / "two", 2, monkeypatch)
    assert one == two
