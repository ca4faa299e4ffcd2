"""Unit tests of the dashboard's data shaping: ablation table, curves, config diffs, rollouts."""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest

from dashboard import configs, curves, rollouts, shaping


def _table() -> pd.DataFrame:
    """A db.queries.ablation_table-shaped frame: 3 arms, seeds 0 and 1, dapo's seed 1 failed."""
    return pd.DataFrame(
        {
            "arm": ["grpo", "clip_higher", "dapo"],
            "adds": ["naive GRPO", "decoupled clip", "dynamic sampling"],
            "paper_score": [30.0, 38.0, 50.0],
            "n_seeds": [2, 2, 1],
            "scores": [[0.30, 0.34], [0.40, 0.36], [0.35]],
            "seeds": [[0, 1], [0, 1], [0]],
            "score_mean": [0.32, 0.38, 0.35],
            # sample std of (0.30, 0.34): sqrt((0.02² + 0.02²) / 1) = 0.028284
            "score_std": [0.028284, 0.028284, math.nan],
            "best_mean": [0.33, 0.39, 0.35],
            "delta_prev": [math.nan, 0.06, -0.03],
            "delta_base": [0.0, 0.06, 0.03],
            "steps": [10, 10, 10],
            "grad_updates": [40, 40, 40],
            "tokens": [12345, 13000, 14000],
            "wall_s": [65.0, 3725.0, 42.0],
            "status": ["completed", "completed", "failed"],
            "eval_dataset": ["aime2024"] * 3,
            "eval_k": [4] * 3,
        }
    )


def test_ablation_display_percent_mean_std_and_deltas() -> None:
    display = shaping.ablation_display(_table())
    assert list(display["arm"]) == ["grpo", "clip_higher", "dapo"]
    # per-seed columns in percent; dapo has no seed-1 score
    assert display["seed 0"].tolist() == pytest.approx([30.0, 40.0, 35.0])
    assert display["seed 1"].iloc[:2].tolist() == pytest.approx([34.0, 36.0])
    assert math.isnan(display["seed 1"].iloc[2])
    # 0.32 ± 0.028284 -> "32.0 ± 2.8"; one seed -> mean only
    assert display["mean ± std"].tolist() == ["32.0 ± 2.8", "38.0 ± 2.8", "35.0"]
    # Δs in percentage points: 0.06 -> +6.0, -0.03 -> -3.0
    assert display["Δ prev"].iloc[1:].tolist() == pytest.approx([6.0, -3.0])
    assert math.isnan(display["Δ prev"].iloc[0])
    assert display["Δ base"].tolist() == pytest.approx([0.0, 6.0, 3.0])
    # paper Δ prev: 38 - 30 = 8, 50 - 38 = 12
    assert display["paper Δ"].iloc[1:].tolist() == pytest.approx([8.0, 12.0])
    assert display["time"].tolist() == ["1m 05s", "1h 02m", "42s"]
    assert display["status"].tolist() == ["✔ completed", "✔ completed", "✖ failed"]
    # the answer first, the bookkeeping last
    assert list(display.columns[:5]) == [
        "arm",
        "adds",
        "mean ± std",
        "Δ prev",
        "Δ base",
    ]


def test_ablation_text_formats_numbers_and_marks_missing() -> None:
    text = shaping.ablation_text(shaping.ablation_display(_table()))
    assert text["Δ prev"].tolist() == ["—", "+6.0", "-3.0"]
    assert text["Δ base"].tolist() == ["+0.0", "+6.0", "+3.0"]
    assert text["seed 1"].tolist() == ["34.0", "36.0", "—"]
    assert text["tokens"].tolist() == ["12,345", "13,000", "14,000"]
    assert text["paper"].tolist() == ["30.0", "38.0", "50.0"]


def test_style_colours_deltas_green_up_red_down() -> None:
    styler = shaping.style_ablation(shaping.ablation_display(_table()))
    html = styler.to_html()
    assert "+6.0" in html and "-3.0" in html
    styles = styler._compute().ctx  # (row, column position) -> [(css property, value)]
    column = list(styler.data.columns).index("Δ prev")
    assert ("color", "#137333") in styles[(1, column)]  # +6.0: green
    assert ("color", "#a50e0e") in styles[(2, column)]  # -3.0: red
    assert (0, column) not in styles or not styles[(0, column)]  # no Δ for the first arm
    assert shaping.delta_css(6.0) == shaping.UP_CSS
    assert shaping.delta_css(-3.0) == shaping.DOWN_CSS
    assert shaping.delta_css(0.0) == ""
    assert shaping.delta_css(math.nan) == ""


