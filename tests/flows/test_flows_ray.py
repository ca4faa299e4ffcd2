"""The flows' Ray side: a local Ray instance listens on 127.0.0.1 only (issue 14.15), and a
driver set up that way still joins a cluster at the machine's own address; where arms run
(the store's host, the runs-directory warning, bundles and the GPU memory plan); arms of N
workers (issue 11 §2): one placement group, a lost rank ending the try, `dapo sweep --workers 2`.

Each driver runs in its own interpreter (ray.init is once per process), which shuts its Ray
down before it exits: nothing is left running. The tests of a local Ray start their own; the
others join the session's warm Ray (conftest.warm_ray). The multi-node cluster is
tests/flows/test_cluster.py's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dapo_cli import FLOW_TEST_TIMEOUT_S, ROOT, SMALL, dapo, store_env
from ray_cluster import RayCluster

# Prints every TCP port that the driver and the processes Ray started for it listen on.
LISTENING = """
import glob, json, os
from flows import ray_worker

ray_worker.connect("local", num_cpus=1)
import ray

def children(pid):
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.split("/")[2]))
    return found

tree, i = [os.getpid()], 0
while i < len(tree):
    tree += children(tree[i])
    i += 1
inodes = set()
for pid in tree:
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
listening = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:
            listening.append(fields[1].split(":")[0])
print(json.dumps({"gcs": ray.get_runtime_context().gcs_address, "listening": listening}))
ray_worker.shutdown()
"""

# Hex forms of the loopback address in /proc/net/tcp{,6}: 127.0.0.1, ::ffff:127.0.0.1, ::1.
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)  # unless `extra` names one
    return {**env, **extra}


def _python(
    code: str, *args: str, cwd: Path, timeout: float = 600, **env: str
) -> subprocess.CompletedProcess[str]:
    """`code` run to its end in an interpreter of its own (so its own Ray), `args` as its
    sys.argv[1:] and `env` added to _env(); output captured."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=_env(**env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_local_ray_instance_listens_on_loopback_only(tmp_path: Path) -> None:
    """It listened on every interface (0.0.0.0 and ::): GCS, raylet, workers and agents."""
    done = _python(LISTENING, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["gcs"].startswith("127.0.0.1:")
    assert len(found["listening"]) >= 3, found  # GCS, raylet, a worker at least
    assert set(found["listening"]) <= LOOPBACK, found


HEAD = """
import os, sys, time
import ray
ray.init(address="local", num_cpus=1, include_dashboard=False,
         object_store_memory=128 * 1024 * 1024)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.readline()  # until the joining driver is done
ray.shutdown()
"""

JOIN = """
import sys
from flows import ray_worker
ray_worker.connect(sys.argv[1])
import ray

@ray.remote
def one():
    return 1

print("joined", ray.get(one.remote()), flush=True)
ray_worker.shutdown()
"""


def test_a_driver_bound_to_loopback_still_joins_a_cluster_at_the_machines_address(
    tmp_path: Path,
) -> None:
    """A cluster started the way `ray start` starts one (on the machine's own address) must
    stay reachable through $RAY_ADDRESS from flows that bind their own Ray to loopback."""
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD],
        env=_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1"),  # Ray's default on Linux
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert head.stdout is not None and head.stdin is not None
        address = head.stdout.readline().strip()
        assert address and not address.startswith("127."), address
        joined = _python(JOIN, address, cwd=tmp_path)
        assert joined.returncode == 0, joined.stderr[-3000:]
        assert "joined 1" in joined.stdout
        head.stdin.write("done\n")
        head.stdin.flush()
        assert head.wait(timeout=60) == 0
    finally:
        if head.poll() is None:
            head.kill()
            head.wait()


# --- where arms run: plain decisions over rows shaped like ray.nodes() -----------------------
def _node(node_id: str, ip: str, cpus: float, **extra: float) -> dict[str, object]:
    return {
        "NodeID": node_id * 7,
        "NodeManagerAddress": ip,
        "Alive": True,
        "Resources": {"CPU": cpus, **extra},
    }


