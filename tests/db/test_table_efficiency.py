"""Sample efficiency in the ablation table (`dapo table --efficiency`): per seed, the mean
held-out avg@k over the run's evaluations, step 0 included; over seeds with the table's 95%
t-interval, and paired by seed against the parent. Numbers by hand.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest
from store_runs import new_attempt
from table_stores import build_threshold

from dapo_lab.cli import main
from db import ablation, efficiency
from db.store import Store

T1 = 12.7062  # t(0.975, 1)


def _run(store: Store, sweep_id: int, arm: str, seed: int, evals: dict[int, float], status: str):
    run_id = new_attempt(store, sweep_id, arm, seed, config_hash=arm)
    with store.sink(run_id) as sink:
        for step, score in evals.items():
            sink.log_evaluation(step, {"dataset": "aime", "k": 4, "avg_at_k": score})
    store.update_run(run_id, status=status, steps=5)


def build(url: str) -> int:
    """a → b, seeds 0 and 1, evaluated at steps 0, 2, 4:
    a, seed 0: 0.2, 0.3, 0.4 -> area 0.3;  seed 1: 0.2, 0.2, 0.5 -> 0.3
    b, seed 0: 0.2, 0.5, 0.5 -> area 0.4;  seed 1 resumed: attempt 1 (failed) evaluated 0.2 at
    step 0 and 0.9 at step 2, attempt 2 replayed step 2 (0.46) and ended at 0.6 -> the curve
    0.2, 0.46, 0.6 (the newer attempt's step 2) -> area 0.42."""
    store = Store(url)
    sweep_id = store.create_sweep(
        name="efficiency",
        preset="tiny",
        arms=["a", "b"],
        seeds=[0, 1],
        base_config={},
        ladder=[{"arm": "a"}, {"arm": "b"}],
    )
    _run(store, sweep_id, "a", 0, {0: 0.2, 2: 0.3, 4: 0.4}, "completed")
    _run(store, sweep_id, "a", 1, {0: 0.2, 2: 0.2, 4: 0.5}, "completed")
    _run(store, sweep_id, "b", 0, {0: 0.2, 2: 0.5, 4: 0.5}, "completed")
    _run(store, sweep_id, "b", 1, {0: 0.2, 2: 0.9}, "failed")
    _run(store, sweep_id, "b", 1, {2: 0.46, 4: 0.6}, "completed")
    return sweep_id


@pytest.fixture
def sweep(tmp_path: Path) -> tuple[str, int]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    return url, build(url)


def test_area_by_hand(sweep: tuple[str, int]) -> None:
    url, sweep_id = sweep
    table = ablation.ablation_table(Store(url).engine, sweep_id).set_index("arm")
    a, b = table.loc["a", "area"], table.loc["b", "area"]
    assert (a.n, a.mean) == (2, pytest.approx(0.3))
    # b: (0.4, 0.42) -> 0.41 ± 12.7062 · 0.01 (s/√2 = 0.01)
    assert b.mean == pytest.approx(0.41)
    assert (b.low, b.high) == pytest.approx((0.41 - 0.01 * T1, 0.41 + 0.01 * T1), abs=1e-6)
    # Δ parent paired by seed: (0.1, 0.12) -> 0.11 ± 0.127062 holds 0: no star
    delta = table.loc["b", "area_delta_parent"]
    assert delta.keys == (0, 1)
    assert delta.mean == pytest.approx(0.11)
    assert (delta.low, delta.high) == pytest.approx((0.11 - 0.01 * T1, 0.11 + 0.01 * T1), abs=1e-6)
    assert not delta.excludes_zero
    assert table.loc["a", "area_delta_parent"].n == 0  # the base arm has no parent
    # the final Δ is (0.1, 0.1): the area tells the seeds apart where the final does not
    assert table.loc["b", "delta_parent"].mean == pytest.approx(0.1)


def test_cli_efficiency(sweep: tuple[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    url, sweep_id = sweep
    args = ["table", "--store", url, "--sweep", str(sweep_id), "--wide"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert "Sample efficiency" not in plain  # the default table is unchanged
    assert main([*args, "--efficiency"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(plain.rstrip("\n"))
    tail = out[len(plain.rstrip("\n")) :]
    assert "Sample efficiency" in tail
    # b: 41.0 [28.3, 53.7], Δ +11.0 [−1.7, +23.7] in percent
    assert "41.0 [28.3, 53.7]" in tail and "+11.0 [-1.7, +23.7]" in tail
    assert main([*args, "--efficiency", "--format", "csv"]) == 0
    rows = {r["arm"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert float(rows["b"]["area_pct"]) == pytest.approx(41.0)
    assert float(rows["b"]["area_delta_parent_pct"]) == pytest.approx(11.0)
    assert rows["b"]["area_delta_parent_n"] == "2"
    assert rows["b"]["area_delta_parent_significant"] == "0"
    assert rows["a"]["area_delta_parent_pct"] == ""
    assert main([*args, "--efficiency", "--format", "markdown"]) == 0
    assert "| Δ parent (area) |" in capsys.readouterr().out


def test_efficiency_and_holm_together(
    sweep: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, sweep_id = sweep
    args = ["table", "--store", url, "--sweep", str(sweep_id), "--efficiency", "--holm"]
    assert main([*args, "--format", "csv"]) == 0
    rows = {r["arm"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    # b's final Δ is 0.1 on both seeds: the exact test's p over two seeds is 2/4 = 0.5, one
    # test, nothing for Holm to keep
    assert (
        rows["b"]["delta_parent_p"] == "0.5" and rows["b"]["delta_parent_holm_significant"] == "0"
    )
    assert float(rows["b"]["area_pct"]) == pytest.approx(41.0)
    assert main([*args, "--wide"]) == 0
    out = capsys.readouterr().out
    # Holm's note sits under the ablation table, the efficiency table after it
    assert out.index("Holm over the 1 Δ parent") < out.index("Sample efficiency")


# --- updates and tokens to a threshold ------------------------------------------------------

T2 = 4.302653  # t(0.975, 2)


@pytest.fixture
def threshold_sweep(tmp_path: Path) -> tuple[str, int]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    return url, build_threshold(url)


def test_updates_and_tokens_to_threshold_by_hand(threshold_sweep: tuple[str, int]) -> None:
    url, sweep_id = threshold_sweep
    engine = Store(url).engine
    table = ablation.ablation_table(engine, sweep_id)
    found = efficiency.reach(engine, sweep_id, table, 0.40)
    assert found is not None and found.rule == "given"
    a, b = found.arms
    assert (a.arm, a.reached_text, dict(a.reached)) == ("a", "2/3", {0: 2, 1: 4})
    assert (b.arm, b.reached_text, dict(b.reached)) == ("b", "3/3", {0: 2, 1: 2, 2: 4})
    assert dict(a.spent["updates"]) == {0: 4, 1: 8}
    # b seed 0: attempt 1's counters; b seed 1: attempt 2's 950 (it replayed step 2)
    assert dict(b.spent["tokens"]) == {0: 800, 1: 950, 2: 1500}
    # a, updates (4, 8): 6 ± 12.7062 · 2 (s = 2.828, s/√2 = 2), over the 2 seeds that reached
    updates = a.estimate["updates"]
    assert (updates.n, updates.mean) == (2, pytest.approx(6.0))
    assert (updates.low, updates.high) == pytest.approx((6 - 2 * T1, 6 + 2 * T1), abs=1e-4)
    # b, tokens (800, 950, 1500): mean 1083.33, s = 368.17, s/√3 = 212.57, ± 4.302653 · that
    tokens = b.estimate["tokens"]
    assert tokens.mean == pytest.approx(3250 / 3)
    half = T2 * math.sqrt(
        ((800 - 3250 / 3) ** 2 + (950 - 3250 / 3) ** 2 + (1500 - 3250 / 3) ** 2) / 2 / 3
    )
    assert (tokens.low, tokens.high) == pytest.approx((3250 / 3 - half, 3250 / 3 + half), rel=1e-5)
    # Δ parent over the seeds where both reached it (0, 1; a's seed 2 is censored):
    # updates (2 − 4, 2 − 8) = (−2, −6) -> −4 ± 12.7062 · 2; tokens (−200, −1650) -> −925 ± 12.7062 · 725
    du, dt = b.delta_parent["updates"], b.delta_parent["tokens"]
    assert du.keys == (0, 1) and dt.keys == (0, 1)
    assert (du.mean, du.low, du.high) == pytest.approx((-4, -4 - 2 * T1, -4 + 2 * T1), abs=1e-4)
    assert (dt.mean, dt.low, dt.high) == pytest.approx(
        (-925, -925 - 725 * T1, -925 + 725 * T1), abs=1e-2
    )
    assert not du.excludes_zero
    assert a.delta_parent["updates"].n == 0  # the base arm has no parent


def test_a_start_at_the_threshold_costs_nothing(threshold_sweep: tuple[str, int]) -> None:
    url, sweep_id = threshold_sweep
    engine = Store(url).engine
    found = efficiency.reach(engine, sweep_id, ablation.ablation_table(engine, sweep_id), 0.2)
    assert found is not None
    for arm in found.arms:
        assert arm.reached_text == "3/3" and set(arm.reached.values()) == {0}
        assert (arm.estimate["updates"].mean, arm.estimate["tokens"].mean) == (0.0, 0.0)
    nobody = efficiency.reach(engine, sweep_id, ablation.ablation_table(engine, sweep_id), 0.9)
    assert nobody is not None and [a.reached_text for a in nobody.arms] == ["0/3", "0/3"]
    assert efficiency.reach_records(nobody)[1]["updates to 90.0%"] == "—"


def test_default_threshold_is_midway_from_start_to_the_best_arm(
    threshold_sweep: tuple[str, int],
) -> None:
    url, sweep_id = threshold_sweep
    engine = Store(url).engine
    table = ablation.ablation_table(engine, sweep_id)
    # start 0.2 on every run; finals a (0.5, 0.45, 0.35), b (0.6, 0.5, 0.42) -> b leads at
    # 1.52 / 3 = 0.50667; midway: (0.2 + 0.50667) / 2 = 0.35333 (a's seed 2, 0.35, misses it)
    found = efficiency.reach(engine, sweep_id, table)
    assert found is not None
    assert found.threshold == pytest.approx((0.2 + 1.52 / 3) / 2)
    assert found.rule == (
        "default: midway between the starting model's 20.0% and the best arm b's final 50.7%"
    )
    assert [dict(a.reached) for a in found.arms] == [{0: 2, 1: 4}, {0: 2, 1: 2, 2: 4}]


def test_cli_threshold(
    threshold_sweep: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, sweep_id = threshold_sweep
    args = ["table", "--store", url, "--sweep", str(sweep_id), "--wide"]
    assert main([*args, "--threshold", "40"]) == 0  # implies --efficiency
    out = capsys.readouterr().out
    assert out.index("Sample efficiency") < out.index("Time to threshold")
    assert "≥ 40.0% (given)" in out
    tail = out[out.index("Time to threshold") :].splitlines()
    lines = {line.split()[0]: line for line in tail if line.startswith(("arm ", "a ", "b "))}
    assert lines["arm"].split()[:6] == ["arm", "reached", "updates", "to", "40.0%", "Δ"]
    # a: 2/3, updates 6.0 [−19.4, 31.4]; b: Δ updates −4.0 [−29.4, +21.4] over n=2
    assert "2/3" in lines["a"] and "6.0 [-19.4, 31.4]" in lines["a"]
    assert "3/3" in lines["b"] and "-4.0 [-29.4, +21.4] (n=2)" in lines["b"]
    # tokens: b's Δ −925 ± 9211.97 -> −925 [−10.1k, +8.29k]
    assert "-925 [-10.1k, +8.29k] (n=2)" in lines["b"]
    assert main([*args, "--efficiency"]) == 0  # the default threshold, said
    assert "≥ 35.3% (default: midway between" in capsys.readouterr().out.replace("\n", " ")
    assert main([*args, "--threshold", "40", "--format", "csv"]) == 0
    rows = {r["arm"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert (rows["a"]["reached"], rows["a"]["reached_of"]) == ("2", "3")
    assert float(rows["b"]["threshold_pct"]) == pytest.approx(40.0)
    assert float(rows["b"]["tokens_to_threshold"]) == pytest.approx(3250 / 3, abs=1e-5)
    assert float(rows["b"]["updates_to_threshold_delta_parent"]) == pytest.approx(-4.0)
    assert rows["b"]["updates_to_threshold_delta_parent_n"] == "2"
    assert rows["b"]["updates_to_threshold_delta_parent_significant"] == "0"
    assert rows["a"]["updates_to_threshold_delta_parent"] == ""
    assert main([*args, "--threshold", "40", "--format", "markdown"]) == 0
    assert "| Δ parent (tokens) |" in capsys.readouterr().out


def test_cli_threshold_out_of_range_is_one_line(
    threshold_sweep: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, sweep_id = threshold_sweep
    assert main(["table", "--store", url, "--sweep", str(sweep_id), "--threshold", "140"]) == 2
    err = capsys.readouterr().err
    assert "--threshold 140: a score in percent, 0 to 100" in err and err.count("\n") == 1
