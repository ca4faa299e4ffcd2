"""The dashboard's rerun: asked, confirmed with what will happen, sent once.

From the plain functions (what the confirmation says; the key every request carries), through
the app under Streamlit's AppTest (a confirmation before any request; a retry after a failure
keeps its key; Cancel sends nothing), to a real Prefect server (a key gives one flow run, never
two) and the real app in headless Chromium, double-clicked against that server.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dashboard_fixtures as fx
import prefect_server
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import browser, rerun

BIN = Path(sys.executable).parent


# --- what the confirmation says ------------------------------------------------------------------


def _attempt(
    run_id: int, attempt: int, status: str, steps: int, ckpt: str | None
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "attempt": attempt,
        "status": status,
        "steps": steps,
        "checkpoint_dir": ckpt,
    }


def test_describe_rerun_says_new_attempt_and_where_it_starts() -> None:
    say = rerun.describe_rerun
    assert say([], 3, "grpo", 0) == "A first attempt of arm 'grpo', seed 0 of sweep 3, from step 0."
    done = [_attempt(7, 1, "completed", 150, "/runs/a")]
    assert say(done, 3, "grpo", 0) == (
        "A new attempt (attempt 2) of arm 'grpo', seed 0 of sweep 3: run 7 completed, so the "
        "forced rerun starts over from step 0 in a new directory; run 7 and its results stay "
        "in the store."
    )
    # the latest attempt (not the first listed) decides: attempt 2 failed at step 40
    failed = [*done, _attempt(9, 2, "failed", 40, "/runs/b")]
    assert say(list(reversed(failed)), 3, "grpo", 0) == (
        "A new attempt (attempt 3) of arm 'grpo', seed 0 of sweep 3 that resumes run 9 "
        "(failed) from its last checkpoint, at step 40 or the checkpoint before it (from step "
        "0 if it left none)."
    )
    running = [_attempt(9, 2, "running", 12, "/runs/b")]
    assert say(running, 3, "grpo", 0).endswith(
        "Run 9 is marked running: if it is still training, the rerun is refused."
    )
    nothing = [_attempt(9, 1, "interrupted", 0, None)]
    assert say(nothing, 3, "grpo", 0) == (
        "A new attempt (attempt 2) of arm 'grpo', seed 0 of sweep 3: run 9 (interrupted) left "
        "no checkpoint, so it starts over from step 0."
    )


def test_the_idempotency_key_reaches_prefect() -> None:
    from test_dashboard_rerun import API, FakeClient

    key = rerun.idempotency_key(3, "grpo", 0, "abc")
    assert key == "dapo-rerun/sweep-3/grpo/seed-0/abc"
    assert rerun.new_token() != rerun.new_token()
    calls: list[tuple[str, Any]] = []
    result = rerun.request_rerun(
        3,
        "grpo",
        0,
        client_factory=lambda _url: FakeClient(calls),
        environ=API,
        idempotency_key=key,
    )
    assert result.ok
    _, kwargs = calls[1][1]
    assert kwargs["idempotency_key"] == key and kwargs["parameters"]["force"] is True


# --- the app, under AppTest ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory: pytest.TempPathFactory) -> fx.FixtureStore:
    return fx.build_store(f"sqlite:///{tmp_path_factory.mktemp('confirm-store') / 'store.db'}")


class Requests(list[dict[str, Any]]):
    """Every rerun request the app makes; `fail_first`: the first one gets no answer."""

    fail_first = False

    def __call__(self, sweep_id: int, arm: str, seed: int, **kw: Any) -> rerun.RerunResult:
        self.append({"target": (sweep_id, arm, seed), **kw})
        if self.fail_first and len(self) == 1:
            return rerun.RerunResult(ok=False, message="The Prefect server did not answer.")
        return rerun.RerunResult(ok=True, message=f"Flow run created ({len(self)}).")


@pytest.fixture
def requests(
    fixture_store: fx.FixtureStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Requests:
    monkeypatch.setenv("DAPO_DB_URL", fixture_store.url)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    seen = Requests()
    monkeypatch.setattr(rerun, "request_rerun", seen)  # the app runs in this process
    return seen


def run_page(store: fx.FixtureStore) -> AppTest:
    return fx.open_page(sweep=store.sweep_id, live=0)


def test_rerun_asks_first_and_says_what_will_happen(
    fixture_store: fx.FixtureStore, requests: Requests
) -> None:
    at = run_page(fixture_store)
    at.button(key="ablation-rerun").click().run()
    assert requests == []  # the first click only asks
    asked = [i.value for i in at.info if "Rerun grpo, seed 0?" in i.value]
    # grpo seed 0 completed in the fixture: a new attempt that starts over
    assert asked == [
        "**Rerun grpo, seed 0?** A new attempt (attempt 2) of arm 'grpo', seed 0 of sweep "
        f"{fixture_store.sweep_id}: run {fixture_store.run_ids[('grpo', 0)]} completed, so the "
        "forced rerun starts over from step 0 in a new directory; run "
        f"{fixture_store.run_ids[('grpo', 0)]} and its results stay in the store."
    ]
    at.button(key="ablation-rerun-cancel").click().run()
    assert requests == [] and not [i for i in at.info if "Rerun grpo" in i.value]
    at.button(key="ablation-rerun").click().run()
    at.button(key="ablation-rerun-confirm").click().run()
    assert len(requests) == 1
    assert requests[0]["target"] == (fixture_store.sweep_id, "grpo", 0)
    first_key = requests[0]["idempotency_key"]
    assert first_key.startswith(f"dapo-rerun/sweep-{fixture_store.sweep_id}/grpo/seed-0/")
    assert [s.value for s in at.success] == ["Flow run created (1)."]
    assert "ablation-rerun-confirm" not in [b.key for b in at.button]  # closed: answered
    # A later rerun is a new request: a new confirmation, a new key.
    at.button(key="ablation-rerun").click().run()
    at.button(key="ablation-rerun-confirm").click().run()
    assert len(requests) == 2 and requests[1]["idempotency_key"] != first_key


def test_a_failed_request_is_retried_with_the_same_key(
    fixture_store: fx.FixtureStore, requests: Requests
) -> None:
    requests.fail_first = True
    at = run_page(fixture_store)
    at.button(key="ablation-rerun").click().run()
    at.button(key="ablation-rerun-confirm").click().run()
    assert [w.value for w in at.warning] == ["The Prefect server did not answer."]
    # still asking: confirming again repeats the same request, so if the first did reach
    # Prefect after all, Prefect hands that flow run back instead of a second
    at.button(key="ablation-rerun-confirm").click().run()
    assert len(requests) == 2
    assert requests[0]["idempotency_key"] == requests[1]["idempotency_key"]
    assert [s.value for s in at.success] == ["Flow run created (2)."]


# --- a real Prefect server -----------------------------------------------------------------------


def _wait(check: Callable[[], Any], what: str, timeout_s: float, log: Path | None = None) -> Any:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}\n{tail}")


@contextmanager
def _client(api_url: str) -> Iterator[Any]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings(updates={PREFECT_API_URL: api_url}),
        get_client(sync_client=True) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `prefect server start` with the arm deployment registered (nothing serves it: the
    flow runs stay Scheduled, which is all a rerun request needs)."""
    with prefect_server.running(tmp_path_factory.mktemp("prefect-home")) as api_url:
        with _client(api_url) as client:
            flow_id = client.create_flow_from_name(rerun.FLOW_NAME)
            client.create_deployment(flow_id=flow_id, name=rerun.DEPLOYMENT_NAME)
        yield api_url


