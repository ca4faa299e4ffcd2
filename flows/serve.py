"""`dapo serve`: the three deployments, served to a Prefect server, with a Ray cluster to run on.

It says which Ray it joined (its nodes, CPUs, GPUs) and where run directories go, with the
runs-directory warning of a multi-node cluster (flows/cluster.py) before anything runs.

Order matters on the way down: the runner (serve) stops before the Prefect server it talks to,
otherwise it hangs on its last API calls. A local Ray instance started here is shared by every
flow run (they join it through RAY_ADDRESS) and ends with this process; so does the Prefect
server it starts, even when this process is killed (the kernel's parent-death signal).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from flows.local_server import healthy, parent_death_signal

SERVER_START_TIMEOUT_S = 120.0
SERVER_STOP_TIMEOUT_S = 15.0
RUNNER_POLL_S = 2.0  # how soon a triggered flow run starts (Prefect's default: 10 s)


def deployments() -> list[Any]:
    """The RunnerDeployments `dapo serve` serves (module entrypoints: any working directory)."""
    from prefect.types.entrypoint import EntrypointType

    from flows.arm import DEPLOYMENT_NAME as ARM
    from flows.arm import ablation_arm
    from flows.evaluate import DEPLOYMENT_NAME as EVAL
    from flows.evaluate import evaluate_run
    from flows.sweep import DEPLOYMENT_NAME as SWEEP
    from flows.sweep import ablation_sweep

    common: dict[str, Any] = {
        "entrypoint_type": EntrypointType.MODULE_PATH,
        # The server checks a run's parameters against the form's schema when it is created (a
        # number typed as text never starts a run; the form says so at Submit); what passes
        # the schema and not the flows' own checks ends the run in one line (params.takes).
        "enforce_parameter_schema": True,
        "tags": ["dapo"],
    }
    return [
        ablation_sweep.to_deployment(
            name=SWEEP,
            description="Run the DAPO ablation ladder: one arm run per arm × seed, then the table.",
            **common,
        ),
        ablation_arm.to_deployment(
            name=ARM,
            description="Train (or rerun) one arm × seed of a sweep; resumes its checkpoint.",
            **common,
        ),
        evaluate_run.to_deployment(
            name=EVAL,
            description="Evaluate a stored run's latest checkpoint on an eval set.",
            **common,
        ),
    ]


def port_owner(port: int) -> str | None:
    """Which process listens on TCP `port` on this machine, as "pid N (command line)", when
    Linux's /proc says so (a process of another user is not shown to us: None)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                # fields: sl, local "ADDR:PORT" (hex), remote, state (0A = LISTEN), ..., inode
                if (
                    len(fields) > 9
                    and fields[3] == "0A"
                    and int(fields[1].rsplit(":", 1)[1], 16) == port
                ):
                    inodes.add(fields[9])
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in targets:
                        command = (
                            (proc / "cmdline")
                            .read_bytes()
                            .replace(b"\0", b" ")
                            .decode(errors="replace")
                        )
                        return f"pid {proc.name} ({command.strip()[:120] or '?'})"
    return None


