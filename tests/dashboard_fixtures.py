"""A small, fully known experiment store for the dashboard tests, written through db.store.

Sweep "ladder" (the older one): the six arms of the ladder × seeds 0 and 1, five rollout steps
each, with the final avg@k of every run fixed in FINAL_SCORES and the starting model's in
START_SCORES, so that tests can recompute the ablation table by hand. Two runs are not clean:
- soft_punish seed 1 failed at step 2 (no evaluation, status failed);
- dapo seed 1 is still running (metrics and samples, but no evaluation yet).
Sweep "tiny-check" (the newer one): two arms × seed 0, completed; it is what the pickers show
by default, so the ladder is reached through the `sweep` query parameter. Its runs are "older":
they do not log loss/long_share (a metric added later), which must read "—", not fail.

Mechanism metrics (step_metrics) are shaped so that each arm's change shows in its own metric,
by amounts the tests recompute by hand over windows of rollout steps.

`build_grid_sweep` writes a third kind of sweep, on its own: a grid (`dapo sweep --arms dapo
--grid algo.clip_high=0.24,0.28,0.32 --grid algo.clip_low=0.2,0.25`), whose five points each
name the base arm `dapo` as their parent (siblings, not a chain), × three seeds.

The app's pages run in the test's process through Streamlit's AppTest: `use_store` points the
app at a store (with no Prefect server), `open_page` runs a page, `chart_rows` reads the table
a chart draws; every page test uses these.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from store_runs import new_attempt

from dapo_common import metric_names as mn
from db.store import Store

if TYPE_CHECKING:
    import pandas as pd
    from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
# A ceiling that only a hung page reaches (a page takes a second or two).
APP_TIMEOUT_S = 90.0


def use_store(monkeypatch: pytest.MonkeyPatch, url: str, tmp_path: Path) -> None:
    """The app's environment: the store at `url`, no Prefect server and no user profile (the
    rerun box must say so, not fail)."""
    monkeypatch.setenv("DAPO_DB_URL", url)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))


def open_page(page: str | None = None, *, only_query: bool = False, **query: object) -> AppTest:
    """The app run once (its default page, the ablation table), then `page` if given, with
    `query` in the URL. `only_query`: the default page runs without it and `page` opens with
    exactly `query` (the default page's sweep picker writes ?sweep=, which a link would not
    carry)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=APP_TIMEOUT_S)
    params = {k: str(v) for k, v in query.items()}
    if not only_query:
        at.query_params.update(params)
    at.run()
    if only_query:
        at.query_params.clear()
        at.query_params.update(params)
    if page is not None:
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def chart_rows(chart: object) -> pd.DataFrame:
    """The one table an Altair chart on the page draws (st.altair_chart sends it as Arrow)."""
    import pyarrow as pa

    (named,) = chart.proto.datasets  # type: ignore[attr-defined]
    return pa.ipc.open_stream(named.data.data).read_pandas()


LADDER: list[dict[str, Any]] = [
    {
        "arm": "grpo",
        "adds": "naive GRPO: symmetric clip 0.2, sample-level loss",
        "paper_score": 30.0,
    },
    {"arm": "overlong_filter", "adds": "truncated samples masked out", "paper_score": 36.0},
    {"arm": "clip_higher", "adds": "decoupled clip: ε_high 0.28", "paper_score": 38.0},
    {"arm": "soft_punish", "adds": "soft overlong punishment (Eq. 13)", "paper_score": 41.0},
    {"arm": "token_loss", "adds": "token-level loss", "paper_score": 42.0},
    {"arm": "dapo", "adds": "dynamic sampling", "paper_score": 50.0},
]
ARMS = [row["arm"] for row in LADDER]
SEEDS = [0, 1]
STEPS = 5
EVAL_K = 4
EVAL_DATASET = "aime2024"
FAILED = ("soft_punish", 1)
RUNNING = ("dapo", 1)

