"""Every dashboard view run headless by streamlit's AppTest against a known SQLite store.

The numbers asserted here are recomputed by hand from tests/dashboard_fixtures.py's
FINAL_SCORES, so a wrong Δ or mean ± std on screen fails the test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import dashboard_fixtures as fx
import pytest
from dashboard_fixtures import chart_rows, open_page
from streamlit.testing.v1 import AppTest

from dashboard import rerun, widgets
from db import ablation
from db.engine import get_engine


@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory: pytest.TempPathFactory) -> fx.FixtureStore:
    path = tmp_path_factory.mktemp("dashboard-store") / "store.db"
    return fx.build_store(f"sqlite:///{path}")


@pytest.fixture(autouse=True)
def _store_env(
    fixture_store: fx.FixtureStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[None]:
    fx.use_store(monkeypatch, fixture_store.url, tmp_path)
    yield


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
    # final score: mean over seeds [95% t-interval], t(0.975, 1) = 12.7062 for two seeds:
    # grpo (30, 34) -> 32.0 ± 12.7062 · 2 = [6.6, 57.4]; overlong_filter (36, 39) -> 37.5 ±
    # 19.06; clip_higher (40, 46) -> 43.0 ± 38.12; soft_punish (44; seed 1 failed) and dapo
    # (50; seed 1 still running) have one seed: no interval; token_loss (43, 46) -> 44.5 ± 19.06
    assert list(table["final"]) == [
        "32.0 [6.6, 57.4]",
        "37.5 [18.4, 56.6]",
        "43.0 [4.9, 81.1]",
        "44.0 (n=1, no interval)",
        "44.5 [25.4, 63.6]",
        "50.0 (n=1, no interval)",
    ]
    # starting model 20 (seed 0), 22 (seed 1); gain paired by seed, e.g. overlong_filter
    # (16, 17) -> 16.5 ± 12.7062 · 0.5 = [10.1, 22.9], above 0: marked
    assert list(table["start"]) == ["21.0", "21.0", "21.0", "20.0", "21.0", "20.0"]
    assert table["gain"].iloc[1] == "+16.5 [+10.1, +22.9]"
    # Δ to the parent (the arm before), paired by seed: overlong_filter − grpo = (6, 5) ->
    # 5.5 ± 6.35; clip_higher − overlong_filter = (4, 7) -> 5.5 ± 19.06; the rest share one seed
    assert list(table["Δ parent"]) == [
        "—",
        "+5.5 [-0.9, +11.9]",
        "+5.5 [-13.6, +24.6]",
        "+4.0 (n=1, no interval)",
        "-1.0 (n=1, no interval)",
        "+7.0 (n=1, no interval)",
    ]
    # Δ to the baseline grpo: token_loss − grpo = (13, 12) -> 12.5 ± 6.35, above 0 although
    # the two arms' own intervals overlap
    assert list(table["Δ base"]) == [
        "—",
        "+5.5 [-0.9, +11.9]",
        "+11.0 [-1.7, +23.7]",
        "+14.0 (n=1, no interval)",
        "+12.5 [+6.1, +18.9]",
        "+20.0 (n=1, no interval)",
    ]
    assert list(table["seed 0"]) == ["30.0", "36.0", "40.0", "44.0", "43.0", "50.0"]
    # soft_punish seed 1 failed and dapo seed 1 is running: no score yet
    assert list(table["seed 1"]) == ["34.0", "39.0", "46.0", "—", "46.0", "—"]
    assert list(table["paper"]) == ["30.0", "36.0", "38.0", "41.0", "42.0", "50.0"]
    assert table["steps"].iloc[0] == str(fx.STEPS)
    status = dict(zip(table["arm"], table["status"], strict=True))
    assert status["grpo"] == "✔ completed"
    assert status["soft_punish"] == "✖ failed"
    assert status["dapo"] == "● running"
    shown = texts(at)
    # dapo has the highest mean but one seed: no arm is named best
    assert "No arm leads significantly: dapo − token_loss = +7.0 pp (n=1, no interval)." in shown
    assert "**dapo vs grpo** (paired by seed, pp): +20.0 (n=1, no interval)" in shown
    assert "10/12 runs done" in shown  # 12 runs, one failed and one still running
    # the numbers on screen are the store's numbers
    store_table = ablation.ablation_table(get_engine(fixture_store.url), fixture_store.sweep_id)
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
    assert not at.exception and not at.warning  # a confirmation first, no request yet
    at.button(key="ablation-rerun-confirm").click().run()
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
    pages = (None, "sweeps", "curves", "mechanisms", "grid", "rollouts", "runs", "run", "compare")
    for page in pages:
        at = open_page(page)
        # said once a page (Compare's two run pickers once said it twice)
        assert [i.value for i in at.info].count(widgets.NO_SWEEPS) == 1, page
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
    # 10 of 12 (arm, seed) pairs done, and one running: dapo seed 1 has stored its 5 steps
    # (the counter reads 5 at its last step, of run.steps 5), so the sweep stands at 11 / 12
    assert ladder["runs"] == "10 / 12 · 1 running"
    assert ladder["progress"] == pytest.approx(11 / 12)
    # bars in a colour that does not read as failure (Streamlit's default is its red)
    progress = json.loads(at.dataframe[0].proto.columns)["progress"]
    assert progress["type_config"]["color"] == "green"
    running = at.dataframe[1].value
    assert running[["arm", "seed", "steps_text", "eta"]].values.tolist() == [
        ["dapo", 1, "5 / 5", "—"]  # the fixture logs no step times: no pace, no ETA
    ]
    assert running["run"].tolist() == [f"run?run={fixture_store.run_ids[fx.RUNNING]}"]
    assert ladder["best_arm"] == "—"  # dapo leads on one seed only: not significantly
    assert ladder["headline"].startswith("No arm leads significantly: dapo − token_loss")
    assert ladder["status"] == "● running"
    assert ladder["open"] == f"./?sweep={fixture_store.sweep_id}"


# --- curves ----------------------------------------------------------------------------------


def test_curves_overlay_arms_for_each_metric(fixture_store: fx.FixtureStore) -> None:
    at = open_page("curves", sweep=fixture_store.sweep_id)
    assert at.selectbox(key="curve-x").value == "gradient updates"  # the paper's x-axis
    metrics = at.multiselect(key="curve-metrics")
    # the first four headline metrics that were logged
    assert metrics.value == ["acc/mean", "reward/mean", "entropy/mean", "response_length/mean"]
    # offered by display name, beside the key
    assert "generated tokens · progress/tokens" in metrics.options
    charts = at.get("vega_lite_chart")
    assert len(charts) == 5  # the held-out score, then the four metrics
    # One unit with the table: the held-out axis in percent, titled with a display name
    held_out = json.loads(charts[0].proto.spec)
    line = held_out["layer"][-1]["encoding"]
    assert line["y"]["title"] == "held-out avg@4 (%)"
    assert line["x"]["title"] == "gradient updates"
    assert held_out["title"]["text"] == "aime2024: held-out avg@4"
    # grpo's last evaluation: seeds 0.30, 0.34 -> 32.0 %, as the ablation table's "32.0"
    shown = chart_rows(charts[0])
    grpo_last = shown[(shown["arm"] == "grpo") & (shown["step"] == fx.STEPS - 1)]
    assert grpo_last["mean"].tolist() == pytest.approx([32.0])
    at.selectbox(key="curve-x").set_value("tokens")
    at.slider(key="curve-smoothing").set_value(0.5)
    at.multiselect(key="curve-metrics").set_value(["acc/mean"]).run()
    assert not at.exception
    _, chart = at.get("vega_lite_chart")
    spec = json.loads(chart.proto.spec)
    assert spec["layer"][-1]["encoding"]["y"]["title"] == "training accuracy (%)"
    assert spec["title"]["subtitle"] == "acc/mean"  # the key, for looking it up
    assert spec["layer"][-1]["encoding"]["x"]["title"] == "tokens"
    # accuracy in percent: step 0 of grpo, 0.1 + 0.01·seed over seeds 0, 1 -> 10.5 %
    acc = chart_rows(chart)
    assert acc.loc[(acc["arm"] == "grpo") & (acc["step"] == 0), "mean"].tolist() == (
        pytest.approx([10.5])
    )
    shown = texts(at)
    assert "2 seed(s) per arm" in shown and "95% t-interval over seeds" in shown
    assert "step 0 = the starting model" in shown


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


def test_rollouts_follow_the_sweep_in_the_url(fixture_store: fx.FixtureStore) -> None:
    # the ladder is the older sweep: without ?sweep= the picker shows the newest (tiny-check)
    at = open_page("rollouts", sweep=fixture_store.sweep_id)
    assert at.selectbox(key="rollout-run-sweep").value == fixture_store.sweep_id
    assert at.selectbox(key="rollout-run").value in fixture_store.run_ids.values()
    at = open_page("rollouts")
    assert at.selectbox(key="rollout-run-sweep").value == fixture_store.other_sweep_id


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
            "key": "algo.clip_high",
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
    # the starting model 0.20 -> 20 %, the mid-run evaluation 0.30 and the final 0.40
    assert sorted(evals["avg_at_k"].round(6)) == [20.0, 30.0, 40.0]
    at.button(key="run-rerun").click().run()
    at.button(key="run-rerun-confirm").click().run()
    assert [w.value for w in at.warning] == [rerun.NO_SERVER]


def test_failed_and_running_runs_show_their_start(fixture_store: fx.FixtureStore) -> None:
    at = open_page("run", run=fixture_store.run_ids[fx.FAILED])
    assert at.error[0].value == "This run failed: RuntimeError: CUDA out of memory"
    # it failed at step 2, after scoring its starting model (seed 1: 0.22) at step 0
    evals = at.dataframe[1].value
    assert evals["step"].tolist() == [0] and evals["avg_at_k"].round(6).tolist() == [22.0]
    at = open_page("run", run=fixture_store.run_ids[fx.RUNNING])
    assert not at.error
    (evals,) = [d.value for d in at.dataframe if "avg_at_k" in d.value.columns]
    assert evals["step"].tolist() == [0]
    at = open_page("run", run=12345)
    assert "No run with id 12345" in texts(at)


# --- compare ---------------------------------------------------------------------------------


def test_compare_two_runs(fixture_store: fx.FixtureStore) -> None:
    a, b = fixture_store.run_ids[("grpo", 0)], fixture_store.run_ids[("clip_higher", 0)]
    at = open_page("compare", a=a, b=b)
    diff = at.dataframe[0].value
    assert list(diff["key"]) == ["algo.clip_high", "algo.overlong_filter", "arm"]
    finals = at.dataframe[1].value.set_index("key")
    # acc at the last step (4): 0.1 + 0.05 * arm_index + 0.1 * 4 -> grpo 0.5, clip_higher 0.6,
    # in percent as the tables show it (this page once showed 0.4336 above a table's 43.4)
    acc = finals.loc["acc/mean"]
    assert acc["metric"] == "training accuracy"
    assert (acc.iloc[1], acc.iloc[2], acc["B − A"]) == ("50.0%", "60.0%", "+10.0 pp")
    # entropy in nats: 1.5 − 0.4 = 1.1 and, with Clip-Higher, 1.3
    entropy = finals.loc["entropy/mean"]
    assert (entropy.iloc[1], entropy.iloc[2], entropy["B − A"]) == (
        "1.1 nats", "1.3 nats", "+0.2 nats",
    )  # fmt: skip
    evals = at.dataframe[2].value
    assert len(evals) == 6  # three evaluations per run: start, mid-run, final
    final_a = evals[(evals["run"].str.startswith("A:")) & (evals["step"] == fx.STEPS - 1)]
    assert final_a["avg_at_k"].tolist() == pytest.approx([30.0])


def test_the_run_picker_lists_runs_in_the_tables_arm_order(fixture_store: fx.FixtureStore) -> None:
    """A run picker's runs: arms in the ablation table's (ladder) order, then seeds, the newest
    attempt first; the order comes from the sweep's ladder, not from scoring its table."""
    a = fixture_store.run_ids[("grpo", 0)]
    at = open_page("compare", a=a, b=a)
    labels = at.selectbox(key="compare-a").options
    rows = [(lbl.split(" · ")[0], int(lbl.split(" · ")[1].split()[1]),
             int(lbl.split(" · ")[2].split()[1])) for lbl in labels]  # fmt: skip
    table = ablation.ablation_table(get_engine(fixture_store.url), fixture_store.sweep_id)
    arms = list(dict.fromkeys(arm for arm, _, _ in rows))
    assert arms == list(table["arm"]) == fx.ARMS and arms != sorted(arms)
    rank = {arm: i for i, arm in enumerate(arms)}
    assert rows == sorted(rows, key=lambda r: (rank[r[0]], r[1], -r[2]))
    assert len(rows) == len(set(rows)) >= 2 * len(fx.ARMS)