def test_ablation_csv_round_trips_percent_columns() -> None:
    frame = pd.read_csv(io.BytesIO(shaping.ablation_csv(_table())))
    assert list(frame["arm"]) == ["grpo", "clip_higher", "dapo"]
    assert frame["score_seed1_pct"].iloc[:2].tolist() == pytest.approx([34.0, 36.0])
    assert frame["delta_prev_pct"].iloc[2] == pytest.approx(-3.0)
    assert frame["paper_score_pct"].tolist() == [30.0, 38.0, 50.0]
    assert frame["status"].iloc[2] == "failed"


def test_score_summary_bounds_are_mean_plus_minus_std() -> None:
    summary = shaping.score_summary(_table())
    # 32.0 ± 2.8284 -> [29.17, 34.83]; no std for dapo -> zero-width
    assert summary["low"].iloc[0] == pytest.approx(32.0 - 2.8284)
    assert summary["high"].iloc[0] == pytest.approx(32.0 + 2.8284)
    assert summary["low"].iloc[2] == summary["high"].iloc[2] == pytest.approx(35.0)
    assert len(shaping.score_points(_table())) == 5  # 2 + 2 + 1 seed scores


def test_small_formatters() -> None:
    assert shaping.mean_std_text(math.nan, math.nan, 0) == "—"
    assert shaping.format_duration(None) == "—"
    assert shaping.format_duration(3599.6) == "1h 00m"  # rounds to 3600 s
    assert shaping.format_time("2026-11-22 21:07:34.326480") == "2026-11-22 21:07:34"
    assert shaping.format_time(None) == "—"
    assert shaping.status_badge("weird") == "weird"
    assert shaping.status_badge(None) == "○ pending"


# --- curves -------------------------------------------------------------------------------


def _long() -> pd.DataFrame:
    """Two seeds of arm a (runs 1, 2), three steps of acc and the tokens counter."""
    rows = []
    acc = {1: [0.0, 1.0, 1.0], 2: [0.5, 0.5, 0.0]}
    tokens = {1: [100, 200, 300], 2: [110, 220, 330]}
    for run_id, seed in ((1, 0), (2, 1)):
        for step in range(3):
            rows.append((run_id, "a", seed, step, "acc/mean", acc[run_id][step]))
            rows.append((run_id, "a", seed, step, "progress/tokens", tokens[run_id][step]))
    return pd.DataFrame(rows, columns=["run_id", "arm", "seed", "step", "name", "value"])


