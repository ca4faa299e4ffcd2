"""The ablation page's Holm checkbox and sample-efficiency expander, run headless by streamlit's
AppTest: the note is db.ablation.holm_note's own text (the one `dapo table --holm` prints), and
the expander shows `dapo table --efficiency`'s area and time-to-threshold tables. The stores are
tests/table_stores.py's, as `dapo table`'s tests use them (three stars, Holm keeps one; a
censored seed).
"""

from __future__ import annotations

from pathlib import Path

import dashboard_fixtures as fx
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from table_stores import build_holm, build_threshold

from db import ablation
from db.store import Store


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int, int]:
    """(url, the Holm sweep, the threshold sweep), the dashboard pointed at it."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    holm, threshold = build_holm(url), build_threshold(url)
    fx.use_store(monkeypatch, url, tmp_path)
    return url, holm, threshold


def _ablation_page(sweep: int) -> AppTest:
    return fx.open_page(sweep=sweep)


def _frame_with(at: AppTest, column: str) -> pd.DataFrame:
    return next(d.value for d in at.dataframe if column in d.value.columns)


def test_holm_checkbox_shows_the_cli_note(store: tuple[str, int, int]) -> None:
    url, holm, _ = store
    at = _ablation_page(holm)
    captions = [c.value for c in at.caption]
    assert not any(c.startswith("Holm over") for c in captions)  # off by default
    at.checkbox(key="ablation-holm").check().run()
    assert not at.exception, [e.value for e in at.exception]
    note = ablation.holm_note(ablation.holm_stars(ablation.ablation_table(Store(url).engine, holm)))
    # three stars, Holm keeps b's (test_table_holm's numbers by hand)
    assert note.startswith("Holm over the 3 Δ parent test(s) (family-wise 5%): 3 starred, 1")
    assert note in [c.value for c in at.caption]


def test_efficiency_expander_times_the_threshold(store: tuple[str, int, int]) -> None:
    _, _, threshold = store
    at = _ablation_page(threshold)
    area = _frame_with(at, "Δ parent (area)")
    assert area["area"].tolist() == ["32.2 [21.8, 42.6]", "37.0 [21.3, 52.7]"]
    reached = _frame_with(at, "reached")
    assert reached["reached"].tolist() == ["2/3", "3/3"]
    # the default threshold, 35.3%, and the rule that drew it
    captions = " ".join(c.value for c in at.caption)
    assert "≥ 35.3% (default: midway" in captions
    at.number_input(key="ablation-threshold").set_value(40.0).run()
    assert not at.exception, [e.value for e in at.exception]
    assert "≥ 40.0% (given)" in " ".join(c.value for c in at.caption)
    reached = _frame_with(at, "updates to 40.0%")
    # test_table_efficiency: a's updates (4, 8) -> 6.0 ± 25.4; b's Δ (−2, −6) over n = 2
    assert reached["updates to 40.0%"].tolist()[0] == "6.0 [-19.4, 31.4]"
    assert reached["Δ parent (updates)"].tolist()[1] == "-4.0 [-29.4, +21.4] (n=2)"