# --- mechanisms ------------------------------------------------------------------------------


def test_mechanisms_page_shows_each_arms_signature(fixture_store: fx.FixtureStore) -> None:
    at = open_page("mechanisms", sweep=fixture_store.sweep_id)
    assert at.number_input(key="mech-window").value == 10
    # windows of 2 of the 5 rollout steps: the numbers of tests/db/test_db_queries.py
    at.number_input(key="mech-window").set_value(2).run()
    assert not at.exception
    signature = at.dataframe[0].value
    assert list(signature.columns) == [
        "arm", "parent", "changes", "metric", "first 2", "last 2", "Δ parent, first 2",
        "Δ parent, last 2",
    ]  # fmt: skip
    # the base changes nothing; every other arm shows the metrics its config change is about
    assert signature[["arm", "metric"]].values.tolist() == [
        ["overlong_filter", "◆ response_length/clip_ratio (%)"],
        ["overlong_filter", "◆ loss/truncated_share (%)"],
        ["clip_higher", "◆ clip_ratio/high (%)"],
        ["clip_higher", "◆ entropy/mean"],
        ["soft_punish", "◆ response_length/clip_ratio (%)"],
        ["soft_punish", "◆ reward/overlong_penalty_mean"],
        ["token_loss", "◆ loss/long_share (%)"],
        ["dapo", "◆ sampling/train_informative (%)"],
        ["dapo", "◆ sampling/gen_batches"],
    ]
    # Clip-Higher: Δ clip_ratio/high (1.2, 1.3) pp -> 1.25 ± 12.7062 · 0.05 = [0.61, 1.89]
    assert signature["Δ parent, last 2"].tolist()[2] == "+1.25 [+0.61, +1.89]"
    # the filter takes truncated responses out of the loss: grpo's last-2 shares (0.065, 0.075)
    # on seeds 0 and 1 fall to 0, with no spread; on the first 2 steps (0.095, 0.105)
    assert signature["Δ parent, last 2"].tolist()[1] == "-7.00 [-13.35, -0.65]"
    assert signature["Δ parent, first 2"].tolist()[1] == "-10.0 [-16.4, -3.6]"
    assert signature["changes"].tolist()[0] == "algo.overlong_filter"
    at.radio(key="mech-cells").set_value("last window").run()  # the first window by default
    every = at.dataframe[1].value
    assert list(every["arm"]) == fx.ARMS
    assert every.loc[every["arm"] == "grpo", "response_length/clip_ratio (%)"].item() == (
        "13.5 [7.1, 19.9]"
    )
    at.radio(key="mech-cells").set_value("Δ parent (last window)").run()
    every = at.dataframe[1].value
    assert every.loc[every["arm"] == "clip_higher", "entropy/mean"].item() == (
        "+0.210 [+0.083, +0.337]"
    )
    assert every.loc[every["arm"] == "grpo", "entropy/mean"].item() == "—"  # no parent
    at.radio(key="mech-cells").set_value("Δ parent (first window)").run()
    every = at.dataframe[1].value
    assert every.loc[every["arm"] == "dapo", "sampling/gen_batches"].item() == (
        "+0.550 (n=1, no interval)"
    )
    assert len(at.get("vega_lite_chart")) == 1
    assert [b.label for b in at.get("download_button")] == ["Download CSV"]


