"""Facts about the Ray cluster an arm runs on: its nodes, where an arm's workers were placed,
whether the runs directory is shared, how much memory its GPUs have.

Decisions are plain functions over rows shaped like `ray.nodes()` (NodeID, NodeManagerAddress,
NodeManagerHostname, Alive, Resources), so tests call them with rows of their own; the few
functions that ask Ray say so (they need a `ray_worker.connect()` first).

The runs directory (DAPO_RUNS_DIR) holds every checkpoint; on a cluster every node must see
it: rank r of an arm writes its shards there, and a retry on another node resumes from there.
`runs_dir_warning` decides from the file system type that /proc/mounts gives the directory's
mount: a network file system (NFS, SMB/CIFS, CephFS, GlusterFS, Lustre, GPFS, BeeGFS, ...) or
a FUSE mount (sshfs, s3fs, gcsfuse, JuiceFS: in practice network-backed) counts as shared;
anything else (ext4, xfs, btrfs, zfs, tmpfs, overlay: /tmp included) as local to one machine.
It cannot tell a local disk that happens to be the same on every node (all nodes on one
machine, as in the tests): the warning then says so rather than stays silent.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flows.params import Resources

NodeRow = Mapping[str, Any]
HOST_MAX_CHARS = 255  # the store's runs.host column
NODE_ID_CHARS = 8  # of Ray's 56 hex digits: enough to tell a cluster's nodes apart

NETWORK_FILE_SYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "cephfs",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "orangefs",
        "pvfs2",
        "afs",
        "ocfs2",
        "gfs2",
        "wekafs",
        "panfs",
    }
)

# GiB of GPU memory per Ray accelerator type (the `accelerator_type:<X>` resource Ray puts on
# a GPU node), as torch.cuda reports total_memory rounded down (dapo_core.setup.plan's GPU_SIZES
# for the 80 GB and 141 GB parts); an ambiguous name takes its smallest variant (A100: 40 GB),
# so the plan refuses rather than over-commits. Other types are unknown: no check.
GPU_MEMORY_GIB = {
    "H200": 139.0,
    "H100": 79.0,
    "A100-80G": 79.0,
    "A100-40G": 39.0,
    "A100": 39.0,
    "L40S": 44.0,
    "L40": 44.0,
    "A40": 44.0,
    "A10G": 22.0,
    "L4": 22.0,
    "V100": 15.0,
    "T4": 14.0,
}


# --- where an arm ran ------------------------------------------------------------------------
def here() -> dict[str, Any]:
    """Where the calling Ray worker runs: {node_id, ip, hostname} (called inside an actor)."""
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
    }


def node_label(place: Mapping[str, Any]) -> str:
    """`1a2b3c4d@10.0.0.5`: the node's id (its first 8 hex digits) and address."""
    return f"{str(place['node_id'])[:NODE_ID_CHARS]}@{place['ip']}"


def describe(places: Sequence[Mapping[str, Any]]) -> str:
    """The store's `host` of a run: where each worker ran, by host, node and rank.

    One worker: `gpu-7 (node 1a2b3c4d@10.0.0.5)`. N workers: `gpu-7 (node 1a2b3c4d@10.0.0.5:
    ranks 0-3; node 5e6f7a8b@10.0.0.6: rank 4)` (ranks in each place's `rank`, else its index);
    hosts in rank order, `; ` between them. Cut to the column's 255 characters.
    """
    if len(places) == 1:
        text = f"{places[0]['hostname']} (node {node_label(places[0])})"
        return _cut(text)
    by_host: dict[str, dict[str, list[int]]] = {}
    for index, place in enumerate(places):
        rank = int(place.get("rank", index))
        by_host.setdefault(str(place["hostname"]), {}).setdefault(node_label(place), []).append(
            rank
        )
    parts = []
    for host, nodes in by_host.items():
        inner = "; ".join(f"node {label}: {_ranks(ranks)}" for label, ranks in nodes.items())
        parts.append(f"{host} ({inner})")
    return _cut("; ".join(parts))


def _ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    spans: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return "ranks " + ",".join(spans)


def _cut(text: str) -> str:
    return text if len(text) <= HOST_MAX_CHARS else text[: HOST_MAX_CHARS - 1] + "…"


# --- the nodes ---------------------------------------------------------------------------------
def alive_nodes() -> list[dict[str, Any]]:
    """`ray.nodes()` rows of the nodes alive now (asks Ray)."""
    import ray

    return [dict(n) for n in ray.nodes() if n.get("Alive")]


def node_alive(node_id: str) -> bool | None:
    """Whether Ray still counts node `node_id` alive (None: Ray does not know it; asks Ray)."""
    import ray

    for n in ray.nodes():
        if n.get("NodeID") == node_id:
            return bool(n.get("Alive"))
    return None


def check_bundles(nodes: Sequence[NodeRow], resources: Resources) -> None:
    """Each worker of an arm is one bundle that must fit on ONE node: a worker asking for more
    CPUs or GPUs than the biggest node has would wait forever. One line (ValueError)."""
    if not nodes:
        return
    for key, want in (("CPU", resources.cpus), ("GPU", resources.gpus)):
        biggest = max(float(dict(n.get("Resources") or {}).get(key, 0.0)) for n in nodes)
        if want > 0 and biggest + 1e-9 < want:
            who = "each worker" if resources.workers > 1 else "each arm"
            raise ValueError(
                f"{who} asks for {want:g} {key}(s) on one node, but the biggest node of the "
                f"Ray cluster has {biggest:g}: lower resources.{key.lower()}s"
                + (" (and raise resources.workers)" if key == "CPU" else "")
            )


