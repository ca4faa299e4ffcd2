"""The pages issue 41 changed, served for real and read in headless Chromium at 1440 px: one unit
and display names on the charts, the Runs page, the Run page's status and curves, Compare,
grids labelled by what varies, the rollout group view's height and legend, the progress of a
running run. Each test waits for the page's content (dashboard.browser), asserts what a user
reads, and keeps a screenshot under tests/artifacts/ (dashboard-*.png). Skipped without
Chromium, as test_dashboard_browser, except under CI."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import dashboard_fixtures as fx
import pytest
import rollout_fixtures as rf
from chromium import ARTIFACTS, find_chromium

from dapo_common import metric_names as M
from dashboard import browser
from db.store import Store

pytestmark = pytest.mark.browser
WIDTH, HEIGHT = 1440, 1000


class Served:
    """The served dashboard's base URL and the ids a test opens."""

    def __init__(self, base: str, ladder: fx.FixtureStore, grid: int, groups: int, live: int):
        self.base, self.ladder, self.grid, self.groups_run, self.live_run = (
            base, ladder, grid, groups, live,
        )  # fmt: skip


def live_run(url: str) -> int:
    """A sweep with one run in flight: 12 of its 20 steps stored, the last ten at 2 s and 4 s
    a step (3 s on average): 8 steps left, ETA 24 s."""
    store = Store(url)
    config = fx.arm_config("dapo", 0) | {"run": {"steps": 20, "seed": 0}}
    sweep = store.create_sweep(
        name="live", preset="tiny", arms=["dapo"], seeds=[0], base_config=config, ladder=[]
    )
    store.set_sweep_status(sweep, "running")
    run_id = store.resume_attempt(
        sweep_id=sweep, arm="dapo", seed=0, config=config, config_hash="live", after=None,
        resume_step=None, checkpoint_dir="/runs/live",
    ).run_id  # fmt: skip
    times = [30.0, 30.0] + [2.0] * 5 + [4.0] * 5
    with store.sink(run_id) as sink:
        for step, seconds in enumerate(times, start=1):
            sink.log_metrics(step, {M.ROLLOUT_STEP: float(step), M.STEP_S: seconds})
    return run_id


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("pages-store")
    url = f"sqlite:///{directory / 'store.db'}"
    ladder = fx.build_store(url)
    grid = fx.build_grid_sweep(url).sweep_id
    _, groups = rf.build_many_groups(url, size=16)
    live = live_run(url)
    env = {"PREFECT_HOME": str(directory / "prefect")}
    with (
        open(directory / "streamlit.log", "wb") as log,
        browser.served(url, cwd=directory, env=env, log=log) as base,
    ):
        yield Served(base, ladder, grid, groups, live)


@pytest.fixture()
def page() -> Iterator[browser.Page]:
    exe = find_chromium()
    with browser.open_page(exe) as tab:
        tab.set_viewport(WIDTH, HEIGHT)
        yield tab


def keep(tab: browser.Page, tmp_path: Path, name: str) -> None:
    """A screenshot of the viewport, kept as tests/artifacts/<name>."""
    data = tab.screenshot(tmp_path / name)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # drawn, not blank
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / name, ARTIFACTS / name)


def scroll_to(tab: browser.Page, heading: str) -> None:
    """Scroll the main area so that the heading `heading` is at the top (the sidebar's
    links may carry the same words)."""
    found = tab.evaluate(
        "(() => { const e = [...document.querySelectorAll("
        '\'[data-testid="stMain"] h1, [data-testid="stMain"] h2, '
        '[data-testid="stMain"] h3\')]'
        f".find(x => x.textContent.trim() === {json.dumps(heading)});"
        " if (e) e.scrollIntoView(); return Boolean(e); })()"
    )
    assert found, heading


def settle(tab: browser.Page, needles: list[str]) -> str:
    """The page's text once every needle is on it and Streamlit has stopped running: the last
    charts are drawn a moment after the text that precedes them."""
    text = tab.wait_for(needles)
    end = time.monotonic() + 60
    while time.monotonic() < end and tab.evaluate(
        "Boolean(document.querySelector('[data-testid=\"stStatusWidget\"]'))"
    ):
        time.sleep(browser.POLL_S)  # polling for the page to finish, not timing anything
    return text


CLICK = """(() => {{ const label = Array.from(document.querySelectorAll('label'))
  .find(l => l.innerText.trim() === {text!r});
  if (!label) return false; label.click(); return true; }})()"""