# Final avg@k (fraction) of each completed run; a mid-run evaluation at step 2 scores 0.1 less,
# so the "final" and "best" scores are the same value and the mid one must be ignored.
FINAL_SCORES: dict[tuple[str, int], float] = {
    ("grpo", 0): 0.30,
    ("grpo", 1): 0.34,
    ("overlong_filter", 0): 0.36,
    ("overlong_filter", 1): 0.39,
    ("clip_higher", 0): 0.40,
    ("clip_higher", 1): 0.46,
    ("soft_punish", 0): 0.44,
    ("token_loss", 0): 0.43,
    ("token_loss", 1): 0.46,
    ("dapo", 0): 0.50,
}
# The starting model's score (the step-0 evaluation): one model per seed, whatever the arm.
START_SCORES: dict[int, float] = {0: 0.20, 1: 0.22}
# Eval problems of every evaluation: with k = 4, avg@k moves in steps of 1 / 200, so every
# score above is a whole number of correct samples.
EVAL_PROBLEMS = 50

# What each arm switches on, cumulatively (so each config differs from the previous arm's by
# exactly these keys); the config is laid out as dapo_core's (sections algo, rollout, run).
CHANGES: dict[str, dict[str, Any]] = {
    "grpo": {},
    "overlong_filter": {"overlong_filter": True},
    "clip_higher": {"clip_high": 0.28},
    "soft_punish": {"overlong_penalty": True},
    "token_loss": {"loss_agg": "token-mean"},
    "dapo": {"dynamic_sampling": True},
}

BASE_ALGORITHM: dict[str, Any] = {
    "clip_low": 0.2,
    "clip_high": 0.2,
    "loss_agg": "seq-mean-token-mean",
    "overlong_filter": False,
    "overlong_penalty": False,
    "overlong_cache_len": 16,
    "dynamic_sampling": False,
    "kl_coef": 0.0,
}


@dataclass
class FixtureStore:
    """What the builder wrote: the URL, the sweep ids and every run id by (arm, seed)."""

    url: str
    sweep_id: int
    other_sweep_id: int
    run_ids: dict[tuple[str, int], int] = field(default_factory=dict)


