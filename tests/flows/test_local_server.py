"""The temporary Prefect server of `dapo sweep` / `dapo arm` (flows/local_server.py): it serves
on a socket the driver bound, a start that fails before answering is tried again on the same
socket, and a failure says its cause (issue 21.12: a first start under load once exited with
code 3 and pointed at an empty log)."""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import pytest

from flows import local_server

pytestmark = pytest.mark.slow


def _flaky_command(marker: Path, real: list[str]) -> list[str]:
    """A server command whose first start fails as a loaded first start did (a line on stderr,
    exit 3), and whose next start is the real server with the same arguments."""
    script = textwrap.dedent(
        f"""
        import os, sys
        marker = {str(marker)!r}
        if not os.path.exists(marker):
            open(marker, "w").close()
            print("sqlite3.OperationalError: database is locked", file=sys.stderr)
            sys.exit(3)
        os.execv(sys.executable, {real!r})
        """
    )
    return [sys.executable, "-c", script]


def test_a_start_that_fails_before_answering_is_tried_again_on_the_same_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    server = local_server.start()
    try:
        # The first start is replaced by one that fails; the retry runs the real server.
        server.process.kill()
        server.process.wait()
        server.command = _flaky_command(tmp_path / "failed-once", server.command)
        server._launch()
        port = server.sock.getsockname()[1] if server.sock else None
        server.wait_ready()
        assert local_server.healthy(server.api_url)
        # The URL published before the retry is still the server's: same socket, same port.
        assert server.api_url == f"http://127.0.0.1:{port}/api"
        said = capsys.readouterr().err
        assert "exited with code 3 before it answered" in said
        assert "database is locked" in said  # the cause, from the server's own output
        assert "start 2 of 3" in said
    finally:
        server.stop()
    assert not local_server.healthy(server.api_url, timeout_s=0.5)
    # The driver's socket is closed with the server: the port is free again.
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_server_that_never_starts_says_why_after_its_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    server = local_server.start()
    server.process.kill()
    server.process.wait()
    server.command = [sys.executable, "-c", "import sys; print('boom: no database'); sys.exit(3)"]
    server._launch()
    with pytest.raises(ConnectionError) as err:
        server.wait_ready(timeout_s=60, tries=2)
    message = str(err.value)
    assert "\n" not in message
    assert "exited with code 3" in message
    assert "boom: no database" in message
    assert "2 starts tried" in message
    assert server.sock is not None and server.sock.fileno() == -1  # closed


def test_a_silent_failure_says_it_wrote_nothing(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("an earlier start's words\n")
    server = local_server.TemporaryServer(
        api_url="http://127.0.0.1:9/api",
        log=log,
        command=[sys.executable, "-c", "import sys; sys.exit(3)"],
        env={},
    )
    server._launch()
    with pytest.raises(ConnectionError, match="it wrote nothing") as err:
        server.wait_ready(timeout_s=30, tries=1)
    # Only this start's output is its cause, never an earlier start's.
    assert "earlier start" not in str(err.value)
