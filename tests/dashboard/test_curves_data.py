"""What the curves page computes and sends (dashboard.curves, issue 27): the seed band folded in
one grouped aggregate, pinned by hand and against db.stats.t_interval one group at a time, and
the one table per chart that every layer of it reads."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dashboard import curves
from db import stats

NAN = float("nan")


def long_frame(rows: list[tuple[str, int, int, float]], name: str = "m") -> pd.DataFrame:
    """(arm, seed, step, value) -> the long frame seed_band folds, x = 10 · step + seed."""
    frame = pd.DataFrame(rows, columns=["arm", "seed", "step", "value"])
    return frame.assign(
        run_id=frame["seed"] + 100 * (frame["arm"] == "b"),
        name=name,
        x=10.0 * frame["step"] + frame["seed"],
    )


def test_seed_band_by_hand() -> None:
    band = curves.seed_band(
        long_frame(
            [
                ("a", 0, 0, 1.0), ("a", 1, 0, 2.0), ("a", 2, 0, NAN),
                ("a", 0, 1, 2.0), ("a", 1, 1, 4.0), ("a", 2, 1, 6.0),
                ("b", 0, 0, 5.0), ("b", 0, 1, NAN),
            ]
        )
    )  # fmt: skip
    assert list(band.columns) == curves.BAND_COLUMNS
    assert list(zip(band["arm"], band["step"], strict=True)) == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1),
    ]  # fmt: skip
    # a, step 0: seed 2's NaN left out -> (1, 2): mean 1.5, s = 0.70711,
    #   half = t(0.975, 1) · s / √2 = 12.7062 · 0.5 = 6.3531; its seed still counts (3 seeds)
    # a, step 1: (2, 4, 6): mean 4, s = 2, half = t(0.975, 2) · 2 / √3 = 4.30265 · 1.1547 = 4.96832
    # b, step 0: one seed: mean 5, no interval; b, step 1: its one value NaN: nothing but n
    assert band["mean"].tolist() == pytest.approx([1.5, 4.0, 5.0, NAN], nan_ok=True)
    assert band["low"].tolist() == pytest.approx(
        [-4.8531, -0.96832, NAN, NAN], abs=1e-4, nan_ok=True
    )
    assert band["high"].tolist() == pytest.approx(
        [7.8531, 8.96832, NAN, NAN], abs=1e-4, nan_ok=True
    )
    assert band["min"].tolist() == pytest.approx([1.0, 2.0, 5.0, NAN], nan_ok=True)
    assert band["max"].tolist() == pytest.approx([2.0, 6.0, 5.0, NAN], nan_ok=True)
    assert band["n_seeds"].tolist() == [3, 3, 1, 1]
    # x: the seeds' mean x, step 0 of a: (0 + 1 + 2) / 3 = 1 (a NaN value keeps its x)
    assert band["x"].tolist() == pytest.approx([1.0, 11.0, 0.0, 10.0])


def test_seed_band_is_t_interval_per_group() -> None:
    # the same statistic as the ablation table's: db.stats.t_interval over each group's values
    rng = np.random.default_rng(27)
    rows = []
    for arm, seeds in (("a", 1), ("b", 2), ("c", 5)):
        for seed in range(seeds):
            for step in range(20):
                value = float(rng.normal(step, 3.0)) if rng.random() > 0.2 else NAN
                rows.append((arm, seed, step, value))
    frame = long_frame(rows)
    band = curves.seed_band(frame).set_index(["arm", "step"])
    for (arm, step), group in frame.groupby(["arm", "step"]):
        values = [v for v in group["value"] if not math.isnan(v)]
        expected = stats.t_interval(values) if values else stats.EMPTY
        row = band.loc[(arm, step)]
        got = (row["mean"], row["low"], row["high"])
        want = (expected.mean, expected.low, expected.high)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12, nan_ok=True), (arm, step)
        assert row["n_seeds"] == group["seed"].nunique()


def test_curve_bands_share_one_join_and_skip_raw_unsmoothed() -> None:
    frame = long_frame([("a", 0, 0, 1.0), ("a", 0, 1, 3.0), ("a", 1, 0, 3.0), ("a", 1, 1, 5.0)])
    frame = frame.drop(columns="x")
    band, raw = curves.curve_bands(frame, ["m"], None, 0.5)
    # EMA 0.5: seed 0 (1, 3) -> (1, 2); seed 1 (3, 5) -> (3, 4): means 2, 3; raw means 2, 4
    assert band["mean"].tolist() == pytest.approx([2.0, 3.0])
    assert raw is not None and raw["mean"].tolist() == pytest.approx([2.0, 4.0])
    assert curves.curve_bands(frame, ["m"], None, 0.0)[1] is None
    pd.testing.assert_frame_equal(curves.curve_band(frame, ["m"], None, 0.5), band)


def test_chart_frame_is_one_table_with_only_what_is_drawn() -> None:
    rows = [("a", 0, 0, 1.0), ("a", 1, 0, 3.0), ("a", 0, 1, 2.0), ("a", 1, 1, 4.0)]
    band = pd.concat([curves.seed_band(long_frame(rows)), curves.seed_band(long_frame(rows, "z"))])
    raw = band.assign(mean=band["mean"] + 10.0)  # stands in for the unsmoothed band
    frame = curves.chart_frame(band, "m", raw=raw)
    assert list(frame.columns) == ["arm", "step", "x", "mean", "low", "high", "n_seeds", "raw"]
    # metric m only; the raw mean beside the smoothed one, matched by (arm, step)
    assert frame["step"].tolist() == [0, 1]
    assert frame["mean"].tolist() == pytest.approx([2.0, 3.0])
    assert frame["raw"].tolist() == pytest.approx([12.0, 13.0])
    # the min–max band adds its two columns; the 95% interval stays for the tooltip
    spread = curves.chart_frame(band, "m", ("min", "max"))
    assert list(spread.columns) == [
        "arm",
        "step",
        "x",
        "mean",
        "low",
        "high",
        "min",
        "max",
        "n_seeds",
    ]
    assert spread["min"].tolist() == [1.0, 2.0] and spread["max"].tolist() == [3.0, 4.0]


def test_band_chart_sends_its_rows_once() -> None:
    rows = [("a", 0, 0, 1.0), ("a", 1, 0, 3.0), ("a", 0, 1, 2.0), ("a", 1, 1, NAN)]
    band = curves.seed_band(long_frame(rows))
    spec = curves.band_chart(band, "m", ["a"], "step", raw=band).to_dict()
    # one dataset for the chart, the two rows of chart_frame; no layer brings its own data
    (values,) = spec["datasets"].values()
    assert len(values) == 2 and set(values[0]) == {
        "arm", "step", "x", "mean", "low", "high", "n_seeds", "raw",
    }  # fmt: skip
    assert all("data" not in layer for layer in spec["layer"])
    marks = [layer["mark"] for layer in spec["layer"]]
    assert [m["type"] for m in marks] == ["line", "area", "line", "line", "line"]
    assert all(m["aria"] is False for m in marks)  # no per-point description strings
    # step 1 has one seed: the band's layers leave it out, as the old per-layer dropna did
    assert [m.get("invalid") for m in marks[1:4]] == ["filter"] * 3


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("points", [False, True])
@pytest.mark.parametrize("log_y", [False, True])
@pytest.mark.parametrize("bounds", list(curves.BANDS.values()))
def test_every_band_chart_variant_is_a_valid_vega_lite_spec(
    raw: bool, points: bool, log_y: bool, bounds: tuple[str, str]
) -> None:
    # band_chart's charts skip Altair's schema validation on every page view (BandChart); this
    # is where each variant the pages draw is validated instead: an invalid spec raises here.
    rows = [("a", 0, 0, 1.0), ("a", 1, 0, 3.0), ("b", 0, 1, 2.0), ("b", 1, 1, 4.0)]
    band = curves.seed_band(long_frame(rows))
    chart = curves.band_chart(
        band, "m", ["a", "b"], "step", points=points, bounds=bounds, log_y=log_y,
        raw=band if raw else None, title="held-out" if points else None,
    )  # fmt: skip
    validated = chart.to_dict(validate=True)
    assert chart.to_dict() == validated  # what st.altair_chart sends is the validated spec
    assert len(validated["layer"]) == 4 + raw
