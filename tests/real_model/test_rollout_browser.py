"""The dashboard's rollout browser, served for real and opened in headless Chromium, on the store
of a real-model sweep (conftest.py `real_sweep`): the prompts and replies SmolLM2 saw and wrote,
in its chat template, with their multi-byte characters intact from tokenizer to screen.

Chromium as in tests/test_dashboard_browser.py: skipped when missing, except under CI. The
screenshot is kept under tests/artifacts/ (rollouts-real-model.png).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from dashboard import browser

from .conftest import MULTIBYTE_PROBLEMS, RealSweep

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
# One pytest-xdist worker for both: they share the session's one real-model sweep.
pytestmark = [pytest.mark.realmodel, pytest.mark.browser, pytest.mark.xdist_group("real_sweep")]

# Opens the first sample's expander (a <details>): its prompt and response are then drawn, so
# that the screenshot shows them (the text is in the page either way).
OPEN_FIRST_SAMPLE = """(() => {
  const summary = document.querySelector('details summary');
  if (!summary) return false;
  if (!summary.parentElement.open) summary.click();
  return true;
})()"""


# True once Streamlit's "running" indicator is gone and the table's canvas is drawn.
SCRIPT_DONE = """(() => !document.querySelector('[data-testid^="stStatusWidgetRunning"]')
  && !!document.querySelector('[data-testid="stDataFrame"] canvas'))()"""


def _wait_until(page: browser.Page, expression: str, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        result = page.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if result.get("result", {}).get("value") is True:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the page did not settle in {timeout_s:g} s: {expression}")


def _chromium() -> str:
    path = browser.find_browser()
    if path:
        return path
    message = "headless Chromium is not installed (apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; it is required when CI is set")
    pytest.skip(message)


def test_the_rollout_browser_shows_the_real_models_text(
    real_sweep: RealSweep, tmp_path: Path
) -> None:
    from db import reads
    from db.engine import get_engine

    exe = _chromium()
    assert real_sweep.done.returncode == 0, real_sweep.done.stderr[-3000:]
    engine = get_engine(real_sweep.store_url)
    (run_id,) = [int(r) for r in reads.runs_of_sweep(engine, 1)["run_id"]]
    last = reads.samples(engine, run_id, step=2, limit=1000)
    first = last.sort_values("idx").iloc[0]
    problem = first["prompt"].split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert problem in {text for text, _ in MULTIBYTE_PROBLEMS}
    response = " ".join(str(first["response"]).split())  # the page's text collapses blanks

    with (
        open(tmp_path / "streamlit.log", "wb") as log,
        browser.served(
            real_sweep.store_url, cwd=tmp_path, env={"PREFECT_HOME": str(tmp_path)}, log=log
        ) as base,
        browser.open_page(exe) as page,
    ):
        page.goto(f"{base}/rollouts?run={run_id}&live=0")
        # The page's last step (2) is shown: its summary line, then the samples' expanders.
        page.wait_for(["Rollouts", "samples ·", "tokens"])
        assert page.call("Runtime.evaluate", expression=OPEN_FIRST_SAMPLE, returnByValue=True)[
            "result"
        ]["value"]
        # The natural-language prompt in SmolLM2's chat template, and the model's own reply,
        # as the store holds them: ë é è И (2 bytes), € — (3 bytes) intact.
        text = page.wait_for(
            [
                "You are a helpful AI assistant named SmolLM",
                problem,
                "Answer:",
                "Response",
                *([response] if response else []),
            ]
        )
        assert "Traceback" not in text
        # The screenshot once the script has finished (the table drawn, no running indicator).
        page.wait_for(["Show", "Wrong", "Truncated"])
        _wait_until(page, SCRIPT_DONE)
        for garbled in ("Ã«", "â‚¬", "Ã©"):  # UTF-8 read as Latin-1 somewhere on the way
            assert garbled not in text
        shot = page.screenshot(tmp_path / "rollouts.png")
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "rollouts.png", ARTIFACTS / "rollouts-real-model.png")
