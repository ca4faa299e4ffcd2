"""The dashboard served for real and opened in headless Chromium.

Skipped with a reason when Chromium is not installed, except under CI (env var CI set), where a
missing browser fails the test: there, `make` installs it (`apt-get install -y chromium`).
The screenshot is kept as a test artifact under tests/artifacts/.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import dashboard_fixtures as fx
import pytest

from dashboard import browser, cli

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
pytestmark = pytest.mark.browser


def find_chromium() -> str:
    """The browser's path; fails under CI and skips elsewhere when none is installed."""
    path = browser.find_browser()
    if path:
        return path
    message = "headless Chromium is not installed (apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; it is required when CI is set")
    pytest.skip(message)


chromium = browser.chromium
free_port = browser.free_port
wait_until_healthy = browser.wait_until_healthy


def visible_text(dom: str) -> str:
    """The rendered page as plain text (scripts and styles dropped)."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text)))


@pytest.fixture(scope="module")
def served_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """The fixture store behind a real `streamlit run` of the dashboard: (base URL, sweep id)."""
    directory = tmp_path_factory.mktemp("browser-store")
    store = fx.build_store(f"sqlite:///{directory / 'store.db'}")
    port = free_port()
    command = cli.streamlit_command(store.url, port=port, host="127.0.0.1")
    env = dict(os.environ, DAPO_DB_URL=store.url, PREFECT_HOME=str(directory / "prefect"))
    with open(directory / "streamlit.log", "wb") as log:
        server = subprocess.Popen(command, cwd=directory, env=env, stdout=log, stderr=log)
        try:
            wait_until_healthy(port, server, deadline_s=60)
            yield f"http://127.0.0.1:{port}", store.sweep_id
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def test_ablation_view_renders_every_arm(served_dashboard: tuple[str, int], tmp_path: Path) -> None:
    exe = find_chromium()
    base, sweep_id = served_dashboard
    page = f"{base}/?sweep={sweep_id}&live=0"  # no refresh mid-screenshot
    # The first loads after start can show only grey placeholders (the server is still
    # importing the app): reload until the table is there, a bounded number of times.
    text = ""
    for _ in range(6):
        text = visible_text(chromium(exe, "--dump-dom", page))
        if all(arm in text for arm in fx.ARMS):
            break
    assert "Ablation ladder" in text
    missing = [arm for arm in fx.ARMS if arm not in text]
    assert not missing, f"arms not rendered: {missing}\n{text[:3000]}"
    assert "Traceback" not in text
    # token_loss − grpo paired by seed: (13, 12) -> 12.5 ± 6.35 pp, marked as above 0
    assert "+12.5 [+6.1, +18.9] *" in text
    assert "n=1, no interval" in text  # one-seed arms show no false certainty
    assert "No arm leads significantly" in text

    shot = tmp_path / "dashboard.png"
    data = b""
    for _ in range(4):  # a fresh load can again catch the placeholders before the table
        chromium(exe, f"--screenshot={shot}", page)
        data = shot.read_bytes()
        if len(data) > 20_000:
            break
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a rendered table and chart, not a blank page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "dashboard.png")


def test_mechanisms_view_renders_each_arms_signature(served_dashboard: tuple[str, int]) -> None:
    exe = find_chromium()
    base, sweep_id = served_dashboard
    page = f"{base}/mechanisms?sweep={sweep_id}"
    text = ""
    for _ in range(6):  # as above: the first loads may show only placeholders
        text = visible_text(chromium(exe, "--dump-dom", page))
        if "Each arm's signature" in text and "clip_ratio/high" in text:
            break
    assert "Mechanisms" in text and "Traceback" not in text
    assert "Each arm's signature" in text, text[:3000]
    # clip_higher − overlong_filter on clip_ratio/high, paired by seed: (1.2, 1.3) pp ->
    # 1.25 ± 12.7062 · 0.05, above 0 (the fixture's value is the same at every step)
    assert "+1.25 [+0.61, +1.89] *" in text
    assert "◆ loss/long_share (%)" in text
