"""A real multi-node Ray cluster on this machine, started and stopped by the processes it owns.

Each node is `ray start ... --block` in a new session of its own (`start_new_session`): the
`ray start` process is the session leader, and every process Ray starts for that node (GCS,
raylet, agents, log monitor, the workers the raylet forks) inherits the session id. Ray moves
its workers into process groups of their own (setpgrp), so a process group would miss them, and
rewrites their command lines (`ray::ArmTrainer`), so a name would too; the session id is kept
by all of them, orphans included (a worker whose raylet was killed). `processes()` lists them
from /proc; `stop()` sends SIGTERM to each `ray start --block` (which shuts its node down),
then SIGKILL to whatever is left in those sessions, and waits until nothing is. Nothing here
touches a Ray process of anyone else: no `ray stop`, no names.

Every node has its own temp dir (`--temp-dir`: sessions, logs, sockets; short, under /tmp, for
Ray's unix socket paths) and its own ports, and
the cluster its own auth token (RAY_AUTH_TOKEN, passed to the drivers through `env`), so it is
independent of other clusters on the machine and of ~/.ray. GCS health checks run every 0.5 s
and give up after 3 misses: a lost node is declared dead in about 2 s instead of Ray's ~30 s,
which keeps the node-loss test short (the behaviour is the same, only sooner). The suite's warm
Ray (conftest.warm_ray, one node) keeps Ray's own checks: on a loaded machine a raylet starved
of CPU for 2 s would be declared dead with everything on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_common.util import free_port

RAY = str(Path(sys.executable).parent / "ray")
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
# Configs, small dicts and the tiny model's weights (a rollout engine's actor) travel through it.
OBJECT_STORE_BYTES = 96 * 1024 * 1024
FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}


# A driver joining through RAY_ADDRESS, as users do: the nodes it sees.
NODES = """
import json, os, ray
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
keys = ("NodeID", "Alive", "NodeManagerAddress", "RayletSocketName", "Resources")
print(json.dumps([{k: n.get(k) for k in keys} for n in ray.nodes()]))
ray.shutdown()
"""


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, process group, session) of a live pid, from /proc/<pid>/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


@dataclass
class Node:
    """One `ray start --block` and what it started."""

    index: int
    proc: subprocess.Popen[bytes]
    temp_dir: Path
    log: Path

    @property
    def session(self) -> int:
        return self.proc.pid  # a session leader's session id is its pid

    def raylet_pid(self) -> int:
        """The raylet of this node: the `ray start` process's child named raylet."""
        for pid in _pids():
            stat = proc_stat(pid)
            if stat and stat[1] == self.proc.pid and _comm(pid) == "raylet":
                return pid
        raise LookupError(f"node {self.index}: no raylet under pid {self.proc.pid}")


