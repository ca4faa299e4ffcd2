"""Every dashboard view run headless by streamlit's AppTest against a known SQLite store.

The numbers asserted here are recomputed by hand from tests/dashboard_fixtures.py's
FINAL_SCORES, so a wrong Δ or mean ± std on screen fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dashboard_fixtures as fx
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import rerun, widgets
from db import queries
from db.engine import get_engine

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory: pytest.TempPathFactory) -> fx.FixtureStore:
    path = tmp_path_factory.mktemp("dashboard-store") / "store.db"
    return fx.build_store(f"sqlite:///{path}")


@pytest.fixture(autouse=True)
def _store_env(
    fixture_store: fx.FixtureStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[None]:
    monkeypatch.setenv("DAPO_DB_URL", fixture_store.url)
    # No Prefect server and no user profile: the rerun button must say so, not fail.
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    yield


def open_page(page: str | None = None, **query: object) -> AppTest:
    """Run the app once (the default page), then switch to `page` if given."""
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S)
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.run()
    if page is not None:
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """Everything written on the page as text (markdown, captions, alerts, metrics)."""
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    for kind in (at.info, at.warning, at.error, at.success):
        parts += [a.value for a in kind]
    parts += [f"{m.label} {m.value}" for m in at.metric]
    return "\n".join(parts)


# --- ablation table --------------------------------------------------------------------------


def test_ablation_table_shows_hand_computed_scores_and_deltas(
    fixture_store: fx.FixtureStore,
) -> None:
    at = open_page(sweep=fixture_store.sweep_id)
    assert at.selectbox(key="sweep").value == fixture_store.sweep_id
    table = at.dataframe[0].value
    assert list(table["arm"]) == fx.ARMS
    # mean ± std over seeds, in percent (sample std of two seeds a, b is |a - b| / √2):
    # grpo (30, 34) -> 32.0 ± 2.8; overlong_filter (35, 39) -> 37.0 ± 2.8;
    # clip_higher (40, 46) -> 43.0 ± 4.2; soft_punish (44; seed 1 failed) -> 44.0;
    # token_loss (43, 41) -> 42.0 ± 1.4; dapo (50; seed 1 still running) -> 50.0
    assert list(table["mean ± std"]) == [
        "32.0 ± 2.8",
        "37.0 ± 2.8",
        "43.0 ± 4.2",
        "44.0",
        "42.0 ± 1.4",
        "50.0",
    ]
    # Δ to the previous arm: 37-32 = 5, 43-37 = 6, 44-43 = 1, 42-44 = -2, 50-42 = 8
    assert list(table["Δ prev"]) == ["—", "+5.0", "+6.0", "+1.0", "-2.0", "+8.0"]
    # Δ to the baseline grpo (32): 0, 5, 11, 12, 10, 18
    assert list(table["Δ base"]) == ["+0.0", "+5.0", "+11.0", "+12.0", "+10.0", "+18.0"]
    assert list(table["seed 0"]) == ["30.0", "35.0", "40.0", "44.0", "43.0", "50.0"]
    # soft_punish seed 1 failed and dapo seed 1 is running: no score yet
    assert list(table["seed 1"]) == ["34.0", "39.0", "46.0", "—", "41.0", "—"]
    assert list(table["paper"]) == ["30.0", "36.0", "38.0", "41.0", "42.0", "50.0"]
    assert table["steps"].iloc[0] == str(fx.STEPS)
    status = dict(zip(table["arm"], table["status"], strict=True))
    assert status["grpo"] == "✔ completed"
    assert status["soft_punish"] == "✖ failed"
    assert status["dapo"] == "● running"
    shown = texts(at)
    assert "Best arm dapo" in shown
    assert "10/12 runs done" in shown  # 12 runs, one failed and one still running
    # the numbers on screen are the store's numbers
    store_table = queries.ablation_table(get_engine(fixture_store.url), fixture_store.sweep_id)
    for arm in fx.ARMS:
        row = store_table[store_table["arm"] == arm].iloc[0]
        assert row["score_mean"] == pytest.approx(fx.expected_mean(arm))
    assert (
        at.toggle(key="live-refresh").value is True
    )  # the sweep is running: live refresh on by default


def test_ablation_csv_export_and_rerun_without_prefect(fixture_store: fx.FixtureStore) -> None:
    at = open_page(sweep=fixture_store.sweep_id)
    assert [b.label for b in at.get("download_button")] == ["Download CSV"]
    at.button(key="ablation-rerun").click().run()
    assert not at.exception
    warnings = [w.value for w in at.warning]
    assert warnings == [rerun.NO_SERVER]
    # `?live=0` turns the refresh of a running sweep off (a static page, e.g. a screenshot)
    assert open_page(sweep=fixture_store.sweep_id, live=0).toggle(key="live-refresh").value is False


def test_default_sweep_is_the_newest_and_unknown_sweep_is_explained(
    fixture_store: fx.FixtureStore,
) -> None:
    at = open_page()
    assert at.selectbox(key="sweep").value == fixture_store.other_sweep_id
    assert list(at.dataframe[0].value["arm"]) == fx.ARMS[:2]
    at = open_page(sweep=999)
    assert "No sweep with id 999" in texts(at)
    assert list(at.dataframe[0].value["arm"]) == fx.ARMS[:2]


def test_every_view_of_an_empty_store_is_friendly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAPO_DB_URL", f"sqlite:///{tmp_path / 'empty.db'}")
    for page in (None, "sweeps", "curves", "rollouts", "run", "compare"):
        at = open_page(page)
        assert widgets.NO_SWEEPS in [i.value for i in at.info], page
        assert not at.error, page


def test_an_unusable_store_url_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAPO_DB_URL", "nosuchdialect://x")
    at = open_page()
    assert len(at.error) == 1
    assert at.error[0].value.startswith("Cannot open the store nosuchdialect://x")


# --- sweeps ----------------------------------------------------------------------------------


def test_sweeps_list(fixture_store: fx.FixtureStore) -> None:
    at = open_page("sweeps")
    frame = at.dataframe[0].value
    assert list(frame["sweep_id"]) == [fixture_store.other_sweep_id, fixture_store.sweep_id]
    ladder = frame[frame["sweep_id"] == fixture_store.sweep_id].iloc[0]
    assert ladder["runs"] == "10 / 12"
    assert ladder["progress"] == pytest.approx(10 / 12)
    assert ladder["best_arm"] == "dapo"
    assert ladder["status"] == "● running"
    assert ladder["open"] == f"./?sweep={fixture_store.sweep_id}"


# --- curves ----------------------------------------------------------------------------------


def test_curves_overlay_arms_for_each_metric(fixture_store: fx.FixtureStore) -> None:
    at = open_page("curves", sweep=fixture_store.sweep_id)
    metrics = at.multiselect(key="curve-metrics")
    # the first four headline metrics that were logged
    assert metrics.value == ["acc/mean", "reward/mean", "entropy/mean", "response_length/mean"]
    assert "progress/tokens" in metrics.options
    charts = at.get("vega_lite_chart")
    assert len(charts) == 4
    at.selectbox(key="curve-x").set_value("tokens")
    at.slider(key="curve-smoothing").set_value(0.5)
    at.multiselect(key="curve-metrics").set_value(["acc/mean"]).run()
    assert not at.exception
    (chart,) = at.get("vega_lite_chart")
    spec = chart.proto.spec
    assert "acc/mean" in spec and "tokens" in spec
    assert "2 seed(s) per arm" in texts(at)


# --- rollouts --------------------------------------------------------------------------------


def test_rollouts_filter_and_reward_parts(fixture_store: fx.FixtureStore) -> None:
    run_id = fixture_store.run_ids[("grpo", 0)]
    at = open_page("rollouts", run=run_id)
    assert at.selectbox(key="rollout-run").value == run_id
    assert at.selectbox(key="rollout-step").value == fx.STEPS - 1
    assert len(at.dataframe[0].value) == 4
    # 4 samples, 2 correct; mean reward (1 - 1 - 1.5 + 0.75) / 4 = -0.1875
    assert "4 samples · 2 correct (50%) · 1 truncated · mean reward -0.188" in texts(at)
    at.radio(key="rollout-filter").set_value("Truncated").run()
    frame = at.dataframe[0].value
    assert frame[["reward", "score", "overlong penalty"]].values.tolist() == [[-1.5, -1.0, -0.5]]
    at.radio(key="rollout-filter").set_value("Correct").run()
    assert sorted(at.dataframe[0].value["reward"]) == [0.75, 1.0]
    assert "reward +0.75 = score +1 + overlong penalty -0.25" in texts(at)


# --- run page --------------------------------------------------------------------------------


def test_run_page_config_diff_against_previous_arm(
    fixture_store: fx.FixtureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_UI_URL", "http://prefect.test")
    run_id = fixture_store.run_ids[("clip_higher", 0)]
    at = open_page("run", run=run_id)
    diff = at.dataframe[0].value
    previous = fixture_store.run_ids[("overlong_filter", 0)]
    assert diff.to_dict("records") == [
        {
            "key": "algorithm.clip_high",
            f"overlong_filter (run {previous})": "0.2",
            f"clip_higher (run {run_id})": "0.28",
        },
        {
            "key": "arm",
            f"overlong_filter (run {previous})": "overlong_filter",
            f"clip_higher (run {run_id})": "clip_higher",
        },
    ]
    shown = texts(at)
    assert f"/ckpt/sweep{fixture_store.sweep_id}/clip_higher/seed0" in shown
    assert "http://prefect.test/runs/flow-run/" in shown
    evals = at.dataframe[1].value
    # final evaluation 0.40 -> 40 %, the mid-run one 0.30 -> 30 %
    assert sorted(evals["avg_at_k"].round(6)) == [30.0, 40.0]
    at.button(key="run-rerun").click().run()
    assert [w.value for w in at.warning] == [rerun.NO_SERVER]


def test_failed_run_and_run_without_evaluations(fixture_store: fx.FixtureStore) -> None:
    at = open_page("run", run=fixture_store.run_ids[fx.FAILED])
    assert at.error[0].value == "This run failed: RuntimeError: CUDA out of memory"
    assert "No evaluations for this run yet" in texts(at)
    at = open_page("run", run=fixture_store.run_ids[fx.RUNNING])
    assert not at.error
    assert "No evaluations for this run yet" in texts(at)
    at = open_page("run", run=12345)
    assert "No run with id 12345" in texts(at)


# --- compare ---------------------------------------------------------------------------------


def test_compare_two_runs(fixture_store: fx.FixtureStore) -> None:
    a, b = fixture_store.run_ids[("grpo", 0)], fixture_store.run_ids[("clip_higher", 0)]
    at = open_page("compare", a=a, b=b)
    diff = at.dataframe[0].value
    assert list(diff["key"]) == ["algorithm.clip_high", "algorithm.overlong_filter", "arm"]
    finals = at.dataframe[1].value.set_index("metric")
    # acc at the last step (4): 0.1 + 0.05 * arm_index + 0.1 * 4 -> grpo 0.5, clip_higher 0.6
    acc = finals.loc["acc/mean"]
    assert acc.iloc[0] == pytest.approx(0.5) and acc.iloc[1] == pytest.approx(0.6)
    assert acc["B − A"] == pytest.approx(0.1)
    evals = at.dataframe[2].value
    assert len(evals) == 4  # two evaluations per run
    final_a = evals[(evals["run"].str.startswith("A:")) & (evals["step"] == fx.STEPS - 1)]
    assert final_a["avg_at_k"].tolist() == pytest.approx([30.0])
