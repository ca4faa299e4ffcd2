"""`dapo table --holm`: Holm's correction over the table's Δ-parent stars, pinned by hand.

Holm's step-down test on m p-values: sorted, p_(1) against α/m, p_(2) against α/(m − 1), ...,
stopping at the first that fails. With three seeds a paired Δ's t has 2 degrees of freedom,
whose two-sided p has a closed form, p = 1 − t / √(t² + 2), so every number below is by hand.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest
from store_runs import new_attempt

from dapo_lab.cli import main
from db import ablation, stats
from db.store import Store

# A ladder a → b → c → d over seeds 0, 1, 2; each arm's final score is its parent's plus a
# per-seed step (mean, mean ± δ), so Δ parent has mean `mean` and sample sd δ:
#   b − a: (0.09, 0.10, 0.11): t = 0.10·√3/0.01 = 17.3205, p = 1 − 17.3205/√302 = 0.0033168
#   c − b: (0.04, 0.06, 0.08): t = 0.06·√3/0.02 = 5.19615, p = 1 − 5.19615/√29  = 0.0350987
#   d − c: (0.03, 0.05, 0.07): t = 0.05·√3/0.02 = 4.33013, p = 1 − 4.33013/√20.75 = 0.0494136
# All three intervals exclude 0 (t > t(0.975, 2) = 4.30265): three stars. Holm, m = 3:
#   0.0033 < 0.05/3 = 0.0167 keeps b; 0.0351 ≥ 0.05/2 = 0.025 stops: c and d lose their star.
# Holm-adjusted p: b 3 · 0.0033168 = 0.0099503; c max(that, 2 · 0.0350987) = 0.0701974;
# d max(0.0701974, 1 · 0.0494136) = 0.0701974.
STEPS = {"b": (0.09, 0.10, 0.11), "c": (0.04, 0.06, 0.08), "d": (0.03, 0.05, 0.07)}
P = {"b": 0.0033168, "c": 0.0350987, "d": 0.0494136}
ADJUSTED = {"b": 0.0099503, "c": 0.0701974, "d": 0.0701974}


def finals() -> dict[str, list[float]]:
    out = {"a": [0.20, 0.20, 0.20]}
    for parent, arm in (("a", "b"), ("b", "c"), ("c", "d")):
        out[arm] = [x + d for x, d in zip(out[parent], STEPS[arm], strict=True)]
    return out


def build(url: str) -> int:
    store = Store(url)
    arms = ["a", "b", "c", "d"]
    sweep_id = store.create_sweep(
        name="holm",
        preset="tiny",
        arms=arms,
        seeds=[0, 1, 2],
        base_config={},
        ladder=[{"arm": arm} for arm in arms],
    )
    for arm, scores in finals().items():
        for seed, final in enumerate(scores):
            run_id = new_attempt(store, sweep_id, arm, seed, config_hash=arm)
            with store.sink(run_id) as sink:
                for step, score in ((0, 0.2), (4, final)):
                    sink.log_evaluation(step, {"dataset": "aime", "k": 4, "avg_at_k": score})
            store.update_run(run_id, status="completed", steps=5)
    return sweep_id


@pytest.fixture
def sweep(tmp_path: Path) -> tuple[str, int]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    return url, build(url)


def test_p_value_from_the_interval_by_hand() -> None:
    # df = 2: p = 1 − t/√(t² + 2); df = 1 (Cauchy): p = 1 − (2/π)·atan(t)
    three = stats.paired({0: 0.24, 1: 0.26, 2: 0.28}, {0: 0.2, 1: 0.2, 2: 0.2})
    assert stats.p_value(three) == pytest.approx(1 - 5.19615 / math.sqrt(29), abs=1e-6)
    # diffs (0.10, 0.12): mean 0.11, se = 0.01, t = 11 -> p = 1 − (2/π)·atan(11) = 0.0577159
    two = stats.paired({0: 0.10, 1: 0.12}, {0: 0.0, 1: 0.0})
    assert stats.p_value(two) == pytest.approx(0.0577159, abs=1e-6)
    assert not two.excludes_zero  # p > 0.05 and the interval holds 0: the same verdict
    assert math.isnan(stats.p_value(stats.t_interval([0.1])))  # one seed: no test
    same = stats.paired({0: 0.2, 1: 0.2}, {0: 0.1, 1: 0.1})  # equal on every seed
    assert stats.p_value(same) == 0.0


def test_holm_by_hand() -> None:
    # m = 3 (the NaN is no test): 0.01 < 0.05/3 rejects; 0.03 ≥ 0.05/2 stops; 0.04 stays
    # although 0.04 < 0.05: step-down never passes a failure
    p = {"x": 0.04, "y": 0.01, "z": 0.03, "w": math.nan}
    assert stats.holm(p) == {"x": False, "y": True, "z": False, "w": False}
    adjusted = stats.holm_adjusted(p)
    assert adjusted["y"] == pytest.approx(0.03)  # 3 · 0.01
    assert adjusted["z"] == pytest.approx(0.06)  # 2 · 0.03
    assert adjusted["x"] == pytest.approx(0.06)  # max(0.06, 1 · 0.04)
    assert math.isnan(adjusted["w"])
    # one test: Holm is the unadjusted 5% test
    assert stats.holm({"only": 0.049}) == {"only": True}


def test_holm_stars_of_the_table(sweep: tuple[str, int]) -> None:
    url, sweep_id = sweep
    table = ablation.ablation_table(Store(url).engine, sweep_id)
    result = ablation.holm_stars(table)
    assert result.p == pytest.approx(P, abs=1e-6)
    assert result.adjusted == pytest.approx(ADJUSTED, abs=1e-6)
    assert result.starred == ("b", "c", "d")
    assert result.holm == ("b",)
    assert result.lost == ("c", "d")
    note = ablation.holm_note(result)
    assert note.startswith(
        "Holm over the 3 Δ parent interval(s) (family-wise 5%): 3 starred, 1 after Holm; "
        "star lost under Holm: c (p = 0.0351, Holm p = 0.0702), d (p = 0.0494, Holm p = 0.0702)"
    )


def test_cli_holm_in_each_format(
    sweep: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, sweep_id = sweep
    args = ["table", "--store", url, "--sweep", str(sweep_id), "--wide"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert "Holm" not in plain  # the default table is unchanged
    assert main([*args, "--holm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(plain.rstrip("\n"))  # the table as it was, the note under it
    assert "3 starred, 1 after Holm" in out and "star lost under Holm: c" in out
    assert main([*args, "--holm", "--format", "markdown"]) == 0
    assert "*Holm over the 3 Δ parent interval(s)" in capsys.readouterr().out
    assert main([*args, "--holm", "--format", "csv"]) == 0
    rows = {r["arm"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert rows["a"]["delta_parent_p"] == ""  # the base arm has no parent: no test
    assert float(rows["c"]["delta_parent_p"]) == pytest.approx(P["c"], abs=1e-6)
    assert float(rows["c"]["delta_parent_holm_p"]) == pytest.approx(ADJUSTED["c"], abs=1e-6)
    assert [rows[a]["delta_parent_holm_significant"] for a in "bcd"] == ["1", "0", "0"]
