"""Arms on a real 2-node Ray cluster on this machine (`make test-cluster`; issue 12 §3).

The cluster (tests/ray_cluster.py) is two `ray start` nodes of 2 CPUs each, with their own temp
dirs, ports and auth token; it is stopped at the end by the processes it started, and the last
test proves none is left. `dapo sweep` runs as a subprocess and joins it the way a user does
(RAY_ADDRESS, or --ray-address), with a store and a runs directory under the test's tmp dir
(the nodes share this machine's disk, so the runs directory is shared).

In file order: two arms that need a whole node each land on different nodes; one arm of two
workers spread over both nodes; the same arm losing the second node mid-run, retried by the
flow's task retry and resumed from its checkpoint on the surviving node; an async arm whose
rollout engine's node is lost, resumed with its engine on a replacement node; the cluster stops.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dapo_cli import DAPO, ROOT, SMALL, store_env
from ray_cluster import RayCluster, proc_stat, ray_cluster

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

NODE = re.compile(r"node ([0-9a-f]{8})@")
SWEEP_TIMEOUT_S = 240
# One arm of two workers with a CPU each, spread over the nodes.
SPREAD_ARM = ("--arms", "grpo", "--workers", "2", "--cpus", "1", "--spread")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    with ray_cluster(tmp_path_factory.mktemp("ray-cluster"), nodes=2, cpus_per_node=2) as c:
        yield c


@pytest.fixture(scope="module")
def node_ids(cluster: RayCluster) -> list[str]:
    """The nodes' ids (first 8 hex digits) by node index, as a driver joining through
    RAY_ADDRESS sees them: both alive, 2 CPUs each."""
    rows = cluster.ray_nodes()
    assert sorted(r["index"] for r in rows) == [0, 1], rows
    assert all(r["Alive"] and r["Resources"]["CPU"] == 2.0 for r in rows), rows
    return [str(r["NodeID"])[:8] for r in sorted(rows, key=lambda r: int(r["index"]))]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, cluster: RayCluster) -> dict[str, Any]:
    """One store and one runs directory for the module's sweeps (each test its own sweep)."""
    tmp = tmp_path_factory.mktemp("cluster-work")
    env = store_env(tmp, cluster.env, OMP_NUM_THREADS="1")
    return {"env": env, "runs": tmp / "runs", "url": env["DAPO_DB_URL"]}


