"""A temporary Prefect server for `dapo sweep` and `dapo arm`, which dies with the command.

Prefect's own ephemeral server (started when PREFECT_API_URL is unset) has two faults here:
it gets PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS (20 s) to start, which a first start
on a new machine (creating and migrating its database) can exceed; and it is a plain child
process, so a driver killed with SIGKILL leaves it running for good. This module starts the
same server (Prefect's app in ephemeral mode: no UI, the ephemeral set of services) as
`python -m flows.local_server --parent PID --fd FD`, which

- asks the kernel to send it SIGTERM when its parent dies (Linux prctl PR_SET_PDEATHSIG), and
- watches its parent's pid once a second (any platform, and a second line of defence),

and waits up to START_TIMEOUT_S for it to answer. The driver points PREFECT_API_URL at it
before Prefect is imported, stops it at exit (after Prefect's own exit handlers have sent
their last logs), and a killed driver takes it down within a second or two.

The driver binds the listening socket itself and hands it to the server process: the port is
the driver's from the first moment (no other process can take it between choosing and
binding), and a server that fails to start (a first start on a loaded machine once exited with
uvicorn's startup-failure code 3) is started again on the same socket, so the API URL that
the driver already published stays right. Each failure is said with its cause: the last
lines the server wrote to its log during that try.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import faulthandler
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
# Starts that end before the server answers (startup failures, not hangs) are tried this often.
START_TRIES = 3
STOP_TIMEOUT_S = 15.0
WATCH_PARENT_S = 1.0
LOG_NAME = "dapo-temporary-server.log"
_PR_SET_PDEATHSIG = 1


@dataclass
class TemporaryServer:
    """A started server: its API URL, its log, the socket it serves on and its process (the
    latest start's: `_launch`)."""

    api_url: str
    log: Path
    command: list[str] = field(repr=False)
    env: dict[str, str] = field(repr=False)
    sock: socket.socket | None = field(default=None, repr=False)
    process: subprocess.Popen[bytes] = field(init=False)
    log_offset: int = field(default=0, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S, tries: int = START_TRIES) -> None:
        """Return once /health answers; a start that exits first is tried again, up to `tries`
        starts in all; ConnectionError / TimeoutError in one line (with the cause) if not."""
        deadline = time.monotonic() + timeout_s
        attempt = 1
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                cause = self.cause()
                said = (
                    f"the temporary Prefect server exited with code {self.process.returncode} "
                    f"before it answered ({cause}; its log: {self.log})"
                )
                if attempt >= tries:
                    self.stop()
                    raise ConnectionError(said + f"; {tries} starts tried")
                attempt += 1
                print(f"{said}; starting it again (start {attempt} of {tries})", file=sys.stderr)
                self._launch()
                continue
            if healthy(self.api_url):
                return
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(
            f"the temporary Prefect server did not answer within {timeout_s:.0f} s "
            f"({self.cause()}; its log: {self.log})"
        )

    def cause(self) -> str:
        """What the server wrote during its latest start, in one line: its last lines."""
        try:
            with self.log.open("rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            return "it wrote nothing"
        return "it said: " + " | ".join(lines[-3:])[-600:]

    def _launch(self) -> None:
        """(Re)start the server process on this server's socket, its output appended to the log."""
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        pass_fds = (self.sock.fileno(),) if self.sock is not None else ()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                pass_fds=pass_fds,
                # Its own session: a Ctrl-C in the terminal stops the driver, which then stops
                # the server in order (the server must outlive the flows' last API calls).
                start_new_session=True,
            )

    def stop(self) -> None:
        """SIGTERM (a graceful shutdown of its database), then SIGKILL after a grace period."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if not hasattr(self, "process") or self.process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        finally:
            if self.sock is not None:
                self.sock.close()


def healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    import httpx

    try:
        return httpx.get(api_url.rstrip("/") + "/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def listening_socket(host: str = HOST) -> socket.socket:
    """A TCP socket bound to a free port of `host` and listening, for the server to inherit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(2048)
    return sock


def start(home: Path | None = None) -> TemporaryServer:
    """Start a server on a free port of 127.0.0.1 (without waiting for it: see wait_ready),
    its log in `home` ($PREFECT_HOME). Registers its stop at exit."""
    home = Path(home or os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    sock = listening_socket()
    port = int(sock.getsockname()[1])
    env = {
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        # Prefect's ephemeral mode: the services an in-process flow run needs, no more.
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        # Its telemetry job has no network to reach here, and races the flows for the database.
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # Its own words reach the log as they are written, not when a buffer fills.
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-m", "flows.local_server"]
    command += ["--parent", str(os.getpid()), "--fd", str(sock.fileno())]
    server = TemporaryServer(
        api_url=f"http://{HOST}:{port}/api",
        log=home / LOG_NAME,
        sock=sock,
        command=command,
        env=env,
    )
    server._launch()
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


def _errors_to_stderr() -> None:
    """Make uvicorn's startup errors reach stderr (the log) whatever logging Prefect set up on
    import: a failed start once left an empty log behind."""
    import logging

    logger = logging.getLogger("uvicorn.error")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent", type=int, required=True, help="die when this pid dies")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--fd", type=int, help="serve on this inherited listening socket")
    where.add_argument("--port", type=int, help="bind this port of --host")
    parser.add_argument("--host", default=HOST)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    faulthandler.enable()
    print(f"dapo temporary Prefect server: starting (pid {os.getpid()})", file=sys.stderr)

    import uvicorn

    config = uvicorn.Config(
        "prefect.server.api.server:create_app",
        factory=True,
        host=args.host,
        port=args.port or 0,
        log_level="error",
        lifespan="on",
    )
    config.load()  # imports Prefect and builds its app, which sets Prefect's logging up
    _errors_to_stderr()
    server = uvicorn.Server(config)
    sockets = [socket.socket(fileno=args.fd)] if args.fd is not None else None
    server.run(sockets=sockets)
    if not server.started:
        print("dapo temporary Prefect server: its start failed (see above)", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
