"""The read side (db.queries) on both backends, against stores whose numbers are known by hand.

The "ladder" store is tests/dashboard_fixtures.py's (six arms × two seeds, one failed run, one
still running); the smaller stores below pin the attempt rules: scores from the latest
completed attempt, status from the latest attempt, final vs best evaluation.
"""

from __future__ import annotations

import math
from typing import Any

import dashboard_fixtures as fx
import pandas as pd
import pytest
import sqlalchemy as sa
from conftest import BACKENDS

from db import queries
from db.errors import NotFound
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


def test_ablation_table_of_the_ladder_by_hand(ladder: tuple[fx.FixtureStore, sa.Engine]) -> None:
    built, engine = ladder
    table = queries.ablation_table(engine, built.sweep_id)
    assert list(table.columns) == queries.ABLATION_COLUMNS
    assert list(table["arm"]) == fx.ARMS  # ladder order
    assert list(table["adds"]) == [r["adds"] for r in fx.LADDER]
    assert list(table["paper_score"]) == [30.0, 36.0, 38.0, 41.0, 42.0, 50.0]
    by_arm = table.set_index("arm")
    # final avg@k per seed (the step-4 evaluation, not the step-2 one that is 0.1 lower)
    assert by_arm.loc["grpo", "seeds"] == [0, 1]
    assert by_arm.loc["grpo", "scores"] == pytest.approx([0.30, 0.34])
    assert by_arm.loc["soft_punish", "seeds"] == [0]  # seed 1 failed: no score
    assert by_arm.loc["dapo", "scores"] == pytest.approx([0.50])  # seed 1 still running
    # mean and sample std: grpo (0.30, 0.34) -> 0.32 ± |0.30-0.34|/√2 = 0.028284
    assert by_arm.loc["grpo", "score_mean"] == pytest.approx(0.32)
    assert by_arm.loc["grpo", "score_std"] == pytest.approx(0.04 / math.sqrt(2))
    assert by_arm.loc["clip_higher", "score_std"] == pytest.approx(0.06 / math.sqrt(2))
    assert math.isnan(by_arm.loc["soft_punish", "score_std"])  # one seed: no spread
    # means 0.32, 0.37, 0.43, 0.44, 0.42, 0.50 -> Δ prev: -, .05, .06, .01, -.02, .08
    assert list(table["delta_prev"])[1:] == pytest.approx([0.05, 0.06, 0.01, -0.02, 0.08])
    assert math.isnan(table["delta_prev"].iloc[0])
    # Δ base (grpo 0.32): 0, .05, .11, .12, .10, .18
    assert list(table["delta_base"]) == pytest.approx([0.0, 0.05, 0.11, 0.12, 0.10, 0.18])
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
    sweeps = queries.list_sweeps(engine)
    assert list(sweeps["sweep_id"]) == [built.other_sweep_id, built.sweep_id]  # newest first
    row = sweeps.set_index("sweep_id").loc[built.sweep_id]
    assert (row["name"], row["preset"], row["status"]) == ("ladder", "tiny", "running")
    assert (row["arms_total"], row["runs_done"]) == (12, 10)
    assert (row["runs_failed"], row["runs_running"]) == (1, 1)
    assert row["best_arm"] == "dapo" and row["best_score"] == pytest.approx(0.50)
    other = sweeps.set_index("sweep_id").loc[built.other_sweep_id]
    assert (other["arms_total"], other["runs_done"], other["best_arm"]) == (2, 2, "overlong_filter")
    assert isinstance(sweeps["created_at"].dtype, pd.DatetimeTZDtype)
    assert queries.latest_sweep_id(engine) == built.other_sweep_id


