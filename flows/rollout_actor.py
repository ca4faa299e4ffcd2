"""The rollout engine on a Ray actor of its own (`--rollout-actor`): its own CPUs or GPUs, on a
node Ray picks (or one offering `--rollout-resource`), apart from the trainer's.

dapo_core knows nothing of Ray: its runs take an `EngineHost` (dapo_core.engines.base), a
function that is handed the engine's recipe (a picklable call that builds the engine) and
returns the engine to sample with. `actor_host` is that function for Ray: it starts an
`EngineActor`, which builds the engine from the recipe in its own process (the recipe carries
the model's weights at that moment), and returns a `RemoteEngine`, the protocol's methods as
calls to the actor. Weights go to the actor after each update as they would to a local engine
(`load_weights`, through Ray's object store); the engine's random stream lives in the actor
and is checkpointed through `state_dict` as before, so a run samples the same tokens wherever
its engine is.

In async mode (docs/async.md) the rollout worker's thread waits on the actor while it
generates, so the trainer's update and the generation run in two processes on their own
CPUs, not on one process's threads. The actor does not restart: if it (or its node) is lost,
the training raises, the arm's try ends as a lost actor and the flow's retry resumes the run
from its checkpoint, with a new engine actor; the groups in flight are regenerated from the
checkpoint's cursor, never trained twice.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from dapo_common.util import first_line

if TYPE_CHECKING:  # the driver imports this module; torch only where an engine runs
    from dapo_core.engines.base import Completion, EngineHost, RolloutEngine, SamplingParams


@dataclass(frozen=True)
class RolloutPlacement:
    """Where an arm's rollout engines go: one actor per training worker, each asking Ray for
    `cpus` CPUs and `gpus` GPUs and, when `resource` is named, a sliver of that custom resource
    (a node started with `--resources '{"<name>": 1}'` takes the engines)."""

    cpus: float = 1.0
    gpus: float = 0.0
    resource: str = ""

    def bundle(self) -> dict[str, float]:
        """The actor's resources as a placement-group bundle."""
        out = {"CPU": self.cpus}
        if self.gpus > 0:
            out["GPU"] = self.gpus
        if self.resource:
            out[self.resource] = RESOURCE_SHARE
        return out


# What an engine actor takes of a custom resource: a node offering 1 holds up to 1,000 engines.
RESOURCE_SHARE = 0.001


@ray.remote(max_restarts=0, max_task_retries=0)
class EngineActor:
    """Builds a run's rollout engine in its own process and serves the protocol's calls, one at
    a time, in the order they come."""

    def __init__(self, recipe: Callable[[], RolloutEngine], deterministic: bool) -> None:
        import torch

        granted = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        torch.set_num_threads(max(1, int(granted)))
        if deterministic:  # as the trainer's own process on CPU (runner.setup_torch)
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.engine = recipe()

    def generate(self, prompts: list[str], sampling: SamplingParams) -> list[Completion]:
        return self.engine.generate(prompts, sampling)

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        self.engine.load_weights(state_dict)

    def state_dict(self) -> dict[str, Any]:
        return self.engine.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.engine.load_state_dict(state)

    def close(self) -> None:
        self.engine.close()

    def where(self) -> dict[str, Any]:
        """The node and process the engine runs in."""
        from flows import cluster

        return {**cluster.here(), "pid": os.getpid()}


class RemoteEngine:
    """A RolloutEngine whose every call runs on an EngineActor and is waited for here."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._closed = False

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        return list(ray.get(self.actor.generate.remote(list(prompts), sampling)))

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        # Detached CPU tensors: what Ray's serializer ships without the autograd graph.
        weights = {k: v.detach().cpu() for k, v in state_dict.items()}
        ray.get(self.actor.load_weights.remote(weights))

    def state_dict(self) -> dict[str, Any]:
        return dict(ray.get(self.actor.state_dict.remote()))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        ray.get(self.actor.load_state_dict.remote(dict(state)))

    def where(self) -> dict[str, Any]:
        return dict(ray.get(self.actor.where.remote()))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The engine gives back what it holds; the actor goes whether or not it answered.
        with contextlib.suppress(Exception):
            ray.get(self.actor.close.remote(), timeout=60)
        with contextlib.suppress(Exception):
            ray.kill(self.actor)


def actor_host(
    placement: RolloutPlacement,
    *,
    deterministic: bool,
    wait_s: float,
    scheduling: Callable[[int], Any] | None = None,
) -> EngineHost:
    """The EngineHost that puts each engine asked of it on an EngineActor of `placement`'s
    resources, waiting up to `wait_s` for Ray to place it (0: without limit). `scheduling(i)`,
    when given, is the i-th engine's scheduling strategy (a bundle of the arm's placement
    group); without it Ray places the actor by its resources alone."""
    made = 0

    def host(recipe: Callable[[], RolloutEngine]) -> RolloutEngine:
        nonlocal made
        options: dict[str, Any] = {"num_cpus": placement.cpus, "num_gpus": placement.gpus}
        if placement.resource:
            options["resources"] = {placement.resource: RESOURCE_SHARE}
        if scheduling is not None:
            options["scheduling_strategy"] = scheduling(made)
        made += 1
        actor = EngineActor.options(**options).remote(recipe, deterministic)  # type: ignore[attr-defined]
        engine = RemoteEngine(actor)
        try:
            # The engine is built (or its recipe raised) before training starts; an actor Ray
            # cannot place (no node offers its resources) gives up as an arm's group does.
            ray.get(actor.where.remote(), timeout=wait_s if wait_s > 0 else None)
        except ray.exceptions.GetTimeoutError:
            engine.close()
            raise RuntimeError(
                f"could not place the rollout engine's actor ({placement.bundle()}) within "
                f"{wait_s:g} s ($DAPO_PLACEMENT_WAIT_S): no live node has it free"
            ) from None
        except ray.exceptions.RayActorError as exc:
            engine.close()
            raise RuntimeError(
                f"the rollout engine's Ray actor did not start: {first_line(exc)}"
            ) from None
        except BaseException:
            engine.close()
            raise
        return engine

    return host


def placement_of(resources: Any) -> RolloutPlacement | None:
    """An arm's RolloutPlacement from its Resources (flows.params): None without rollout_actor."""
    if not resources.rollout_actor:
        return None
    return RolloutPlacement(
        resources.rollout_cpus, resources.rollout_gpus, resources.rollout_resource
    )


def host_for(
    placement: RolloutPlacement | None,
    config: Mapping[str, Any],
    *,
    wait_s: float,
    group: Any = None,
    bundle_index: int = 0,
) -> EngineHost | None:
    """The EngineHost a training actor uses for `placement` (None: the engine in its own
    process), waiting up to `wait_s` for its actor's placement (flows.ray_worker's placement
    wait). With `group` (the arm's placement group), its engine goes into bundle
    `bundle_index`. The engine computes as the trainer would: deterministic kernels on CPU."""
    if placement is None:
        return None
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from dapo_core.train.runner import resolve_device

    # The config was validated by the caller; only its device is needed here.
    device = resolve_device(str(config.get("run", {}).get("device", "auto")))
    scheduling = None
    if group is not None:

        def scheduling(i: int) -> Any:
            return PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=bundle_index + i
            )

    return actor_host(
        placement, deterministic=device == "cpu", wait_s=wait_s, scheduling=scheduling
    )