def arm_config(arm: str, seed: int, **algo: Any) -> dict[str, Any]:
    """The run config of a paper arm (a grid arm: `algo` overrides on top of one)."""
    algorithm = json.loads(json.dumps(BASE_ALGORITHM))
    for name in ARMS[: ARMS.index(arm) + 1]:
        algorithm.update(json.loads(json.dumps(CHANGES[name])))
    algorithm.update(algo)
    return {
        "arm": arm,
        "preset": "tiny",
        "model": {"name_or_path": "tiny", "hidden_size": 64},
        "rollout": {"group_size": 4, "max_response_len": 64},
        "algo": algorithm,
        "run": {"steps": STEPS, "seed": seed},
    }


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def step_metrics(
    arm_index: int, seed: int, step: int, *, long_share: bool = True
) -> dict[str, float]:
    """Deterministic curves: accuracy climbs with the step and the arm; tokens grow per step.

    Each technique moves its own metric (F, C, P, T, D: 1 from the arm that adds overlong
    filtering, Clip-Higher, soft punishment, the token-level loss, dynamic sampling on):
      truncated fraction  0.20 − 0.02·step − 0.05·F − 0.04·P + 0.01·seed
      clip_ratio/high     0.002 + 0.001·seed + 0.012·C + 0.001·seed·C
      entropy             1.5 − 0.1·step + 0.2·C + 0.02·seed·C
      overlong penalty    −(0.1 + 0.01·step)·P
      loss/long_share     0.5 + 0.15·T + 0.01·seed·T   (only when `long_share`)
      loss/truncated_share (0.1 − 0.01·step + 0.01·seed)·(1 − F)   (likewise)
      gen_batches         1 + (0.5 + 0.1·step)·D
    """
    acc = 0.1 + 0.05 * arm_index + 0.1 * step + 0.01 * seed
    f, c, p, t, d = (float(arm_index >= i) for i in range(1, 6))
    metrics = {
        mn.ACC_MEAN: acc,
        mn.REWARD_MEAN: 2 * acc - 1,
        mn.ENTROPY_MEAN: 1.5 - 0.1 * step + 0.2 * c + 0.02 * seed * c,
        mn.RESPONSE_LENGTH_MEAN: 30.0 + step,
        mn.RESPONSE_CLIP_RATIO: 0.2 - 0.02 * step - 0.05 * f - 0.04 * p + 0.01 * seed,
        mn.CLIP_RATIO_HIGH: 0.002 + 0.001 * seed + 0.012 * c + 0.001 * seed * c,
        mn.CLIP_RATIO_LOW: 0.02,
        mn.OVERLONG_PENALTY_MEAN: -(0.1 + 0.01 * step) * p,
        mn.KEPT_GROUPS: 0.5 + 0.05 * seed,
        # dynamic sampling trains on informative groups only; without it, on what it generated
        mn.TRAIN_INFORMATIVE: 1.0 if d else 0.5 + 0.05 * seed,
        mn.GEN_BATCHES: 1.0 + (0.5 + 0.1 * step) * d,
        mn.APPROX_KL: 0.001 * step,
        mn.GRAD_NORM: 1.0 + 0.1 * seed,
        mn.ROLLOUT_STEP: float(step + 1),
        mn.GRAD_UPDATES: float(4 * (step + 1)),
        mn.TOKENS_TOTAL: float(1000 * (step + 1) + 100 * seed),
    }
    if long_share:
        metrics[mn.LOSS_LONG_SHARE] = 0.5 + 0.15 * t + 0.01 * seed * t
        metrics[mn.LOSS_TRUNCATED_SHARE] = (0.1 - 0.01 * step + 0.01 * seed) * (1 - f)
    return metrics


def step_samples(step: int) -> list[dict[str, Any]]:
    """Four rollouts: correct, wrong, wrong and truncated (penalised), correct and long."""
    return [
        {"prompt": "What is 2+3?", "response": "2+3=5\nAnswer: 5", "ground_truth": "5",
         "pred": "5", "reward": 1.0, "score": 1.0, "overlong_penalty": 0.0, "correct": True,
         "length": 12, "truncated": False},
        {"prompt": "What is 4*4?", "response": "4*4=15\nAnswer: 15", "ground_truth": "16",
         "pred": "15", "reward": -1.0, "score": -1.0, "overlong_penalty": 0.0, "correct": False,
         "length": 14, "truncated": False},
        {"prompt": "What is 9-7?", "response": "9-7 is " + "so " * 40, "ground_truth": "2",
         "pred": "", "reward": -1.5, "score": -1.0, "overlong_penalty": -0.5, "correct": False,
         "length": 64, "truncated": True},
        {"prompt": f"What is {step}+1?", "response": f"Answer: {step + 1}",
         "ground_truth": str(step + 1), "pred": str(step + 1), "reward": 0.75, "score": 1.0,
         "overlong_penalty": -0.25, "correct": True, "length": 56, "truncated": False},
    ]  # fmt: skip


def correct_counts(score: float, problems: int = EVAL_PROBLEMS, k: int = EVAL_K) -> list[int]:
    """Correct samples (of k) per problem adding up to `score`: as even as can be, the extra
    ones on the first problems (so two scores of one seed differ on the first problems)."""
    total = round(score * problems * k)
    base, rest = divmod(total, problems)
    return [base + 1 if i < rest else base for i in range(problems)]


def evaluation(score: float) -> dict[str, Any]:
    """One evaluation result as the runner logs it, per-problem counts included."""
    return {
        "dataset": EVAL_DATASET,
        "k": EVAL_K,
        "avg_at_k": score,
        "pass_at_k": min(1.0, score + 0.2),
        "cons_at_k": score,
        "n_problems": EVAL_PROBLEMS,
        "correct_per_problem": correct_counts(score),
    }


