"""Two small stores of the ablation table's tests, numbers by hand, shared by `dapo table`'s
tests (tests/db/test_table_holm.py, test_table_efficiency.py) and the ablation page's
(tests/dashboard/test_dashboard_holm.py): Holm's three stars (build_holm) and sample efficiency
to a threshold with a censored seed (build_threshold).
"""

from __future__ import annotations

from store_runs import new_attempt

from dapo_common import metric_names as M
from db.store import Store

# A ladder a → b → c → d over seeds 0..6; each arm's final score is its parent's plus a per-seed
# step, so Δ parent is that step. With S = Σ|d| and F the set of flipped values, a flip's sum is
# S − 2·Σ_F|d|; it reaches the observed |Σ d| when Σ_F is small enough (or, mirrored, large):
#   b − a: seven positive steps: only F = {} and its mirror reach it: p = 2/128 = 0.015625
#   c − b: (0.02, ..., 0.07, −0.01): S = 0.28, Σ d = 0.26: Σ_F <= 0.01 for F = {}, {0.01},
#          and two mirrors: p = 4/128 = 0.03125
#   d − c: (0.02, ..., 0.07, −0.02): S = 0.29, Σ d = 0.25: Σ_F <= 0.02 for F = {}, {0.02},
#          {−0.02} and three mirrors: p = 6/128 = 0.046875
# All three are below 0.05: three stars. Holm, m = 3: 0.015625 < 0.05/3 = 0.0167 keeps b;
# 0.03125 >= 0.05/2 = 0.025 stops: c and d lose their star. Holm-adjusted p: b 3 · 0.015625 =
# 0.046875; c max(that, 2 · 0.03125) = 0.0625; d max(0.0625, 1 · 0.046875) = 0.0625.
SEEDS = list(range(7))
RISE = (0.02, 0.03, 0.04, 0.05, 0.06, 0.07)
STEPS = {"b": (*RISE, 0.08), "c": (*RISE, -0.01), "d": (*RISE, -0.02)}


def finals() -> dict[str, list[float]]:
    out = {"a": [0.20] * len(SEEDS)}
    for parent, arm in (("a", "b"), ("b", "c"), ("c", "d")):
        out[arm] = [x + d for x, d in zip(out[parent], STEPS[arm], strict=True)]
    return out


def build_holm(url: str) -> int:
    store = Store(url)
    arms = ["a", "b", "c", "d"]
    sweep_id = store.create_sweep(
        name="holm",
        preset="tiny",
        arms=arms,
        seeds=SEEDS,
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


def _counted(
    store: Store,
    sweep_id: int,
    arm: str,
    seed: int,
    evals: dict[int, float],
    counts: dict[int, tuple[int, int]],
    status: str,
) -> None:
    """A run with held-out evaluations and the trainer's cumulative progress counters
    (step -> gradient updates, generated tokens)."""
    run_id = new_attempt(store, sweep_id, arm, seed, config_hash=arm)
    with store.sink(run_id) as sink:
        for step, score in evals.items():
            sink.log_evaluation(step, {"dataset": "aime", "k": 4, "avg_at_k": score})
        for step, (updates, tokens) in counts.items():
            sink.log_metrics(step, {M.GRAD_UPDATES: updates, M.TOKENS_TOTAL: tokens})
    store.update_run(run_id, status=status, steps=4)


def build_threshold(url: str) -> int:
    """a → b, seeds 0, 1, 2, evaluated at steps 0, 2, 4 (counters logged at steps 1..4).
    At 40%:
    a, seed 0: 0.2, 0.4, 0.5  -> reached at step 2: 4 updates, 1000 tokens
       seed 1: 0.2, 0.3, 0.45 -> step 4: 8 updates, 2600 tokens
       seed 2: 0.2, 0.3, 0.35 -> never: censored (a: 2/3 reached)
    b, seed 0 resumed: attempt 1 (failed) 0.2, 0.5 at steps 0, 2 with its counters; attempt
       2 resumed from step 2's checkpoint and ended at 0.6 at step 4 -> step 2, the counters
       of attempt 1 there: 2 updates, 800 tokens
       seed 1 resumed: attempt 1 (failed) 0.2 at step 0, 0.38 at step 2 (2, 900); attempt 2
       replayed step 2 at 0.41 (2, 950) and ended at 0.5 -> step 2, the newer attempt's
       score and counters: 2 updates, 950 tokens
       seed 2: 0.2, 0.3, 0.42   -> step 4: 4 updates, 1500 tokens (b: 3/3 reached)"""
    store = Store(url)
    sweep_id = store.create_sweep(
        name="threshold",
        preset="tiny",
        arms=["a", "b"],
        seeds=[0, 1, 2],
        base_config={},
        ladder=[{"arm": "a"}, {"arm": "b"}],
    )
    evals = {
        ("a", 0): {0: 0.2, 2: 0.4, 4: 0.5},
        ("a", 1): {0: 0.2, 2: 0.3, 4: 0.45},
        ("a", 2): {0: 0.2, 2: 0.3, 4: 0.35},
        ("b", 2): {0: 0.2, 2: 0.3, 4: 0.42},
    }
    counts = {
        ("a", 0): {1: (2, 400), 2: (4, 1000), 3: (6, 1500), 4: (8, 2100)},
        ("a", 1): {1: (2, 600), 2: (4, 1200), 3: (6, 1900), 4: (8, 2600)},
        ("a", 2): {1: (2, 500), 2: (4, 1100), 3: (6, 1700), 4: (8, 2300)},
        ("b", 2): {1: (1, 300), 2: (2, 700), 3: (3, 1100), 4: (4, 1500)},
    }
    for (arm, seed), curve in evals.items():
        _counted(store, sweep_id, arm, seed, curve, counts[(arm, seed)], "completed")
    _counted(store, sweep_id, "b", 0, {0: 0.2, 2: 0.5}, {1: (1, 300), 2: (2, 800)}, "failed")
    _counted(store, sweep_id, "b", 0, {4: 0.6}, {3: (3, 1200), 4: (4, 1700)}, "completed")
    _counted(store, sweep_id, "b", 1, {0: 0.2, 2: 0.38}, {1: (1, 400), 2: (2, 900)}, "failed")
    resumed = {2: (2, 950), 3: (3, 1400), 4: (4, 1900)}
    _counted(store, sweep_id, "b", 1, {2: 0.41, 4: 0.5}, resumed, "completed")
    return sweep_id