def _arm_runs(api_url: str, sweep_id: int) -> list[Any]:
    with _client(api_url) as client:
        runs = client.read_flow_runs()
    return [r for r in runs if (r.parameters or {}).get("sweep_id") == sweep_id]


@pytest.mark.slow
def test_prefect_gives_one_flow_run_per_key(prefect_api: str) -> None:
    env = {"PREFECT_API_URL": prefect_api}
    key = rerun.idempotency_key(501, "grpo", 0, rerun.new_token())
    first = rerun.request_rerun(501, "grpo", 0, environ=env, idempotency_key=key, timeout_s=60)
    again = rerun.request_rerun(501, "grpo", 0, environ=env, idempotency_key=key, timeout_s=60)
    assert first.ok and again.ok, (first.message, again.message)
    assert again.flow_run_id == first.flow_run_id
    other = rerun.idempotency_key(501, "grpo", 0, rerun.new_token())
    later = rerun.request_rerun(501, "grpo", 0, environ=env, idempotency_key=other, timeout_s=60)
    assert later.ok and later.flow_run_id != first.flow_run_id
    assert len(_arm_runs(prefect_api, 501)) == 2


# --- the real app in headless Chromium -----------------------------------------------------------

DOUBLE_CLICK_MS = int(os.environ.get("DAPO_TEST_DOUBLE_CLICK_MS", "120"))
# Streamlit draws buttons as <button> and an expander's title as <summary>; a material icon
# is text inside the button, hence `includes`.
_CLICK = """
(() => {
  const find = () => Array.from(document.querySelectorAll('button, summary'))
    .find(b => b.textContent.includes(%(label)s));
  const button = find();
  if (!button) return false;
  button.click();
  // a double click's second press, while the first one's script run asks Prefect
  if (%(again_ms)d >= 0) setTimeout(() => { const b = find(); if (b) b.click(); }, %(again_ms)d);
  return true;
})()
"""


