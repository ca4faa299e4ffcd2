"""A one-key grid reads by what varies: its arms ("clip_higher-clip_high=0.24", names that an axis
or a legend cut to the same "clip_higher-clip_hig…") are labelled "clip_high=0.24" on the Grid,
Curves and Mechanisms pages, the Grid page's axis is honest and its table has no constant
column. Run headless by streamlit's AppTest; numbers by hand from the rows written here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dashboard_fixtures as fx
import pandas as pd
import pytest
from dashboard_fixtures import chart_rows
from streamlit.testing.v1 import AppTest

from dapo_common import metric_names as mn
from dashboard import grids
from db.store import Store

BASE = "clip_higher"
# arm -> (clip_high, final score of seeds 0 and 1)
POINTS: dict[str, tuple[float, tuple[float, float]]] = {
    BASE: (0.28, (0.43, 0.44)),
    "clip_higher-clip_high=0.2": (0.2, (0.42, 0.425)),
    "clip_higher-clip_high=0.24": (0.24, (0.425, 0.435)),
    "clip_higher-clip_high=0.32": (0.32, (0.435, 0.445)),
}
LADDER: list[dict[str, Any]] = [
    {
        "arm": arm,
        "adds": f"clip_high={high:g}",
        "parent": None if arm == BASE else BASE,
        "grid": {"algo.clip_high": high},
    }
    for arm, (high, _) in POINTS.items()
]


@pytest.fixture(scope="module")
def grid_url(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    url = f"sqlite:///{tmp_path_factory.mktemp('one-key-grid') / 'store.db'}"
    store = Store(url)
    sweep = store.create_sweep(
        name="clip-grid", preset="tiny", arms=list(POINTS), seeds=[0, 1],
        base_config=fx.arm_config(BASE, 0), ladder=LADDER,
    )  # fmt: skip
    for arm, (high, finals) in POINTS.items():
        for seed, final in enumerate(finals):
            config = fx.arm_config(BASE, seed, clip_high=high) | {"arm": arm}
            run_id = store.resume_attempt(
                sweep_id=sweep, arm=arm, seed=seed, config=config, config_hash=f"{arm}{seed}",
                after=None, resume_step=None, checkpoint_dir=f"/runs/{arm}-{seed}",
            ).run_id  # fmt: skip
            with store.sink(run_id) as sink:
                sink.log_evaluation(0, fx.evaluation(fx.START_SCORES[seed]))
                for step in range(fx.STEPS):
                    metrics = fx.step_metrics(2, seed, step)
                    metrics[mn.CLIP_RATIO_HIGH] = fx.grid_clip_fraction(high, seed)
                    sink.log_metrics(step, metrics)
                sink.log_evaluation(fx.STEPS - 1, fx.evaluation(final))
            store.update_run(run_id, status="completed", steps=fx.STEPS, wall_s=60.0)
    store.set_sweep_status(sweep, "completed")
    return url, sweep


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    yield


def open_page(url: str, page: str, monkeypatch: pytest.MonkeyPatch, **query: object) -> AppTest:
    monkeypatch.setenv("DAPO_DB_URL", url)
    return fx.open_page(page, **query)


LABELS = ["clip_high=0.28 (base)", "clip_high=0.2", "clip_high=0.24", "clip_high=0.32"]


def test_labels_name_what_varies() -> None:
    assert list(grids.arm_labels(LADDER).values()) == LABELS
    # two keys of which one holds one value everywhere: only the other names the point
    two = [
        {"arm": "a", "grid": {"algo.clip_high": 0.2, "algo.clip_low": 0.2}},
        {"arm": "b", "parent": "a", "grid": {"algo.clip_high": 0.24, "algo.clip_low": 0.2}},
    ]
    assert grids.arm_labels(two) == {"a": "clip_high=0.2 (base)", "b": "clip_high=0.24"}
    assert grids.arm_labels([{"arm": "grpo"}]) == {}  # not a grid: names stay
    same = [{"arm": "a", "grid": {"k": 1}}, {"arm": "b", "grid": {"k": 1}}]
    assert grids.arm_labels(same) == {}  # a label must name one arm, else the names stay


def test_zoom_never_makes_a_small_gap_fill_the_chart() -> None:
    # two means 1.5 pp apart with no intervals: zoomed, the axis still spans 10 pp
    frame = pd.DataFrame(
        {"mean": [42.0, 43.5], "low": [float("nan")] * 2, "high": [float("nan")] * 2}
    )
    low, high = grids.y_domain(frame, score=True, share=True, zoom=True) or [0, 0]
    assert high - low == pytest.approx(grids.MIN_ZOOM_SPAN_PP)
    assert grids.y_domain(frame, score=True, share=True, zoom=False) == [0.0, 100.0]
    assert grids.y_domain(frame, score=False, share=True, zoom=False) is None  # from 0
    # near the bound, the window moves inside 0-100 rather than past it
    near = frame.assign(mean=[1.0, 2.0])
    assert grids.y_domain(near, score=True, share=True, zoom=True) == [0.0, 10.0]


def test_grid_page_of_a_one_key_grid(
    grid_url: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, sweep = grid_url
    at = open_page(url, "grid", monkeypatch, sweep=sweep)
    points = at.dataframe[0].value
    # one key: no "series" column saying "all" on every row
    assert "series" not in points.columns
    assert points["label"].tolist() == [LABELS[1], LABELS[2], LABELS[0], LABELS[3]]  # by x
    # means over seeds 0, 1 in percent: (42 + 42.5) / 2 = 42.25 at clip_high 0.2
    assert points["mean"].tolist() == pytest.approx([42.25, 43.0, 43.5, 44.0])
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert spec["layer"][0]["encoding"]["y"]["scale"]["domain"] == [0.0, 100.0]


def test_curves_and_mechanisms_label_grid_arms(
    grid_url: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, sweep = grid_url
    at = open_page(url, "curves", monkeypatch, sweep=sweep)
    held_out = at.get("vega_lite_chart")[0]
    assert set(chart_rows(held_out)["arm"]) == set(LABELS)
    legend = json.loads(held_out.proto.spec)["layer"][-1]["encoding"]["color"]["legend"]
    assert legend["labelLimit"] >= 400  # a label is shown whole
    assert at.multiselect(key="curve-arms").options == LABELS
    at = open_page(url, "mechanisms", monkeypatch, sweep=sweep)
    chart = at.get("vega_lite_chart")[0]
    spec = json.loads(chart.proto.spec)
    assert spec["layer"][0]["encoding"]["x"]["sort"] == LABELS
    assert spec["layer"][0]["encoding"]["x"]["axis"]["labelLimit"] >= 300
