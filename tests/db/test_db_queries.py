"""The read side (db.reads, db.ablation, db.mechanism_table, db.grids) on both backends,
against stores whose numbers are known by hand.

The "ladder" store is tests/dashboard_fixtures.py's (six arms × two seeds, one failed run, one
still running); the smaller stores below pin the attempt rules: scores from the latest
completed attempt, status from the latest attempt, final vs best evaluation.
"""

from __future__ import annotations

import csv
import io
import math
from types import SimpleNamespace
from typing import Any

import dashboard_fixtures as fx
import pandas as pd
import pytest
import sqlalchemy as sa
from conftest import BACKENDS
from store_runs import new_attempt

from db import ablation, grids, mechanisms, reads, stats
from db.errors import NotFound
from db.mechanism_table import MECHANISM_COLUMNS, mechanism_table
from db.models import SWEEPS
from db.store import Store


@pytest.fixture(scope="module", params=BACKENDS)
def ladder(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[fx.FixtureStore, sa.Engine]:
    """The dashboard's fixture store, built once per backend (these tests only read it)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('ladder') / 'store.db'}"
    else:
        url = request.getfixturevalue("pg_schemas")()
    built = fx.build_store(url)
    return built, Store(url).engine


def _bounds(estimate: stats.Estimate) -> tuple[float, float]:
    return estimate.low, estimate.high


def test_ablation_table_of_the_ladder_by_hand(ladder: tuple[fx.FixtureStore, sa.Engine]) -> None:
    built, engine = ladder
    table = ablation.ablation_table(engine, built.sweep_id)
    assert list(table.columns) == ablation.ABLATION_COLUMNS
    assert list(table["arm"]) == fx.ARMS  # ladder order
    assert list(table["adds"]) == [r["adds"] for r in fx.LADDER]
    assert list(table["paper_score"]) == [30.0, 36.0, 38.0, 41.0, 42.0, 50.0]
    assert list(table["parent"])[1:] == fx.ARMS[:-1]  # no explicit parents: the arm before
    by_arm = table.set_index("arm")
    # final avg@k per seed (the step-4 evaluation, not the step-2 one that is 0.1 lower)
    assert by_arm.loc["grpo", "seeds"] == [0, 1]
    assert by_arm.loc["grpo", "scores"] == pytest.approx([0.30, 0.34])
    assert by_arm.loc["grpo", "start_scores"] == pytest.approx([0.20, 0.22])
    assert by_arm.loc["soft_punish", "seeds"] == [0]  # seed 1 failed: no score
    assert by_arm.loc["dapo", "scores"] == pytest.approx([0.50])  # seed 1 still running
    # mean and 95% t-interval over seeds, t(0.975, 1) = 12.7062: grpo (0.30, 0.34) -> mean
    # 0.32, s / √2 = 0.02 -> ± 0.254124; token_loss (0.43, 0.46) -> 0.445 ± 12.7062 · 0.015
    assert by_arm.loc["grpo", "score_mean"] == pytest.approx(0.32)
    assert by_arm.loc["grpo", "score_std"] == pytest.approx(0.04 / math.sqrt(2))
    assert _bounds(by_arm.loc["grpo", "score"]) == pytest.approx((0.065876, 0.574124), abs=1e-6)
    assert _bounds(by_arm.loc["token_loss", "score"]) == pytest.approx(
        (0.254407, 0.635593), abs=1e-6
    )
    one = by_arm.loc["soft_punish", "score"]  # one seed: a mean, no interval
    assert (one.n, one.mean, one.has_interval) == (1, pytest.approx(0.44), False)
    # start: seed 0's model scores 0.20, seed 1's 0.22 -> 0.21 over both, 0.20 for seed 0 only
    assert list(table["start_mean"]) == pytest.approx([0.21, 0.21, 0.21, 0.20, 0.21, 0.20])
    # gain = final − start by seed: overlong_filter (0.16, 0.17) -> 0.165 ± 12.7062 · 0.005
    # = [0.101469, 0.228531], above 0; grpo (0.10, 0.12) -> 0.11 ± 0.127062 holds 0
    gain = by_arm.loc["overlong_filter", "gain"]
    assert gain.mean == pytest.approx(0.165) and gain.excludes_zero
    assert _bounds(gain) == pytest.approx((0.101469, 0.228531), abs=1e-6)
    assert _bounds(by_arm.loc["grpo", "gain"]) == pytest.approx((-0.017062, 0.237062), abs=1e-6)
    assert by_arm.loc["dapo", "gain"].mean == pytest.approx(0.30)
    # Δ parent, paired by seed: overlong_filter − grpo = (0.06, 0.05) -> 0.055 ± 0.063531;
    # clip_higher − overlong_filter = (0.04, 0.07) -> 0.055 ± 12.7062 · 0.015 = ± 0.190593;
    # soft_punish, token_loss and dapo share only seed 0 with their parent: n = 1
    parent = table["delta_parent"].tolist()
    assert parent[0].n == 0 and math.isnan(parent[0].mean)  # the baseline has no parent
    assert _bounds(parent[1]) == pytest.approx((-0.008531, 0.118531), abs=1e-6)
    assert _bounds(parent[2]) == pytest.approx((-0.135593, 0.245593), abs=1e-6)
    assert [(d.n, round(d.mean, 6)) for d in parent[3:]] == [(1, 0.04), (1, -0.01), (1, 0.07)]
    assert not any(d.has_interval for d in parent[3:])
    # Δ base (grpo): token_loss − grpo = (0.13, 0.12) -> 0.125 ± 0.063531 = [0.061469,
    # 0.188531], above 0, though the arms' own intervals overlap widely
    base = by_arm.loc["token_loss", "delta_base"]
    assert _bounds(base) == pytest.approx((0.061469, 0.188531), abs=1e-6) and base.excludes_zero
    assert _bounds(by_arm.loc["clip_higher", "delta_base"]) == pytest.approx(
        (-0.017062, 0.237062), abs=1e-6
    )
    assert by_arm.loc["dapo", "delta_base"].mean == pytest.approx(0.20)
    # one seed: the interval over the 50 eval problems (problem sampling only). dapo − token_loss
    # on seed 0: 100 vs 86 correct of 200 -> 14 problems differ by 1/4, 36 by 0; mean 0.07,
    # s² = (36 · 0.07² + 14 · 0.18²) / 49 = 0.012857, s / √50 = 0.016036,
    # t(0.975, 49) = 2.009575 -> 0.07 ± 0.032225 = [0.037775, 0.102225]
    problems = by_arm.loc["dapo", "delta_parent_problems"]
    assert problems.n == fx.EVAL_PROBLEMS and problems.method == stats.OVER_PROBLEMS
    assert _bounds(problems) == pytest.approx((0.037775, 0.102225), abs=1e-6)
    assert by_arm.loc["token_loss", "delta_base_problems"].n == 0  # two seeds: not needed
    # the best evaluation is the final one in this store
    assert list(table["best_mean"]) == pytest.approx(list(table["score_mean"]))
    assert list(table["n_seeds"]) == [2, 2, 2, 1, 2, 1]
    assert dict(zip(table["arm"], table["status"], strict=True)) == {
        "grpo": "completed",
        "overlong_filter": "completed",
        "clip_higher": "completed",
        "soft_punish": "failed",
        "token_loss": "completed",
        "dapo": "running",
    }
    # counters: mean over the completed runs behind the scores (tokens 1000 * 5 + 100 * seed,
    # wall 60 * 5 + seed); soft_punish's failed seed 1 (3 steps) and dapo's running one do not
    # count while another seed completed
    assert by_arm.loc["grpo", "steps"] == 5 and by_arm.loc["grpo", "grad_updates"] == 20
    assert by_arm.loc["grpo", "tokens"] == pytest.approx((5000 + 5100) / 2)
    assert by_arm.loc["grpo", "wall_s"] == pytest.approx((300 + 301) / 2)
    assert by_arm.loc["soft_punish", "steps"] == 5 and by_arm.loc["dapo", "tokens"] == 5000
    assert (table["eval_dataset"] == fx.EVAL_DATASET).all() and (table["eval_k"] == fx.EVAL_K).all()
    assert by_arm.loc["grpo", "run_ids"] == [built.run_ids[("grpo", 0)], built.run_ids[("grpo", 1)]]


def test_list_sweeps_progress_and_best_arm(ladder: tuple[fx.FixtureStore, sa.Engine]) -> None:
    built, engine = ladder
    sweeps = ablation.list_sweeps(engine)
    assert list(sweeps["sweep_id"]) == [built.other_sweep_id, built.sweep_id]  # newest first
    row = sweeps.set_index("sweep_id").loc[built.sweep_id]
    assert (row["name"], row["preset"], row["status"]) == ("ladder", "tiny", "running")
    assert (row["arms_total"], row["runs_done"]) == (12, 10)
    assert (row["runs_failed"], row["runs_running"]) == (1, 1)
    # dapo has the highest mean (0.50) but one seed: its lead over token_loss (0.445), +0.07 on
    # seed 0, has no interval, so no best arm is named
    lead = row["leader"]
    assert (lead.best, lead.runner_up, lead.lead.n, lead.significant) == (
        "dapo",
        "token_loss",
        1,
        False,
    )
    assert row["best_arm"] is None and math.isnan(row["best_score"])
    other = sweeps.set_index("sweep_id").loc[built.other_sweep_id]
    assert (other["arms_total"], other["runs_done"], other["best_arm"]) == (2, 2, None)
    assert isinstance(sweeps["created_at"].dtype, pd.DatetimeTZDtype)
    assert reads.latest_sweep_id(engine) == built.other_sweep_id


def test_runs_details_previous_arm_and_attempts(ladder: tuple[fx.FixtureStore, sa.Engine]) -> None:
    built, engine = ladder
    runs = reads.runs_of_sweep(engine, built.sweep_id)
    assert len(runs) == 12 and list(runs.columns) == reads.RUN_COLUMNS
    clip = built.run_ids[("clip_higher", 0)]
    details = reads.run_details(engine, clip)
    assert (details["arm"], details["seed"], details["attempt"]) == ("clip_higher", 0, 1)
    assert details["config"]["algo"]["clip_high"] == 0.28
    assert details["checkpoint_dir"] == f"/ckpt/sweep{built.sweep_id}/clip_higher/seed0"
    assert reads.previous_arm_run(engine, clip) == built.run_ids[("overlong_filter", 0)]
    assert reads.previous_arm_run(engine, built.run_ids[("grpo", 1)]) is None  # first arm
    # the arm before token_loss seed 1 is soft_punish seed 1, which failed: no completed run
    assert reads.previous_arm_run(engine, built.run_ids[("token_loss", 1)]) is None
    attempts = reads.arm_attempts(engine, built.sweep_id, "soft_punish")
    assert attempts[["seed", "attempt", "status"]].values.tolist() == [
        [0, 1, "completed"],
        [1, 1, "failed"],
    ]
    assert attempts["error"].iloc[1].endswith("CUDA out of memory")
    with pytest.raises(NotFound, match="no run with id 999999"):
        reads.run_details(engine, 999999)
    for call in (
        lambda: ablation.ablation_table(engine, 999999),
        lambda: reads.runs_of_sweep(engine, 999999),
        lambda: reads.arm_attempts(engine, 999999, "grpo"),
    ):
        with pytest.raises(NotFound, match="no sweep with id 999999"):
            call()


def test_curves_names_and_samples(ladder: tuple[fx.FixtureStore, sa.Engine]) -> None:
    built, engine = ladder
    a, b = built.run_ids[("grpo", 0)], built.run_ids[("clip_higher", 1)]
    names = reads.metric_names(engine, [a, b])
    assert names == sorted(fx.step_metrics(0, 0, 0))
    curves = reads.metric_curves(engine, [a, b], names=["acc/mean", "progress/tokens"])
    assert list(curves.columns) == reads.CURVE_COLUMNS
    assert len(curves) == 2 * 2 * fx.STEPS
    acc_b = curves[(curves["run_id"] == b) & (curves["name"] == "acc/mean")]
    assert list(acc_b["step"]) == list(range(fx.STEPS))
    # acc = 0.1 + 0.05 * arm_index + 0.1 * step + 0.01 * seed; clip_higher is arm 2, seed 1
    assert list(acc_b["value"]) == pytest.approx([0.21 + 0.1 * s for s in range(fx.STEPS)])
    assert set(acc_b["arm"]) == {"clip_higher"} and set(acc_b["seed"]) == {1}
    assert reads.metric_curves(engine, []).empty and reads.metric_names(engine, []) == []

    every = reads.samples(engine, a, limit=None)
    assert sorted(set(every["step"])) == [0, fx.STEPS - 1] and len(every) == 8
    wrong = reads.samples(engine, a, step=fx.STEPS - 1, correct=False)
    assert list(wrong["idx"]) == [1, 2]
    cut = reads.samples(engine, a, step=fx.STEPS - 1, truncated=True)
    assert cut[["reward", "score", "overlong_penalty"]].values.tolist() == [[-1.5, -1.0, -0.5]]
    assert cut["correct"].dtype == bool and cut["truncated"].dtype == bool
    assert len(reads.samples(engine, a, limit=3)) == 3


def test_evaluation_curves_start_at_step_zero(ladder: tuple[fx.FixtureStore, sa.Engine]) -> None:
    built, engine = ladder
    runs = [built.run_ids[("grpo", 0)], built.run_ids[("soft_punish", 1)]]
    curves = reads.evaluation_curves(engine, runs, fx.EVAL_DATASET, fx.EVAL_K)
    assert list(curves.columns) == reads.CURVE_COLUMNS
    assert set(curves["name"]) == {reads.EVAL_CURVE}
    # grpo seed 0: the start 0.20, mid-run 0.30 − 0.1 = 0.20, final 0.30; the failed
    # soft_punish seed 1 has only its start (0.22)
    assert curves[["seed", "step"]].values.tolist() == [[0, 0], [0, 2], [0, 4], [1, 0]]
    assert curves["value"].tolist() == pytest.approx([0.20, 0.20, 0.30, 0.22])
    assert reads.evaluation_curves(engine, runs, "nosuch", fx.EVAL_K).empty
    assert reads.evaluation_curves(engine, [], fx.EVAL_DATASET, fx.EVAL_K).empty


def _store_with(store_url: str, arms: list[str], ladder: list[dict[str, Any]]) -> tuple[Store, int]:
    store = Store(store_url)
    sweep_id = store.create_sweep(
        name="s", preset="tiny", arms=arms, seeds=[0], base_config={}, ladder=ladder
    )
    return store, sweep_id


def _attempt(
    store: Store, sweep_id: int, arm: str, status: str, evals: dict[int, float], seed: int = 0
) -> int:
    run_id = new_attempt(store, sweep_id, arm, seed, config_hash="h")
    with store.sink(run_id) as sink:
        for step, score in evals.items():
            sink.log_evaluation(step, {"dataset": "aime", "k": 4, "avg_at_k": score})
    if status != "running":
        store.update_run(run_id, status=status, steps=max(evals, default=0) + 1)
    return run_id


def test_scores_come_from_the_latest_completed_attempt(store_url: str) -> None:
    store, sweep_id = _store_with(store_url, ["a", "b", "c"], [{"arm": "a"}, {"arm": "b"}])
    # a: attempt 1 completed (0.2), attempt 2 failed after a mid-run eval -> 0.2, "failed"
    _attempt(store, sweep_id, "a", "completed", {9: 0.2})
    _attempt(store, sweep_id, "a", "failed", {4: 0.9})
    # b: attempt 1 completed (0.3), attempt 2 completed (0.4) -> 0.4
    _attempt(store, sweep_id, "b", "completed", {9: 0.3})
    _attempt(store, sweep_id, "b", "completed", {9: 0.4})
    # c: attempt 1 completed, final 0.5 but best 0.6; a rerun is running -> 0.5, "running"
    _attempt(store, sweep_id, "c", "completed", {3: 0.6, 9: 0.5})
    _attempt(store, sweep_id, "c", "running", {2: 0.99})
    table = ablation.ablation_table(store.engine, sweep_id).set_index("arm")
    assert list(table.index) == ["a", "b", "c"]  # c is not on the ladder: it comes last
    assert table["scores"].tolist() == [[0.2], [0.4], [0.5]]
    assert table["best_scores"].tolist() == [[0.2], [0.4], [0.6]]
    assert table["status"].tolist() == ["failed", "completed", "running"]
    # one seed each: b − a = 0.2, c − b = 0.1, with n = 1 and no interval
    assert [d.mean for d in table["delta_parent"]][1:] == pytest.approx([0.2, 0.1])
    assert [d.n for d in table["delta_parent"]][1:] == [1, 1]
    assert table.loc["c", "best_mean"] == pytest.approx(0.6)
    assert table.loc["a", "steps"] == 10  # the completed attempt's, not the failed rerun's 5


def test_arms_follow_the_ladder_not_the_sweeps_order(store_url: str) -> None:
    ladder = [{"arm": n, "adds": n.upper(), "paper_score": 10 * i} for i, n in enumerate("xyz")]
    store, sweep_id = _store_with(store_url, ["z", "x"], ladder)
    table = ablation.ablation_table(store.engine, sweep_id)
    assert list(table["arm"]) == ["x", "z"]  # only the sweep's arms, in ladder order
    assert list(table["adds"]) == ["X", "Z"] and list(table["paper_score"]) == [0.0, 20.0]
    assert list(table["status"]) == ["pending", "pending"]  # no runs yet
    assert table["score_mean"].isna().all() and (table["n_seeds"] == 0).all()


def test_the_evaluation_most_runs_have_scores_the_table(store_url: str) -> None:
    store, sweep_id = _store_with(store_url, ["a", "b"], [{"arm": "a"}, {"arm": "b"}])
    for arm, score in (("a", 0.1), ("b", 0.2)):
        run_id = new_attempt(store, sweep_id, arm, 0, config_hash="h")
        with store.sink(run_id) as sink:
            sink.log_evaluation(5, {"dataset": "aime", "k": 32, "avg_at_k": score})
            sink.log_evaluation(5, {"dataset": "math", "k": 4, "avg_at_k": score + 0.5})
            if arm == "a":  # only one run has this one
                sink.log_evaluation(5, {"dataset": "gsm", "k": 1, "avg_at_k": 0.9})
        store.update_run(run_id, status="completed")
    # aime@32 and math@4 tie on runs: the first by name wins
    table = ablation.ablation_table(store.engine, sweep_id)
    assert (table["eval_dataset"].iloc[0], table["eval_k"].iloc[0]) == ("aime", 32)
    assert list(table["score_mean"]) == pytest.approx([0.1, 0.2])
    chosen = ablation.ablation_table(store.engine, sweep_id, dataset="math")
    assert list(chosen["score_mean"]) == pytest.approx([0.6, 0.7])
    assert chosen["eval_k"].iloc[0] == 4
    # one asked for that the sweep does not have: say which there are (`dapo table` exits 2)
    have = "it has: aime avg@32, gsm avg@1, math avg@4"
    with pytest.raises(NotFound, match=f"no evaluation with dataset 'nope' k=3; {have}$"):
        ablation.ablation_table(store.engine, sweep_id, dataset="nope", k=3)
    with pytest.raises(NotFound, match=f"no evaluation with k=99; {have}$"):
        ablation.ablation_table(store.engine, sweep_id, k=99)
    with pytest.raises(NotFound, match="no evaluation with dataset 'gsm' k=4"):
        ablation.ablation_table(store.engine, sweep_id, dataset="gsm", k=4)
    assert ablation.ablation_table(store.engine, sweep_id, k=1)["eval_dataset"].iloc[0] == "gsm"


def test_an_empty_store(store_url: str) -> None:
    engine = Store(store_url).engine
    assert ablation.list_sweeps(engine).empty
    assert list(ablation.list_sweeps(engine).columns) == ablation.SWEEP_COLUMNS
    assert reads.latest_sweep_id(engine) is None


def test_an_arm_still_running_shows_its_progress(store_url: str) -> None:
    store, sweep_id = _store_with(store_url, ["a"], [{"arm": "a"}])
    run_id = _attempt(store, sweep_id, "a", "running", {})
    store.update_run(run_id, steps=7, tokens=700)
    row = ablation.ablation_table(store.engine, sweep_id).iloc[0]
    assert (row["status"], row["steps"], row["tokens"], row["n_seeds"]) == ("running", 7, 700, 0)
    assert math.isnan(row["score_mean"]) and row["run_ids"] == [run_id]


def _seeded(
    store: Store,
    sweep_id: int,
    arm: str,
    seed: int,
    evals: dict[int, float],
    *,
    n_problems: int | None = None,
    status: str = "completed",
) -> int:
    run_id = new_attempt(store, sweep_id, arm, seed, config_hash="h")
    with store.sink(run_id) as sink:
        for step, score in evals.items():
            result = {"dataset": "aime", "k": 4, "avg_at_k": score, "n_problems": n_problems}
            sink.log_evaluation(step, result)
    store.update_run(run_id, status=status, steps=max(evals, default=0))
    return run_id


def test_three_seeds_paired_delta_and_a_significant_leader(store_url: str) -> None:
    store = Store(store_url)
    ladder = [{"arm": "base"}, {"arm": "x"}, {"arm": "y"}]
    sweep_id = store.create_sweep(
        name="s", preset="tiny", arms=["base", "x", "y"], seeds=[0, 1, 2], base_config={},
        ladder=ladder,
    )  # fmt: skip
    finals = {
        "base": (0.40, 0.50, 0.60),
        "x": (0.43, 0.54, 0.65),  # beats base on every seed by 3, 4, 5 points
        "y": (0.10, 0.20, 0.30),
    }
    for arm, scores in finals.items():
        for seed, score in enumerate(scores):
            _seeded(store, sweep_id, arm, seed, {0: 0.30, 10: score})
    table = ablation.ablation_table(store.engine, sweep_id).set_index("arm")
    # base (0.40, 0.50, 0.60): mean 0.5, s = 0.1, s / √3 = 0.057735, t(0.975, 2) = 4.302653
    # -> 0.5 ± 0.248414; x: mean 0.54, s = 0.11 -> 0.54 ± 0.273255: the intervals overlap
    assert _bounds(table.loc["base", "score"]) == pytest.approx((0.251586, 0.748414), abs=1e-6)
    assert _bounds(table.loc["x", "score"]) == pytest.approx((0.266745, 0.813255), abs=1e-6)
    # paired x − base = (0.03, 0.04, 0.05): 0.04 ± 4.302653 · 0.01 / √3 = [0.015159, 0.064841]
    delta = table.loc["x", "delta_parent"]
    assert delta.keys == (0, 1, 2) and delta.excludes_zero
    assert _bounds(delta) == pytest.approx((0.015159, 0.064841), abs=1e-6)
    # gain of base over its start 0.30: (0.10, 0.20, 0.30) -> 0.2 ± 0.248414
    assert _bounds(table.loc["base", "gain"]) == pytest.approx((-0.048414, 0.448414), abs=1e-6)
    # x has the highest mean and its interval over base excludes 0, but over three seeds the
    # exact test's p is at least 2/8 = 0.25: no arm is named
    assert delta.p == pytest.approx(0.25) and not delta.significant
    sweeps = ablation.list_sweeps(store.engine).set_index("sweep_id")
    assert sweeps.loc[sweep_id, "best_arm"] is None
    # the same pattern over six seeds: x above base on every seed, p = 2/64: x is named
    six = store.create_sweep(
        name="s6", preset="tiny", arms=["base", "x", "y"], seeds=list(range(6)),
        base_config={}, ladder=ladder,
    )  # fmt: skip
    for arm, scores in finals.items():
        for seed, score in enumerate(scores + scores):
            _seeded(store, six, arm, seed, {0: 0.30, 10: score})
    sweeps = ablation.list_sweeps(store.engine).set_index("sweep_id")
    assert sweeps.loc[six, "best_arm"] == "x"
    assert sweeps.loc[six, "best_score"] == pytest.approx(0.54)
    assert sweeps.loc[six, "leader"].lead.p == pytest.approx(2 / 64)


def test_explicit_parents_and_ancestors_outside_the_sweep() -> None:
    ladder = [
        {"arm": "a"},
        {"arm": "b"},
        {"arm": "c", "parent": "a"},  # a branch off a, not the arm before it
        {"arm": "d", "parent": "b"},
    ]
    sweep = SimpleNamespace(ladder=ladder, arms=["a", "b", "c", "d"])
    assert reads.parents(sweep, ["a", "b", "c", "d"]) == {
        "a": None,
        "b": "a",
        "c": "a",
        "d": "b",
    }
    # a sweep of a, c and d: d's parent b is not run, so its own parent a stands in
    assert reads.parents(sweep, ["a", "c", "d"]) == {"a": None, "c": "a", "d": "a"}
    # an arm outside the ladder compares with the row above it
    assert reads.parents(sweep, ["a", "b", "z"])["z"] == "b"


def test_delta_parent_follows_the_explicit_parent(store_url: str) -> None:
    store = Store(store_url)
    ladder = [{"arm": "a"}, {"arm": "b"}, {"arm": "c", "parent": "a"}]
    sweep_id = store.create_sweep(
        name="s", preset="tiny", arms=["a", "b", "c"], seeds=[0], base_config={}, ladder=ladder
    )
    # The stored rungs carry `parent` once ladder files write it; set it here either way.
    with store.engine.begin() as conn:
        conn.execute(sa.update(SWEEPS).where(SWEEPS.c.id == sweep_id).values(ladder=ladder))
    for arm, score in (("a", 0.2), ("b", 0.5), ("c", 0.3)):
        _seeded(store, sweep_id, arm, 0, {5: score})
    table = ablation.ablation_table(store.engine, sweep_id).set_index("arm")
    assert table.loc["c", "parent"] == "a"
    assert table.loc["c", "delta_parent"].mean == pytest.approx(0.1)  # 0.3 − 0.2, not − 0.5
    run_c = int(table.loc["c", "run_ids"][0])
    assert reads.previous_arm_run(store.engine, run_c) == int(table.loc["a", "run_ids"][0])


def test_start_of_a_resumed_rerun_and_seeds_on_other_problems(store_url: str) -> None:
    store = Store(store_url)
    sweep_id = store.create_sweep(
        name="s", preset="tiny", arms=["a", "b"], seeds=[0, 1], base_config={},
        ladder=[{"arm": "a"}, {"arm": "b"}],
    )  # fmt: skip
    # a seed 0: attempt 1 failed after scoring its start (0.25); the rerun resumed from the
    # checkpoint (no step-0 evaluation) and finished at 0.45 -> gain 0.20 from attempt 1's start
    _seeded(store, sweep_id, "a", 0, {0: 0.25, 3: 0.3}, n_problems=30, status="failed")
    _seeded(store, sweep_id, "a", 0, {10: 0.45}, n_problems=30)
    _seeded(store, sweep_id, "a", 1, {0: 0.25, 10: 0.55}, n_problems=30)
    # b seed 0 on the same 30 problems; b seed 1 was evaluated on 40: not the same problems
    _seeded(store, sweep_id, "b", 0, {0: 0.25, 10: 0.50}, n_problems=30)
    _seeded(store, sweep_id, "b", 1, {0: 0.25, 10: 0.65}, n_problems=40)
    table = ablation.ablation_table(store.engine, sweep_id).set_index("arm")
    assert table.loc["a", "start_scores"] == pytest.approx([0.25, 0.25])
    # gain (0.20, 0.30): 0.25 ± 12.7062 · 0.05 = [-0.38531, 0.88531]
    assert _bounds(table.loc["a", "gain"]) == pytest.approx((-0.38531, 0.88531), abs=1e-5)
    delta = table.loc["b", "delta_parent"]
    assert (delta.keys, delta.mean) == ((0,), pytest.approx(0.05))  # seed 1 left unpaired


# --- mechanisms --------------------------------------------------------------------------------


def test_config_changes_and_the_metrics_they_are_about() -> None:
    parent = {"arm": "a", "algo": {"clip_high": 0.2, "loss_agg": "seq"}, "run": {"seed": 0}}
    child = {
        "arm": "b",
        "algo": {"clip_high": 0.28, "loss_agg": "seq", "new": 1},
        "run": {"seed": 0},
    }
    # the arm's own name is bookkeeping, not a change; a key only one side has is a change
    assert mechanisms.config_changes(child, parent, "b", "a") == ("algo.clip_high", "algo.new")
    assert mechanisms.config_changes(parent, parent, "a", "a") == ()
    # one technique per key; shared metrics named once, in the order the keys first name them
    assert mechanisms.focus_metrics(["algo.overlong_filter"]) == (
        "loss/truncated_share",
        "response_length/clip_ratio",
    )
    assert mechanisms.focus_metrics(["algo.clip_high"]) == ("clip_ratio/high", "entropy/mean")
    assert mechanisms.focus_metrics(["algo.overlong_penalty"]) == (
        "reward/overlong_penalty_mean",
        "response_length/clip_ratio",
    )
    assert mechanisms.focus_metrics(["algo.loss_agg"]) == ("loss/long_share",)
    assert mechanisms.focus_metrics(["algo.dynamic_sampling"]) == (
        "sampling/train_informative",
        "sampling/gen_batches",
    )
    assert mechanisms.focus_metrics(["algo.clip_high", "algo.clip_low"]) == (
        "clip_ratio/high",
        "entropy/mean",
        "clip_ratio/low",
    )
    assert mechanisms.focus_metrics(["optim.lr", "run.seed"]) == ()  # none known
    # a loss mode is about the tokens its variants select and the entropy they guard
    assert mechanisms.focus_metrics(["algo.loss_mode"])[0] == "loss/cov_selected_share"


def _mech(table: pd.DataFrame, arm: str, metric: str) -> dict[str, Any]:
    found = table[(table["arm"] == arm) & (table["metric"] == metric)]
    assert len(found) == 1, (arm, metric)
    return dict(found.iloc[0])


def test_mechanism_table_of_the_ladder_by_hand(ladder: tuple[fx.FixtureStore, sa.Engine]) -> None:
    """Windows of 2 of the fixture's 5 rollout steps: first = steps 0-1, last = steps 3-4;
    the formulas are tests/dashboard_fixtures.step_metrics'."""
    built, engine = ladder
    table = mechanism_table(engine, built.sweep_id, window=2)
    assert list(table.columns) == MECHANISM_COLUMNS
    assert list(table["arm"]) == [a for a in fx.ARMS for _ in mechanisms.DEFAULT_METRICS]
    assert (table["window"] == 2).all()
    # what each arm changes, from its runs' configs against its parent's, and what that is about
    changes = dict(zip(table["arm"], table["changes"], strict=False))
    assert changes == {
        "grpo": (),
        "overlong_filter": ("algo.overlong_filter",),
        "clip_higher": ("algo.clip_high",),
        "soft_punish": ("algo.overlong_penalty",),
        "token_loss": ("algo.loss_agg",),
        "dapo": ("algo.dynamic_sampling",),
    }
    focus = {a: set(table[(table["arm"] == a) & table["focus"]]["metric"]) for a in fx.ARMS}
    assert focus == {
        "grpo": set(),
        "overlong_filter": {"loss/truncated_share", "response_length/clip_ratio"},
        "clip_higher": {"clip_ratio/high", "entropy/mean"},
        "soft_punish": {"reward/overlong_penalty_mean", "response_length/clip_ratio"},
        "token_loss": {"loss/long_share"},
        "dapo": {"sampling/train_informative", "sampling/gen_batches"},
    }

    # truncated fraction 0.20 − 0.02·step + 0.01·seed for grpo: first (0.20 + 0.18) / 2 = 0.19
    # and 0.20; last (0.14 + 0.12) / 2 = 0.13 and 0.14 -> 0.135 ± 12.7062 · 0.005
    grpo = _mech(table, "grpo", "response_length/clip_ratio")
    assert grpo["seeds"] == [0, 1] and pd.isna(grpo["parent"])  # the base has no parent
    assert grpo["first_values"] == pytest.approx([0.19, 0.20])
    assert grpo["last_values"] == pytest.approx([0.13, 0.14])
    assert _bounds(grpo["last"]) == pytest.approx((0.071469, 0.198531), abs=1e-6)
    assert grpo["first"].mean == pytest.approx(0.195) and grpo["delta_parent"].n == 0
    # overlong filtering takes 0.05 off on both seeds: Δ (−0.05, −0.05), no spread, marked
    overlong = _mech(table, "overlong_filter", "response_length/clip_ratio")
    assert overlong["delta_parent"].mean == pytest.approx(-0.05)
    assert overlong["delta_parent"].excludes_zero and overlong["focus"]
    # ... and takes truncated responses out of the loss: their share (0.1 − 0.01·step +
    # 0.01·seed under grpo; last 0.065, 0.075) is 0 under the filter on every step
    dropped = _mech(table, "overlong_filter", "loss/truncated_share")
    assert dropped["last_values"] == [0.0, 0.0] and dropped["focus"]
    assert dropped["delta_parent"].mean == pytest.approx(-0.07)
    assert _bounds(dropped["delta_parent"]) == pytest.approx((-0.133531, -0.006469), abs=1e-6)
    # Clip-Higher: clip_ratio/high 0.014, 0.016 vs 0.002, 0.003 -> Δ (0.012, 0.013): 0.0125 ±
    # 12.7062 · 0.0005; entropy 1.35, 1.37 vs 1.15, 1.15 -> Δ (0.20, 0.22): 0.21 ± 0.127062
    clip = _mech(table, "clip_higher", "clip_ratio/high")
    assert clip["last_values"] == pytest.approx([0.014, 0.016])
    assert _bounds(clip["delta_parent"]) == pytest.approx((0.0061469, 0.0188531), abs=1e-7)
    entropy = _mech(table, "clip_higher", "entropy/mean")
    assert entropy["delta_parent"].keys == (0, 1)
    assert _bounds(entropy["delta_parent"]) == pytest.approx((0.082938, 0.337062), abs=1e-6)
    # soft punishment: seed 1 failed, so seed 0 alone: penalty −(0.1 + 0.01·step), first
    # −0.105, last −0.135, Δ to clip_higher (no penalty) −0.135 with n = 1: no interval
    penalty = _mech(table, "soft_punish", "reward/overlong_penalty_mean")
    assert penalty["seeds"] == [0]
    assert (penalty["first"].mean, penalty["last"].mean) == pytest.approx((-0.105, -0.135))
    assert (penalty["delta_parent"].n, penalty["delta_parent"].has_interval) == (1, False)
    assert penalty["delta_parent"].mean == pytest.approx(-0.135)
    # the token-level loss: long share 0.65, 0.66 vs sample-level 0.5; paired with
    # soft_punish on seed 0 only
    share = _mech(table, "token_loss", "loss/long_share")
    assert share["last"].mean == pytest.approx(0.655)
    assert (share["delta_parent"].keys, share["delta_parent"].mean) == ((0,), pytest.approx(0.15))
    # dynamic sampling: 1 + 0.5 + 0.1·step batches: first 1.55, last 1.85; seed 1 is running
    batches = _mech(table, "dapo", "sampling/gen_batches")
    assert batches["seeds"] == [0]
    assert (batches["first"].mean, batches["last"].mean) == pytest.approx((1.55, 1.85))
    assert batches["delta_parent"].mean == pytest.approx(0.85)

    # a window longer than the runs: first and last are both the mean over all 5 steps
    whole = mechanism_table(engine, built.sweep_id, ["response_length/clip_ratio"], window=10)
    row = _mech(whole, "grpo", "response_length/clip_ratio")
    assert row["first_values"] == pytest.approx([0.16, 0.17])
    assert row["last_values"] == pytest.approx([0.16, 0.17])
    with pytest.raises(ValueError, match="window must be at least 1"):
        mechanism_table(engine, built.sweep_id, window=0)
    with pytest.raises(NotFound, match="no sweep with id 999999"):
        mechanism_table(engine, 999999)


def test_a_metric_older_runs_did_not_log_reads_as_missing(
    ladder: tuple[fx.FixtureStore, sa.Engine],
) -> None:
    built, engine = ladder
    table = mechanism_table(engine, built.other_sweep_id, window=2)
    share = _mech(table, "overlong_filter", "loss/long_share")
    assert (share["seeds"], share["last"].n, share["delta_parent"].n) == ([], 0, 0)
    text = mechanisms.render(table, "text")
    line = next(x for x in text.splitlines() if "loss/long_share" in x)
    assert line.split()[-3:] == ["—", "—", "—"]


def test_mechanism_text_markdown_and_csv(ladder: tuple[fx.FixtureStore, sa.Engine]) -> None:
    built, engine = ladder
    table = mechanism_table(engine, built.sweep_id, window=2)
    text = mechanisms.render(table, "text", focus_only=True, wide=True)
    lines = text.splitlines()
    assert lines[0].startswith("per seed, the metric's mean over the first and the last 2")
    header = lines[2].split("  ")
    assert [h.strip() for h in header if h.strip()] == [
        "arm",
        "parent",
        "changes",
        "metric",
        "first 2",
        "last 2",
        "Δ parent, first 2",
        "Δ parent, last 2",
    ]
    # one-seed values are bare numbers; what that means is said once, under the rows
    assert lines[-1] == mechanisms.SINGLE_NOTE
    body = [" ".join(x.split()) for x in lines[4:-1]]
    # percent with three significant digits, Δ in points; the base arm changes nothing: no row.
    # Δ parent on the first 2 steps, then on the last 2: they part where the metric's gap to
    # the parent moves with the step (the truncated share, the penalty, generation batches)
    assert body == [
        "overlong_filter grpo algo.overlong_filter ◆ response_length/clip_ratio (%) "
        "14.5 [8.1, 20.9] 8.50 [2.15, 14.85] -5.00 [-5.00, -5.00] -5.00 [-5.00, -5.00]",
        # grpo's truncated share by seed: last 2 0.065, 0.075; first 2 0.095, 0.105 -> Δ −0.10
        # ± 12.7062 · 0.005; 0 under the filter
        "◆ loss/truncated_share (%) 0.00 [0.00, 0.00] 0.00 [0.00, 0.00] "
        "-10.0 [-16.4, -3.6] -7.00 [-13.35, -0.65]",
        "clip_higher overlong_filter algo.clip_high ◆ clip_ratio/high (%) "
        "1.50 [0.23, 2.77] 1.50 [0.23, 2.77] +1.25 [+0.61, +1.89] +1.25 [+0.61, +1.89]",
        "◆ entropy/mean 1.66 [1.53, 1.79] 1.36 [1.23, 1.49] +0.210 [+0.083, +0.337] "
        "+0.210 [+0.083, +0.337]",
        "soft_punish clip_higher algo.overlong_penalty ◆ response_length/clip_ratio (%) "
        "10.0 4.00 -4.00 "
        "-4.00",
        # the penalty −(0.1 + 0.01·step): first 2 steps −0.105 against the parent's 0
        "◆ reward/overlong_penalty_mean -0.105 -0.135 -0.105 -0.135",
        "token_loss soft_punish algo.loss_agg ◆ loss/long_share (%) "
        "65.5 [59.1, 71.9] 65.5 [59.1, 71.9] +15.0 +15.0",
        # the training batch is all informative under dynamic sampling (1.0) and as informative
        # as what was generated without it (token_loss seed 0: 0.5): +50 pp
        "dapo token_loss algo.dynamic_sampling ◆ sampling/train_informative (%) "
        "100 100 +50.0 "
        "+50.0",
        # 1 + (0.5 + 0.1·step) batches: first 2 steps 1.55 against the parent's 1
        "◆ sampling/gen_batches 1.55 1.85 +0.550 +0.850",
    ]
    full = mechanisms.render(table, "text", wide=True).splitlines()
    assert len(full) == 4 + len(fx.ARMS) * len(mechanisms.DEFAULT_METRICS) + 1  # + the note
    markdown = mechanisms.render(table, "markdown", focus_only=True)
    assert markdown.startswith(
        "| arm | parent | changes | metric | first 2 | last 2 | Δ parent, first 2 | Δ parent, last 2 |"
    )
    # two seeds: no Δ is a test the exact sign-flip test can pass (p >= 0.5), so no mark
    assert "| -5.00 [-5.00, -5.00] |" in markdown and "] \\* |" not in markdown
    rows = list(csv.DictReader(io.StringIO(mechanisms.render(table, "csv"))))
    assert len(rows) == len(table)
    clip = next(r for r in rows if r["arm"] == "clip_higher" and r["metric"] == "clip_ratio/high")
    assert (clip["focus"], clip["delta_parent_n"], clip["delta_parent_significant"]) == (
        "1",
        "2",
        "0",
    )
    assert float(clip["delta_parent_low"]) == pytest.approx(0.0061469, abs=1e-7)
    assert clip["changes"] == "algo.clip_high" and clip["window"] == "2"
    share = next(r for r in rows if r["metric"] == "loss/truncated_share" and r["parent"])
    assert share["arm"] == "overlong_filter" and share["delta_parent_first_significant"] == "0"
    assert float(share["delta_parent_first_mean"]) == pytest.approx(-0.10)
    assert float(share["delta_parent_first_low"]) == pytest.approx(-0.163531, abs=1e-6)


# --- grids: siblings of one base -----------------------------------------------------------------


def test_grid_fixture_is_what_the_grid_expansion_stores() -> None:
    from dapo_core.setup import ladders

    grid = ladders.expand_grid(
        "dapo", [("algo.clip_high", [0.24, 0.28, 0.32]), ("algo.clip_low", [0.16, 0.2])]
    )
    assert grid.rows() == fx.GRID_LADDER


def test_a_grid_sweep_compares_each_point_with_its_base(store_url: str) -> None:
    built = fx.build_grid_sweep(store_url)
    engine = Store(store_url).engine
    table = ablation.ablation_table(engine, built.sweep_id).set_index("arm")
    arms = list(fx.GRID_POINTS)
    assert list(table.index) == arms
    # every point's parent is the base, not the row above it
    assert pd.isna(table["parent"].iloc[0])
    assert table["parent"].tolist()[1:] == ["dapo"] * (len(arms) - 1)
    # clip_high 0.32 / clip_low 0.2 (0.42, 0.44, 0.46) − the base (0.45, 0.46, 0.47) =
    # (−0.03, −0.02, −0.01): −0.02 ± 4.302653 · 0.01 / √3 = [−0.044841, 0.004841], holds 0
    wide = table.loc["dapo-clip_high=0.32-clip_low=0.2", "delta_parent"]
    assert _bounds(wide) == pytest.approx((-0.044841, 0.004841), abs=1e-6)
    assert not wide.excludes_zero
    # clip_high 0.24 / clip_low 0.16: 0.10 below the base on every seed
    low = table.loc["dapo-clip_high=0.24-clip_low=0.16", "delta_parent"]
    assert low.mean == pytest.approx(-0.10) and low.excludes_zero
    # the base (0.45, 0.46, 0.47): 0.46 ± 0.024841
    assert _bounds(table.loc["dapo", "score"]) == pytest.approx((0.435159, 0.484841), abs=1e-6)

    assert grids.grid_keys(engine, built.sweep_id) == list(fx.GRID_KEYS)
    grid = grids.grid_table(engine, built.sweep_id, metric="clip_ratio/high", window=2)
    assert list(grid.columns) == grids.GRID_COLUMNS
    assert list(grid["arm"]) == arms
    assert grid["base"].tolist() == [True] + [False] * (len(arms) - 1)
    assert grid["point"].iloc[0] == {"algo.clip_high": 0.28, "algo.clip_low": 0.2}
    assert [e.mean for e in grid["score"]] == pytest.approx([0.46, 0.36, 0.40, 0.42, 0.40, 0.44])
    # clip_ratio/high (0.36 − ε_high) / 4 + 0.001·seed: the base (0.020, 0.021, 0.022) ->
    # 0.021 ± 4.302653 · 0.001 / √3 = [0.0185159, 0.0234841]
    assert _bounds(grid["metric"].iloc[0]) == pytest.approx((0.0185159, 0.0234841), abs=1e-7)
    assert [e.mean for e in grid["metric"]] == pytest.approx(
        [0.021, 0.031, 0.031, 0.021, 0.011, 0.011]
    )
    # what each point changes: the base its swept keys, a point the keys it moves off the base
    mech = mechanism_table(engine, built.sweep_id, ["clip_ratio/high"], window=2)
    assert dict(zip(mech["arm"], mech["changes"], strict=True)) == {
        "dapo": ("algo.clip_high", "algo.clip_low"),
        "dapo-clip_high=0.24-clip_low=0.16": ("algo.clip_high", "algo.clip_low"),
        "dapo-clip_high=0.24-clip_low=0.2": ("algo.clip_high",),
        "dapo-clip_high=0.28-clip_low=0.16": ("algo.clip_low",),
        "dapo-clip_high=0.32-clip_low=0.16": ("algo.clip_high", "algo.clip_low"),
        "dapo-clip_high=0.32-clip_low=0.2": ("algo.clip_high",),
    }
    # a sweep that is not a grid has no grid table
    store, plain = _store_with(store_url, ["a"], [{"arm": "a"}])
    assert grids.grid_keys(store.engine, plain) == []
    assert grids.grid_table(store.engine, plain).empty
