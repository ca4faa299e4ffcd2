"""How the ranks of one arm talk: the few collectives the trainer needs, behind one protocol.

`LOCAL` is the single-process case (every collective is the identity), so the trainer has one
code path for 1 and N workers. `TorchCollective` uses torch.distributed's default process group
(gloo on CPU, NCCL on GPU) for tensors, which it moves to the backend's device and back, and
a gloo group for objects and barriers (`objects`, see `open_collective`).
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


class Collective(Protocol):
    rank: int
    world_size: int

    def all_gather_object(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order."""
        ...

    def all_reduce_sum(self, x: Tensor) -> Tensor:
        """Element-wise sum over ranks (a new tensor; float64 keeps counts exact)."""
        ...

    def broadcast_object(self, obj: T, src: int = 0) -> T:
        """Rank `src`'s `obj` on every rank."""
        ...

    def barrier(self) -> None: ...


class LocalCollective:
    """One process: rank 0 of 1."""

    rank = 0
    world_size = 1

    def all_gather_object(self, obj: T) -> list[T]:
        return [obj]

    def all_reduce_sum(self, x: Tensor) -> Tensor:
        return x.clone()

    def broadcast_object(self, obj: T, src: int = 0) -> T:
        return obj

    def barrier(self) -> None:
        return None


LOCAL = LocalCollective()


class TorchCollective:
    """A torch.distributed group (initialised by the caller): the default one, or `group` (a
    subgroup of it, e.g. the workers of one arm when a job holds several)."""

    def __init__(self, group: Any | None = None, *, objects: Any | None = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        # Object collectives and barriers go here (the same ranks as `group`).
        self.objects = group if objects is None else objects
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        backend = str(dist.get_backend(group))
        self._device = (
            torch.device("cuda", torch.cuda.current_device())
            if "nccl" in backend  # also "cpu:gloo,cuda:nccl" (CPU offload)
            else torch.device("cpu")
        )

    def all_gather_object(self, obj: T) -> list[T]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj, group=self.objects)
        return out

    def all_reduce_sum(self, x: Tensor) -> Tensor:
        y = x.detach().to(self._device, copy=True)
        self._dist.all_reduce(y, group=self.group)
        return y.to(x.device)

    def broadcast_object(self, obj: T, src: int = 0) -> T:
        box: list[Any] = [obj]
        # `src` is a rank of this group; torch names the source by its global rank.
        self._dist.broadcast_object_list(box, src=self._global(src), group=self.objects)
        return box[0]  # type: ignore[no-any-return]

    def barrier(self) -> None:
        self._dist.barrier(group=self.objects)

    def _global(self, rank: int) -> int:
        if self.objects is None:
            return rank
        return int(self._dist.get_global_rank(self.objects, rank))


def open_collective(timeout_s: float) -> TorchCollective:
    """The collective of a training job over every rank of the default process group (already
    initialised), its objects and barriers on a new gloo group that waits `timeout_s` seconds.

    On NCCL an object collective pickles through GPU memory and waits under NCCL's watchdog: a
    rank that is still generating (ranks' rollouts and evaluations take different times) would
    end the run at the default group's timeout. On gloo they wait on the host for as long as
    run.collective_timeout_s says. Every rank must call this, in the same order (new_group)."""
    import datetime

    import torch.distributed as dist

    objects = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return TorchCollective(objects=objects)


def shard(items: list[T], rank: int, world_size: int) -> list[T]:
    """This rank's share of a list: every world_size-th item from `rank` (lengths differ by ≤ 1)."""
    return items[rank::world_size]


def full_tensor(
    t: Tensor, *, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> Tensor:
    """The whole of a (possibly FSDP-sharded) tensor on every rank, optionally cast to `dtype`.

    A DTensor's local shard is cast (and moved to the collective's `device`: with CPU offload it
    lives in host memory) before the all-gather, so a bfloat16 gather moves half the bytes of a
    float32 one and the full tensor never exists in float32. A plain tensor is cast and returned.
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t.detach().to(device=device or t.device, dtype=dtype or t.dtype)
    local = t.to_local().detach().to(device=device or t.to_local().device, dtype=dtype or t.dtype)
    whole = DTensor.from_local(
        local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride()
    )
    return whole.full_tensor()