def test_the_store_host_names_each_workers_node_and_rank() -> None:
    from flows.cluster import describe

    a = {"node_id": "1a2b3c4d" + "0" * 48, "ip": "10.0.0.5", "hostname": "gpu-7"}
    b = {"node_id": "5e6f7a8b" + "0" * 48, "ip": "10.0.0.6", "hostname": "gpu-8"}
    assert describe([a]) == "gpu-7 (node 1a2b3c4d@10.0.0.5)"
    # Four ranks packed on one node, then one on another host: ranges, hosts in rank order.
    places = [{**a, "rank": r} for r in range(4)] + [{**b, "rank": 4}]
    assert describe(places) == (
        "gpu-7 (node 1a2b3c4d@10.0.0.5: ranks 0-3); gpu-8 (node 5e6f7a8b@10.0.0.6: rank 4)"
    )
    # One machine, two nodes (as in tests/flows/test_cluster.py): the node tells them apart.
    same_host = {**b, "hostname": "gpu-7"}
    assert describe([{**a, "rank": 0}, {**same_host, "rank": 1}, {**a, "rank": 2}]) == (
        "gpu-7 (node 1a2b3c4d@10.0.0.5: ranks 0,2; node 5e6f7a8b@10.0.0.6: rank 1)"
    )
    # 64 workers on 64 nodes still fit the store's column (255 characters).
    many = [
        {"node_id": f"{i:08x}" + "0" * 48, "ip": f"10.0.1.{i}", "hostname": "h", "rank": i}
        for i in range(64)
    ]
    text = describe(many)
    assert len(text) == 255 and text.endswith("…")


MOUNTS = """\
overlay / overlay rw,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid 0 0
nas:/export/runs /mnt/shared\\040runs nfs4 rw,relatime 0 0
s3fs /mnt/bucket fuse.s3fs rw 0 0
"""


def test_a_runs_directory_on_a_local_file_system_is_warned_about_on_a_cluster() -> None:
    from flows.cluster import mount_of, runs_dir_warning

    one = [_node("a", "10.0.0.5", 2)]
    two = [*one, _node("b", "10.0.0.6", 2)]
    # Decided by the mount's file system type (the path need not exist yet).
    assert mount_of(Path("/tmp/dapo/runs"), MOUNTS) == ("/tmp", "tmpfs")
    assert mount_of(Path("/mnt/shared runs/x"), MOUNTS) == ("/mnt/shared runs", "nfs4")
    assert mount_of(Path("/home/me/runs"), MOUNTS) == ("/", "overlay")
    warning = runs_dir_warning(Path("/tmp/dapo/runs"), two, MOUNTS)
    assert warning is not None and "\n" not in warning
    assert warning.startswith("warning: the runs directory /tmp/dapo/runs (DAPO_RUNS_DIR)")
    assert "(tmpfs at /tmp)" in warning and "has 2 nodes" in warning
    assert "so they see it" not in warning  # two machines
    # Shared mounts, and a single node, say nothing.
    assert runs_dir_warning(Path("/mnt/shared runs/x"), two, MOUNTS) is None
    assert runs_dir_warning(Path("/mnt/bucket/runs"), two, MOUNTS) is None
    assert runs_dir_warning(Path("/tmp/dapo/runs"), one, MOUNTS) is None
    # Two nodes of one machine see the same local disk: the warning says so.
    local = [_node("a", "10.0.0.5", 2), _node("b", "10.0.0.5", 2)]
    assert "its 2 nodes all run on 10.0.0.5, so they see it" in str(
        runs_dir_warning(Path("/tmp/x"), local, MOUNTS)
    )


