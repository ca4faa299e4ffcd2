"""Unit tests of the dashboard's data shaping: ablation table, curves, config diffs, rollouts."""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest

from dapo_common.util import duration
from dashboard import configs, curves, rollouts, shaping
from db import stats, table_format

FINALS = {
    "grpo": {0: 0.30, 1: 0.34},
    "clip_higher": {0: 0.40, 1: 0.45},
    "token_loss": {0: 0.35, 1: 0.396},
    "dapo": {0: 0.38},
}
# Six seeds: the fewest at which a Δ can be called real (the exact test's smallest p is 2/2^6);
# clip_higher above grpo and token_loss below clip_higher on every seed.
SIX = {
    "grpo": {s: 0.30 + 0.01 * s for s in range(6)},
    "clip_higher": {s: 0.40 + 0.01 * s + 0.002 * (s % 2) for s in range(6)},
    "token_loss": {s: 0.35 + 0.01 * s for s in range(6)},
    "dapo": {0: 0.38},
}


def _table(finals: dict[str, dict[int, float]] = FINALS) -> pd.DataFrame:
    """A db.ablation.ablation_table-shaped frame: 4 arms × seeds 0 and 1; dapo's seed 1 failed.
    Its statistics come from db.stats (pinned in tests/db/test_stats.py); this file pins how
    they are shown."""
    starts = {s: 0.20 + 0.02 * (s % 2) for s in range(6)}
    arms = list(finals)
    rows = []
    for i, arm in enumerate(arms):
        seeds = finals[arm]
        parent = arms[i - 1] if i else None
        rows.append(
            {
                "arm": arm,
                "adds": f"adds {arm}",
                "parent": parent,
                "paper_score": [30.0, 38.0, 42.0, 50.0][i],
                "seeds": list(seeds),
                "scores": list(seeds.values()),
                "best_scores": list(seeds.values()),
                "start_scores": [starts[s] for s in seeds],
                "n_seeds": len(seeds),
                "score": stats.t_interval(list(seeds.values())),
                "gain": stats.paired(seeds, {s: starts[s] for s in seeds}),
                "gain_problems": stats.EMPTY,
                "delta_parent": stats.paired(seeds, finals[parent]) if parent else stats.EMPTY,
                "delta_parent_problems": stats.EMPTY,
                "delta_base": stats.paired(seeds, finals["grpo"]) if i else stats.EMPTY,
                "delta_base_problems": stats.EMPTY,
                "score_mean": stats.mean_sd(list(seeds.values()))[0],
                "score_std": stats.mean_sd(list(seeds.values()))[1],
                "best_mean": stats.mean_sd(list(seeds.values()))[0],
                "best_std": stats.mean_sd(list(seeds.values()))[1],
                "start_mean": stats.mean_sd([starts[s] for s in seeds])[0],
                "steps": 10,
                "grad_updates": 40,
                "tokens": [12345, 13000, 13500, 14000][i],
                "wall_s": [65.0, 3725.0, 100.0, 42.0][i],
                "status": "failed" if arm == "dapo" else "completed",
                "eval_dataset": "aime2024",
                "eval_k": 4,
            }
        )
    return pd.DataFrame(rows)


