"""Issue 25's dashboard parts, run headless by streamlit's AppTest against the fixture store:
tags and notes on sweeps and runs and hidden sweeps (dashboard.notes), smoothed curves with
the raw line behind, log y, the wall-clock axis and the plotted data as CSV (dashboard.curves),
and the tables' key-columns-first layout (dashboard.layout). Hand-computed where numeric."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dashboard_fixtures as fx
import pandas as pd
import pytest
from dashboard_fixtures import open_page
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest

from dapo_common import metric_names as mn
from dashboard import curves, layout, notes
from db import annotations as ann
from db.annotations import Target
from db.engine import get_engine
from db.store import Store

# --- pure pieces -----------------------------------------------------------------------------


def test_visible_sweeps_leave_hidden_ones_out_unless_shown_or_named() -> None:
    assert notes.visible([3, 2, 1], {2}, show=False) == [3, 1]
    assert notes.visible([3, 2, 1], {2}, show=True) == [3, 2, 1]
    assert notes.visible([3, 2, 1], {2, 3}, show=False, keep=[2]) == [2, 1]  # ?sweep=2
    assert notes.note_cell("first line\nsecond") == "first line"
    assert notes.note_cell("x" * 100, 10) == "xxxxxxxxx…"
    assert notes.tag_cell(("a", "b")) == "a, b" and notes.tag_cell(None) == ""


def long_frame(values: dict[int, list[float]], name: str, arm: str = "a") -> pd.DataFrame:
    """run_id -> per-step values as db.reads.metric_curves' long frame (seed = run_id)."""
    return pd.DataFrame(
        [
            {"run_id": r, "arm": arm, "seed": r, "step": s, "name": name, "value": v}
            for r, vs in values.items()
            for s, v in enumerate(vs)
        ]
    )


def test_wall_clock_is_the_running_sum_of_step_times() -> None:
    # run 1: 30 s, 30 s, 60 s -> 0.5, 1.0, 2.0 min; run 2: 6 s, then a missing time (counts 0)
    times = long_frame({1: [30.0, 30.0, 60.0], 2: [6.0, float("nan")]}, mn.STEP_S)
    clock = curves.with_wall_clock(times)
    wall = clock[clock["name"] == curves.WALL_CLOCK].sort_values(["run_id", "step"])
    assert wall["value"].tolist() == pytest.approx([0.5, 1.0, 2.0, 0.1, 0.1])
    # the clock of a downsampled read comes from every step's time: step 2 of run 1 is at 2 min
    kept = long_frame({1: [0.1, 0.2, 0.3]}, mn.ACC_MEAN).iloc[[0, 2]]
    joined = curves.attach_x(curves.with_wall_clock(kept, times), curves.WALL_CLOCK)
    assert joined.loc[joined["name"] == mn.ACC_MEAN, "x"].tolist() == pytest.approx([0.5, 2.0])
    assert curves.x_axes()["wall-clock (min)"] == curves.WALL_CLOCK
    assert curves.with_wall_clock(kept) is kept  # no step times: nothing added