def dapo_sweep(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [DAPO, "sweep", *args, *SMALL],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait for a `dapo sweep`; killed by its pid if it overruns, whatever happens."""
    try:
        out, err = proc.communicate(timeout=SWEEP_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-3000:]}\n{err[-5000:]}"
    return out, err


def runs(url: str) -> list[dict[str, Any]]:
    from db import reads
    from db.engine import get_engine

    engine = get_engine(url)
    sweep = reads.latest_sweep_id(engine)
    assert sweep is not None
    return [reads.run_details(engine, int(r)) for r in reads.runs_of_sweep(engine, sweep)["run_id"]]


def test_two_arms_that_need_a_node_each_run_on_different_nodes(
    cluster: RayCluster, node_ids: list[str], work: dict[str, Any]
) -> None:
    """--cpus 2 on 2-CPU nodes: the sweep's two warm actors need a whole node each, so they
    sit on different nodes, and the arms take them in turn (whether they overlap in time or
    not); the driver joins through RAY_ADDRESS; the store says where each ran; the runs
    directory warning is one line."""
    env = {**work["env"], "RAY_ADDRESS": cluster.address}
    _, err = finish(
        dapo_sweep(env, "--arms", "grpo", "clip_higher", "--cpus", "2", "--steps", "2", "--quiet")
    )
    done = sorted(runs(work["url"]), key=lambda r: str(r["arm"]))
    assert [(r["arm"], r["status"]) for r in done] == [
        ("clip_higher", "completed"),
        ("grpo", "completed"),
    ]
    nodes = [NODE.findall(r["host"]) for r in done]
    assert all(len(n) == 1 for n in nodes), [r["host"] for r in done]
    assert {n[0] for n in nodes} == set(node_ids), (nodes, node_ids)
    for run in done:
        ckpt = Path(run["checkpoint_dir"])
        assert ckpt.is_absolute() and ckpt.is_relative_to(work["runs"])
        assert (ckpt / "checkpoints" / "step_2").is_dir()
    # DAPO_RUNS_DIR is on this machine's local disk: said once, at sweep start, in words.
    warnings = [line for line in err.splitlines() if "local file system" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: "), err
    assert "the Ray cluster has 2 nodes" in warnings[0]
    assert "so they see it" in warnings[0]  # both nodes are on this machine


def test_a_two_worker_arm_spreads_over_both_nodes(
    cluster: RayCluster, node_ids: list[str], work: dict[str, Any]
) -> None:
    """--workers 2 --spread: rank 0 and rank 1 on different nodes, one sharded checkpoint in
    the shared runs directory; the driver joins through --ray-address."""
    finish(
        dapo_sweep(
            work["env"],
            "--ray-address",
            cluster.address,
            *SPREAD_ARM,
            "--steps",
            "2",
            "--name",
            "spread",
        )
    )
    (run,) = runs(work["url"])
    assert run["status"] == "completed" and run["tries"] == 1
    ranks = dict(re.findall(r"node ([0-9a-f]{8})@[^:]+: rank (\d)", run["host"]))
    assert set(ranks) == set(node_ids) and sorted(ranks.values()) == ["0", "1"], run["host"]
    step = Path(run["checkpoint_dir"]) / "checkpoints" / "step_2"
    assert step.is_relative_to(work["runs"])
    assert (step / "dcp").is_dir()  # torch.distributed.checkpoint shards of both ranks
    assert sorted(p.name for p in (step / "ranks").iterdir()) == ["rank_0.pt", "rank_1.pt"]


def test_losing_a_node_mid_run_is_retried_and_resumed_on_the_surviving_node(
    cluster: RayCluster, node_ids: list[str], work: dict[str, Any]
) -> None:
    """The second node is lost (all its processes SIGKILLed) after the arm's first checkpoint:
    the try fails with one line naming the lost node, the flow's task retry starts both workers again on the
    surviving node, resumed from the last checkpoint; every step's metrics are there once."""
    steps = 5
    proc = dapo_sweep(
        {**work["env"], "RAY_ADDRESS": cluster.address},
        *SPREAD_ARM,
        "--steps",
        str(steps),
        "--name",
        "node-loss",
    )
    try:
        latest = _first_checkpoint(proc, work["url"], "node-loss")
        t_kill = time.monotonic()
        raylet = cluster.kill_node(1)
        saved = int(latest.read_text().strip().removeprefix("step_"))  # at the kill, or after
        # Rank 1 died with its node, so rank 0 cannot have finished the arm alone.
        assert saved < steps, f"the arm finished (step {saved}) before the node was lost"
        lost_session = cluster.nodes[1].session
        out, _ = finish(proc)
        t_done = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    # The lost node took every process of its own with it.
    assert proc_stat(raylet) is None
    left = [p for p in cluster.processes() if (proc_stat(p) or ("", 0, 0, 0))[3] == lost_session]
    assert left == [], left

    (run,) = runs(work["url"])
    assert run["status"] == "completed" and run["tries"] == 2, run
    # A completed run keeps no error from its lost try (issue 21.13); the sweep said the lost
    # try's one line, naming the worker and the node that died, while the task retried.
    assert run["error"] is None, run["error"]
    lost = [line for line in out.splitlines() if "ActorLost: worker" in line]
    assert len(lost) == 1, out[-3000:]
    assert f"on node {node_ids[1]}@" in lost[0] and "(its node died)" in lost[0], lost[0]
    # The retry ran both ranks on the surviving node, from the checkpoint.
    assert NODE.findall(run["host"]) == [node_ids[0]], run["host"]
    assert "ranks 0-1" in run["host"]
    resumed = re.findall(r"resuming from the checkpoint at step (\d+)", out)
    assert len(resumed) == 1 and saved <= int(resumed[0]) < steps, (saved, out)

    from db import reads
    from db.engine import get_engine

    engine = get_engine(work["url"])
    curves = reads.metric_curves(engine, [run["id"]])
    per_key = curves.groupby(["step", "name"]).size()
    assert (per_key == 1).all()  # once each (the store's upsert)
    names = {
        step: {n for n in frame["name"] if not n.startswith("eval/")}
        for step, frame in curves.groupby("step")
    }
    assert sorted(names) == list(range(1, steps + 1)), sorted(names)
    assert all(names[s] == names[1] for s in names), "a step misses metrics"
    rollout = curves[curves["name"] == "progress/rollout_step"].set_index("step")["value"]
    assert rollout.to_dict() == {s: float(s) for s in range(1, steps + 1)}
    evals = reads.evaluations(engine, run["id"])
    assert sorted(evals["step"]) == [0, steps]
    # What happened, for the log (`pytest -s`): the sweep's own timestamped lines.
    story = [
        line
        for line in out.splitlines()
        if re.match(r"\[\d+:\d\d:\d\d\] grpo s0  (run|resuming)", line)
    ]
    killed = f"node {node_ids[1]} killed; the arm's latest checkpoint then: step {saved}"
    done = f"sweep done {t_done - t_kill:.1f} s after the kill"
    print("\n".join(["", killed, *story, done]))


def test_losing_the_rollout_engines_node_mid_async_run_is_retried_and_resumed(
    cluster: RayCluster, work: dict[str, Any]
) -> None:
    """An async arm (max_staleness 1) trains on the head while its rollout engine's actor runs
    on a node of its own (the only one offering the `rollout` resource). That node is lost
    after the first checkpoint, with batches queued or in flight: the try ends as a lost actor,
    a replacement node joins, and the flow's retry resumes from the checkpoint with a new
    engine actor there; every step is trained and stored once."""
    steps = 5
    engine_node = cluster.add_node({"rollout": 1})
    proc = dapo_sweep(
        {**work["env"], "RAY_ADDRESS": cluster.address},
        *("--arms", "dapo", "--cpus", "1", "--rollout-actor", "--rollout-resource", "rollout"),
        *("--set", "rollout.mode=async", "--set", "rollout.max_staleness=1"),
        *("--steps", str(steps), "--name", "engine-loss"),
    )
    try:
        latest = _first_checkpoint(proc, work["url"], "engine-loss")
        raylet = cluster.kill_node(engine_node.index)
        saved = int(latest.read_text().strip().removeprefix("step_"))
        cluster.add_node({"rollout": 1})  # the replacement the retry's engine goes to
        out, _ = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc_stat(raylet) is None

    (run,) = [r for r in runs(work["url"]) if r["arm"] == "dapo"]
    assert run["status"] == "completed" and run["tries"] == 2, (run, out[-3000:])
    assert run["error"] is None, run["error"]
    lost = [line for line in out.splitlines() if "rollout engine's Ray actor died" in line]
    assert len(lost) == 1, out[-3000:]
    assert "rollout engine: an actor of 1 CPU on rollout nodes" in out, out[-3000:]
    resumed = re.findall(r"resuming from the checkpoint at step (\d+)", out)
    assert len(resumed) == 1 and saved <= int(resumed[0]) <= steps, (saved, out)

    from db import reads
    from db.engine import get_engine

    curves = reads.metric_curves(get_engine(work["url"]), [run["id"]])
    assert (curves.groupby(["step", "name"]).size() == 1).all()  # once each
    rollout = curves[curves["name"] == "progress/rollout_step"].set_index("step")["value"]
    assert rollout.to_dict() == {s: float(s) for s in range(1, steps + 1)}
    lag = curves[curves["name"] == "staleness/max"]["value"]
    assert len(lag) == steps and lag.max() <= 2  # k + 1 for dynamic sampling's carried groups


def _first_checkpoint(proc: subprocess.Popen[str], url: str, sweep_name: str) -> Path:
    """The `latest` pointer of the first checkpoint of sweep `sweep_name`'s run, once written
    (polled: the run directory is known from the store once the run starts)."""
    deadline = time.monotonic() + SWEEP_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        run_dir = _run_dir(url, sweep_name)
        if run_dir is not None and (run_dir / "checkpoints" / "latest").is_file():
            return run_dir / "checkpoints" / "latest"
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint of sweep {sweep_name!r} appeared")


def _run_dir(url: str, sweep_name: str) -> Path | None:
    """The run directory of the newest run of the newest sweep, when that sweep is named so."""
    from db import reads
    from db.engine import get_engine

    engine = get_engine(url)
    sweep = reads.latest_sweep_id(engine)
    if sweep is None or reads.sweep_details(engine, sweep).get("name") != sweep_name:
        return None
    frame = reads.runs_of_sweep(engine, sweep)
    if frame.empty or not frame["checkpoint_dir"].iloc[-1]:
        return None
    return Path(str(frame["checkpoint_dir"].iloc[-1]))


def test_the_cluster_stops_leaving_no_process(cluster: RayCluster) -> None:
    assert cluster.processes(), "the head node should still be running"
    cluster.stop()
    assert cluster.processes() == {}
    for node in cluster.nodes:
        assert node.proc.returncode is not None
