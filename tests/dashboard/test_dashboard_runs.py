"""The Runs page (every run of every sweep: filter, sort, group, curves) and the Run page's own
curves and progress, run headless by streamlit's AppTest against tests/dashboard_fixtures.py's
store; db.run_index beneath them. Every number is worked out by hand from FINAL_SCORES,
START_SCORES and step_metrics."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import dashboard_fixtures as fx
import pandas as pd
import pytest
from dashboard_fixtures import chart_rows
from streamlit.testing.v1 import AppTest

from dashboard import run_table
from db import annotations as ann
from db import run_index
from db.engine import get_engine


@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory: pytest.TempPathFactory) -> fx.FixtureStore:
    path = tmp_path_factory.mktemp("runs-store") / "store.db"
    store = fx.build_store(f"sqlite:///{path}")
    engine = get_engine(store.url)
    # a tag on the ladder sweep, one on a run of tiny-check
    ann.add_tags(engine, ann.Target(store.sweep_id), ["paper-ladder"])
    tiny_grpo = max(store.run_ids.values()) + 1  # tiny-check's first run
    ann.add_tags(engine, ann.Target(store.other_sweep_id, tiny_grpo), ["baseline"])
    return store


@pytest.fixture(autouse=True)
def _store_env(
    fixture_store: fx.FixtureStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[None]:
    fx.use_store(monkeypatch, fixture_store.url, tmp_path)
    yield


def open_page(page: str, **query: object) -> AppTest:
    """The app, then `page` with exactly `query` in the URL (the default page's sweep picker
    writes ?sweep=, which a link to this page would not carry)."""
    return fx.open_page(page, only_query=True, **query)


def table(at: AppTest) -> pd.DataFrame:
    return at.dataframe[0].value


# --- db.run_index ------------------------------------------------------------------------------


def test_the_index_has_every_run_with_its_scores_tags_and_newest_attempt(
    fixture_store: fx.FixtureStore,
) -> None:
    engine = get_engine(fixture_store.url)
    index = run_index.run_index(engine)
    assert len(index) == 12 + 2 and index["latest"].all()
    row = index.set_index("run_id").loc[fixture_store.run_ids[("clip_higher", 1)]]
    assert (row["sweep"], row["preset"], row["eval_dataset"], row["eval_k"]) == (
        "ladder", "tiny", fx.EVAL_DATASET, fx.EVAL_K,
    )  # fmt: skip
    # its start (seed 1's 0.22), its last evaluation (0.46 at step 4), of 3 evaluations
    assert (row["start"], row["final"], row["final_step"], row["evals"]) == (0.22, 0.46, 4, 3)
    assert row["tags"] == ("paper-ladder",)  # its sweep's tag
    # the failed run scored only its start: no score of its own
    failed = index.set_index("run_id").loc[fixture_store.run_ids[fx.FAILED]]
    assert failed["start"] == 0.22 and math.isnan(failed["final"]) and failed["evals"] == 1
    tiny = index[index["sweep"] == "tiny-check"]
    assert [t for t in tiny["tags"]] == [("baseline",), ()]
    # one run alone (the Run page): the same row
    alone = run_index.run_index(engine, [fixture_store.run_ids[("clip_higher", 1)]])
    assert alone.iloc[0]["final"] == 0.46 and alone.iloc[0]["tags"] == ("paper-ladder",)
    configs = run_index.run_configs(engine, index["run_id"])
    frame = run_index.config_frame(configs)
    assert run_index.varying_keys(frame, leave_out=("run.seed", "arm")) == [
        "algo.clip_high", "algo.dynamic_sampling", "algo.loss_agg", "algo.overlong_filter",
        "algo.overlong_penalty",
    ]  # fmt: skip
    # acc/mean at each run's last step (4): 0.1 + 0.05 · arm index + 0.4 + 0.01 · seed
    finals = run_index.final_values(engine, [fixture_store.run_ids[("dapo", 0)]], "acc/mean")
    assert finals["value"].tolist() == pytest.approx([0.75])


def test_conditions_parse_and_compare_as_shown() -> None:
    parsed = run_table.parse_conditions("algo.clip_high >= 0.24, final>40 tags=baseline")
    assert [str(c) for c in parsed] == ["algo.clip_high>=0.24", "final>40", "tags=baseline"]
    with pytest.raises(ValueError, match="write key=value"):
        run_table.parse_conditions("clip_high")
    at_least = run_table.Condition("algo.clip_high", ">=", 0.24)
    assert at_least.holds(0.28) and not at_least.holds(0.2) and not at_least.holds(None)
    assert not at_least.holds("0.28")  # text never compares by order
    on = run_table.Condition("algo.dynamic_sampling", "=", True)
    assert on.holds(True) and not on.holds(1)  # true is not the number 1
    assert run_table.Condition("tags", "=", "baseline").holds(("baseline", "x"))
    assert run_table.Condition("tags", "!=", "baseline").holds(())


# --- the Runs page -------------------------------------------------------------------------


def test_runs_of_every_sweep_in_one_table_in_percent(fixture_store: fx.FixtureStore) -> None:
    at = open_page("runs")
    runs = table(at)
    # 12 ladder runs + 2 tiny-check runs: the newest sweep first, each sweep's arms in the
    # order they started (the ladder's), each arm's seeds ascending (not newest run first,
    # which lists seed 1 above seed 0)
    assert len(runs) == 14
    assert list(zip(runs["arm"], runs["seed"], strict=True)) == [
        ("grpo", 0), ("overlong_filter", 0),
        *((arm, seed) for arm in fx.ARMS for seed in fx.SEEDS),
    ]  # fmt: skip
    assert runs["page"].tolist()[0] == f"run?run={max(fixture_store.run_ids.values()) + 1}"
    assert set(runs["sweep"]) == {
        f"#{fixture_store.sweep_id} ladder", f"#{fixture_store.other_sweep_id} tiny-check"
    }  # fmt: skip
    ladder = runs[runs["sweep"].str.endswith("ladder")].set_index(["arm", "seed"])
    # scores in percent, as the ablation table: grpo s0 30.0 from a start of 20.0
    assert ladder.loc[("grpo", 0), "final"] == "30.0"
    assert ladder.loc[("grpo", 0), "start"] == "20.0"
    assert ladder.loc[fx.FAILED, "final"] == "—"  # no score of its own; not "None"
    assert ladder.loc[fx.FAILED, "status"] == "✖ failed"
    # the config keys that tell the runs apart are columns
    assert {"algo.clip_high", "algo.loss_agg"} <= set(runs.columns)
    assert ladder.loc[("clip_higher", 0), "algo.clip_high"] == 0.28


def test_filter_sort_and_a_metric_column(fixture_store: fx.FixtureStore) -> None:
    at = open_page("runs")
    # Clip-Higher's ε_high and a held-out score above 40 %: clip_higher s1 (46), soft_punish
    # s0 (44), token_loss s0 (43) and s1 (46), dapo s0 (50); clip_higher s0 scores 40, not > 40
    at.text_input(key="runs-filter").input("algo.clip_high=0.28 final>40").run()
    at.selectbox(key="runs-sort").set_value("held-out, best first").run()
    runs = table(at)
    assert list(zip(runs["arm"], runs["seed"], runs["final"], strict=True)) == [
        ("dapo", 0, "50.0"),
        ("clip_higher", 1, "46.0"),
        ("token_loss", 1, "46.0"),
        ("soft_punish", 0, "44.0"),
        ("token_loss", 0, "43.0"),
    ]
    # a metric's last value as a column, in its shown unit: acc/mean at step 4 is
    # 0.1 + 0.05 · arm index + 0.4 + 0.01 · seed -> dapo s0 75.0 %; filter on it as shown
    at.text_input(key="runs-filter").input("acc/mean>=70").run()
    at.selectbox(key="runs-metric").set_value("acc/mean").run()
    at.selectbox(key="runs-sort").set_value("metric: highest first").run()
    runs = table(at)
    assert list(zip(runs["arm"], runs["seed"], strict=True)) == [
        ("dapo", 1), ("dapo", 0), ("token_loss", 1), ("token_loss", 0),
    ]  # fmt: skip
    assert runs["acc/mean"].tolist() == ["76.0", "75.0", "71.0", "70.0"]
    # tags: the sweep's and the run's own; a bad condition is a warning, not a failure
    at.text_input(key="runs-filter").input("tags=baseline").run()
    assert table(at)["tags"].tolist() == ["baseline"]
    at.text_input(key="runs-filter").input("clip_high").run()
    assert any("write key=value" in w.value for w in at.warning)
    at.text_input(key="runs-filter").input("").run()
    at.text_input(key="runs-search").input("tiny-check").run()
    assert len(table(at)) == 2


def test_group_by_a_config_key_folds_seeds_into_a_band(fixture_store: fx.FixtureStore) -> None:
    at = open_page("runs", sweep=fixture_store.sweep_id)  # a link with ?sweep= picks it
    assert at.multiselect(key="runs-sweeps").value == [fixture_store.sweep_id]
    assert len(table(at)) == 12
    at.selectbox(key="runs-group").set_value("algo.clip_high").run()
    assert not at.exception, [e.value for e in at.exception]
    held_out, *training = at.get("vega_lite_chart")
    spec = json.loads(held_out.proto.spec)
    assert spec["layer"][-1]["encoding"]["y"]["title"] == "held-out avg@4 (%)"
    rows = chart_rows(held_out)
    assert set(rows["arm"]) == {"clip_high=0.2", "clip_high=0.28"}
    # step 0 is the starting model: over the 4 runs of clip_high 0.2 (grpo, overlong_filter
    # x seeds 0, 1) the start is (20 + 22 + 20 + 22) / 4 = 21.0 %, n = 4 runs
    start = rows[(rows["arm"] == "clip_high=0.2") & (rows["step"] == 0)].iloc[0]
    assert start["mean"] == pytest.approx(21.0) and start["n_seeds"] == 4
    # the final step: grpo 30, 34 and overlong_filter 36, 39 -> 34.75 %, 95% t over 4 runs
    last = rows[(rows["arm"] == "clip_high=0.2") & (rows["step"] == fx.STEPS - 1)].iloc[0]
    assert last["mean"] == pytest.approx(34.75)
    assert last["high"] - last["mean"] == pytest.approx(
        3.182446 * pd.Series([30.0, 34.0, 36.0, 39.0]).std() / 2, rel=1e-4
    )
    # training metrics in percent with their display names
    specs = {json.loads(c.proto.spec)["title"]["subtitle"]: c for c in training}
    acc = json.loads(specs["acc/mean"].proto.spec)
    assert acc["layer"][-1]["encoding"]["y"]["title"] == "training accuracy (%)"
    # clip_high 0.2 at step 0: acc 0.1 + 0.05 · arm index + 0.01 · seed over grpo and
    # overlong_filter x seeds 0, 1 -> (0.10 + 0.11 + 0.15 + 0.16) / 4 = 13.0 % (unsmoothed)
    acc_rows = chart_rows(specs["acc/mean"])
    first = acc_rows[(acc_rows["arm"] == "clip_high=0.2") & (acc_rows["step"] == 0)]
    assert first["raw"].tolist() == pytest.approx([13.0])


def test_a_single_point_is_drawn(fixture_store: fx.FixtureStore) -> None:
    # soft_punish s1 failed after scoring only its start: one held-out point, at step 0
    at = open_page("runs")
    at.text_input(key="runs-filter").input("arm=soft_punish seed=1").run()
    assert len(table(at)) == 1
    held_out = at.get("vega_lite_chart")[0]
    rows = chart_rows(held_out)
    assert rows[["step", "mean"]].values.tolist() == [[0, pytest.approx(22.0)]]
    line = json.loads(held_out.proto.spec)["layer"][-1]["mark"]
    assert line.get("point")  # a point per value: a line of one point would draw nothing


# --- the Run page ------------------------------------------------------------------------------


def test_the_run_page_has_its_own_curves_and_a_whole_status(fixture_store: fx.FixtureStore) -> None:
    run_id = fixture_store.run_ids[("clip_higher", 0)]
    at = open_page("run", run=run_id)
    # the status as a line, not a metric tile cut to "✔ comple…"
    assert "**Status:** ✔ completed" in [m.value for m in at.markdown]
    assert "status" not in [m.label for m in at.metric]
    held_out, *_ = at.get("vega_lite_chart")
    rows = chart_rows(held_out)
    # seed 0: start 20 %, the mid-run 30 % at step 2, the final 40 % at step 4
    assert rows[["step", "mean"]].values.tolist() == [
        [0, pytest.approx(20.0)], [2, pytest.approx(30.0)], [4, pytest.approx(40.0)],
    ]  # fmt: skip


def test_a_running_run_shows_its_step_and_eta(fixture_store: fx.FixtureStore) -> None:
    at = open_page("run", run=fixture_store.run_ids[fx.RUNNING])
    progress = [d.value for d in at.dataframe if "steps_text" in d.value.columns]
    assert len(progress) == 1
    # dapo s1 stored its 5 steps (the counter reads 5 at the last one) of run.steps 5
    assert progress[0][["steps_text", "progress"]].values.tolist() == [["5 / 5", 1.0]]


def test_the_runs_charts_are_valid_vega_lite() -> None:
    # band_chart skips Altair's validation on every view; the variants the Runs page draws
    # (legend below, subtitle dropped, run counts in the tooltip) are validated here
    from dashboard import curves

    long = pd.DataFrame(
        {
            "run_id": [1, 1, 2, 2],
            "arm": ["a", "a", "a", "a"],
            "seed": [1, 1, 2, 2],
            "step": [0, 1, 0, 1],
            "name": ["acc/mean"] * 4,
            "value": [10.0, 20.0, 12.0, 22.0],
        }
    )
    band = curves.curve_band(long, ["acc/mean"], None, 0.0)
    chart = curves.band_chart(
        band, "acc/mean", ["a"], "rollout step", points=True, colour_title="line",
        n_title="runs", legend_below=True, subtitle="",
    )  # fmt: skip
    spec = chart.to_dict(validate=True)
    legend = spec["layer"][-1]["encoding"]["color"]["legend"]
    assert (legend["orient"], legend["columns"]) == ("bottom", 2)
    assert spec["layer"][-1]["encoding"]["x"]["axis"]["tickMinStep"] == 1  # whole steps