def test_smoothing_default_raw_line_log_scale_and_chart_data() -> None:
    # two seeds of one arm; EMA 0.5 of seed 1 (1, 3, 5) = 1, 2, 3.5; of seed 2 (3, 5, 7) = 3, 4, 5.5
    long = long_frame({1: [1.0, 3.0, 5.0], 2: [3.0, 5.0, 7.0]}, mn.ACC_MEAN)
    smooth = curves.curve_band(long, [mn.ACC_MEAN], None, 0.5)
    raw = curves.curve_band(long, [mn.ACC_MEAN], None, 0.0)
    assert smooth["mean"].tolist() == pytest.approx([2.0, 3.0, 4.5])
    assert raw["mean"].tolist() == pytest.approx([2.0, 4.0, 6.0])
    assert 0.0 < curves.DEFAULT_SMOOTHING < 1.0  # smoothed by default
    chart = curves.band_chart(smooth, mn.ACC_MEAN, ["a"], "step", raw=raw, log_y=True).to_dict()
    layers = chart["layer"]
    assert len(layers) == 5  # the raw line behind, the band, its two edges, the smoothed line
    assert layers[0]["mark"]["opacity"] == pytest.approx(0.3)
    assert layers[-1]["encoding"]["y"]["scale"]["type"] == "log"
    # log domain: the values' range 1..7 (raw and smoothed, seeds' min and max) padded by a factor
    low, high = layers[-1]["encoding"]["y"]["scale"]["domain"]
    assert low < 1.0 < 7.0 < high and low > 0
    assert curves.log_ready(smooth)
    assert not curves.log_ready(curves.curve_band(long.assign(value=-1.0), [mn.ACC_MEAN], None, 0))
    data = curves.chart_data(smooth, "gradient updates", raw)
    assert list(data.columns) == [
        "arm", "metric", "step", "gradient updates", "mean", "low (95%)", "high (95%)",
        "seed min", "seed max", "seeds", "mean (raw)", "unit",
    ]  # fmt: skip
    assert set(data["unit"]) == {"%"}  # acc/mean is a share: the numbers are as shown
    assert data["mean (raw)"].tolist() == pytest.approx([2.0, 4.0, 6.0])
    # two seeds at step 1: smoothed (2, 4) -> mean 3 ± 12.7062 · 1 = [-9.71, 15.71]
    assert data.loc[1, "low (95%)"] == pytest.approx(3.0 - 12.7062, abs=1e-3)


def test_key_columns_come_first() -> None:
    ablation = ["arm", "adds", "n", "start", "final", "gain", "parent", "Δ parent", "Δ base"]
    ablation += ["seed 0", "seed 1", "paper", "steps", "updates", "tokens", "time", "status"]
    order = layout.ablation_order(ablation)
    assert order[: len(layout.ABLATION_KEY)] == layout.ABLATION_KEY
    assert sorted(order) == sorted(ablation)  # nothing lost, only moved
    signature = ["arm", "parent", "changes", "metric", "first 10", "last 10", "Δ parent"]
    signature += ["Δ parent, first 10"]
    assert layout.signature_order(signature) == [
        "arm",
        "metric",
        "Δ parent",
        "Δ parent, first 10",
        "first 10",
        "last 10",
        "parent",
        "changes",
    ]  # fmt: skip: the first window first, as in the CLI


# --- the app -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory: pytest.TempPathFactory) -> fx.FixtureStore:
    path = tmp_path_factory.mktemp("notes-store") / "store.db"
    store = fx.build_store(f"sqlite:///{path}")
    # every run logs its step time: 30 s per step, so the wall clock reaches 2.5 min at step 4
    writer = Store(store.url)
    for run_id in store.run_ids.values():
        with writer.sink(run_id) as sink:
            for step in range(fx.STEPS):
                sink.log_metrics(step, {mn.STEP_S: 30.0})
    return store