def main_height(tab: browser.Page) -> int:
    """The height of the page's scrolling main area, in CSS pixels."""
    return int(tab.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight"))


def test_curves_in_percent_by_display_name(
    served: Served, page: browser.Page, tmp_path: Path
) -> None:
    page.goto(f"{served.base}/curves?sweep={served.ladder.sweep_id}")
    text = settle(page, ["held-out avg@4 (%)", "training accuracy (%)", "Download the plotted"])
    assert "eval/avg_at_k" not in text.split("Held-out score")[1].split("Training metrics")[0]
    keep(page, tmp_path, "dashboard-curves.png")
    scroll_to(page, "Training metrics")
    keep(page, tmp_path, "dashboard-curves-training.png")


def test_runs_page_across_sweeps(served: Served, page: browser.Page, tmp_path: Path) -> None:
    page.goto(f"{served.base}/runs")
    # the newest sweeps first (the table draws the rows in view): runs of three sweeps
    text = settle(
        page,
        [
            "Group by",
            "held-out avg@4 (%)",
            "Lines and their runs",
            "#5 live",
            "#3 grid",
            "clip_high=0.28, clip_low=0.2 (base)",
        ],  # a grid's arm by what varies
    )
    assert "Traceback" not in text
    keep(page, tmp_path, "dashboard-runs.png")
    scroll_to(page, "Curves")
    keep(page, tmp_path, "dashboard-runs-curves.png")


def test_run_page_status_whole_and_its_curves(
    served: Served, page: browser.Page, tmp_path: Path
) -> None:
    run_id = served.ladder.run_ids[("clip_higher", 0)]
    page.goto(f"{served.base}/run?run={run_id}")
    text = settle(page, ["Status:", "✔ completed", "Curves of this run", "held-out avg@4 (%)"])
    assert "comple…" not in text
    keep(page, tmp_path, "dashboard-run.png")
    scroll_to(page, "Curves of this run")
    keep(page, tmp_path, "dashboard-run-curves.png")


def test_compare_in_the_tables_unit(served: Served, page: browser.Page, tmp_path: Path) -> None:
    a, b = served.ladder.run_ids[("grpo", 0)], served.ladder.run_ids[("clip_higher", 0)]
    page.goto(f"{served.base}/compare?a={a}&b={b}")
    # acc/mean at the last step: 50.0 % and 60.0 %, a difference of +10.0 pp
    text = settle(page, ["training accuracy", "50.0%", "60.0%", "+10.0 pp", "Curves"])
    assert text.count("The store has no sweeps yet") == 0
    scroll_to(page, "Final metrics")
    keep(page, tmp_path, "dashboard-compare.png")


def test_grid_labelled_by_what_varies(served: Served, page: browser.Page, tmp_path: Path) -> None:
    page.goto(f"{served.base}/grid?sweep={served.grid}")
    text = settle(page, ["clip_high=0.28, clip_low=0.2 (base)", "held-out avg@4 (%)", "point"])
    assert "series" not in text.split("point")[0]  # the table's first header is the point
    keep(page, tmp_path, "dashboard-grid.png")
    page.goto(f"{served.base}/curves?sweep={served.grid}")
    settle(page, ["clip_high=0.24, clip_low=0.16", "Download the plotted"])
    keep(page, tmp_path, "dashboard-grid-curves.png")


def test_rollout_groups_page_stays_short(
    served: Served, page: browser.Page, tmp_path: Path
) -> None:
    page.goto(f"{served.base}/rollouts?run={served.groups_run}")
    page.wait_for(["Rollouts", "Groups"])
    assert page.evaluate(CLICK.format(text="Groups"))
    # the legend is drawn after the counts (at a load of 4 it was not there yet): wait for it too
    needles = ["16 group(s) stored: 6 mixed, 5 all right, 5 all wrong", "Page (of 8)"]
    text = settle(page, [*needles, "the token's update step"])
    assert "None" not in text.split("16 group(s) stored")[1]
    # the legend reads its apostrophe, escaped once
    legend = page.evaluate("document.querySelector('.dapo-legend').textContent")
    assert "the token's update step" in legend and "&#x27;" not in legend
    # two whole groups of 16 long responses: one screenful or a few, not 12,833 px
    height = main_height(page)
    assert height < 4500, height
    keep(page, tmp_path, "dashboard-rollout-groups.png")
    assert page.evaluate(CLICK.format(text="All wrong"))
    text = settle(page, ["Page (of 3)", "Group 11"])
    assert "Group 0 " not in text


def test_a_running_run_shows_its_step_and_eta(
    served: Served, page: browser.Page, tmp_path: Path
) -> None:
    page.goto(f"{served.base}/sweeps?live=0")
    # 12 of 20 steps, the last ten at 3 s a step on average: 8 left, ETA 24 s
    text = settle(page, ["Running now", "12 / 20", "3.0 s/step", "24s"])
    assert "0 / 1 · 1 running" in text
    keep(page, tmp_path, "dashboard-sweeps-progress.png")
    page.goto(f"{served.base}/run?run={served.live_run}")
    settle(page, ["● running", "12 / 20", "24s"])
    keep(page, tmp_path, "dashboard-run-progress.png")