def gpu_memory_gib(nodes: Sequence[NodeRow]) -> float | None:
    """The smallest GPU memory of the cluster's GPU nodes, from their accelerator type; None
    when a GPU node's type is missing or not in GPU_MEMORY_GIB (the plan is then skipped)."""
    sizes = []
    for n in nodes:
        res = dict(n.get("Resources") or {})
        if float(res.get("GPU", 0.0)) <= 0:
            continue
        kinds = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
        known = [GPU_MEMORY_GIB[k] for k in kinds if k in GPU_MEMORY_GIB]
        if not known:
            return None
        sizes.append(min(known))
    return min(sizes) if sizes else None


def uses_gpus(resources: Resources) -> bool:
    """Whether an arm's trainers or its engines' actors ask for GPUs (their plans are checked)."""
    return resources.gpus > 0 or (resources.rollout_actor and resources.rollout_gpus > 0)


def check_arm_plan(
    configs: Iterable[Mapping[str, Any]], resources: Resources, gpu_memory: float | None
) -> None:
    """What the trainer would refuse for this many workers (dapo_core's check_workers), and,
    for a GPU run on GPUs of known memory, the memory plan (`dapo plan`): one line each. With
    the engines on actors of their own, the trainer is planned without its engine, and an
    engine given GPUs is planned on a GPU of its own (`dapo plan --rollout-actor`)."""
    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.setup.plan import check_engine_fits, check_fits
    from dapo_core.train.distributed import check_workers

    apart = resources.rollout_actor
    for config in configs:
        cfg = ExperimentConfig.from_dict(dict(config))
        check_workers(cfg, resources.workers)
        if gpu_memory is None:
            continue
        if resources.gpus > 0:
            check_fits(cfg, resources.workers, gpu_memory, engine_apart=apart)
        if apart and resources.rollout_gpus > 0:
            check_engine_fits(cfg, resources.workers, gpu_memory)


def preflight(
    address: str | None, resources: Resources, configs: Iterable[Mapping[str, Any]]
) -> None:
    """`dapo sweep` / `dapo arm` before anything is written: the worker count against each
    config; for a GPU run, the plan is checked against the GPUs' memory of the Ray cluster the
    caller has joined (ray_worker.connect)."""
    gpu_memory = None
    if uses_gpus(resources):
        gpu_memory = gpu_memory_gib(alive_nodes())
    check_arm_plan(configs, resources, gpu_memory)


def check_placement(
    resources: Resources, configs: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """In a flow, after connect(): check_bundles and check_arm_plan against the cluster's live
    nodes (asks Ray); returns them."""
    nodes = alive_nodes()
    check_bundles(nodes, resources)
    check_arm_plan(configs, resources, gpu_memory_gib(nodes) if uses_gpus(resources) else None)
    return nodes


# --- storage -----------------------------------------------------------------------------------
def mount_of(path: Path, mounts: str) -> tuple[str, str]:
    """(mount point, file system type) of the mount holding `path`, from /proc/mounts text.

    The path need not exist yet: its nearest existing ancestor decides (resolved, so a symlink
    into a shared mount counts as shared)."""
    probe, rest = Path(path).expanduser().absolute(), Path()
    while not probe.exists() and probe != probe.parent:
        probe, rest = probe.parent, Path(probe.name) / rest
    target = str(probe.resolve() / rest).rstrip("/") or "/"
    best = ("/", "unknown")
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # /proc/mounts escapes blanks in mount points as octal (\040 is a space).
        point = fields[1].encode().decode("unicode_escape")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fields[2])
    return best


def is_shared_fs(fstype: str) -> bool:
    return fstype in NETWORK_FILE_SYSTEMS or fstype.startswith("fuse.")


def unplanned_warning(resources: Resources, nodes: Sequence[NodeRow]) -> str | None:
    """One line when a GPU run's memory plan could not be checked (a GPU type Ray reports that
    GPU_MEMORY_GIB does not know), so that a skipped check is never silent."""
    if not uses_gpus(resources) or gpu_memory_gib(nodes) is not None:
        return None
    kinds = sorted(
        {
            k.split(":", 1)[1]
            for n in nodes
            for k in dict(n.get("Resources") or {})
            if k.startswith("accelerator_type:")
        }
    )
    return (
        f"warning: the memory plan was not checked: the cluster's GPU type "
        f"({', '.join(kinds) or 'not reported'}) is not one of {', '.join(GPU_MEMORY_GIB)}; "
        "check it with `dapo plan --preset P --workers N --gpu-memory GiB`"
    )


def runs_dir_warning(
    runs_dir: Path, nodes: Sequence[NodeRow], mounts: str | None = None
) -> str | None:
    """One line when a cluster of more than one node would keep checkpoints on a file system
    local to one machine (see the module docstring); None otherwise."""
    if len(nodes) <= 1:
        return None
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None  # not Linux: nothing to decide from
    point, fstype = mount_of(runs_dir, mounts)
    if is_shared_fs(fstype):
        return None
    addresses = sorted({str(n.get("NodeManagerAddress")) for n in nodes})
    where = (
        f"; its {len(nodes)} nodes all run on {addresses[0]}, so they see it, but a node on "
        "another machine would not"
        if len(addresses) == 1
        else ""
    )
    return (
        f"warning: the runs directory {runs_dir} (DAPO_RUNS_DIR) is on a local file system "
        f"({fstype} at {point}) and the Ray cluster has {len(nodes)} nodes: workers on other "
        "machines would write checkpoints no other node can read, and a retry on another node "
        f"could not resume; set DAPO_RUNS_DIR to a mount every node shares (NFS, ...){where}"
    )
