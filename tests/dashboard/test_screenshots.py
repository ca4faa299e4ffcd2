"""scripts/screenshots.py shoots the dashboard only once the content is drawn: the ablation
table in the picture has its rows, in the DOM and in the pixels.

The store is the dashboard tests' fixture (tests/dashboard_fixtures.py), written without
training. Skipped when Chromium is missing, except under CI (tests/chromium.py, as every browser
test).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import dashboard_fixtures as fx
import pytest
from chromium import find_chromium
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.browser


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "scripts/screenshots.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


shots = _load_script()


def dark_share(png: Path, box: list[float]) -> float:
    """The share of the pixels inside `box` (x, y, width, height in CSS pixels; the shots are
    taken at one device pixel per CSS pixel) darker than the page's grey text: drawn cells have
    text, a grey placeholder has none."""
    x, y, w, h = (round(v) for v in box)
    crop = Image.open(png).convert("L").crop((x, y, x + w, y + h))
    return sum(crop.histogram()[:110]) / float(w * h)


def test_the_ablation_table_in_the_shot_has_every_arm(tmp_path: Path) -> None:
    find_chromium()
    store = fx.build_store(f"sqlite:///{tmp_path / 'store.db'}")
    # The ablation page only: the curves page goes through the same wait (its charts are
    # checked by is_ready below), and each page costs the suite seconds.
    states = shots.shoot(
        store.url, tmp_path / "out", sweep=store.sweep_id, pages=shots.PAGES[:1], timeout_s=120
    )

    png = tmp_path / "out" / "dashboard.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    state = states[png]
    assert not state["running"] and state["skeletons"] == 0
    table = state["tables"][0]  # the ablation table, first on the page
    assert table["canvas"]
    header, *rows = table["rows"]
    assert header[0] == "arm"
    assert [row[0] for row in rows] == fx.ARMS  # every arm, in ladder order
    # grpo's final over seeds 0 and 1 (30 and 34 %): the fixture's numbers, drawn.
    assert any(cell.startswith("32.0 [") for cell in rows[0])
    # In the pixels: the table's box holds text (about 2.5% dark pixels when drawn; the grey
    # placeholder the old picture showed has none).
    assert dark_share(png, table["box"]) > 0.01

    assert not (tmp_path / "out" / "curves.png").exists()


@pytest.mark.parametrize(
    ("change", "ready"),
    [
        ({}, True),
        ({"running": True}, False),
        ({"skeletons": 1}, False),
        ({"tables": [{"canvas": True, "rows": [["arm"]], "box": [0, 0, 1, 1]}]}, False),
        ({"tables": [{"canvas": False, "rows": [["arm"], ["grpo"]], "box": [0, 0, 1, 1]}]}, False),
        ({"tables": []}, False),
        ({"charts": [False]}, False),
        ({"text": "Ablation"}, False),
    ],
)
def test_ready_means_every_table_and_chart_in_view_is_drawn(
    change: dict[str, object], ready: bool
) -> None:
    state = {
        "running": False,
        "skeletons": 0,
        "tables": [{"canvas": True, "rows": [["arm"], ["grpo"]], "box": [0, 0, 1, 1]}],
        "charts": [True],
        "text": "Ablation ladder ...",
    }
    assert shots.is_ready({**state, **change}, shots.PAGES[0]) is ready


def test_every_page_the_script_shoots_is_a_page_of_the_app() -> None:
    # --all shoots each page by its url_path: a renamed page would be shot as the default one.
    app = (ROOT / "dashboard/app.py").read_text()
    for shot in (*shots.PAGES, *shots.MORE_PAGES):
        assert shot.path == "" or f'url_path="{shot.path}"' in app, shot
    files = [s.file for s in (*shots.PAGES, *shots.MORE_PAGES)]
    assert len(set(files)) == len(files)