def test_runs_details_previous_arm_and_attempts(ladder: tuple[fx.FixtureStore, sa.Engine]) -> None:
    built, engine = ladder
    runs = queries.runs_of_sweep(engine, built.sweep_id)
    assert len(runs) == 12 and list(runs.columns) == queries.RUN_COLUMNS
    clip = built.run_ids[("clip_higher", 0)]
    details = queries.run_details(engine, clip)
    assert (details["arm"], details["seed"], details["attempt"]) == ("clip_higher", 0, 1)
    assert details["config"]["algorithm"]["clip_high"] == 0.28
    assert details["checkpoint_dir"] == f"/ckpt/sweep{built.sweep_id}/clip_higher/seed0"
    assert queries.previous_arm_run(engine, clip) == built.run_ids[("overlong_filter", 0)]
    assert queries.previous_arm_run(engine, built.run_ids[("grpo", 1)]) is None  # first arm
    # the arm before token_loss seed 1 is soft_punish seed 1, which failed: no completed run
    assert queries.previous_arm_run(engine, built.run_ids[("token_loss", 1)]) is None
    attempts = queries.arm_attempts(engine, built.sweep_id, "soft_punish")
    assert attempts[["seed", "attempt", "status"]].values.tolist() == [
        [0, 1, "completed"],
        [1, 1, "failed"],
    ]
    assert attempts["error"].iloc[1].endswith("CUDA out of memory")
    with pytest.raises(NotFound, match="no run with id 999999"):
        queries.run_details(engine, 999999)
    for call in (
        lambda: queries.ablation_table(engine, 999999),
        lambda: queries.runs_of_sweep(engine, 999999),
        lambda: queries.arm_attempts(engine, 999999, "grpo"),
    ):
        with pytest.raises(NotFound, match="no sweep with id 999999"):
            call()


def test_curves_names_and_samples(ladder: tuple[fx.FixtureStore, sa.Engine]) -> None:
    built, engine = ladder
    a, b = built.run_ids[("grpo", 0)], built.run_ids[("clip_higher", 1)]
    names = queries.metric_names(engine, [a, b])
    assert names == sorted(fx.step_metrics(0, 0, 0))
    curves = queries.metric_curves(engine, [a, b], names=["acc/mean", "progress/tokens"])
    assert list(curves.columns) == queries.CURVE_COLUMNS
    assert len(curves) == 2 * 2 * fx.STEPS
    acc_b = curves[(curves["run_id"] == b) & (curves["name"] == "acc/mean")]
    assert list(acc_b["step"]) == list(range(fx.STEPS))
    # acc = 0.1 + 0.05 * arm_index + 0.1 * step + 0.01 * seed; clip_higher is arm 2, seed 1
    assert list(acc_b["value"]) == pytest.approx([0.21 + 0.1 * s for s in range(fx.STEPS)])
    assert set(acc_b["arm"]) == {"clip_higher"} and set(acc_b["seed"]) == {1}
    assert queries.metric_curves(engine, []).empty and queries.metric_names(engine, []) == []

    every = queries.samples(engine, a, limit=None)
    assert sorted(set(every["step"])) == [0, fx.STEPS - 1] and len(every) == 8
    wrong = queries.samples(engine, a, step=fx.STEPS - 1, correct=False)
    assert list(wrong["idx"]) == [1, 2]
    cut = queries.samples(engine, a, step=fx.STEPS - 1, truncated=True)
    assert cut[["reward", "score", "overlong_penalty"]].values.tolist() == [[-1.5, -1.0, -0.5]]
    assert cut["correct"].dtype == bool and cut["truncated"].dtype == bool
    assert len(queries.samples(engine, a, limit=3)) == 3


def _store_with(store_url: str, arms: list[str], ladder: list[dict[str, Any]]) -> tuple[Store, int]:
    store = Store(store_url)
    sweep_id = store.create_sweep(
        name="s", preset="tiny", arms=arms, seeds=[0], base_config={}, ladder=ladder
    )
    return store, sweep_id