@pytest.fixture(autouse=True)
def _store_env(
    fixture_store: fx.FixtureStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[None]:
    fx.use_store(monkeypatch, fixture_store.url, tmp_path)
    yield
    engine = get_engine(fixture_store.url)  # every test starts from no annotations
    for sweep_id in (fixture_store.sweep_id, fixture_store.other_sweep_id):
        ann.set_hidden(engine, sweep_id, False)
        ann.set_tags(engine, Target(sweep_id), [])
        ann.set_note(engine, Target(sweep_id), None)


def texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    for kind in (at.info, at.warning, at.error, at.success):
        parts += [a.value for a in kind]
    return "\n".join(parts)


def test_hidden_sweeps_are_left_out_until_shown(fixture_store: fx.FixtureStore) -> None:
    engine = get_engine(fixture_store.url)
    ann.set_hidden(engine, fixture_store.other_sweep_id)
    at = open_page()
    # the newest sweep is hidden: the picker offers (and opens) the ladder
    assert at.selectbox(key="sweep").options == [f"#{fixture_store.sweep_id} · ladder · running"]
    at.toggle(key=notes.SHOW_HIDDEN_KEY).set_value(True).run()
    assert len(at.selectbox(key="sweep").options) == 2
    # a link to a hidden sweep still opens it
    at = open_page(sweep=fixture_store.other_sweep_id)
    assert at.selectbox(key="sweep").value == fixture_store.other_sweep_id
    assert "**hidden**" in texts(at)

    at = open_page("sweeps")
    assert at.dataframe[0].value["sweep_id"].tolist() == [fixture_store.sweep_id]
    assert "1 hidden (Show hidden sweeps, in the sidebar, lists them)" in texts(at)
    at.toggle(key=notes.SHOW_HIDDEN_KEY).set_value(True).run()
    frame = at.dataframe[0].value
    assert frame["sweep_id"].tolist() == [fixture_store.other_sweep_id, fixture_store.sweep_id]
    assert frame["name"].tolist() == ["tiny-check (hidden)", "ladder"]


def test_tags_and_note_edited_on_the_dashboard(fixture_store: fx.FixtureStore) -> None:
    engine = get_engine(fixture_store.url)
    at = open_page(sweep=fixture_store.sweep_id)
    key = f"ablation-notes-s{fixture_store.sweep_id}"
    at.text_input(key=f"{key}-tags").input("baseline, paper-fig2")
    at.text_area(key=f"{key}-note").input("first full ladder")
    at.button(key=f"{key}-save").click().run()
    assert not at.exception
    assert ann.read(engine, Target(fixture_store.sweep_id)) == ann.Annotations(
        tags=("baseline", "paper-fig2"), note="first full ladder"
    )
    shown = texts(at)
    assert f"Saved the tags and note of sweep {fixture_store.sweep_id}." in shown
    assert "tags `baseline` `paper-fig2` · note: first full ladder" in shown
    # the picker names the sweep with its tags
    assert any("[baseline, paper-fig2]" in o for o in at.selectbox(key="sweep").options)
    # a bad tag is one warning and nothing is written
    at.text_input(key=f"{key}-tags").input("bad tag!")
    at.button(key=f"{key}-save").click().run()
    assert [w.value for w in at.warning][-1].startswith("tag 'tag!': one word")
    assert ann.read(engine, Target(fixture_store.sweep_id)).tags == (
        "baseline",
        "paper-fig2",
    )

    # the sweep list shows them; the run's own, on its page and in the sweep's run list
    frame = open_page("sweeps").dataframe[0].value.set_index("sweep_id")
    assert frame.loc[fixture_store.sweep_id, "tags"] == "baseline, paper-fig2"
    assert frame.loc[fixture_store.sweep_id, "note"] == "first full ladder"
    run_id = fixture_store.run_ids[("grpo", 0)]
    at = open_page("run", run=run_id)
    key = f"run-notes-r{run_id}"
    at.text_input(key=f"{key}-tags").input("lr-bug")
    at.text_area(key=f"{key}-note").input("diverged at step 40\nsee the entropy")
    at.button(key=f"{key}-save").click().run()
    assert "tags `lr-bug` · note: diverged at step 40" in texts(at)
    # the sweep's run list: found by its `page` column (the page shows other tables too)
    tables = [d.value for d in open_page(sweep=fixture_store.sweep_id).dataframe]
    runs = next(t for t in tables if "page" in t.columns).set_index("page")
    mine = runs.loc[f"run?run={run_id}"]
    assert (mine["tags"], mine["note"]) == ("lr-bug", "diverged at step 40")
    ann.set_tags(engine, Target(fixture_store.sweep_id, run_id), [])
    ann.set_note(engine, Target(fixture_store.sweep_id, run_id), None)


def test_hiding_from_the_editor(fixture_store: fx.FixtureStore) -> None:
    at = open_page("sweeps")
    at.selectbox(key="sweeps-annotate").set_value(fixture_store.other_sweep_id).run()
    key = f"sweeps-notes-s{fixture_store.other_sweep_id}"
    at.checkbox(key=f"{key}-hide").check()
    at.button(key=f"{key}-save").click().run()
    assert not at.exception
    assert ann.hidden_sweeps(get_engine(fixture_store.url)) == {fixture_store.other_sweep_id}
    assert at.dataframe[0].value["sweep_id"].tolist() == [fixture_store.sweep_id]


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """What the page's download buttons serve, by file name (AppTest's media store is gone
    once a run ends, so the files are caught on their way in)."""
    caught: dict[str, bytes] = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def spy(
        self: MemoryMediaFileStorage,
        path_or_data: str | bytes,
        mimetype: str,
        kind: Any,
        filename: str | None = None,
    ) -> str:
        if filename and isinstance(path_or_data, bytes):
            caught[filename] = path_or_data
        return original(self, path_or_data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", spy)
    return caught


def test_curves_smoothed_by_default_with_log_y_wall_clock_and_csv(
    fixture_store: fx.FixtureStore, downloads: dict[str, bytes]
) -> None:
    at = open_page("curves", sweep=fixture_store.sweep_id)
    assert at.slider(key="curve-smoothing").value == curves.DEFAULT_SMOOTHING
    assert at.toggle(key="curve-log").value is False
    assert "smoothed (EMA 0.6; faint line: unsmoothed)" in texts(at)
    charts = at.get("vega_lite_chart")
    # a training chart draws the raw line behind the smoothed one
    spec = json.loads(charts[1].proto.spec)
    assert len(spec["layer"]) == 5 and spec["layer"][0]["mark"]["opacity"] == pytest.approx(0.3)
    # its layers read one table, sent once (dashboard.curves.chart_frame)
    assert len(charts[1].proto.datasets) == 1
    labels = [b.label for b in at.get("download_button")]
    assert labels == ["Download the held-out curve (CSV)", "Download the plotted data (CSV)"]

    at.selectbox(key="curve-x").set_value(curves.WALL_CLOCK_LABEL)
    at.toggle(key="curve-log").set_value(True)
    at.multiselect(key="curve-metrics").set_value([mn.ACC_MEAN, mn.REWARD_MEAN]).run()
    assert not at.exception
    charts = at.get("vega_lite_chart")
    held_out = json.loads(charts[0].proto.spec)
    assert held_out["layer"][-1]["encoding"]["x"]["title"] == "wall-clock (min)"
    acc = json.loads(charts[1].proto.spec)
    assert acc["layer"][-1]["encoding"]["y"]["scale"]["type"] == "log"
    # reward/mean = 2·acc − 1 is negative early on: that chart stays linear, and says so
    reward = json.loads(charts[2].proto.spec)
    assert reward["layer"][-1]["encoding"]["y"]["scale"]["type"] == "linear"
    assert "Linear y (values ≤ 0, which a log scale cannot show): mean reward." in texts(at)

    # the CSV is what is plotted: x in wall-clock minutes (30 s per step: step 4 at 2.5 min)
    data = pd.read_csv(io.BytesIO(downloads[f"curves-sweep{fixture_store.sweep_id}.csv"]))
    assert set(data["metric"]) == {mn.ACC_MEAN, mn.REWARD_MEAN}
    last = data[(data["arm"] == "grpo") & (data["metric"] == mn.ACC_MEAN) & (data["step"] == 4)]
    assert last["wall-clock (min)"].tolist() == pytest.approx([2.5])
    # raw acc at step 4, grpo: 0.1 + 0.4 + 0.01·seed over seeds 0, 1 -> 0.505, in % as shown
    assert last["mean (raw)"].tolist() == pytest.approx([50.5])
    assert last["unit"].tolist() == ["%"]
    assert last["mean"].iloc[0] < 50.5  # the EMA lags a rising curve
