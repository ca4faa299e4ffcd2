"""The mechanism table's companions: `clip_ratio/high_eligible` beside `clip_ratio/high` and
`entropy/decision` beside `entropy/mean`, where the sweep's runs logged them, and absent (no
row, no dashboard column) where none did; the same metrics in `dapo table --mechanisms`, the
dashboard and the Prefect artifact. Two arms (`base` at ε_high 0.2, `ch` at 0.28) × seeds 0, 1,
four rollout steps each, window 2, numbers by hand.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from store_runs import new_attempt

from dapo_common import metric_names as M
from dapo_lab.cli import main
from dashboard import mechanisms as shaping
from db import mechanisms
from db.mechanism_table import mechanism_table
from db.store import Store

STEPS, WINDOW = 4, 2


def eligible(a: int, seed: int, step: int) -> float:
    """The eligible share of arm a (0 base, 1 ch): ch is 0.01 + 0.002·seed above base."""
    return 0.02 + (0.01 + 0.002 * seed) * a + 0.005 * seed + 0.001 * step


def decision(a: int, step: int) -> float:
    return 0.3 + 0.1 * a + 0.01 * step


def _sweep(store: Store, *, with_decision: bool) -> int:
    sweep_id = store.create_sweep(
        name="companions",
        preset="tiny",
        arms=["base", "ch"],
        seeds=[0, 1],
        base_config={},
        ladder=[{"arm": "base"}, {"arm": "ch"}],
    )
    for a, (arm, clip_high) in enumerate((("base", 0.2), ("ch", 0.28))):
        for seed in (0, 1):
            config = {"arm": arm, "algo": {"clip_high": clip_high}, "run": {"seed": seed}}
            run_id = new_attempt(
                store, sweep_id, arm, seed, config=config, config_hash=f"{arm}{seed}"
            )
            with store.sink(run_id) as sink:
                for step in range(STEPS):
                    metrics = {
                        M.CLIP_RATIO_HIGH: 0.001 * (a + 1),
                        M.CLIP_RATIO_HIGH_ELIGIBLE: eligible(a, seed, step),
                        M.ENTROPY_MEAN: 0.5,
                    }
                    if with_decision:
                        metrics[M.ENTROPY_DECISION] = decision(a, step)
                    sink.log_metrics(step, metrics)
            store.update_run(run_id, status="completed", steps=STEPS)
    return sweep_id


@pytest.fixture
def stores(tmp_path: Path) -> tuple[str, int, int]:
    """(url, a sweep whose runs log entropy/decision, one whose runs do not)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(url)
    return url, _sweep(store, with_decision=True), _sweep(store, with_decision=False)


def test_default_metrics_put_each_companion_beside_its_partner_when_logged() -> None:
    logged = [M.CLIP_RATIO_HIGH_ELIGIBLE, M.ENTROPY_DECISION, M.IS_MASKED_FRAC]
    shown = mechanisms.default_metrics(logged)
    i = shown.index(M.CLIP_RATIO_HIGH)
    assert shown[i + 1] == M.CLIP_RATIO_HIGH_ELIGIBLE
    assert M.CLIP_RATIO_HIGH_DECISION not in shown  # not logged: no row of dashes
    both = mechanisms.default_metrics([*logged, M.CLIP_RATIO_HIGH_DECISION])
    k = both.index(M.CLIP_RATIO_HIGH)
    assert both[k + 1 : k + 3] == (M.CLIP_RATIO_HIGH_ELIGIBLE, M.CLIP_RATIO_HIGH_DECISION)
    j = shown.index(M.ENTROPY_MEAN)
    assert shown[j + 1] == M.ENTROPY_DECISION
    assert shown[-1] == M.IS_MASKED_FRAC  # a focus metric the runs logged comes last
    # neither logged: the defaults as they were, no companion
    assert mechanisms.default_metrics([]) == mechanisms.DEFAULT_METRICS
    assert mechanisms.with_companions([M.ENTROPY_DECISION, M.ENTROPY_MEAN]) == (
        M.ENTROPY_DECISION,
        M.ENTROPY_MEAN,
    )  # asked for already: not twice


