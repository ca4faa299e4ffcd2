"""The ablation page says how sure each difference is: the comparisons of `dapo table` (exact p,
MDE, seeds needed, P(A>B), verdict), an effect to plan for, the protocol line, the seeds as dots
with their pairing on demand, and an adaptive sweep's decisions; headless through AppTest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import dashboard_fixtures as fx
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from db import looks


@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory: pytest.TempPathFactory) -> fx.FixtureStore:
    path = tmp_path_factory.mktemp("decisions-store") / "store.db"
    return fx.build_store(f"sqlite:///{path}")


@pytest.fixture(autouse=True)
def _store_env(
    fixture_store: fx.FixtureStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[None]:
    fx.use_store(monkeypatch, fixture_store.url, tmp_path)
    yield


def ablation_page(sweep_id: int) -> AppTest:
    return fx.open_page("ablation", sweep=sweep_id)


def comparisons(at: AppTest) -> pd.DataFrame:
    return next(d.value for d in at.dataframe if "verdict" in d.value.columns)


def test_every_difference_carries_its_test_and_what_it_would_take(
    fixture_store: fx.FixtureStore,
) -> None:
    at = ablation_page(fixture_store.sweep_id)
    frame = comparisons(at)
    assert list(frame.columns[:7]) == ["comparison", "vs", "n", "Δ", "p", "MDE", "seeds"]
    row = frame.set_index("comparison").loc["clip_higher − overlong_filter"]
    # two seeds: (0.40 − 0.36, 0.46 − 0.39) = (+4, +7) pp; the exact p over 2 seeds is 2/4
    assert (row["n"], row["Δ"], row["p"]) == ("2", "+5.5 [-13.6, +24.6]", "0.5")
    assert row["verdict"] == "2 seeds: can't reach 5%"
    assert row["MDE"] == "none below 6"  # no test below 6 seeds detects anything
    captions = [c.value for c in at.caption]
    assert any(c.startswith("protocol: eval aime2024 (50 problems), avg@4") for c in captions)
    assert any(c.startswith("Comparisons: Δ = A − B paired by seed") for c in captions)
    # an effect to plan for adds its seed count
    at.number_input(key="ablation-effect").set_value(3.0).run()
    assert "seeds for 3 pp" in comparisons(at).columns


def test_the_seeds_can_be_paired_across_arms(fixture_store: fx.FixtureStore) -> None:
    at = ablation_page(fixture_store.sweep_id)

    def marks() -> list[str]:
        spec = json.loads(at.get("vega_lite_chart")[-1].proto.spec)
        return [layer["mark"]["type"] for layer in spec["layer"]]

    assert "line" not in marks()
    at.checkbox(key="ablation-paired").check().run()
    assert marks()[-1] == "line"


def test_an_adaptive_sweeps_decisions_show(fixture_store: fx.FixtureStore) -> None:
    from db.store import Store

    store = Store(fixture_store.url)
    looks.record(
        store.engine,
        fixture_store.sweep_id,
        "clip_higher:overlong_filter",
        look=0,
        seeds=[0, 1],
        mean=0.055,
        p=0.5,
        nominal=0.05,
        conditional_power=0.04,
        decision="futile",
    )
    at = ablation_page(fixture_store.sweep_id)
    frame = comparisons(at).set_index("comparison")
    decided = frame.loc["clip_higher − overlong_filter", "until decided"]
    assert decided == "futile at n = 2: +5.5 [-13.6, +24.6]"
    assert frame.loc["overlong_filter − grpo", "until decided"] == "—"  # not planned
