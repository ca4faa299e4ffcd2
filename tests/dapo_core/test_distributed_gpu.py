"""Issue 22 items 8 and 9, on CPU: what the first multi-GPU run would have met.

- Object collectives and barriers go over a gloo group whose timeout is run.collective_timeout_s,
  not over the default (NCCL on GPU) group with its default timeout: two gloo processes, one of
  which never reaches a barrier, show the other giving up after the configured seconds.
- Only the current device's CUDA random stream is saved, and a stream saved by a process that
  saw more GPUs restores where fewer are visible (a fake torch.cuda counts the devices touched).
- model.cpu_offload on CUDA joins the process group as `cpu:gloo,cuda:nccl` (NCCL alone cannot
  reduce the offloaded CPU shards); the decision is a plain function, and init_distributed is
  checked to pass it on (torch.distributed's init recorded, torch.cuda faked).
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from dapo_common.util import free_port
from dapo_core.setup.config import ConfigError, ExperimentConfig
from dapo_core.train import rng
from dapo_core.train.distributed import init_distributed, process_group_backend

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 2.0


# --- item 8: object collectives on gloo, with the config's timeout --------------------------------
def _skewed_ranks(rank: int, init: str, out: str, released: Any) -> None:
    """Rank 1 gathers once, then stays away from the barrier (a rank still generating) until rank
    0 has given up waiting for it."""
    import torch.distributed as dist

    from dapo_core.train.collective import open_collective

    init_distributed(rank, 2, init, device="cpu")
    try:
        coll = open_collective(TIMEOUT_S)
        backend = coll.objects._get_backend(torch.device("cpu"))
        report: dict[str, Any] = {
            "backend": str(dist.get_backend(coll.objects)),
            "timeout_s": backend.options._timeout.total_seconds(),
            "gathered": coll.all_gather_object(rank * 10),
            "broadcast": coll.broadcast_object(f"from {rank}", src=1),
        }
        if rank == 0:
            t0 = time.monotonic()
            try:
                coll.barrier()
                report["barrier"] = "returned"
            except Exception as exc:  # gloo's timeout, as the run would see it
                report["barrier"] = str(exc).splitlines()[0]
            report["waited_s"] = time.monotonic() - t0
            torch.save(report, out)
            released.set()
        else:
            released.wait(60)
    finally:
        dist.destroy_process_group()


def test_object_collectives_wait_on_gloo_for_the_configured_timeout(tmp_path: Path) -> None:
    out = tmp_path / "report.pt"
    released = mp.get_context("spawn").Event()
    mp.spawn(_skewed_ranks, args=(f"tcp://127.0.0.1:{free_port()}", str(out), released), nprocs=2)
    report = torch.load(out, weights_only=True)
    assert report["backend"] == "gloo" and report["timeout_s"] == TIMEOUT_S
    assert report["gathered"] == [0, 10] and report["broadcast"] == "from 1"
    # The default group's timeout is 1800 s: rank 0 giving up within seconds shows the barrier
    # ran on the object group, with the configured timeout.
    assert report["barrier"] != "returned"
    assert "timeout" in report["barrier"].lower() or "timed out" in report["barrier"].lower()
    assert TIMEOUT_S * 0.9 <= report["waited_s"] < 60


def test_collective_timeout_is_a_validated_resumable_run_field() -> None:
    from dapo_core.train.runner import RESUMABLE_CHANGES

    assert ExperimentConfig().run.collective_timeout_s == 1800.0
    cfg = ExperimentConfig().with_overrides({"run.collective_timeout_s": 7200})
    assert cfg.run.collective_timeout_s == 7200
    with pytest.raises(ConfigError, match=r"^run.collective_timeout_s=0(\.0)? must be > 0"):
        ExperimentConfig().with_overrides({"run.collective_timeout_s": 0})
    assert "run.collective_timeout_s" in RESUMABLE_CHANGES


# --- item 8: the CUDA random stream of this device only ----------------------------------------
class FakeCuda:
    """torch.cuda's random-stream functions over `count` fake devices, current device `current`;
    records which devices were read or written (the real get/set_rng_state_all loop over
    torch.cuda.random's own get/set_rng_state, patched as well)."""

    def __init__(self, count: int, current: int) -> None:
        self.count, self.current = count, current
        self.read: list[int] = []
        self.written: dict[int, torch.Tensor] = {}

    def _index(self, device: Any) -> int:
        if device in ("cuda", None, -1):
            return self.current
        index = device if isinstance(device, int) else torch.device(device).index
        if index is None:
            return self.current
        if not 0 <= index < self.count:  # torch: "invalid device ordinal"
            raise RuntimeError(f"CUDA error: invalid device ordinal {index}")
        return int(index)

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        index = self._index(device)
        self.read.append(index)
        return torch.full((8,), index, dtype=torch.uint8)

    def set_rng_state(self, state: torch.Tensor, device: Any = "cuda") -> None:
        self.written[self._index(device)] = state

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        for module in (torch.cuda, torch.cuda.random):
            monkeypatch.setattr(module, "get_rng_state", self.get_rng_state)
            monkeypatch.setattr(module, "set_rng_state", self.set_rng_state)
        monkeypatch.setattr(torch.cuda.random, "device_count", lambda: self.count)


def test_only_the_current_devices_cuda_stream_is_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(count=4, current=2)
    cuda.install(monkeypatch)
    state = rng.rng_state()
    assert cuda.read == [2]  # get_rng_state_all would touch 0, 1, 2, 3
    assert torch.equal(state["cuda"], torch.full((8,), 2, dtype=torch.uint8))


def test_a_cuda_stream_restores_on_fewer_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # Written by a process that saw 4 GPUs, restored where 1 is visible (a Ray actor's view).
    cuda = FakeCuda(count=4, current=0)
    cuda.install(monkeypatch)
    old_format = rng.rng_state()
    old_format["cuda"] = [torch.full((8,), i, dtype=torch.uint8) for i in range(4)]
    new_format = rng.rng_state()
    few = FakeCuda(count=1, current=0)
    few.install(monkeypatch)
    rng.set_rng_state(old_format)  # set_rng_state_all would ask for devices 1..3
    assert list(few.written) == [0] and torch.equal(few.written[0], old_format["cuda"][0])
    few.written.clear()
    rng.set_rng_state(new_format)
    assert list(few.written) == [0] and torch.equal(few.written[0], new_format["cuda"])
    # A list with no entry for this device leaves the stream alone instead of failing.
    third = FakeCuda(count=4, current=3)
    third.install(monkeypatch)
    rng.set_rng_state({**old_format, "cuda": old_format["cuda"][:2]})
    assert third.written == {}


# --- item 9: CPU offload on NCCL -------------------------------------------------------------------
def test_the_backend_for_cuda_with_cpu_offload_adds_gloo() -> None:
    assert process_group_backend("cpu") == "gloo"
    assert process_group_backend("cpu", cpu_offload=True) == "gloo"
    assert process_group_backend("cuda") == "nccl"
    assert process_group_backend("cuda", cpu_offload=True) == "cpu:gloo,cuda:nccl"


def test_init_distributed_joins_with_the_offload_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    joined: list[tuple[str, dict[str, Any]]] = []
    devices: list[torch.device] = []
    monkeypatch.setattr(dist, "init_process_group", lambda b, **kw: joined.append((b, kw)))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    got = init_distributed(3, 4, "tcp://127.0.0.1:1", device="cuda", cpu_offload=True)
    assert got == torch.device("cuda", 1) and devices == [got]
    init_distributed(3, 4, "tcp://127.0.0.1:1", device="cuda", timeout_s=60)
    assert [b for b, _ in joined] == ["cpu:gloo,cuda:nccl", "nccl"]
    assert joined[1][1]["timeout"] == datetime.timedelta(seconds=60)