def test_companions_by_hand(stores: tuple[str, int, int]) -> None:
    url, with_decision, _ = stores
    table = mechanism_table(Store(url).engine, with_decision, window=WINDOW)
    ch = table[table["arm"] == "ch"].set_index("metric")
    names = list(ch.index)
    assert names[names.index(M.CLIP_RATIO_HIGH) + 1] == M.CLIP_RATIO_HIGH_ELIGIBLE
    assert names[names.index(M.ENTROPY_MEAN) + 1] == M.ENTROPY_DECISION
    # last window = steps 2, 3: eligible = 0.02 + (0.01 + 0.002 s) + 0.005 s + 0.0025
    # -> seed 0: 0.0325, seed 1: 0.0395 (mean 0.036); base: 0.0225, 0.0275
    elig = ch.loc[M.CLIP_RATIO_HIGH_ELIGIBLE]
    assert elig["last_values"] == pytest.approx([0.0325, 0.0395])
    # Δ parent paired by seed: 0.010, 0.012 -> mean 0.011, s/√2 = 0.001, t(0.975, 1) = 12.7062
    delta = elig["delta_parent"]
    assert delta.mean == pytest.approx(0.011)
    assert (delta.low, delta.high) == pytest.approx(
        (0.011 - 0.0127062, 0.011 + 0.0127062), abs=1e-6
    )
    # decision entropy, last window: 0.3 + 0.1 + 0.025 = 0.425 (base 0.325), Δ +0.1 each seed
    dec = ch.loc[M.ENTROPY_DECISION]
    assert dec["last"].mean == pytest.approx(0.425)
    assert dec["delta_parent"].mean == pytest.approx(0.1)
    # the arm changes algo.clip_high: the companions are about what their partners are about
    assert elig["focus"] and dec["focus"]
    text = mechanisms.render(table, "markdown", focus_only=True)
    lines = [line for line in text.splitlines() if line.startswith("| ch ")]
    metrics_in_order = [line.split("|")[4].strip() for line in lines]
    assert metrics_in_order == [
        "◆ clip_ratio/high (%)",
        "◆ clip_ratio/high_eligible (%)",
        "◆ entropy/mean",
        "◆ entropy/decision",
    ]
    assert "| 3.60 [" in text  # the eligible share in percent: 3.60 over 2 seeds


def test_no_companion_rows_or_columns_for_runs_without_them(stores: tuple[str, int, int]) -> None:
    url, _, without = stores
    engine = Store(url).engine
    table = mechanism_table(engine, without, window=WINDOW)
    assert M.ENTROPY_DECISION not in set(table["metric"])
    assert M.CLIP_RATIO_HIGH_ELIGIBLE in set(table["metric"])  # logged: shown
    # asked for by name (the dashboard's multiselect) and not logged: still absent
    asked = mechanism_table(engine, without, [M.ENTROPY_MEAN, M.ENTROPY_DECISION], WINDOW)
    assert list(asked["metric"]) == [M.ENTROPY_MEAN, M.ENTROPY_MEAN]
    rows = list(csv.DictReader(io.StringIO(mechanisms.render(table, "csv"))))
    assert M.ENTROPY_DECISION not in {r["metric"] for r in rows}
    # the dashboard's wide table: no column of dashes
    assert "entropy/decision" not in shaping.wide(table, "last").columns
    with_it = mechanism_table(engine, stores[1], window=WINDOW)
    assert "entropy/decision" in shaping.wide(with_it, "last").columns


def test_cli_dashboard_and_artifact_show_the_same_metrics(
    stores: tuple[str, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, with_decision, without = stores
    from flows.publish import mechanisms_markdown

    for sweep, has_decision in ((with_decision, True), (without, False)):
        args = ["table", "--store", url, "--sweep", str(sweep), "--mechanisms"]
        assert main([*args, "--format", "markdown", "--window", str(WINDOW)]) == 0
        cli = capsys.readouterr().out
        assert ("entropy/decision" in cli) is has_decision
        assert "clip_ratio/high_eligible (%)" in cli
        # the artifact: the same rows (its window is the default, cut to the runs' 4 steps)
        artifact = mechanisms_markdown(url, sweep)
        assert ("entropy/decision" in artifact) is has_decision
        assert "clip_ratio/high_eligible (%)" in artifact
        # the dashboard's default list
        logged = [M.CLIP_RATIO_HIGH_ELIGIBLE, *([M.ENTROPY_DECISION] if has_decision else [])]
        assert (M.ENTROPY_DECISION in mechanisms.default_metrics(logged)) is has_decision


def test_dashboard_page_shows_the_companions_where_logged(
    stores: tuple[str, int, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from streamlit.testing.v1 import AppTest

    url, with_decision, without = stores
    monkeypatch.setenv("DAPO_DB_URL", url)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    app = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    for sweep, has_decision in ((with_decision, True), (without, False)):
        at = AppTest.from_file(str(app), default_timeout=60.0)
        at.query_params["sweep"] = str(sweep)
        at.run()
        at.switch_page("views/mechanisms.py").run()
        at.number_input(key="mech-window").set_value(WINDOW).run()
        assert not at.exception, [e.value for e in at.exception]
        signature = at.dataframe[0].value
        assert signature["metric"].tolist() == [
            "◆ clip_ratio/high (%)",
            "◆ clip_ratio/high_eligible (%)",
            "◆ entropy/mean",
            *(["◆ entropy/decision"] if has_decision else []),
        ]
        at.radio(key="mech-cells").set_value("last window").run()  # first window by default
        every = at.dataframe[1].value
        columns = list(every.columns)
        i = columns.index("clip_ratio/high (%)")
        assert columns[i + 1] == "clip_ratio/high_eligible (%)"
        assert ("entropy/decision" in columns) is has_decision
        # ch's eligible share over its last 2 steps: (3.25, 3.95)% -> 3.60 ± 12.7062 · 0.35 =
        # [-0.85, 8.05], cut at 0 where a share ends; in the mean's 2 places
        assert every.loc[every["arm"] == "ch", "clip_ratio/high_eligible (%)"].item() == (
            "3.60 [0.00, 8.05]"
        )
