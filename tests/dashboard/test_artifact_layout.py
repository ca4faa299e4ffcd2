"""The Prefect artifacts of a sweep in Prefect's own UI, in headless Chromium at 1440 px wide (a
laptop screen): the ablation table, the summary and the mechanism table show their key columns
first and whole on screen, and keep every column after them.

The module starts one `prefect server start` with its UI (temporary PREFECT_HOME, a free port),
publishes the fixture ladder sweep's artifacts with flows.publish.publish_sweep inside a flow
run (in a subprocess, as a worker would; no training), and opens each artifact's page. On that
page the artifact's details take the right side, so a table gets about 880 px and scrolls
inside its card: "whole on screen" reads: each key header lies within the viewport and within
every clipping box around its table. Screenshots are kept under tests/artifacts/
(artifact-*.png). Skipped without Chromium, as test_dashboard_browser. The first two tests,
without a server, check that the artifacts' order only moves columns: every cell stays.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dashboard_fixtures as fx
import prefect_server
import prefect_ui
import pytest
from chromium import ARTIFACTS, find_chromium

from dashboard import browser
from db import table_format
from flows import plan, publish

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WIDTH, HEIGHT = 1440, 900
# the fixture's runs are 5 rollout steps: windows of 5; the first window's Δ leads
MECHANISM_KEY = ["arm", "metric", "Δ parent, first 5"]


@dataclass
class Published:
    api_url: str
    store: fx.FixtureStore
    columns: list[str]  # the ablation table's columns, as `dapo table` has them


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> fx.FixtureStore:
    return fx.build_store(f"sqlite:///{tmp_path_factory.mktemp('artifact-store') / 'store.db'}")


def markdown_rows(markdown: str) -> list[dict[str, str]]:
    """The cells of the (first) Markdown table in `markdown`, by column (a summary holds the
    comparisons' table after the ablation table's)."""
    lines = []
    for line in markdown.splitlines():
        if line.startswith("| "):
            lines.append(line)
        elif lines and not line.startswith("|"):  # past the table (its rule starts "|:")
            break
    head, *body = ([c.strip() for c in line.strip("| ").split(" | ")] for line in lines)
    return [dict(zip(head, row, strict=True)) for row in body]


def test_the_artifact_order_puts_the_key_columns_first_and_keeps_every_cell(
    store: fx.FixtureStore,
) -> None:
    table, sweep = publish.ablation(store.url, store.sweep_id)
    records = table_format.ablation_records(table)
    ordered = table_format.artifact_records(records)
    key = list(table_format.ARTIFACT_KEY)
    assert list(ordered[0])[: len(key)] == key and list(ordered[0])[-1] == "adds"
    assert ordered == records  # the same cells (dicts compare without their order)
    # the summary: `dapo table --format markdown`'s cells and notes, in the artifact's order
    cli = table_format.render(table, "markdown", sweep)
    summary = publish.summary_markdown(table, sweep, None)
    assert list(markdown_rows(summary)[0])[: len(key)] == key
    assert markdown_rows(summary) == markdown_rows(cli)
    assert summary.endswith(cli.split("\n\n", 1)[1])


def test_the_mechanism_artifact_is_the_cli_table_key_first(store: fx.FixtureStore) -> None:
    from db import mechanisms

    cli = mechanisms.render(store_frame(store), "markdown", focus_only=True)
    artifact = publish.mechanisms_markdown(store.url, store.sweep_id)
    assert list(markdown_rows(artifact)[0])[: len(MECHANISM_KEY)] == MECHANISM_KEY
    # An arm's parent and changes once, then '"' (as above) on its other rows.
    rows = markdown_rows(artifact)
    for i in range(1, len(rows)):
        for column in ("parent", "changes"):
            if rows[i][column] == mechanisms.DITTO:
                assert rows[i]["arm"] == rows[i - 1]["arm"]
                rows[i][column] = rows[i - 1][column]
    assert any(r["changes"] == mechanisms.DITTO for r in markdown_rows(artifact))
    assert rows == markdown_rows(cli)
    assert artifact.split("\n\n", 1)[1] == cli.split("\n\n", 1)[1]  # notes and caption


def store_frame(store: fx.FixtureStore) -> Any:
    """The mechanism table the artifact is made of (its window: `dapo table`'s default)."""
    from db import reads
    from db.cli import mechanism_window
    from db.engine import get_engine
    from db.mechanism_table import mechanism_table

    engine = get_engine(store.url)
    steps = reads.runs_of_sweep(engine, store.sweep_id)["steps"]
    window = mechanism_window(None, steps, store.sweep_id)
    return mechanism_table(engine, store.sweep_id, window=window)


@pytest.fixture(scope="module")
def published(
    store: fx.FixtureStore, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Published]:
    work = tmp_path_factory.mktemp("artifact-layout")
    with prefect_server.running(work / "prefect-server", ui=True) as api_url:
        run = textwrap.dedent(f"""
            from prefect import flow
            from flows.publish import publish_sweep

            @flow(name="publish-artifacts")
            def publish_artifacts() -> None:
                publish_sweep({store.url!r}, {store.sweep_id})

            publish_artifacts()
            """)
        client_env = {
            **os.environ,
            "PREFECT_API_URL": api_url,
            "PREFECT_HOME": str(work / "prefect-client"),
        }
        done = subprocess.run(
            [sys.executable, "-c", run],
            env=client_env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        table, _ = publish.ablation(store.url, store.sweep_id)
        yield Published(api_url, store, list(table_format.ablation_records(table)[0]))


def whole_on_screen(table: dict[str, Any], keys: list[str]) -> None:
    """Every key header is there, lies within the part of the screen the table can show, and
    within the viewport."""
    headers = {h["text"]: h for h in table["headers"]}
    missing = [k for k in keys if k not in headers]
    assert not missing, f"key columns missing: {missing} (headers: {list(headers)})"
    assert table["left"] >= 0 and table["right"] <= WIDTH, table
    cut = [
        (k, round(headers[k]["left"]), round(headers[k]["right"]))
        for k in keys
        if headers[k]["left"] < table["left"] or headers[k]["right"] > table["right"]
    ]
    assert not cut, (
        f"key columns out of sight at {WIDTH} px (the table shows x in "
        f"[{table['left']:.0f}, {table['right']:.0f}]): {cut}"
    )


def look(
    page: browser.Page, url: str, needles: list[str], name: str, *, count: int = 1
) -> list[dict[str, Any]]:
    tables = prefect_ui.artifact_tables(page, url, needles)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(ARTIFACTS / f"artifact-{name}.png")
    assert len(tables) == count, [t["headers"] for t in tables]
    return tables


@pytest.mark.browser
@pytest.mark.slow
def test_key_columns_fit_1440_px(published: Published) -> None:
    exe = find_chromium()
    api, sweep_id = published.api_url, published.store.sweep_id
    key = list(table_format.ARTIFACT_KEY)
    with browser.open_page(exe) as page:
        page.set_viewport(WIDTH, HEIGHT)

        url = prefect_ui.latest_artifact_url(api, plan.artifact_key("ablation-table", sweep_id))
        # token_loss's Δ base: significant; dapo: still running
        (table,) = look(page, url, [*fx.ARMS, "+12.5 [+6.1, +18.9]", "running"], "table")
        headers = [h["text"] for h in table["headers"]]
        assert headers[: len(key)] == key
        assert sorted(headers) == sorted(published.columns)  # every column, key ones first
        whole_on_screen(table, key)

        url = prefect_ui.latest_artifact_url(api, plan.artifact_key("ablation-summary", sweep_id))
        # the ablation table, then the comparisons' (exact p, MDE, seeds needed)
        table, compared = look(
            page, url, [*fx.ARMS, "No arm leads significantly"], "summary", count=2
        )
        assert [h["text"] for h in compared["headers"]][:5] == ["comparison", "vs", "n", "Δ", "p"]
        headers = [h["text"] for h in table["headers"]]
        assert headers[: len(key)] == key
        assert sorted(headers) == sorted(published.columns)
        whole_on_screen(table, key)

        url = prefect_ui.latest_artifact_url(api, plan.artifact_key("mechanism-table", sweep_id))
        (table,) = look(page, url, ["clip_ratio/high (%)", "+1.25 [+0.61, +1.89]"], "mechanisms")
        assert [h["text"] for h in table["headers"]][: len(MECHANISM_KEY)] == MECHANISM_KEY
        whole_on_screen(table, MECHANISM_KEY)
