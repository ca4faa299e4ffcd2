"""Sample efficiency in the ablation table (`dapo table --efficiency`): per seed, the mean
held-out avg@k over the run's evaluations, step 0 included; over seeds with the table's 95%
t-interval, and paired by seed against the parent. Numbers by hand.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from dapo_lab.cli import main
from db import ablation
from db.store import Store

T1 = 12.7062  # t(0.975, 1)


def _run(store: Store, sweep_id: int, arm: str, seed: int, evals: dict[int, float], status: str):
    run_id = store.start_run(
        sweep_id=sweep_id, arm=arm, seed=seed, config={}, config_hash=arm, host="h"
    )
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
    # b's final Δ is 0.1 on both seeds (s = 0): p = 0, one test, Holm keeps its star
    assert (
        rows["b"]["delta_parent_p"] == "0.0" and rows["b"]["delta_parent_holm_significant"] == "1"
    )
    assert float(rows["b"]["area_pct"]) == pytest.approx(41.0)
    assert main([*args, "--wide"]) == 0
    out = capsys.readouterr().out
    # Holm's note sits under the ablation table, the efficiency table after it
    assert out.index("Holm over the 1 Δ parent") < out.index("Sample efficiency")
