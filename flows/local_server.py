"""A temporary Prefect server for `dapo sweep` and `dapo arm`, which dies with the command.

Prefect's own ephemeral server (started when PREFECT_API_URL is unset) has two faults here:
it gets PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS (20 s) to start, which a first start
on a new machine (creating and migrating its database) can exceed; and it is a plain child
process, so a driver killed with SIGKILL leaves it running for good. This module starts the
same server (Prefect's app in ephemeral mode: no UI, the ephemeral set of services) as
`python -m flows.local_server --parent PID --port PORT`, which

- asks the kernel to send it SIGTERM when its parent dies (Linux prctl PR_SET_PDEATHSIG), and
- watches its parent's pid once a second (any platform, and a second line of defence),

and waits up to START_TIMEOUT_S for it to answer. The driver points PREFECT_API_URL at it
before Prefect is imported, stops it at exit (after Prefect's own exit handlers have sent
their last logs), and a killed driver takes it down within a second or two.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
# A cold first start on a new machine creates Prefect's database and runs its ~200 migrations:
# 15 s on an idle machine, over 20 s (Prefect's own limit) on a loaded one.
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0
WATCH_PARENT_S = 1.0
LOG_NAME = "dapo-temporary-server.log"
_PR_SET_PDEATHSIG = 1


@dataclass
class TemporaryServer:
    """A started server: its process, its API URL and its log."""

    process: subprocess.Popen[bytes]
    api_url: str
    log: Path
    _stopped: bool = field(default=False, repr=False)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once /health answers; ConnectionError / TimeoutError in one line if not."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConnectionError(
                    f"the temporary Prefect server exited with code {self.process.returncode} "
                    f"before it answered: see {self.log}"
                )
            if healthy(self.api_url):
                return
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(
            f"the temporary Prefect server did not answer within {timeout_s:.0f} s: see {self.log}"
        )

    def stop(self) -> None:
        """SIGTERM (a graceful shutdown of its database), then SIGKILL after a grace period."""
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    import httpx

    try:
        return httpx.get(api_url.rstrip("/") + "/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def start(home: Path | None = None) -> TemporaryServer:
    """Start a server on a free port of 127.0.0.1 (without waiting for it: see wait_ready),
    its log in `home` ($PREFECT_HOME). Registers its stop at exit."""
    home = Path(home or os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = home / LOG_NAME
    env = {
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        # Prefect's ephemeral mode: the services an in-process flow run needs, no more.
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        # Its telemetry job has no network to reach here, and races the flows for the database.
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-m", "flows.local_server"]
    command += ["--parent", str(os.getpid()), "--port", str(port)]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            # Its own session: a Ctrl-C in the terminal stops the driver, which then stops the
            # server in order (the server must outlive the flows' last API calls).
            start_new_session=True,
        )
    server = TemporaryServer(process, f"http://{HOST}:{port}/api", log_path)
    # Registered before Prefect is imported, so it runs after Prefect's own exit handlers
    # (atexit runs last-registered first), which send the last logs and events.
    atexit.register(server.stop)
    return server


# --- the server process ----------------------------------------------------------------------
def parent_death_signal() -> None:
    """Ask Linux to SIGTERM this process when its parent dies, even by SIGKILL (the setting
    survives an exec; elsewhere this does nothing)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _die_with_parent(parent: int) -> None:
    """SIGTERM this process when `parent` dies: the kernel's parent-death signal where there is
    one, and a thread that watches the parent's pid everywhere."""
    parent_death_signal()
    if os.getppid() != parent:  # died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)

    def watch() -> None:
        while True:
            time.sleep(WATCH_PARENT_S)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(STOP_TIMEOUT_S)
                os._exit(1)  # the graceful stop hung

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent", type=int, required=True, help="die when this pid dies")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default=HOST)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)

    import uvicorn

    uvicorn.run(
        "prefect.server.api.server:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        log_level="error",
        lifespan="on",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
