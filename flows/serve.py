"""`dapo serve`: the three deployments, served to a Prefect server, with a Ray cluster to run on.

Order matters on the way down: the runner (serve) stops before the Prefect server it talks to,
otherwise it hangs on its last API calls. A local Ray instance started here is shared by every
flow run (they join it through RAY_ADDRESS) and ends with this process.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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
        # The flows check their parameters themselves and fail the run with one line naming
        # the field; the server's schema check would refuse the run with a 422 instead.
        "enforce_parameter_schema": False,
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


def server_healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    import httpx

    try:
        return httpx.get(api_url.rstrip("/") + "/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def start_server(host: str, port: int, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`prefect server start` in its own process group; returns it and its API URL once healthy."""
    with socket.socket() as s:
        if s.connect_ex((host, port)) == 0:
            raise ConnectionError(
                f"port {port} on {host} is taken but no Prefect server answers there: "
                "choose another --port, or set PREFECT_API_URL to the server you run"
            )
    prefect = shutil.which("prefect", path=str(Path(sys.executable).parent)) or "prefect"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    proc = subprocess.Popen(
        [prefect, "server", "start", "--host", host, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    api_url = f"http://{host}:{port}/api"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConnectionError(
                f"the Prefect server exited with code {proc.returncode}: see {log_path}"
            )
        if server_healthy(api_url):
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
        if not server_healthy(api_url):
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


def _serve(api_url: str, ray_address: str | None, limit: int | None) -> int:
    from prefect import serve as prefect_serve
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows import ray_worker

    cluster = ray_worker.connect(ray_address)
    if not (ray_address or os.environ.get("RAY_ADDRESS")):
        import ray

        # Flow runs are subprocesses: they join this local instance instead of starting theirs.
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        where = f"a local Ray instance at {os.environ['RAY_ADDRESS']}"
    else:
        where = f"the Ray cluster at {ray_address or os.environ['RAY_ADDRESS']}"
    ui = api_url.rstrip("/").removesuffix("/api")
    print(
        f"\nPrefect UI: {ui}\n"
        f"Ray: {where} ({cluster.get('CPU', 0):g} CPU, {cluster.get('GPU', 0):g} GPU)\n"
        "Serving: ablation-sweep/dapo-sweep, ablation-arm/dapo-arm, evaluate-run/dapo-eval\n\n"
        "Trigger a sweep:\n"
        f"  UI:    {ui}/deployments → dapo-sweep → Run → Custom run (a form of the parameters)\n"
        f"  shell: PREFECT_API_URL={api_url} prefect deployment run ablation-sweep/dapo-sweep "
        "--param preset=tiny\n"
        f"The dashboard's rerun button needs PREFECT_API_URL={api_url} in its environment.\n"
        "Stop with Ctrl-C.\n",
        flush=True,
    )
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