def test_ema_by_hand() -> None:
    # weight 0.5: s0 = 0; s1 = 0.5*0 + 0.5*1 = 0.5; s2 = 0.5*0.5 + 0.5*1 = 0.75
    assert curves.ema([0.0, 1.0, 1.0], 0.5).tolist() == pytest.approx([0.0, 0.5, 0.75])
    assert curves.ema([2.0, 4.0], 0.0).tolist() == [2.0, 4.0]
    # a NaN keeps the running value
    assert curves.ema([1.0, np.nan, 3.0], 0.5).tolist() == pytest.approx([1.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="smoothing weight"):
        curves.ema([1.0], 1.0)


def test_curve_band_over_seeds_with_tokens_axis() -> None:
    band = curves.curve_band(_long(), ["acc/mean"], "progress/tokens", 0.0)
    assert band["step"].tolist() == [0, 1, 2]
    # x = mean tokens over seeds: (100+110)/2 = 105, (200+220)/2 = 210, (300+330)/2 = 315
    assert band["x"].tolist() == pytest.approx([105.0, 210.0, 315.0])
    # mean / min / max over seeds: step 0 (0, .5), step 1 (1, .5), step 2 (1, 0)
    assert band["mean"].tolist() == pytest.approx([0.25, 0.75, 0.5])
    assert band["low"].tolist() == pytest.approx([0.0, 0.5, 0.0])
    assert band["high"].tolist() == pytest.approx([0.5, 1.0, 1.0])
    assert band["n_seeds"].tolist() == [2, 2, 2]


def test_curve_band_smooths_each_run_before_folding_seeds() -> None:
    band = curves.curve_band(_long(), ["acc/mean"], None, 0.5)
    # run 1 smoothed: 0, 0.5, 0.75; run 2: 0.5, 0.5, 0.25 -> means 0.25, 0.5, 0.5
    assert band["mean"].tolist() == pytest.approx([0.25, 0.5, 0.5])
    assert band["x"].tolist() == [0.0, 1.0, 2.0]  # no x metric: the step


def test_attach_x_drops_steps_without_the_x_metric() -> None:
    long = _long()
    long = long[~((long["name"] == "progress/tokens") & (long["step"] == 2))]
    joined = curves.attach_x(long, "progress/tokens")
    assert sorted(joined["step"].unique()) == [0, 1]


def test_band_chart_builds_and_final_values() -> None:
    band = curves.curve_band(_long(), ["acc/mean"], None, 0.0)
    spec = curves.band_chart(band, "acc/mean", ["a"], "rollout step").to_dict()
    assert spec["title"] == "acc/mean"
    # Which arm is which colour must be readable: no layer may switch the shared legend off
    # (Vega-Lite drops the merged legend of a layered chart if one layer says legend=None).
    colours = [layer["encoding"]["color"] for layer in spec["layer"]]
    assert all(c.get("legend", {}) is not None for c in colours)
    assert colours[0] == colours[1]
    finals = curves.final_values(_long(), [1, 2], ["A", "B"])
    acc = finals[finals["metric"] == "acc/mean"].iloc[0]
    assert (acc["A"], acc["B"]) == (1.0, 0.0)  # value at step 2 of each run
    assert curves.final_values(_long().iloc[0:0], [1, 2], ["A", "B"]).empty


# --- config diffs ---------------------------------------------------------------------------


def test_flatten_and_diff_show_only_changed_dotted_keys() -> None:
    before = {"algo": {"clip": {"low": 0.2, "high": 0.2}, "loss_agg": "seq"}, "seed": 0}
    after = {"algo": {"clip": {"low": 0.2, "high": 0.28}, "loss_agg": "seq"}, "seed": 0, "x": None}
    assert configs.flatten(before) == {
        "algo.clip.low": 0.2,
        "algo.clip.high": 0.2,
        "algo.loss_agg": "seq",
        "seed": 0,
    }
    diff = configs.config_diff(before, after, "grpo", "clip_higher")
    assert diff.to_dict("records") == [
        {"key": "algo.clip.high", "grpo": "0.2", "clip_higher": "0.28"},
        {"key": "x", "grpo": configs.ABSENT, "clip_higher": "null"},
    ]
    assert configs.config_diff(before, before, "a", "b").empty


# --- rollouts -------------------------------------------------------------------------------


def test_reward_parts_and_titles() -> None:
    wrong = {"idx": 3, "correct": False, "truncated": True, "reward": -1.25, "score": -1.0}
    wrong |= {"overlong_penalty": -0.25, "length": 64}
    right = {"idx": 4, "correct": True, "truncated": False, "reward": 1.0, "score": 1.0}
    right |= {"overlong_penalty": 0.0, "length": 20}
    sample = pd.Series(wrong)
    assert rollouts.reward_text(sample) == "reward -1.25 = score -1 + overlong penalty -0.25"
    assert rollouts.sample_title(sample) == "#3 · ✖ wrong · reward -1.25 · 64 tokens · truncated"
    frame = pd.DataFrame([wrong, right])
    # 2 samples, 1 correct; mean reward (-1.25 + 1) / 2 = -0.125 = score 0 + penalty -0.125
    assert rollouts.step_summary(frame) == (
        "2 samples · 1 correct (50%) · 1 truncated · mean reward -0.125 = score +0.000 "
        "+ penalty -0.125"
    )
    assert list(rollouts.reward_table(frame).columns)[4] == "overlong penalty"
    assert rollouts.step_summary(frame.iloc[0:0]) == "No samples at this step."