def _write_run(
    store: Store,
    sweep_id: int,
    arm: str,
    seed: int,
    *,
    failed: bool,
    running: bool,
    long_share: bool = True,
) -> int:
    config = arm_config(arm, seed)
    run_id = new_attempt(
        store,
        sweep_id,
        arm,
        seed,
        config=config,
        config_hash=config_hash(config),
        flow_run_id=f"00000000-0000-0000-0000-{sweep_id:04d}{ARMS.index(arm):04d}{seed:04d}",
        checkpoint_dir=f"/ckpt/sweep{sweep_id}/{arm}/seed{seed}",
    )
    sink = store.sink(run_id)
    sink.log_evaluation(0, evaluation(START_SCORES[seed]))  # every run scores its start
    last_step = 2 if failed else STEPS - 1
    for step in range(last_step + 1):
        sink.log_metrics(step, step_metrics(ARMS.index(arm), seed, step, long_share=long_share))
        if step in (0, last_step):
            sink.log_samples(step, step_samples(step))
    if not failed and not running:
        final = FINAL_SCORES[(arm, seed)]
        for step, score in ((2, final - 0.1), (last_step, final)):
            sink.log_evaluation(step, evaluation(score))
    sink.close()
    steps_done = last_step + 1
    fields: dict[str, Any] = {
        "steps": steps_done,
        "grad_updates": 4 * steps_done,
        "tokens": 1000 * steps_done + 100 * seed,
        "wall_s": 60.0 * steps_done + seed,
    }
    if failed:
        fields |= {"status": "failed", "error": "Traceback ...\nRuntimeError: CUDA out of memory"}
    elif not running:
        fields["status"] = "completed"
    store.update_run(run_id, **fields)
    return run_id


def build_store(url: str) -> FixtureStore:
    """Write both sweeps into the (new) store at `url`."""
    store = Store(url)
    sweep_id = store.create_sweep(
        name="ladder",
        preset="tiny",
        arms=ARMS,
        seeds=SEEDS,
        base_config=arm_config("grpo", 0),
        ladder=LADDER,
        flow_run_id="11111111-1111-1111-1111-111111111111",
    )
    store.set_sweep_status(sweep_id, "running")
    fixture = FixtureStore(url=url, sweep_id=sweep_id, other_sweep_id=-1)
    for arm in ARMS:
        for seed in SEEDS:
            fixture.run_ids[(arm, seed)] = _write_run(
                store,
                sweep_id,
                arm,
                seed,
                failed=(arm, seed) == FAILED,
                running=(arm, seed) == RUNNING,
            )
    other = store.create_sweep(
        name="tiny-check",
        preset="tiny",
        arms=ARMS[:2],
        seeds=[0],
        base_config=arm_config("grpo", 0),
        ladder=LADDER[:2],
    )
    for arm in ARMS[:2]:
        _write_run(store, other, arm, 0, failed=False, running=False, long_share=False)
    store.set_sweep_status(other, "completed")
    fixture.other_sweep_id = other
    return fixture


def expected_mean(arm: str) -> float:
    """Mean final score (fraction) over the arm's completed seeds, by hand from FINAL_SCORES."""
    scores = [FINAL_SCORES[(arm, s)] for s in SEEDS if (arm, s) in FINAL_SCORES]
    return sum(scores) / len(scores)