def test_ablation_display_is_the_one_record_function() -> None:
    table = _table()
    display = shaping.ablation_display(table)
    # the same columns and cells as `dapo table` and the Prefect artifact
    records = table_format.ablation_records(table)
    assert list(display.columns) == list(records[0])
    assert display.drop(columns="status").to_dict("records") == [
        {k: v for k, v in r.items() if k != "status"} for r in records
    ]
    assert list(display.columns) == [
        "arm", "adds", "n", "start", "final", "gain", "parent", "Δ parent", "Δ base",
        "seed 0", "seed 1", "paper", "steps", "updates", "tokens", "time", "collapsed",
        "status",
    ]  # fmt: skip
    # final: grpo (30, 34) -> 32.0 ± t(0.975, 1) · 2 = 32.0 ± 25.4; dapo has one seed
    assert display["final"].tolist() == [
        "32.0 [6.6, 57.4]",
        "42.5 [10.7, 74.3]",
        "37.3 [8.1, 66.5]",
        "38.0 (n=1, no interval)",
    ]
    # Δ parent, paired by seed: clip_higher − grpo = (10, 11) -> 10.5 ± 12.7062 · 0.5
    # = [4.1, 16.9], above 0; token_loss − clip_higher = (−5, −5.4) -> −5.2 ± 12.7062 · 0.2
    # = [−7.7, −2.7], below 0; dapo − token_loss on seed 0 only: +3.0, no interval. Two seeds
    # are no test (the exact p is at least 2/2^2 = 0.5): no star, whatever the interval.
    assert display["Δ parent"].tolist() == [
        "—",
        "+10.5 [+4.1, +16.9]",
        "-5.2 [-7.7, -2.7]",
        "+3.0 (n=1, no interval)",
    ]
    # Δ base: dapo − grpo on seed 0 only (its seed 1 failed): 38 − 30
    assert display["Δ base"].tolist()[3] == "+8.0 (n=1, no interval)"
    # start 20 (seed 0) and 22 (seed 1); gain of grpo (10, 12) -> 11.0 ± 12.7
    assert display["start"].tolist() == ["21.0", "21.0", "21.0", "20.0"]
    assert display["gain"].tolist()[0] == "+11.0 [-1.7, +23.7]"
    assert display["parent"].tolist() == ["—", "grpo", "clip_higher", "token_loss"]
    assert display["seed 1"].tolist() == ["34.0", "45.0", "39.6", "—"]
    assert display["time"].tolist() == ["1m 05s", "1h 02m", "1m 40s", "42s"]
    assert display["status"].tolist()[2:] == ["✔ completed", "✖ failed"]
    assert display["tokens"].tolist()[0] == "12,345"
    assert shaping.number_columns(display)[:3] == ["n", "start", "final"]


def test_style_colours_only_differences_the_exact_test_calls_real() -> None:
    two = _table()
    assert shaping.estimate_css(two["delta_parent"][1]) == ""  # excludes 0, but 2 seeds
    table = _table(SIX)
    styler = shaping.style_ablation(table)
    html = styler.to_html()
    # clip_higher − grpo = (10, 10.2, 10, 10.2, 10, 10.2): every seed above: p = 2/64
    assert "+10.1 [+10.0, +10.2] *" in html
    styles = styler._compute().ctx  # (row, column position) -> [(css property, value)]
    column = list(styler.data.columns).index("Δ parent")
    assert ("color", "#137333") in styles[(1, column)]  # above 0: green
    assert ("color", "#a50e0e") in styles[(2, column)]  # below 0: red
    for row in (0, 3):  # no parent; n=1 without interval: plain
        assert (row, column) not in styles or not styles[(row, column)]
    assert shaping.estimate_css(table["delta_parent"][1]) == shaping.UP_CSS
    assert shaping.estimate_css(table["delta_parent"][2]) == shaping.DOWN_CSS
    assert shaping.estimate_css(table["delta_base"][3]) == ""  # n=1
    assert shaping.estimate_css(math.nan) == ""


def test_the_csv_carries_the_intervals() -> None:
    frame = pd.read_csv(io.StringIO(table_format.render(_table(), "csv")))
    assert list(frame["arm"]) == ["grpo", "clip_higher", "token_loss", "dapo"]
    clip = frame.iloc[1]
    assert clip["delta_parent_pct"] == pytest.approx(10.5)
    # 10.5 ± 12.706205 · 0.5 = [4.146898, 16.853102]
    assert clip["delta_parent_low_pct"] == pytest.approx(4.146898, abs=1e-6)
    assert clip["delta_parent_high_pct"] == pytest.approx(16.853102, abs=1e-6)
    assert (clip["delta_parent_n"], clip["delta_parent_significant"]) == (2, 0)
    assert clip["delta_parent_p"] == pytest.approx(0.5)  # 2 seeds: the smallest p there is
    assert clip["score_low_pct"] == pytest.approx(42.5 - 12.706205 * 2.5, abs=1e-5)
    dapo = frame.iloc[3]
    assert math.isnan(dapo["score_low_pct"]) and dapo["score_n"] == 1  # one seed: empty
    assert dapo["delta_base_pct"] == pytest.approx(8.0)
    assert frame["score_seed1_pct"].iloc[:2].tolist() == pytest.approx([34.0, 45.0])
    assert frame["start_seed0_pct"].tolist() == pytest.approx([20.0] * 4)
    assert frame["paper_score_pct"].tolist() == [30.0, 38.0, 42.0, 50.0]
    assert frame["status"].iloc[3] == "failed"
    assert set(frame["interval"]) == {"95% t over seeds"}


