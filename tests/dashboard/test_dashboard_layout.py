"""The dashboard in headless Chromium at 1440 px wide, a laptop screen: the ablation, sweeps and
mechanism tables show their key columns whole (dashboard.layout), and the sweep list shows tags
and leaves a hidden sweep out (dashboard.notes).

Streamlit draws a table on a canvas; beside it, for screen readers, it keeps a hidden table
whose header row holds only the columns the grid has drawn: those that intersect the visible
part of the table. So "every key column is whole on screen" reads: every key header is
there, and so is a header after the last key column (the one cut by the edge, if any, is not a
key column); and the table itself lies within the 1440 px viewport. Screenshots are kept
under tests/artifacts/ (layout-*.png). Skipped without Chromium, as test_dashboard_browser.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dashboard_fixtures as fx
import prefect_ui
import pytest
from chromium import ARTIFACTS, find_chromium

from dashboard import browser, layout
from db import annotations as ann
from db.annotations import Target
from db.engine import get_engine

pytestmark = pytest.mark.browser
WIDTH, HEIGHT = 1440, 900

# Per table on screen: its left and right edges and the headers the grid has drawn.
TABLES_JS = """(() => Array.from(document.querySelectorAll('[data-testid="stDataFrame"]'))
  .map(frame => { const box = frame.getBoundingClientRect();
    return {left: box.left, right: box.right,
            headers: Array.from(frame.querySelectorAll('th')).map(th => th.textContent.trim())};
  }))()"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, fx.FixtureStore]]:
    directory = tmp_path_factory.mktemp("layout-store")
    store = fx.build_store(f"sqlite:///{directory / 'store.db'}")
    engine = get_engine(store.url)
    ann.add_tags(engine, Target(store.sweep_id), ["baseline", "paper-fig2"])
    ann.set_note(engine, Target(store.sweep_id), "first full ladder")
    ann.set_hidden(engine, store.other_sweep_id)  # the newer one: a trial
    env = {"PREFECT_HOME": str(directory / "prefect")}
    with (
        open(directory / "streamlit.log", "wb") as log,
        browser.served(store.url, cwd=directory, env=env, log=log) as base,
    ):
        yield base, store


def key_columns_whole(table: dict[str, Any], keys: list[str]) -> None:
    headers = table["headers"]
    missing = [k for k in keys if k not in headers]
    assert not missing, f"key columns off screen at {WIDTH} px: {missing} (drawn: {headers})"
    last = max(headers.index(k) for k in keys)
    assert last + 1 < len(headers), f"the last key column {headers[last]!r} is cut: {headers}"
    assert table["left"] >= 0 and table["right"] <= WIDTH, table


def look(page: browser.Page, url: str, needles: list[str], shot: Path) -> list[dict[str, Any]]:
    page.goto(url)
    text = page.wait_for(needles)
    assert "Traceback" not in text
    # The needles can be on the page before the grid has drawn its header row (CI once read a
    # table with none): wait for the headers too.
    prefect_ui.wait_js(
        page,
        "!!document.querySelector('[data-testid=\"stDataFrame\"]')?.querySelector('th')",
        "the table's header row",
    )
    page.screenshot(shot)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)
    return list(page.evaluate(TABLES_JS))


def test_key_columns_fit_1440_px(served: tuple[str, fx.FixtureStore], tmp_path: Path) -> None:
    exe = find_chromium()
    base, store = served
    with browser.open_page(exe) as page:
        page.set_viewport(WIDTH, HEIGHT)
        tables = look(
            page,
            f"{base}/?sweep={store.sweep_id}&live=0",
            [*fx.ARMS, "+12.5 [+6.1, +18.9]"],
            tmp_path / "layout-ablation.png",
        )
        key_columns_whole(tables[0], layout.ABLATION_KEY)

        tables = look(
            page,
            f"{base}/sweeps?live=0",
            ["baseline, paper-fig2", "1 hidden (Show hidden sweeps"],
            tmp_path / "layout-sweeps.png",
        )
        key_columns_whole(tables[0], layout.SWEEP_KEY_HEADERS)

        tables = look(
            page,
            f"{base}/mechanisms?sweep={store.sweep_id}",
            ["Each arm's signature", "+1.25 [+0.61, +1.89]"],
            tmp_path / "layout-mechanisms.png",
        )
        key_columns_whole(tables[0], layout.signature_key(tables[0]["headers"]))


def test_sweep_list_shows_tags_and_leaves_the_hidden_sweep_out(
    served: tuple[str, fx.FixtureStore],
) -> None:
    exe = find_chromium()
    base, store = served
    with browser.open_page(exe) as page:
        page.set_viewport(WIDTH, HEIGHT)
        page.goto(f"{base}/sweeps?live=0")
        text = page.wait_for(["baseline, paper-fig2", "1 hidden (Show hidden sweeps"])
        assert "first full ladder" in text
        assert "tiny-check" not in text  # the hidden sweep: not in the list, nor the editor
        page.goto(f"{base}/?sweep={store.other_sweep_id}&live=0")  # a link still opens it
        # (the picker's text is not in the DOM: the page's own line says it is hidden)
        page.wait_for(["Sweep hidden", "2/2 runs done"])
