"""`dapo aa`, the A/A noise floor (db.aa), pinned by hand.

Four seeds scored 0.1, 0.2, 0.3, 0.6 split three ways (the first seed always in half A):
  {0.1, 0.2} | {0.3, 0.6}: 0.15 − 0.45 = −0.30
  {0.1, 0.3} | {0.2, 0.6}: 0.20 − 0.40 = −0.20
  {0.1, 0.6} | {0.2, 0.3}: 0.35 − 0.25 = +0.10
so |differences| are 0.1, 0.2, 0.3 and the 95th percentile by nearest rank (the ceil(2.85) = 3rd)
is 0.3. The fixed split pairs (0.1, 0.3) and (0.2, 0.6): differences −0.2, −0.4, mean −0.3,
sd √0.02 = 0.141421, t(0.975, 1) = 12.7062, half-width 12.7062 · 0.141421 / √2 = 1.27062.
"""

from __future__ import annotations

import math
from itertools import combinations
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_runs import new_attempt

from dapo_lab.cli import main
from db import aa
from db.store import Store

FOUR = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.6}


def test_split_differences_by_hand() -> None:
    diffs = aa.split_differences([0.1, 0.2, 0.3, 0.6])
    assert sorted(round(d, 10) for d in diffs) == [-0.3, -0.2, 0.1]
    assert aa.nearest_rank([abs(d) for d in diffs], 0.95) == pytest.approx(0.3)
    assert aa.nearest_rank([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0  # ceil(2) = the 2nd


def test_aa_from_scores_by_hand() -> None:
    check = aa.aa_from_scores(1, "grpo", "arith-eval avg@4", FOUR)
    assert (check.half_a, check.half_b, check.left_out) == ((0, 1), (2, 3), ())
    assert check.mean_a == pytest.approx(0.15) and check.mean_b == pytest.approx(0.45)
    assert check.delta.n == 2 and check.delta.mean == pytest.approx(-0.3)
    assert check.delta.low == pytest.approx(-0.3 - 1.27062, abs=1e-5)
    assert check.delta.high == pytest.approx(-0.3 + 1.27062, abs=1e-5)
    assert not check.delta.excludes_zero
    assert (check.splits, check.sampled) == (3, False)
    assert check.floor == pytest.approx(0.3) and check.largest == pytest.approx(0.3)


def test_an_odd_seed_is_left_out_and_too_few_seeds_is_one_clear_error() -> None:
    check = aa.aa_from_scores(1, "a", "e avg@1", {**FOUR, 9: 0.9})
    assert check.left_out == (9,) and check.half_b == (2, 3)
    with pytest.raises(ValueError, match="needs at least 4"):
        aa.aa_from_scores(1, "a", "e avg@1", {0: 0.1, 1: 0.2, 2: 0.3})


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=12).filter(lambda xs: len(xs) % 2 == 0))
def test_every_split_once_and_its_difference(scores: list[float]) -> None:
    m, n = len(scores), len(scores) // 2
    diffs = aa.split_differences(scores)
    assert len(diffs) == math.comb(m, n) // 2  # each split once, not again as its mirror
    # each one the difference of a real split's means (brute force over the halves with 0 in A)
    expected = sorted(
        sum(scores[i] for i in a) / n - sum(scores[i] for i in range(m) if i not in a) / n
        for a in combinations(range(m), n)
        if 0 in a
    )
    assert sorted(diffs) == pytest.approx(expected, abs=1e-9)


def test_many_seeds_are_sampled_reproducibly() -> None:
    scores = [i / 20 for i in range(20)]
    diffs = aa.split_differences(scores)
    assert len(diffs) == aa.SAMPLED_SPLITS and diffs == aa.split_differences(scores)
    assert max(abs(d) for d in diffs) <= 0.5 + 1e-9  # the extreme split: top half vs bottom


def build(url: str, arms: dict[str, list[float]]) -> int:
    """A sweep whose arms have these final scores on seeds 0, 1, ...; step 0 scores 0.1."""
    store = Store(url)
    seeds = list(range(max(len(v) for v in arms.values())))
    sweep_id = store.create_sweep(
        name="aa",
        preset="tiny",
        arms=list(arms),
        seeds=seeds,
        base_config={},
        ladder=[{"arm": arm} for arm in arms],
    )
    for arm, finals in arms.items():
        for seed, final in enumerate(finals):
            run_id = new_attempt(store, sweep_id, arm, seed, config_hash=arm)
            with store.sink(run_id) as sink:
                for step, score in ((0, 0.1), (4, final)):
                    sink.log_evaluation(step, {"dataset": "arith", "k": 4, "avg_at_k": score})
            store.update_run(run_id, status="completed", steps=5)
    return sweep_id


def test_dapo_aa_prints_the_check_of_the_sweeps_one_arm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    sweep_id = build(url, {"grpo": list(FOUR.values())})
    assert main(["aa", "--store", url]) == 0
    out = capsys.readouterr().out
    assert f"arm 'grpo', sweep {sweep_id}, on arith avg@4" in out
    assert "half A (seeds 0 1): 15.0%" in out and "half B (seeds 2 3): 45.0%" in out
    assert "Δ A − B: -30.0 points [-157.1, +97.1]" in out and "not starred" in out
    assert "all 3 ways" in out and "up to 30.0 points" in out


def test_dapo_aa_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    build(url, {"a": [0.1, 0.2, 0.3, 0.4], "b": [0.2, 0.3, 0.4, 0.5]})
    for argv, says in (
        (["aa", "--store", url], "name the arm to check with --arm (a (4 seeds), b (4 seeds)"),
        (["aa", "--store", url, "--arm", "nosuch"], "has no arm 'nosuch': it has a, b"),
        (["aa", "--store", url, "--sweep", "99"], "99"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    assert main(["aa", "--store", url, "--arm", "b"]) == 0
    assert "half A (seeds 0 1): 25.0%" in capsys.readouterr().out