def test_placement_refuses_a_worker_no_node_can_hold_and_plans_gpu_memory() -> None:
    from dapo_core.setup.plan import PlanError
    from dapo_core.setup.presets import preset_config
    from flows import plan
    from flows.cluster import check_arm_plan, check_bundles, gpu_memory_gib, unplanned_warning
    from flows.params import Resources

    nodes = [_node("a", "10.0.0.5", 2), _node("b", "10.0.0.6", 2)]
    check_bundles(nodes, Resources(cpus=2, workers=2))  # one worker per node
    # 4 CPUs in all, but no node has 3: the group would wait forever.
    with pytest.raises(ValueError, match=r"^each worker asks for 3 CPU\(s\) on one node"):
        check_bundles(nodes, Resources(cpus=3, workers=1 + 1))
    # An arm of N workers holds N bundles: 2 arms of 2 × 1 CPU at once on 4 CPUs, and the
    # cluster's totals must hold all N.
    assert plan.concurrency({"CPU": 4.0}, Resources(cpus=1, workers=2), 6) == 2
    assert plan.concurrency({"CPU": 4.0, "GPU": 4.0}, Resources(gpus=1, workers=4), 6) == 1
    with pytest.raises(ValueError, match=r"asks for 4 workers × 1 CPU\(s\) but the Ray cluster"):
        plan.check_fits({"CPU": 3.0}, Resources(cpus=1, workers=4))

    # GPU memory from Ray's accelerator type; an unknown type skips the plan.
    h100 = [_node("g", "10.0.0.7", 16, GPU=8, **{"accelerator_type:H100": 1})]
    assert gpu_memory_gib(h100) == 79.0
    assert gpu_memory_gib([_node("g", "10.0.0.7", 16, GPU=8)]) is None
    assert gpu_memory_gib(nodes) is None  # no GPU at all
    qwen7b = preset_config("qwen2.5-7b").to_dict()
    with pytest.raises(PlanError) as refused:
        check_arm_plan([qwen7b], Resources(gpus=1, workers=1), 79.0)
    assert "\n" not in str(refused.value) and "needs at least" in str(refused.value)
    check_arm_plan([qwen7b], Resources(gpus=1, workers=8), 79.0)
    check_arm_plan([qwen7b], Resources(gpus=1, workers=1), None)  # memory unknown: no check
    # ... but never silently: the sweep and the arm print one line naming the unknown type.
    b200 = [_node("g", "10.0.0.7", 16, GPU=8, **{"accelerator_type:B200": 1})]
    warning = unplanned_warning(Resources(gpus=1, workers=1), b200)
    assert warning is not None and "\n" not in warning
    assert warning.startswith("warning: the memory plan was not checked") and "(B200)" in warning
    assert unplanned_warning(Resources(gpus=1, workers=8), h100) is None
    assert unplanned_warning(Resources(workers=2), nodes) is None  # a CPU run plans nothing
    # What the trainer refuses on N workers is refused before anything starts.
    tiny_kl = preset_config("tiny").with_overrides({"algo.kl_coef": 0.1}).to_dict()
    with pytest.raises(ValueError, match=r"^algo.kl_coef=0.1: .* several workers"):
        check_arm_plan([tiny_kl], Resources(workers=2), None)


# --- N workers on a local Ray ----------------------------------------------------------------
GROUP = """
import json, sys
from flows import plan, ray_worker  # first: it binds a local Ray to loopback, as the flows do
import ray
from dapo_core.setup.ladders import paper_ladder
from db.store import Store
from flows.params import Resources

url, out = sys.argv[1], sys.argv[2]
small = {"batch.train_batch_size": 4, "batch.gen_batch_size": 4, "batch.mini_batch_size": 2,
         "rollout.group_size": 4, "run.checkpoint_every": 1, "run.steps": 8,
         "data.eval_problems": 8, "data.eval_k": 2}
cfg = paper_ladder().config("grpo", "tiny", small).to_dict()
store = Store(url)
sweep = store.create_sweep(name="g", preset="tiny", arms=["grpo"], seeds=[0], base_config=cfg,
                           ladder=paper_ladder().rows())
run = store.resume_attempt(sweep_id=sweep, arm="grpo", seed=0, config=cfg, config_hash="h",
                           after=None, resume_step=None, checkpoint_dir=out).run_id
owner = {"store": store.store_id, "sweep": sweep, "arm": "grpo", "seed": 0, "config_hash": "h"}
ray_worker.connect()  # the warm Ray ($RAY_ADDRESS), which other tests' groups may be on
ours = lambda: {i: g for i, g in ray.util.placement_group_table().items() if i not in before}
before = set(ray.util.placement_group_table())
report = {"places": [], "steps": []}

def kill_rank1(update):
    report["steps"].append(update.get("step"))
    if len(report["steps"]) == 1:  # a worker is lost mid-run
        ray.kill(ray.get_actor(plan.actor_name(run) + "-rank1", namespace=plan.ACTOR_NAMESPACE))

def train(owner, on_progress=None):
    try:
        ray_worker.run_training(run_id=run, config=cfg, store_url=url, out_dir=out, owner=owner,
                                resources=Resources(cpus=1, workers=2), on_progress=on_progress,
                                on_placed=report["places"].extend)
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    finally:
        report.setdefault("groups", []).append(sorted(g["state"] for g in ours().values()))
        report.setdefault("alive", []).append([alive(""), alive("-rank1")])

def alive(suffix):
    try:
        ray.get_actor(plan.actor_name(run) + suffix, namespace=plan.ACTOR_NAMESPACE)
    except ValueError:
        return False
    return True

report["lost"] = train(owner, kill_rank1)
report["refused"] = train({**owner, "arm": "dapo"})  # the directory is grpo's
print(json.dumps(report))
ray_worker.shutdown()
"""