def test_mechanisms_of_older_runs_show_a_dash(fixture_store: fx.FixtureStore) -> None:
    at = open_page("mechanisms", sweep=fixture_store.other_sweep_id)
    every = at.dataframe[1].value
    assert every["loss/long_share (%)"].tolist() == ["—", "—"]  # not logged by those runs
    assert every["loss/truncated_share (%)"].tolist() == ["—", "—"]


# --- grids -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grid_store(tmp_path_factory: pytest.TempPathFactory) -> fx.GridFixture:
    path = tmp_path_factory.mktemp("grid-store") / "store.db"
    return fx.build_grid_sweep(f"sqlite:///{path}")


def test_grid_page_plots_the_score_against_the_swept_value(
    grid_store: fx.GridFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAPO_DB_URL", grid_store.url)
    at = open_page("grid", sweep=grid_store.sweep_id)
    assert at.selectbox(key="grid-x").options == list(fx.GRID_KEYS)
    scores = at.dataframe[0].value
    # x = clip_high, one line per clip_low; mean final score in %, 95% interval over 3 seeds
    # (spread 1 point: ± 4.302653 · 1 / √3 = ± 2.48), the base (0.28, 0.2) a diamond
    assert scores[["algo.clip_high", "series", "mean", "role"]].values.tolist() == [
        [0.24, "clip_low=0.16", pytest.approx(36.0), "grid point"],
        [0.28, "clip_low=0.16", pytest.approx(42.0), "grid point"],
        [0.32, "clip_low=0.16", pytest.approx(40.0), "grid point"],
        [0.24, "clip_low=0.2", pytest.approx(40.0), "grid point"],
        [0.28, "clip_low=0.2", pytest.approx(46.0), "base arm"],
        [0.32, "clip_low=0.2", pytest.approx(44.0), "grid point"],
    ]
    assert scores["text"].iloc[4] == "46.0 [43.5, 48.5]"
    # clip_high 0.32 / clip_low 0.2 spreads 2 points: ± 4.97
    assert scores["text"].iloc[5] == "44.0 [39.0, 49.0]"
    # each point named by what varies, the base marked; not by names cut to one prefix
    assert scores["label"].tolist()[3:5] == [
        "clip_high=0.24, clip_low=0.2",
        "clip_high=0.28, clip_low=0.2 (base)",
    ]
    charts = at.get("vega_lite_chart")
    assert len(charts) == 1 and "algo.clip_high" in charts[0].proto.spec
    # an honest axis: the score is a share, 0 to 100 %; zoomed, the whiskers stay in view
    y = json.loads(charts[0].proto.spec)["layer"][0]["encoding"]["y"]
    assert y["scale"]["domain"] == [0.0, 100.0] and y["title"] == "held-out avg@4 (%)"
    at.toggle(key="grid-zoom").set_value(True).run()
    low, high = json.loads(at.get("vega_lite_chart")[0].proto.spec)["layer"][0]["encoding"]["y"][
        "scale"
    ]["domain"]
    # the lowest whisker 36 − 2.4841 = 33.5159, the highest 44 + 4.9683 = 48.9683: a span of
    # 15.4524, padded by a tenth of it (1.5452) on each side
    assert (low, high) == (pytest.approx(33.5159 - 1.5452, abs=1e-3),
                           pytest.approx(48.9683 + 1.5452, abs=1e-3))  # fmt: skip
    at.toggle(key="grid-zoom").set_value(False).run()

    # a training metric too: clip_ratio/high over the last 2 steps, in %
    at.selectbox(key="grid-metric").set_value("clip_ratio/high")
    at.number_input(key="grid-window").set_value(2).run()
    assert not at.exception
    values = at.dataframe[1].value
    assert values["mean"].tolist() == pytest.approx([3.1, 2.1, 1.1, 3.1, 2.1, 1.1])
    assert values["text"].iloc[4] == "2.10 [1.85, 2.35]"
    # a metric's axis starts at 0 (its shares are small: 0-100 % would flatten them)
    metric_y = json.loads(at.get("vega_lite_chart")[1].proto.spec)["layer"][0]["encoding"]["y"]
    assert metric_y["scale"] == {"zero": True}
    assert metric_y["title"] == "tokens clipped at 1 + ε_high (%)"
    assert len(at.get("vega_lite_chart")) == 2

    # the other key on x: one line per clip_high
    at.selectbox(key="grid-x").set_value("algo.clip_low").run()
    scores = at.dataframe[0].value
    assert scores[["algo.clip_low", "series"]].values.tolist()[:2] == [
        [0.16, "clip_high=0.24"],
        [0.2, "clip_high=0.24"],
    ]


def test_a_grid_sweep_in_the_ablation_table_compares_with_its_base(
    grid_store: fx.GridFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAPO_DB_URL", grid_store.url)
    at = open_page(sweep=grid_store.sweep_id)
    table = at.dataframe[0].value
    assert list(table["arm"]) == list(fx.GRID_POINTS)
    # siblings of one base: each point's parent is dapo, not the row above it
    assert table["parent"].tolist() == ["—"] + ["dapo"] * (len(fx.GRID_POINTS) - 1)
    # (0.42, 0.44, 0.46) − (0.45, 0.46, 0.47) = (−3, −2, −1) pp: −2.0 ± 2.48
    assert table["Δ parent"].tolist()[-1] == "-2.0 [-4.5, +0.5]"
    assert table["Δ parent"].tolist()[1] == "-10.0 [-10.0, -10.0]"
    assert f"[Grid](grid?sweep={grid_store.sweep_id})" in texts(at)


def test_grid_page_of_a_sweep_that_is_not_a_grid(fixture_store: fx.FixtureStore) -> None:
    at = open_page("grid", sweep=fixture_store.sweep_id)
    assert f"Sweep {fixture_store.sweep_id} is not a grid" in texts(at)
