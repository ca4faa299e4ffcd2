"""Unit tests of the Mechanisms and Grid pages' shaping, on small frames built by hand.

The frames have db.mechanism_table.mechanism_table's and grid_table's columns; their statistics come
from db.stats (pinned in tests/db/test_stats.py), so these tests pin what is shown and how.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from dashboard import grids, mechanisms
from db import mechanisms as mech_text
from db import stats
from db.grids import GRID_COLUMNS
from db.mechanism_table import MECHANISM_COLUMNS

TRUNCATED, CLIP_HIGH, ENTROPY = "response_length/clip_ratio", "clip_ratio/high", "entropy/mean"


def _row(
    arm: str,
    parent: str | None,
    changes: tuple[str, ...],
    metric: str,
    last: dict[int, float],
    first: dict[int, float],
    parent_last: dict[int, float] | None = None,
    parent_first: dict[int, float] | None = None,
) -> dict[str, Any]:
    return {
        "arm": arm,
        "parent": parent,
        "adds": None,
        "changes": changes,
        "focus": metric in mech_text.focus_metrics(changes),
        "metric": metric,
        "seeds": list(last),
        "first_values": [first[s] for s in last],
        "last_values": list(last.values()),
        "first": stats.t_interval(list(first.values())),
        "last": stats.t_interval(list(last.values())),
        "delta_parent": stats.paired(last, parent_last) if parent_last else stats.EMPTY,
        "delta_parent_first": stats.paired(first, parent_first) if parent_first else stats.EMPTY,
        "window": 3,
    }


def _table() -> pd.DataFrame:
    """Two arms × two metrics; clip_higher changes algo.clip_high (its focus: clip_ratio/high
    and entropy), and a third arm changes a key no metric is about."""
    base_clip, base_trunc = {0: 0.002, 1: 0.004}, {0: 0.10, 1: 0.12}
    base_clip_first = {0: 0.001, 1: 0.003}
    rows = [
        _row("grpo", None, (), CLIP_HIGH, base_clip, base_clip_first),
        _row("grpo", None, (), TRUNCATED, base_trunc, {0: 0.20, 1: 0.22}),
        # Δ clip_ratio/high (0.010, 0.012): 0.011 ± 12.7062 · 0.001 = [−0.0017, 0.0237];
        # on the first window (0.009, 0.009): no spread, excludes 0
        _row("clip_higher", "grpo", ("algo.clip_high",), CLIP_HIGH,
             {0: 0.012, 1: 0.016}, {0: 0.010, 1: 0.012}, base_clip, base_clip_first),
        # Δ truncated (0.0, 0.0): no spread, no difference
        _row("clip_higher", "grpo", ("algo.clip_high",), TRUNCATED,
             {0: 0.10, 1: 0.12}, {0: 0.20, 1: 0.22}, base_trunc),
        _row("gspo", "clip_higher", ("algo.loss_mode",), CLIP_HIGH,
             {0: 0.5}, {0: 0.5}, {0: 0.012}),
        _row("gspo", "clip_higher", ("algo.loss_mode",), TRUNCATED, {}, {}, None),
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=MECHANISM_COLUMNS)


def test_values_in_their_units_with_three_significant_digits() -> None:
    estimate = stats.t_interval([0.13, 0.14])  # 0.135 ± 0.063531
    assert mech_text.value_text(estimate, TRUNCATED) == "13.5 [7.1, 19.9]"  # percent
    assert mech_text.value_text(estimate, ENTROPY) == "0.135 [0.071, 0.199]"  # nats
    assert mech_text.value_text(stats.t_interval([153.0]), "response_length/mean") == (
        "153 (n=1, no interval)"
    )
    delta = stats.paired({0: 1.0, 1: 1.0}, {0: 0.0, 1: 0.0})  # a float's 1.0: 1.00, not 1.000
    assert mech_text.value_text(delta, "sampling/gen_batches", signed=True) == (
        "+1.00 [+1.00, +1.00]"  # two seeds: the exact test's p is 0.5, no mark
    )
    six = stats.paired(dict.fromkeys(range(6), 1.0), dict.fromkeys(range(6), 0.0))
    assert mech_text.value_text(six, "sampling/gen_batches", signed=True) == (
        "+1.00 [+1.00, +1.00] *"  # six seeds of one sign: p = 2/64
    )
    assert mech_text.value_text(stats.EMPTY, TRUNCATED) == "—"
    assert mech_text.metric_label(CLIP_HIGH) == "clip_ratio/high (%)"
    assert mech_text.metric_label(ENTROPY) == "entropy/mean"


def test_signature_keeps_each_arms_own_metrics() -> None:
    table = _table()
    shown = mechanisms.signature(table)
    assert shown[["arm", "metric"]].values.tolist() == [
        ["clip_higher", "◆ clip_ratio/high (%)"],
        # an arm whose change is about metrics its runs did not log says which, once
        [
            "gspo",
            "(not logged: loss/cov_selected_share (%), entropy/mean, clip_ratio/high_natural (%))",
        ],
    ]
    assert shown["Δ parent, last 3"].tolist() == ["+1.10 [-0.17, +2.37]", "—"]
    assert shown["Δ parent, first 3"].tolist() == ["+0.900 [+0.900, +0.900]", "—"]
    assert shown["last 3"].tolist()[0] == "1.40 [-1.14, 3.94]"
    css = mechanisms.signature_css(table, shown)
    # two seeds: the first window's interval excludes 0, but no exact test passes: not bold
    assert (css == "").all().all()
    # six seeds of the same first-window gap: bold there, and only there
    seeds = range(6)
    six = pd.DataFrame(
        [
            _row("grpo", None, (), CLIP_HIGH, dict.fromkeys(seeds, 0.002), dict.fromkeys(seeds, 0.001)),
            _row(
                "clip_higher", "grpo", ("algo.clip_high",), CLIP_HIGH,
                {s: 0.012 + 0.001 * s for s in seeds}, dict.fromkeys(seeds, 0.010),
                {s: 0.002 + 0.002 * (s % 2) * (-1) ** s for s in seeds},
                dict.fromkeys(seeds, 0.001),
            ),
        ],
        columns=MECHANISM_COLUMNS,
    )  # fmt: skip
    shown6 = mechanisms.signature(six)
    css6 = mechanisms.signature_css(six, shown6)
    assert css6.loc[0, "Δ parent, first 3"] == mechanisms.SIGNIFICANT_CSS
    assert css6.loc[0, "Δ parent, last 3"] == mechanisms.SIGNIFICANT_CSS  # every seed above too


def test_wide_table_highlights_the_focus_cells() -> None:
    table = _table()
    last = mechanisms.wide(table, "last")
    assert list(last.columns) == [
        "arm", "changes", "clip_ratio/high (%)", "response_length/clip_ratio (%)",
    ]  # fmt: skip
    assert last["arm"].tolist() == ["grpo", "clip_higher", "gspo"]
    assert last["changes"].tolist() == ["—", "algo.clip_high", "algo.loss_mode"]
    assert last["response_length/clip_ratio (%)"].tolist() == [
        "11.0 [-1.7, 23.7]",
        "11.0 [-1.7, 23.7]",
        "—",  # not logged
    ]
    css = mechanisms.wide_css(table, "last")
    assert css.loc[1, "clip_ratio/high (%)"] == mechanisms.FOCUS_CSS
    assert css.loc[1, "response_length/clip_ratio (%)"] == ""
    assert css.loc[0, "clip_ratio/high (%)"] == ""  # the base is about nothing
    delta = mechanisms.wide(table, "delta_parent")
    assert delta["clip_ratio/high (%)"].tolist() == [
        "—",
        "+1.10 [-0.17, +2.37]",
        "+48.8 (n=1, no interval)",
    ]
    # a Δ of exactly 0 on both seeds has a zero-width interval: not significant (0 ∈ [0, 0])
    assert delta["response_length/clip_ratio (%)"].tolist()[1] == "+0.00 [+0.00, +0.00]"
    assert mechanisms.style_wide(table, "delta_parent").data.shape == delta.shape


def test_metric_summary_and_seed_points() -> None:
    table = _table()
    summary = mechanisms.metric_summary(table, CLIP_HIGH)
    assert summary["arm"].tolist() == ["grpo", "clip_higher", "gspo"]
    assert summary["mean"].tolist() == pytest.approx([0.3, 1.4, 50.0])  # percent
    assert summary["first"].tolist() == pytest.approx([0.2, 1.1, 50.0])
    assert math.isnan(summary["low"].iloc[2])  # one seed: no whisker
    assert summary["focus"].tolist() == ["other", "its change is about it", "other"]
    assert mechanisms.metric_summary(table, TRUNCATED)["arm"].tolist() == ["grpo", "clip_higher"]
    points = mechanisms.metric_points(table, CLIP_HIGH)
    assert points.values.tolist() == [
        ["grpo", 0, pytest.approx(0.2)],
        ["grpo", 1, pytest.approx(0.4)],
        ["clip_higher", 0, pytest.approx(1.2)],
        ["clip_higher", 1, pytest.approx(1.6)],
        ["gspo", 0, pytest.approx(50.0)],
    ]


# --- grids -----------------------------------------------------------------------------------


def _grid(points: dict[str, dict[str, Any]], base: str) -> pd.DataFrame:
    rows = []
    for i, (arm, point) in enumerate(points.items()):
        scores = [0.30 + 0.05 * i + d for d in (-0.01, 0.0, 0.01)] if i != 2 else [0.5]
        rows.append(
            {
                "arm": arm,
                "parent": None if arm == base else base,
                "base": arm == base,
                "point": point,
                "n_seeds": len(scores),
                "score": stats.t_interval(scores),
                "metric": stats.t_interval([0.01 * (i + 1)]),
                "metric_name": CLIP_HIGH,
                "eval_dataset": "aime",
                "eval_k": 4,
            }
        )
    return pd.DataFrame(rows, columns=GRID_COLUMNS)


def test_plot_frame_of_one_swept_key() -> None:
    grid = _grid(
        {
            "dapo": {"algo.clip_high": 0.28},
            "dapo-clip_high=0.32": {"algo.clip_high": 0.32},
            "dapo-clip_high=0.24": {"algo.clip_high": 0.24},
        },
        base="dapo",
    )
    frame = grids.plot_frame(grid, "algo.clip_high")
    assert list(frame.columns) == grids.PLOT_COLUMNS
    # sorted by x; scores in %; 3 seeds spread 1 point: ± 4.302653 / √3 = ± 2.484
    assert frame["x"].tolist() == [0.24, 0.28, 0.32]
    assert frame["mean"].tolist() == pytest.approx([50.0, 30.0, 35.0])
    assert frame["low"].iloc[1] == pytest.approx(30.0 - 2.484138, abs=1e-5)
    assert math.isnan(frame["low"].iloc[0])  # one seed: no whisker
    assert frame["series"].unique().tolist() == [grids.ONE_SERIES]
    assert frame["role"].tolist() == [grids.POINT, grids.BASE, grids.POINT]
    assert frame["text"].tolist()[0] == "50.0 (n=1, no interval)"
    metric = grids.plot_frame(grid, "algo.clip_high", "metric", metric=CLIP_HIGH)
    assert metric["mean"].tolist() == pytest.approx([3.0, 1.0, 2.0])  # percent
    spec = grids.grid_chart(frame, "algo.clip_high", "score (%)", "t").to_dict()
    marks = [layer["mark"]["type"] for layer in spec["layer"]]
    assert marks == ["line", "errorbar", "point", "text"]  # the text names the base arm
    assert spec["layer"][0]["encoding"]["x"]["scale"]["domain"] == pytest.approx([0.2336, 0.3264])
    shape = spec["layer"][2]["encoding"]["shape"]["scale"]
    assert shape == {"domain": [grids.BASE, grids.POINT], "range": ["diamond", "circle"]}
    assert spec["layer"][0]["encoding"]["x"]["type"] == "quantitative"


def test_plot_frame_of_categorical_values_and_unscored_arms() -> None:
    grid = _grid(
        {
            "tis": {"algo.rollout_correction": "tis", "algo.rollout_is_cap": 2.0},
            "mis": {"algo.rollout_correction": "mis", "algo.rollout_is_cap": 2.0},
            "none": {"algo.rollout_correction": "none", "algo.rollout_is_cap": 3.0},
        },
        base="tis",
    )
    grid.at[1, "score"] = stats.EMPTY  # no completed seed yet: no point
    frame = grids.plot_frame(grid, "algo.rollout_correction")
    assert frame[["x", "series"]].values.tolist() == [
        ["tis", "rollout_is_cap=2"],
        ["none", "rollout_is_cap=3"],
    ]
    assert not grids.numeric(frame)
    spec = grids.grid_chart(frame, "algo.rollout_correction", "score (%)", "t").to_dict()
    assert spec["layer"][0]["encoding"]["x"]["type"] == "nominal"
    assert grids.plot_frame(grid.iloc[0:0], "algo.rollout_correction").empty
    assert grids.value_name(True) == "true" and grids.value_name(0.2) == "0.2"