def _attempt(
    store: Store, sweep_id: int, arm: str, status: str, evals: dict[int, float], seed: int = 0
) -> int:
    run_id = store.start_run(
        sweep_id=sweep_id, arm=arm, seed=seed, config={}, config_hash="h", host="h"
    )
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
    table = queries.ablation_table(store.engine, sweep_id).set_index("arm")
    assert list(table.index) == ["a", "b", "c"]  # c is not on the ladder: it comes last
    assert table["scores"].tolist() == [[0.2], [0.4], [0.5]]
    assert table["best_scores"].tolist() == [[0.2], [0.4], [0.6]]
    assert table["status"].tolist() == ["failed", "completed", "running"]
    assert table["delta_prev"].tolist()[1:] == pytest.approx([0.2, 0.1])
    assert table.loc["c", "best_mean"] == pytest.approx(0.6)
    assert table.loc["a", "steps"] == 10  # the completed attempt's, not the failed rerun's 5


def test_arms_follow_the_ladder_not_the_sweeps_order(store_url: str) -> None:
    ladder = [{"arm": n, "adds": n.upper(), "paper_score": 10 * i} for i, n in enumerate("xyz")]
    store, sweep_id = _store_with(store_url, ["z", "x"], ladder)
    table = queries.ablation_table(store.engine, sweep_id)
    assert list(table["arm"]) == ["x", "z"]  # only the sweep's arms, in ladder order
    assert list(table["adds"]) == ["X", "Z"] and list(table["paper_score"]) == [0.0, 20.0]
    assert list(table["status"]) == ["pending", "pending"]  # no runs yet
    assert table["score_mean"].isna().all() and (table["n_seeds"] == 0).all()


def test_the_evaluation_most_runs_have_scores_the_table(store_url: str) -> None:
    store, sweep_id = _store_with(store_url, ["a", "b"], [{"arm": "a"}, {"arm": "b"}])
    for arm, score in (("a", 0.1), ("b", 0.2)):
        run_id = store.start_run(
            sweep_id=sweep_id, arm=arm, seed=0, config={}, config_hash="h", host="h"
        )
        with store.sink(run_id) as sink:
            sink.log_evaluation(5, {"dataset": "aime", "k": 32, "avg_at_k": score})
            sink.log_evaluation(5, {"dataset": "math", "k": 4, "avg_at_k": score + 0.5})
            if arm == "a":  # only one run has this one
                sink.log_evaluation(5, {"dataset": "gsm", "k": 1, "avg_at_k": 0.9})
        store.update_run(run_id, status="completed")
    # aime@32 and math@4 tie on runs: the first by name wins
    table = queries.ablation_table(store.engine, sweep_id)
    assert (table["eval_dataset"].iloc[0], table["eval_k"].iloc[0]) == ("aime", 32)
    assert list(table["score_mean"]) == pytest.approx([0.1, 0.2])
    chosen = queries.ablation_table(store.engine, sweep_id, dataset="math")
    assert list(chosen["score_mean"]) == pytest.approx([0.6, 0.7])
    assert chosen["eval_k"].iloc[0] == 4
    none = queries.ablation_table(store.engine, sweep_id, dataset="nope", k=3)
    assert none["score_mean"].isna().all()


def test_an_empty_store(store_url: str) -> None:
    engine = Store(store_url).engine
    assert queries.list_sweeps(engine).empty
    assert list(queries.list_sweeps(engine).columns) == queries.SWEEP_COLUMNS
    assert queries.latest_sweep_id(engine) is None


def test_an_arm_still_running_shows_its_progress(store_url: str) -> None:
    store, sweep_id = _store_with(store_url, ["a"], [{"arm": "a"}])
    run_id = _attempt(store, sweep_id, "a", "running", {})
    store.update_run(run_id, steps=7, tokens=700)
    row = queries.ablation_table(store.engine, sweep_id).iloc[0]
    assert (row["status"], row["steps"], row["tokens"], row["n_seeds"]) == ("running", 7, 700, 0)
    assert math.isnan(row["score_mean"]) and row["run_ids"] == [run_id]