def start_server(host: str, port: int, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`prefect server start` in its own process group; returns it and its API URL once healthy."""
    with socket.socket() as s:
        if s.connect_ex((host, port)) == 0:
            if healthy(f"http://{host}:{port}/api"):
                raise ConnectionError(
                    f"a Prefect server already answers on {host}:{port}: serve to it with "
                    f"PREFECT_API_URL=http://{host}:{port}/api dapo serve, or choose another --port"
                )
            owner = port_owner(port)
            raise ConnectionError(
                f"port {port} on {host} is taken by "
                + (owner if owner else "another program")
                + ", and it is not a Prefect server: choose another --port, or stop it (or set "
                "PREFECT_API_URL to the Prefect server you run)"
            )
    prefect = shutil.which("prefect", path=str(Path(sys.executable).parent)) or "prefect"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    proc = subprocess.Popen(
        [prefect, "server", "start", "--host", host, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # Safe here: `dapo serve` has started no threads yet (Prefect is not imported).
        preexec_fn=parent_death_signal if sys.platform.startswith("linux") else None,
    )
    api_url = f"http://{host}:{port}/api"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConnectionError(
                f"the Prefect server exited with code {proc.returncode}: see {log_path}"
            )
        if healthy(api_url):
            return proc, api_url
        time.sleep(0.5)
    stop_process(proc)
    raise TimeoutError(
        f"the Prefect server did not answer within {SERVER_START_TIMEOUT_S:.0f} s: see {log_path}"
    )


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, then SIGKILL what is left after a grace period."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=SERVER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def serve(*, host: str, port: int, ray_address: str | None, limit: int | None) -> int:
    """Serve until interrupted; returns the exit code."""
    # Started in the background by a script, SIGINT arrives ignored; `kill -INT` should stop
    # serving just like Ctrl-C does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server: subprocess.Popen[bytes] | None = None
    api_url = os.environ.get("PREFECT_API_URL")
    if api_url:
        if not healthy(api_url):
            raise ConnectionError(f"no Prefect server answers at PREFECT_API_URL={api_url}")
        print(f"using the Prefect server at {api_url}", flush=True)
    else:
        home = Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect"))
        print(
            f"starting a Prefect server on http://{host}:{port} (log: {home / 'dapo-server.log'}) ...",
            flush=True,
        )
        server, api_url = start_server(host, port, home / "dapo-server.log")
        # Before prefect is imported: the runner and its flow-run subprocesses read it.
        os.environ["PREFECT_API_URL"] = api_url
    try:
        return _serve(api_url, ray_address, limit)
    finally:
        if server is not None:
            print("stopping the Prefect server ...", flush=True)
            stop_process(server)


def share_ray(ray_address: str | None) -> tuple[str, list[Any]]:
    """Join `ray_address` (or $RAY_ADDRESS), else start a local Ray instance in this process,
    and export RAY_ADDRESS so that the flow runs this process starts (subprocesses) join the
    same Ray instead of starting one each. Returns a line saying which Ray, and its nodes."""
    import ray

    from flows import ray_worker
    from flows.cluster import alive_nodes

    given = ray_address or os.environ.get("RAY_ADDRESS")
    cluster = ray_worker.connect(ray_address)
    nodes = alive_nodes()
    # The address joined, whether it came from --ray-address, $RAY_ADDRESS ("auto" resolved)
    # or a local start: without it a flow run would start a Ray of its own, and a Ray job
    # would find no job server.
    joined = (
        given if given and given.startswith("ray://") else ray.get_runtime_context().gcs_address
    )
    os.environ["RAY_ADDRESS"] = joined
    if not given:
        where = f"a local Ray instance at {joined}"
    else:
        where = f"the Ray cluster at {given}" + (f" ({joined})" if given != joined else "")
    line = (
        f"Ray: {where} ({len(nodes)} node{'s' if len(nodes) != 1 else ''}, "
        f"{cluster.get('CPU', 0):g} CPU, {cluster.get('GPU', 0):g} GPU)"
    )
    return line, nodes


def _serve(api_url: str, ray_address: str | None, limit: int | None) -> int:
    from prefect import serve as prefect_serve
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from db.engine import resolve_url, safe_url
    from flows import ray_worker
    from flows.cluster import runs_dir_warning
    from flows.plan import runs_dir

    ray_line, nodes = share_ray(ray_address)
    ui = api_url.rstrip("/").removesuffix("/api")
    print(
        f"\nPrefect UI: {ui}\n"
        f"{ray_line}\n"
        f"Store (a form's empty store_url): {safe_url(resolve_url(None))}\n"
        f"Run directories (checkpoints): {runs_dir()}\n"
        "Serving: ablation-sweep/dapo-sweep, ablation-arm/dapo-arm, evaluate-run/dapo-eval\n\n"
        "Trigger a sweep:\n"
        f"  UI:    {ui}/deployments → dapo-sweep → Run → Custom run (a form of the parameters)\n"
        f"  shell: PREFECT_API_URL={api_url} prefect deployment run ablation-sweep/dapo-sweep "
        "--param preset=tiny\n"
        f"The dashboard's rerun button needs PREFECT_API_URL={api_url} in its environment.\n"
        "Stop with Ctrl-C.\n",
        flush=True,
    )
    # A sweep says it again when it starts; here it is seen before anything runs.
    warning = runs_dir_warning(runs_dir(), nodes)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            prefect_serve(
                *deployments(),
                limit=limit,
                print_starting_message=False,
                query_seconds=RUNNER_POLL_S,
            )
    except KeyboardInterrupt:
        pass
    finally:
        ray_worker.shutdown()
    return 0