# --- a grid sweep: siblings of one base arm ------------------------------------------------------
GRID_BASE = "dapo"
GRID_KEYS = ("algo.clip_high", "algo.clip_low")
GRID_SEEDS = [0, 1, 2]
GRID_START: dict[int, float] = {0: 0.20, 1: 0.22, 2: 0.24}
# arm -> (clip_high, clip_low, mean final score, spread): seed s scores mean + spread·(s − 1),
# so each arm's seeds are (mean − spread, mean, mean + spread); the base's spread is 0.01.
GRID_POINTS: dict[str, tuple[float, float, float, float]] = {
    "dapo": (0.28, 0.2, 0.46, 0.01),
    "dapo-clip_high=0.24-clip_low=0.16": (0.24, 0.16, 0.36, 0.01),
    "dapo-clip_high=0.24-clip_low=0.2": (0.24, 0.2, 0.40, 0.01),
    "dapo-clip_high=0.28-clip_low=0.16": (0.28, 0.16, 0.42, 0.01),
    "dapo-clip_high=0.32-clip_low=0.16": (0.32, 0.16, 0.40, 0.01),
    "dapo-clip_high=0.32-clip_low=0.2": (0.32, 0.2, 0.44, 0.02),
}
# The rungs `dapo sweep --arms dapo --grid algo.clip_high=0.24,0.28,0.32 --grid
# algo.clip_low=0.16,0.2` stores (tests/db/test_db_queries.py checks them against expand_grid).
GRID_LADDER: list[dict[str, Any]] = [
    {
        "arm": arm,
        "adds": (
            "dynamic sampling: keep groups with 0 < #correct < G"
            if arm == GRID_BASE
            else f"clip_high={high:g}, clip_low={low:g}"
        ),
        "parent": None if arm == GRID_BASE else GRID_BASE,
        "paper_score": 50.0 if arm == GRID_BASE else None,
        "grid": {"algo.clip_high": high, "algo.clip_low": low},
    }
    for arm, (high, low, _, _) in GRID_POINTS.items()
]


def grid_score(arm: str, seed: int) -> float:
    _, _, mean, spread = GRID_POINTS[arm]
    return round(mean + spread * (seed - 1), 6)


def grid_clip_fraction(clip_high: float, seed: int) -> float:
    """clip_ratio/high of a grid run, flat over steps: (0.36 − ε_high) / 4 + 0.001·seed, so a
    wider upper bound clips fewer tokens (0.24 -> 0.03, 0.28 -> 0.02, 0.32 -> 0.01)."""
    return (0.36 - clip_high) / 4 + 0.001 * seed


@dataclass
class GridFixture:
    url: str
    sweep_id: int
    run_ids: dict[tuple[str, int], int] = field(default_factory=dict)


def build_grid_sweep(url: str) -> GridFixture:
    """Write the grid sweep (all runs completed) into the store at `url`."""
    store = Store(url)
    sweep_id = store.create_sweep(
        name="grid",
        preset="tiny",
        arms=list(GRID_POINTS),
        seeds=GRID_SEEDS,
        base_config=arm_config(GRID_BASE, 0),
        ladder=GRID_LADDER,
    )
    fixture = GridFixture(url=url, sweep_id=sweep_id)
    for arm, (high, low, _, _) in GRID_POINTS.items():
        for seed in GRID_SEEDS:
            config = arm_config(GRID_BASE, seed, clip_high=high, clip_low=low) | {"arm": arm}
            run_id = new_attempt(
                store, sweep_id, arm, seed, config=config, config_hash=config_hash(config)
            )
            with store.sink(run_id) as sink:
                sink.log_evaluation(0, evaluation(GRID_START[seed]))
                for step in range(STEPS):
                    metrics = step_metrics(ARMS.index(GRID_BASE), seed, step)
                    metrics[mn.CLIP_RATIO_HIGH] = grid_clip_fraction(high, seed)
                    sink.log_metrics(step, metrics)
                sink.log_evaluation(STEPS - 1, evaluation(grid_score(arm, seed)))
            store.update_run(
                run_id, status="completed", steps=STEPS, grad_updates=4 * STEPS, wall_s=60.0
            )
            fixture.run_ids[(arm, seed)] = run_id
    store.set_sweep_status(sweep_id, "completed")
    return fixture