def test_score_summary_is_the_interval_over_seeds() -> None:
    summary = shaping.score_summary(_table())
    # grpo: 32.0 ± 25.4124 -> [6.5876, 57.4124]; dapo (n=1): no interval
    assert summary["low"].iloc[0] == pytest.approx(6.5876, abs=1e-4)
    assert summary["high"].iloc[0] == pytest.approx(57.4124, abs=1e-4)
    assert math.isnan(summary["low"].iloc[3]) and summary["n"].iloc[3] == 1
    assert summary["start (%)"].tolist() == pytest.approx([21.0, 21.0, 21.0, 20.0])
    assert len(shaping.score_points(_table())) == 7  # 2 + 2 + 2 + 1 seed scores


def test_small_formatters() -> None:
    assert shaping.format_time("2026-11-22 21:07:34.326480") == "2026-11-22 21:07:34"
    assert shaping.format_time(None) == "—"
    assert shaping.status_badge("weird") == "weird"
    assert shaping.status_badge(None) == "○ pending"
    # a table cell's duration, then a progress line's (ETA)
    assert duration(3599.6, compact=True, missing="—") == "1h 00m"  # rounds to 3600 s
    assert duration(None, compact=True, missing="—") == "—"
    assert duration(185, compact=True) == "3m 05s"
    assert duration(3725.4) == "1:02:05"
    assert duration(math.nan) == "-"


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
    assert band["min"].tolist() == pytest.approx([0.0, 0.5, 0.0])
    assert band["max"].tolist() == pytest.approx([0.5, 1.0, 1.0])
    # 95% t-interval of two seeds a, b: mean ± 12.7062 · |a − b| / 2; step 0: 0.25 ± 3.17655
    assert band["low"].tolist() == pytest.approx([-2.92655, 0.75 - 3.17655, -5.85310], abs=1e-5)
    assert band["high"].tolist() == pytest.approx([3.42655, 0.75 + 3.17655, 6.85310], abs=1e-5)
    assert band["n_seeds"].tolist() == [2, 2, 2]


def test_one_seed_has_no_band() -> None:
    band = curves.curve_band(_long()[lambda f: f["run_id"] == 1], ["acc/mean"], None, 0.0)
    assert band["mean"].tolist() == [0.0, 1.0, 1.0]
    assert band["low"].isna().all() and band["high"].isna().all()
    chart = curves.band_chart(band, "acc/mean", ["a"], "rollout step").to_dict()
    assert chart["layer"][0]["mark"]["type"] == "area"  # drawn from no rows: no band


def test_eval_band_puts_the_start_at_zero_updates() -> None:
    evals = pd.DataFrame(
        [(1, "a", 0, 0, "eval/avg_at_k", 0.2), (1, "a", 0, 2, "eval/avg_at_k", 0.4),
         (2, "a", 1, 0, "eval/avg_at_k", 0.2), (2, "a", 1, 2, "eval/avg_at_k", 0.5)],
        columns=["run_id", "arm", "seed", "step", "name", "value"],
    )  # fmt: skip
    counters = pd.DataFrame(
        [(1, "a", 0, 2, "progress/grad_updates", 8.0), (2, "a", 1, 2, "progress/grad_updates", 10.0)],
        columns=["run_id", "arm", "seed", "step", "name", "value"],
    )  # fmt: skip
    band = curves.eval_band(evals, counters, "progress/grad_updates")
    # step 0 (the starting model) sits at x = 0; step 2 at the seeds' mean 9 updates
    assert band["x"].tolist() == pytest.approx([0.0, 9.0])
    # step 2: (0.4, 0.5) -> 0.45 ± 12.7062 · 0.05 = [-0.18531, 1.08531]
    assert band["mean"].tolist() == pytest.approx([0.2, 0.45])
    assert band["low"].iloc[1] == pytest.approx(-0.18531, abs=1e-5)
    by_step = curves.eval_band(evals, counters, None)
    assert by_step["x"].tolist() == [0.0, 2.0]
    # the chart's y range is that of the seeds' values, padded 5%: 0.2..0.5 -> 0.185..0.515
    assert curves.value_domain(band) == pytest.approx([0.185, 0.515])


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
    # titled by its display name, the key under it to look it up by (dapo_common.metric_display)
    assert spec["title"]["text"] == "training accuracy"
    assert spec["title"]["subtitle"] == "acc/mean"
    assert spec["layer"][-1]["encoding"]["y"]["title"] == "training accuracy (%)"
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