@pytest.mark.e2e
@pytest.mark.timeout(FLOW_TEST_TIMEOUT_S)
def test_a_lost_worker_ends_the_try_and_frees_the_group(
    tmp_path: Path, warm_ray: RayCluster
) -> None:
    """Two workers in one placement group; rank 1's actor is killed after the first step:
    rank 0 (left waiting in a collective) is killed too, the try ends with ActorLost naming
    the worker, and the group is removed. A refusal raised by every rank (another run's
    directory) keeps its class and its one line."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    done = _python(
        GROUP,
        url,
        str(tmp_path / "run"),
        cwd=tmp_path,
        timeout=1200,
        OMP_NUM_THREADS="1",
        **warm_ray.client_env(),
    )
    assert done.returncode == 0, done.stderr[-5000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    kind, line = report["lost"]
    assert kind == "ActorLost" and "\n" not in line, report
    assert line.startswith("worker 1 of 2 on node ") and "(its actor died)" in line, line
    assert report["steps"][0] >= 1 and max(report["steps"]) < 8  # stopped mid-run
    assert [p["rank"] for p in report["places"][:2]] == [0, 1]
    assert report["groups"][0] == ["REMOVED"] and report["alive"][0] == [False, False]
    kind, line = report["refused"]
    assert kind == "NotOwner" and "\n" not in line, report
    assert report["groups"][1] == ["REMOVED", "REMOVED"] and report["alive"][1] == [False, False]


@pytest.mark.e2e
@pytest.mark.timeout(FLOW_TEST_TIMEOUT_S)
def test_a_two_worker_arm_inside_dapo_sweep_is_recorded_in_the_store(
    tmp_path: Path, warm_ray: RayCluster
) -> None:
    """Issue 11 §4: `dapo sweep --workers 2` through Prefect and Ray: two actors in one
    placement group, one run in the store with every step once and a sharded checkpoint."""
    from db import reads
    from db.engine import get_engine

    env = store_env(tmp_path, _env(), ray=warm_ray, OMP_NUM_THREADS="1")
    url = env["DAPO_DB_URL"]
    done = dapo("sweep", "--arms", "grpo", "--workers", "2", "--steps", "2", *SMALL, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 workers × (1 CPU), PACK; checkpoints in " + str(tmp_path / "runs") in done.stdout
    engine = get_engine(url)
    sweep = reads.latest_sweep_id(engine)
    assert sweep is not None
    (run_id,) = reads.runs_of_sweep(engine, sweep)["run_id"]
    run = reads.run_details(engine, int(run_id))
    assert (run["status"], run["tries"], run["steps"]) == ("completed", 1, 2)
    # One node (the warm Ray's, at the machine's address: tests/ray_cluster.py) holds both.
    assert re.fullmatch(r".+ \(node [0-9a-f]{8}@[0-9.]+: ranks 0-1\)", run["host"]), run["host"]
    step = Path(run["checkpoint_dir"]) / "checkpoints" / "step_2"
    assert sorted(p.name for p in (step / "ranks").iterdir()) == ["rank_0.pt", "rank_1.pt"]
    curves = reads.metric_curves(engine, [int(run_id)])
    assert (curves.groupby(["step", "name"]).size() == 1).all()
    assert sorted(set(curves["step"])) == [1, 2]
    # Metrics of both ranks in one row per step: rank 0 writes, with each rank's timings.
    assert {"time/rank0/step_s", "time/rank1/step_s", "acc/mean"} <= set(curves["name"])


def test_workers_and_placement_are_resources_in_the_forms_and_the_commands() -> None:
    """`workers` is a resource like cpus: in the Prefect forms (typed), in `dapo sweep` /
    `dapo arm`, and not in the config (a run may resume on another number of workers)."""
    from prefect.utilities.callables import parameter_schema

    from flows.arm import ablation_arm
    from flows.params import SweepParams, validate
    from flows.plan import sweep_jobs
    from flows.sweep import ablation_sweep

    for flow in (ablation_sweep, ablation_arm):
        form = parameter_schema(flow.fn).model_dump_for_openapi()
        props = form["definitions"]["Resources"]["properties"]
        assert props["workers"]["type"] == "integer" and props["workers"]["minimum"] == 1
        assert props["placement"]["enum"] == ["PACK", "SPREAD"]
    one, two = (
        validate(SweepParams, {"arms": ["grpo"], "resources": {"workers": n}}) for n in (1, 2)
    )
    assert sweep_jobs(one)[0].config_hash == sweep_jobs(two)[0].config_hash
    with pytest.raises(ValueError, match=r"^resources.workers: Input should be greater"):
        validate(SweepParams, {"resources": {"workers": 0}})
    for command in ("sweep", "arm"):
        shown = dapo(command, "--help", env=_env()).stdout
        assert "--workers" in shown and "--spread" in shown, shown
