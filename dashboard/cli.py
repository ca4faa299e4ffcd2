"""`dapo dashboard`: serve the Streamlit app against a store.

The port and the store are checked (and the store migrated) here first, so that a busy port or
a bad URL ends with one line in the terminal instead of an error page in the browser. Streamlit
runs as this command's child (through dashboard.serve, which loads the pages' libraries before
it listens), and the URL is printed once it answers. SIGTERM or SIGHUP to `dapo dashboard` (a
service manager, a closed terminal) stops it too, instead of leaving it serving with no parent.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

APP = Path(__file__).with_name("app.py")
STOP_GRACE_S = 10.0  # how long Streamlit gets to stop on SIGTERM before it is killed
ANSWER_WAIT_S = 120.0  # how long the URL waits for Streamlit to answer before it is printed anyway
ANSWER_POLL_S = 0.1
ACCENT = "#2f6db5"  # the dashboard's accent colour (buttons, toggles, progress): not a red


def register(subparsers: Any) -> None:
    """Add the `dashboard` subcommand to the `dapo` dispatcher."""
    from db.cli import store_argument

    parser = subparsers.add_parser(
        "dashboard",
        help="serve the dashboard (ablation table, curves, rollouts, runs)",
        description="Serve the DAPO Lab dashboard with Streamlit and print its URL.",
    )
    store_argument(parser)
    parser.add_argument("--port", type=int, default=8501, help="port to serve on (8501)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.set_defaults(func=run_dashboard)


def streamlit_command(*, port: int, host: str) -> list[str]:
    """The `streamlit run` command line, through dashboard.serve (the pages' libraries loaded
    before the server listens). It names no store: the URL, password and all, goes to the app
    in $DAPO_DB_URL (see streamlit_env), since any user can read a command line (`ps`), and
    only its owner the environment."""
    return [
        sys.executable,
        "-m",
        "dashboard.serve",
        "run",
        str(APP),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
        # Streamlit's default accent is a red: on a page where red means a failed run, its
        # progress bars, toggles and chips would read as failure. One blue accent instead.
        "--theme.primaryColor",
        ACCENT,
    ]


def streamlit_env(url: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The app's environment: this one, with the store in $DAPO_DB_URL."""
    return {**(os.environ if environ is None else environ), "DAPO_DB_URL": url}


def check_port(host: str, port: int) -> None:
    """ValueError in one line when Streamlit could not listen on (host, port): another
    dashboard (or anything) holds it, or the address is not this machine's. Streamlit would
    otherwise say so in a page of its own log and exit, after the store was opened."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise ValueError(f"--host {host}: not an address to serve on ({error})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As Streamlit's server binds: SO_REUSEADDR, so a port left in TIME_WAIT by a dashboard
        # that just stopped is free, and one that something listens on is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"port {port} on {host} is in use (another dashboard?): stop it, or pick "
                    "another with --port"
                ) from None
            raise ValueError(f"cannot serve on {host}:{port}: {error.strerror or error}") from None


@contextlib.contextmanager
def _stopping_child_on(child: subprocess.Popen[bytes], *signals: int) -> Iterator[list[int]]:
    """While the block runs, each of `signals` is passed on to `child` as SIGTERM and noted in
    the list the block gets (the first one is this command's exit code). The handler only
    signals: waiting is the caller's loop, since a handler that waited inside the caller's
    own Popen.wait would wait on itself."""
    received: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if child.poll() is None:
            child.terminate()

    previous = {sig: signal.signal(sig, stop) for sig in signals}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_for(child: subprocess.Popen[bytes], stopping: list[int]) -> int:
    """The child's exit code; once asked to stop (a signal, Ctrl+C), it gets STOP_GRACE_S to
    exit before it is killed."""
    deadline: float | None = None
    while True:
        try:
            return child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if stopping and deadline is None:
                deadline = time.monotonic() + STOP_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                child.kill()
        except KeyboardInterrupt:
            # Ctrl+C reached Streamlit too (one process group): it is stopping by itself.
            stopping.append(signal.SIGINT)


def health_url(host: str, port: int) -> str:
    """Streamlit's health endpoint on (host, port); a server on every address is asked on
    the loopback one."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return (
        f"http://[{host}]:{port}/_stcore/health"
        if ":" in host
        else f"http://{host}:{port}/_stcore/health"
    )


def answers(url: str) -> bool:
    """Whether the health endpoint at `url` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _await_answer(
    host: str, port: int, child: subprocess.Popen[bytes], stopping: list[int], deadline_s: float
) -> None:
    """Return once Streamlit answers on (host, port), exits, a signal stops it, or
    `deadline_s` passes."""
    url, end = health_url(host, port), time.monotonic() + deadline_s
    while time.monotonic() < end and child.poll() is None and not stopping:
        if answers(url):
            return
        time.sleep(ANSWER_POLL_S)


def run_dashboard(args: argparse.Namespace) -> int:
    """Check the port and the store, then run Streamlit in the foreground until interrupted."""
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be between 1 and 65535, got {args.port}")
    check_port(args.host, args.port)
    from db import engine as db_engine
    from db.cli import existing_store

    url = db_engine.resolve_url(args.store)
    # A store is a look here, as for `dapo table`: a typo'd path is refused, not created empty.
    existing_store(url)
    db_engine.get_engine(url)  # ValueError / ConnectionError with one clear line if unusable
    address = f"http://{args.host}:{args.port}"
    print(f"starting the dashboard on {address} (store: {db_engine.safe_url(url)})", flush=True)
    child = subprocess.Popen(
        streamlit_command(port=args.port, host=args.host), env=streamlit_env(url)
    )
    with _stopping_child_on(child, signal.SIGTERM, signal.SIGHUP) as stopping:
        try:
            _await_answer(args.host, args.port, child, stopping, ANSWER_WAIT_S)
        except KeyboardInterrupt:  # Ctrl+C reached Streamlit too: it is stopping by itself
            stopping.append(signal.SIGINT)
        if child.poll() is None and not stopping:
            # The URL once it works (the server loads the pages' libraries before it listens),
            # or after ANSWER_WAIT_S on a machine too busy to say.
            print(f"DAPO Lab dashboard: {address}  (store: {db_engine.safe_url(url)})")
            print("Press Ctrl+C to stop.", flush=True)
        code = _wait_for(child, stopping)
    if not stopping:
        return code
    # Ctrl+C is how a user stops it (exit 0); a signal from elsewhere keeps its usual code.
    return 0 if stopping[0] == signal.SIGINT else 128 + stopping[0]