def _click(page: browser.Page, label: str, *, again_ms: int = -1) -> bool:
    """Click the first button (or expander title) whose text holds `label`; with `again_ms`,
    click it again that many milliseconds later if it is still there."""
    import json

    script = _CLICK % {"label": json.dumps(label), "again_ms": again_ms}
    found = page.call("Runtime.evaluate", expression=script, returnByValue=True)
    return bool(found.get("result", {}).get("value"))


@pytest.mark.slow
@pytest.mark.browser
def test_a_double_click_in_the_browser_starts_one_flow_run(
    prefect_api: str, tmp_path: Path
) -> None:
    from chromium import find_chromium

    exe = find_chromium()
    store = fx.build_store(f"sqlite:///{tmp_path / 'store.db'}")
    env = {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": prefect_api}
    with (
        open(tmp_path / "streamlit.log", "wb") as log,
        browser.served(store.url, cwd=tmp_path, env=env, log=log) as base,
        browser.open_page(exe) as page,
    ):
        page.goto(f"{base}/?sweep={store.sweep_id}&live=0")
        page.wait_for(["Rerun an arm"])
        assert _click(page, "Rerun an arm")  # open the expander
        _wait(lambda: _click(page, "Rerun grpo (seed 0)"), "the rerun button", 60)
        text = page.wait_for(["Rerun grpo, seed 0?", "Confirm rerun"])
        assert "A new attempt (attempt 2) of arm 'grpo', seed 0" in text
        assert _arm_runs(prefect_api, store.sweep_id) == []  # asking sent nothing
        assert _click(page, "Confirm rerun", again_ms=DOUBLE_CLICK_MS)
        text = page.wait_for(["Flow run", "rerunning arm 'grpo', seed 0"])
        assert "Traceback" not in text
        time.sleep(2)  # a second request, had there been one, would have landed by now
    runs = _arm_runs(prefect_api, store.sweep_id)
    assert len(runs) == 1, [r.name for r in runs]
    assert runs[0].idempotency_key.startswith(f"dapo-rerun/sweep-{store.sweep_id}/grpo/seed-0/")
    uuid.UUID(str(runs[0].id))
