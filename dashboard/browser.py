"""Headless Chromium against a served dashboard: for the README's screenshots and the browser test.

Flags as ../shared/ENV_NOTES.md found them to work on a headless Linux box running as root.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--virtual-time-budget=60000",
    "--window-size=1600,1200",
)


def find_browser() -> str | None:
    """The first Chromium-family browser on PATH, or None."""
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def chromium(browser: str, *args: str, timeout_s: float = 120) -> str:
    """Run the browser headless with a throw-away profile; its stdout (e.g. `--dump-dom`)."""
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{browser} exited with {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_healthy(port: int, server: subprocess.Popen[bytes], deadline_s: float) -> None:
    """Poll Streamlit's health endpoint until it answers; RuntimeError if the server dies or
    the deadline passes."""
    url = f"http://127.0.0.1:{port}/_stcore/health"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)  # polling interval while the server starts, not a timing assumption
    raise RuntimeError(f"streamlit did not answer on port {port} within {deadline_s} s")
