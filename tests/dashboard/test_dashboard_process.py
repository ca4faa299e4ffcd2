"""`dapo dashboard` as a process: SIGTERM stops its Streamlit child too, and a busy port is one
line and exit 2 before anything starts. The console script in a subprocess, as a service
manager or a user runs it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from dapo_common.util import free_port
from dashboard import browser

ROOT = Path(__file__).resolve().parents[2]
DAPO = ROOT / ".venv" / "bin" / "dapo"


def _env(tmp_path: Path, *, store: bool = False) -> dict[str, str]:
    """The command's environment; `store`: its store exists (`dapo dashboard` refuses a
    missing one, as `dapo table` does)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    if store:
        from db.engine import get_engine

        get_engine(url)  # created and migrated, as `dapo db upgrade` would
    env = dict(os.environ, DAPO_DB_URL=url)
    env.pop("DAPO_DEBUG", None)
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    return env


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not reaped by its parent, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_sigterm_stops_streamlit_too(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [str(DAPO), "dashboard", "--port", str(port)],
        env=_env(tmp_path, store=True),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: the test kills nothing else by accident
    )
    child = None
    try:
        assert proc.stdout is not None
        shown = b""
        for line in iter(proc.stdout.readline, b""):
            shown += line
            if b"DAPO Lab dashboard: " in line:
                break
        assert f"DAPO Lab dashboard: http://127.0.0.1:{port}".encode() in shown, shown
        # The URL works the moment it is printed (the server loads its libraries first).
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5) as ok:
            assert ok.status == 200
        browser.wait_until_healthy(port, proc, 90)  # Streamlit answers: it is running
        children = _children(proc.pid)
        assert len(children) == 1, children
        child = children[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        end = time.monotonic() + 15
        while _alive(child) and time.monotonic() < end:
            time.sleep(0.1)
        assert not _alive(child), "streamlit outlived `dapo dashboard`"
        with socket.socket() as s:  # and the port is free again
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    finally:
        for pid in (child, proc.pid):
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        # A failure before the child was found leaves it unnamed: the whole group goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_busy_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [str(DAPO), "dashboard", "--port", str(port)],
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use (another dashboard?): stop it, or pick "
        "another with --port"
    ]
    assert done.stdout == ""  # nothing started, nothing announced
    assert not (tmp_path / "store.db").exists()  # checked before the store was touched


@pytest.mark.parametrize("host", ["no-such-host.invalid", "203.0.113.7"])
def test_a_host_to_serve_on_that_is_not_this_machines(tmp_path: Path, host: str) -> None:
    done = subprocess.run(
        [str(DAPO), "dashboard", "--host", host, "--port", str(free_port())],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr


def test_a_store_path_with_a_typo_is_refused_not_created(tmp_path: Path) -> None:
    # as `dapo table` does: a missing SQLite file is a mistake, not a new empty store
    typo = tmp_path / "stroe.db"
    done = subprocess.run(
        [str(DAPO), "dashboard", "--store", f"sqlite:///{typo}", "--port", str(free_port())],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        f"error: no store at {typo} (it is created by the first `dapo sweep`, or `dapo db upgrade`)"
    ]
    assert done.stdout == "" and not typo.exists()
