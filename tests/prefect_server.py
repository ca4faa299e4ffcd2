"""A real `prefect server start` for the tests that need one, and the waits around it.

    with prefect_server.running(tmp / "prefect-server", ui=True) as api_url:
        ...   # http://127.0.0.1:PORT/api; the server is stopped by its process group after

The server gets a free port of 127.0.0.1 and a PREFECT_HOME of its own (its database); with
`ui` it also serves the v1 UI, the one tests/prefect_ui.py drives, reading this API (left
unset, the UI's pages would call the default port 4200).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dapo_common.util import free_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 120.0


def wait_for(
    check: Callable[[], Any],
    what: str,
    timeout_s: float,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
) -> Any:
    """Poll `check` until it returns something truthy (a condition, not a guess at timing);
    fail with the log's tail when `proc` exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            pytest.fail(f"{what}: the process exited with {proc.returncode}\n{tail}")
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}\n{tail}")


def healthy(api_url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{api_url}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> None:
    """Stop `proc` and its process group (it was started in a session of its own)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def running(home: Path, *, ui: bool = False) -> Iterator[str]:
    """A Prefect server with its database in `home` (created), until the block ends; yields
    its API URL once it answers."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "true" if ui else "false",
    }
    if ui:
        env.update({"PREFECT_SERVER_UI_V2_ENABLED": "false", "PREFECT_UI_API_URL": api_url})
    env.pop("PREFECT_API_URL", None)
    log = home / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: healthy(api_url), "the Prefect server", START_TIMEOUT_S, proc, log)
        yield api_url
    finally:
        stop(proc)