@dataclass
class RayCluster:
    """A head node and worker nodes on this machine; see the module docstring."""

    root: Path
    cpus_per_node: int = 2
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    nodes: list[Node] = field(default_factory=list)
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    temp_root: Path | None = None
    # The head's dashboard, which serves Ray's job server (tests/flows/test_ray_jobs.py): its port,
    # on 127.0.0.1 only; None leaves the dashboard off, as the other tests want it.
    job_server_port: int | None = None
    fast_health_checks: bool = True
    # Each node's object store (a bench that ships a real model's weights to an actor wants more).
    object_store_bytes: int = OBJECT_STORE_BYTES

    @property
    def job_server(self) -> str:
        """The job server's HTTP address (JobSubmissionClient's, RAY_API_SERVER_ADDRESS)."""
        assert self.job_server_port is not None, "started without a job server"
        return f"http://127.0.0.1:{self.job_server_port}"

    @property
    def address(self) -> str:
        """What a user puts in RAY_ADDRESS / --ray-address."""
        return f"127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a driver of this cluster (and of its nodes)."""
        env = {
            **self.base_env,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name, None)
        return env

    def client_env(self) -> dict[str, str]:
        """What a driver's environment needs to join this cluster: RAY_ADDRESS and the token
        (added to an environment of one's own, e.g. dapo_cli.store_env(..., ray=cluster))."""
        return {
            "RAY_ADDRESS": self.address,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
        }

    def start(self, nodes: int = 2) -> None:
        for _ in range(nodes):
            self.add_node()

    def add_node(self, resources: Mapping[str, float] | None = None) -> Node:
        """A node more (the head first), offering `resources` (custom Ray resources) too."""
        index = len(self.nodes)
        if self.temp_root is None:
            # Ray's unix sockets live under the temp dir, and their paths may not exceed 107
            # bytes: a pytest tmp_path is too deep for that. Removed by stop().
            self.temp_root = Path(tempfile.mkdtemp(prefix="dapo-ray-", dir="/tmp"))
        temp_dir = self.temp_root / f"n{index}"
        temp_dir.mkdir()
        args = [
            RAY,
            "start",
            "--block",
            "--num-cpus",
            str(self.cpus_per_node),
            "--node-ip-address",
            "127.0.0.1",
            "--temp-dir",
            str(temp_dir),
            "--object-store-memory",
            str(self.object_store_bytes),
            "--dashboard-agent-listen-port",
            str(free_port()),
            "--metrics-export-port",
            str(free_port()),
            "--disable-usage-stats",
        ]
        if index == 0:
            args += [
                "--head",
                "--port",
                str(self.port),
                "--include-dashboard",
                "false" if self.job_server_port is None else "true",
                "--dashboard-host",
                "127.0.0.1",
                "--dashboard-port",
                str(self.job_server_port or free_port()),
                "--ray-client-server-port",
                str(free_port()),
            ]
            if self.fast_health_checks:
                args += ["--system-config", json.dumps(FAST_HEALTH_CHECKS)]
        else:
            args += ["--address", self.address]
        if resources:
            args += ["--resources", json.dumps(dict(resources))]
        log = self.root / f"node{index}.log"
        env = self.env
        # flows.ray_worker turns this off on import (a local Ray on loopback only); inherited
        # by `ray start` from a test process that imported it, it refuses a second node.
        env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args,
                env=env,
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        node = Node(index, proc, temp_dir, log)
        self.nodes.append(node)
        self._wait_started(node)
        return node

    def _wait_started(self, node: Node) -> None:
        """`ray start --block` says "Ray runtime started" once its node is registered."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if "Ray runtime started" in node.log.read_text(errors="replace"):
                return
            if node.proc.poll() is not None:
                break
            time.sleep(0.3)
        tail = node.log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"Ray node {node.index} did not start:\n{tail}")

    def ray_nodes(self) -> list[dict[str, Any]]:
        """`ray.nodes()` as a driver that joins through RAY_ADDRESS sees them, each with the
        `index` of the node here that it is (told by its raylet socket's temp dir)."""
        done = subprocess.run(
            [sys.executable, "-c", NODES],
            env={**self.env, "RAY_ADDRESS": self.address},
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"a driver could not list the nodes:\n{done.stderr[-3000:]}")
        rows: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
        for row in rows:
            socket_path = str(row.get("RayletSocketName"))
            row["index"] = next(
                (n.index for n in self.nodes if socket_path.startswith(f"{n.temp_dir}/")), None
            )
        return rows

    def kill_node(self, index: int) -> int:
        """Lose node `index` as a machine is lost: SIGKILL every process of it at once (the
        raylet, its workers, `ray start` itself); returns the raylet's pid.

        Killing the raylet alone is not a node loss: its workers live on for seconds (they poll
        for their raylet), keep their direct gloo connections to the other ranks, and can finish
        the arm and return their results before the GCS declares the node dead."""
        node = self.nodes[index]
        raylet = node.raylet_pid()
        for pid in _pids():
            stat = proc_stat(pid)
            if stat is not None and stat[3] == node.session:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return raylet

    def processes(self) -> dict[int, str]:
        """Every live process of this cluster (zombies excluded): pid → command line."""
        sessions = {node.session for node in self.nodes}
        found = {}
        for pid in _pids():
            stat = proc_stat(pid)
            if stat is not None and stat[3] in sessions and stat[0] != "Z":
                found[pid] = command_line(pid)
        return found

    def stop(self) -> dict[int, str]:
        """Stop every node; returns what had to be SIGKILLed (empty when the nodes' own
        shutdown ended everything). Raises if any process of the cluster survives."""
        for node in reversed(self.nodes):  # worker nodes first, the head (GCS) last
            if node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        # What the shutdown left (or did not reach in time): SIGKILL, by pid.
        _wait_until(lambda: not self.processes(), 5.0)
        killed = self.processes()
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.kill()
            node.proc.wait()
        if not _wait_until(lambda: not self.processes(), 10.0):
            raise RuntimeError(f"processes of the Ray cluster survived: {self.processes()}")
        if self.temp_root is not None:
            shutil.rmtree(self.temp_root, ignore_errors=True)
        return killed


def _pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


@contextlib.contextmanager
def ray_cluster(
    root: Path,
    *,
    nodes: int = 2,
    cpus_per_node: int = 2,
    job_server: bool = False,
    fast_health_checks: bool = True,
) -> Iterator[RayCluster]:
    """A started cluster, stopped at the end whatever happens (a failed start included);
    `job_server`: the head serves Ray's job server on a free port of 127.0.0.1."""
    cluster = RayCluster(
        root,
        cpus_per_node=cpus_per_node,
        job_server_port=free_port() if job_server else None,
        fast_health_checks=fast_health_checks,
    )
    try:
        cluster.start(nodes)
        yield cluster
    finally:
        cluster.stop()
