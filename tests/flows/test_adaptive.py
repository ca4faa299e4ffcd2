"""`dapo sweep --until-decided` (flows/adaptive.py): the rounds, the looks, what runs next, a
resume that keeps its spent looks, the time budget, and the table's decisions; on a real store,
with the arms' training replaced by runs written straight into it (what the round's arm runs
would store), so that each scenario's scores, and so its decisions, are known by hand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from store_runs import new_attempt

from db import ablation, looks, table_format
from db.report import extras
from db.store import Store
from flows import adaptive, plan
from flows.params import SweepParams, validate

Score = Callable[[str, int], float]


def params(**plan_: Any) -> SweepParams:
    fields = {"preset": "tiny", "arms": ["grpo", "dapo"], "seeds": [0]}
    return validate(SweepParams, {**fields, "adaptive": {"until_decided": True, **plan_}})


def test_rounds_fill_the_first_to_six_seeds_then_add_per_round() -> None:
    assert adaptive.rounds(params(max_seeds=10)) == [[0, 1, 2, 3, 4, 5], [6, 7], [8, 9]]
    # the sweep's own seeds first, then the next unused ones
    odd = validate(
        SweepParams,
        {"preset": "tiny", "arms": ["grpo", "dapo"], "seeds": [3, 7], "adaptive": {
            "until_decided": True, "max_seeds": 9, "seeds_per_round": 2}},
    )  # fmt: skip
    assert adaptive.rounds(odd) == [[3, 7, 0, 1, 2, 4], [5, 6], [8]]
    d = adaptive.design_of(params(max_seeds=10))
    assert d.looks == (6, 8, 10) and d.spending == "obrien-fleming"


def test_planned_pairs_default_to_parents_and_last_against_first() -> None:
    assert adaptive.planned_pairs(params()) == [("dapo", "grpo")]
    ladder = validate(SweepParams, {"preset": "tiny", "adaptive": {"until_decided": True}})
    pairs = adaptive.planned_pairs(ladder)
    assert pairs[0] == ("overlong_filter", "grpo") and pairs[-1] == ("dapo", "grpo")
    assert ("dapo", "token_loss") in pairs and len(pairs) == 6
    assert adaptive.planned_pairs(params(compare=["grpo:dapo"])) == [("grpo", "dapo")]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"compare": ["dapo:nope"]}, "no arm 'nope'"),
        ({"compare": ["dapo"]}, "write two different arms as A:B"),
        ({"max_seeds": 5}, "greater than or equal to 6"),
    ],
)
def test_bad_plans_are_one_line(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        params(**fields)


def test_one_arm_cannot_be_compared() -> None:
    with pytest.raises(ValueError, match="at least two arms"):
        validate(
            SweepParams,
            {"preset": "tiny", "arms": ["grpo"], "adaptive": {"until_decided": True}},
        )


class Runner:
    """Runs a round's jobs by writing each (arm, seed) as a completed run whose final score is
    score(arm, seed) (step 0 scores 0.2): what the arm's flow run stores, without training. A
    completed (arm, seed) is skipped, as the arm flow skips it. `fail_at`: the round whose
    runs raise (a killed sweep)."""

    def __init__(self, store: Store, sweep_id: int, score: Score, fail_at: int | None = None):
        self.store, self.sweep_id, self.score, self.fail_at = store, sweep_id, score, fail_at
        self.rounds: list[tuple[list[int], list[str]]] = []

    def __call__(self, sweep_id: int, number: int, seeds: list[int], arms: list[str]) -> Any:
        self.rounds.append((seeds, arms))
        if number == self.fail_at:
            raise KeyboardInterrupt("the sweep's process was stopped")
        out = []
        for arm in arms:
            for seed in seeds:
                latest = self.store.latest_attempt(sweep_id, arm, seed)
                if latest is not None and latest["status"] == "completed":
                    out.append({"label": f"{arm} s{seed}", "status": "skipped"})
                    continue
                write(self.store, sweep_id, arm, seed, self.score(arm, seed))
                out.append({"label": f"{arm} s{seed}", "status": "completed"})
        return out


def write(store: Store, sweep_id: int, arm: str, seed: int, final: float) -> None:
    run_id = new_attempt(store, sweep_id, arm, seed, config_hash=arm)
    with store.sink(run_id) as sink:
        for step, score in ((0, 0.2), (10, final)):
            sink.log_evaluation(step, {"dataset": "held-out", "k": 4, "avg_at_k": score})
    store.update_run(run_id, status="completed", steps=10)


def sweep(tmp_path: Path, p: SweepParams) -> tuple[Store, int]:
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    sweep_id = store.create_sweep(
        name="adaptive",
        preset=p.preset,
        arms=p.arms,
        seeds=p.seeds,
        base_config={},
        ladder=p.parsed_ladder.rows(),
        params=p.model_dump(),
    )
    return store, sweep_id


def not_run(jobs: list[plan.ArmJob]) -> list[dict[str, Any]]:
    raise AssertionError("the rounds go through the round runner")


def lead(by: float) -> Score:
    # dapo above grpo by `by` on every seed (plus a little that differs by seed)
    return lambda arm, seed: 0.40 + (by + 0.001 * (seed % 3) if arm == "dapo" else 0.0)


def test_a_consistent_lead_is_decided_at_the_second_look(tmp_path: Path) -> None:
    p = params(max_seeds=10)
    store, sweep_id = sweep(tmp_path, p)
    runner = Runner(store, sweep_id, lead(0.05))
    adaptive.run_rounds(p, store, sweep_id, not_run, round_flow=runner)
    # looks at 6, 8, 10: the first tests nothing (2/64 > O'Brien-Fleming's 0.0014: it spends
    # nothing), the second reaches p = 2/256 = 0.0078 <= its level: decided, no third round
    stored = looks.of_sweep(store.engine, sweep_id)["dapo:grpo"]
    assert [(s.n, s.decision) for s in stored] == [(6, "continue"), (8, "real")]
    assert stored[1].p == pytest.approx(2 / 256)
    assert runner.rounds == [([0, 1, 2, 3, 4, 5], ["grpo", "dapo"]), ([6, 7], ["grpo", "dapo"])]
    assert store.get_sweep(sweep_id)["seeds"] == list(range(8))  # widened by its rounds
    # the table says so, with the Δ over the deciding look's seeds
    table = ablation.ablation_table(store.engine, sweep_id)
    text = table_format.render(table, "text", wide=True, **extras(store.engine, sweep_id, table))
    assert "decided at n = 8: +5.1 [+5.0, +5.2]" in text
    assert table.set_index("arm").loc["dapo", "status"] == "completed"


def test_no_difference_stops_for_futility_after_the_first_round(tmp_path: Path) -> None:
    p = params(max_seeds=16)
    store, sweep_id = sweep(tmp_path, p)
    # dapo − grpo = +0.01, −0.01, ... : mean 0, p = 1 at six seeds: futile at once
    runner = Runner(
        store, sweep_id, lambda arm, s: 0.4 + (0.01 * (-1) ** s if arm == "dapo" else 0)
    )
    adaptive.run_rounds(p, store, sweep_id, not_run, round_flow=runner)
    stored = looks.of_sweep(store.engine, sweep_id)["dapo:grpo"]
    assert [(s.n, s.decision) for s in stored] == [(6, "futile")]
    assert stored[0].conditional_power < 0.1 and len(runner.rounds) == 1
    table = ablation.ablation_table(store.engine, sweep_id)
    out = table_format.render(table, "text", wide=True, **extras(store.engine, sweep_id, table))
    assert "futile at n = 6" in out


def test_a_killed_sweep_resumes_at_its_round_and_keeps_its_spent_looks(tmp_path: Path) -> None:
    p = params(max_seeds=12)
    store, sweep_id = sweep(tmp_path, p)
    weak = lambda arm, s: 0.4 + (0.02 * (s % 2) if arm == "dapo" else 0.0)  # noqa: E731
    with pytest.raises(KeyboardInterrupt):
        adaptive.run_rounds(
            p, store, sweep_id, not_run, round_flow=Runner(store, sweep_id, weak, 2)
        )
    first = looks.of_sweep(store.engine, sweep_id)["dapo:grpo"]
    assert [(s.n, s.decision) for s in first] == [(6, "continue")]
    # Meanwhile dapo's seed 0 is rerun and now scores far above: the spent look keeps what it
    # saw (mean 0.01 over its six seeds), and the resumed sweep skips round 1's runs.
    write(store, sweep_id, "dapo", 0, 0.9)
    again = Runner(store, sweep_id, weak)
    adaptive.run_rounds(p, store, sweep_id, not_run, round_flow=again)
    stored = looks.of_sweep(store.engine, sweep_id)["dapo:grpo"]
    assert stored[0] == first[0] and stored[0].mean == pytest.approx(0.01)
    assert again.rounds[0] == ([0, 1, 2, 3, 4, 5], ["grpo", "dapo"])  # replayed, all skipped
    assert [s.n for s in stored][:2] == [6, 8] and stored[1].seeds == tuple(range(8))


def test_the_time_budget_starts_no_round_it_would_pass(tmp_path: Path) -> None:
    p = params(max_seeds=12, budget_minutes=1e-9)
    store, sweep_id = sweep(tmp_path, p)
    runner = Runner(store, sweep_id, lambda arm, s: 0.4 + (0.02 * (s % 2) if arm == "dapo" else 0))
    adaptive.run_rounds(p, store, sweep_id, not_run, round_flow=runner)
    assert len(runner.rounds) == 1  # round 2 would pass the budget: not started
    stored = looks.of_sweep(store.engine, sweep_id)["dapo:grpo"]
    assert [s.decision for s in stored] == ["continue"]
    table = ablation.ablation_table(store.engine, sweep_id)
    store.set_sweep_status(sweep_id, "completed")
    out = table_format.render(table, "text", wide=True, **extras(store.engine, sweep_id, table))
    assert "undecided at n = 6 (stopped)" in out


def test_a_round_with_a_failed_run_fails_the_sweep_before_looking(tmp_path: Path) -> None:
    p = params(max_seeds=8)
    store, sweep_id = sweep(tmp_path, p)

    def failing(sweep_id: int, number: int, seeds: list[int], arms: list[str]) -> Any:
        return [{"label": "dapo s3", "status": "failed", "error": "out of memory"}]

    with pytest.raises(RuntimeError, match="round 1: 1 of 1 arm runs failed: dapo s3"):
        adaptive.run_rounds(p, store, sweep_id, not_run, round_flow=failing)
    assert looks.of_sweep(store.engine, sweep_id) == {}
