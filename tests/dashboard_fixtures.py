"""A small, fully known experiment store for the dashboard tests, written through db.store.

Sweep "ladder" (the older one): the six arms of the ladder × seeds 0 and 1, five rollout steps
each, with the final avg@k of every run fixed in FINAL_SCORES so that tests can recompute the
ablation table by hand. Two runs are not clean:
- soft_punish seed 1 failed at step 2 (no evaluation, status failed);
- dapo seed 1 is still running (metrics and samples, but no evaluation yet).
Sweep "tiny-check" (the newer one): two arms × seed 0, completed; it is what the pickers show
by default, so the ladder is reached through the `sweep` query parameter.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from dapo_core import metric_names as mn
from db.store import Store

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
    ("overlong_filter", 0): 0.35,
    ("overlong_filter", 1): 0.39,
    ("clip_higher", 0): 0.40,
    ("clip_higher", 1): 0.46,
    ("soft_punish", 0): 0.44,
    ("token_loss", 0): 0.43,
    ("token_loss", 1): 0.41,
    ("dapo", 0): 0.50,
}

# What each arm switches on, cumulatively (so each config differs from the previous arm's by
# exactly these keys).
CHANGES: dict[str, dict[str, Any]] = {
    "grpo": {},
    "overlong_filter": {"overlong_filter": True},
    "clip_higher": {"clip_high": 0.28},
    "soft_punish": {"soft_punish": {"enabled": True, "max_len": 64, "cache_len": 16}},
    "token_loss": {"loss_agg": "token-mean"},
    "dapo": {"dynamic_sampling": True},
}

BASE_ALGORITHM: dict[str, Any] = {
    "clip_low": 0.2,
    "clip_high": 0.2,
    "loss_agg": "seq-mean-token-mean",
    "overlong_filter": False,
    "soft_punish": {"enabled": False, "max_len": 64, "cache_len": 16},
    "dynamic_sampling": False,
    "group_size": 4,
}


@dataclass
class FixtureStore:
    """What the builder wrote: the URL, the sweep ids and every run id by (arm, seed)."""

    url: str
    sweep_id: int
    other_sweep_id: int
    run_ids: dict[tuple[str, int], int] = field(default_factory=dict)


def arm_config(arm: str, seed: int) -> dict[str, Any]:
    algorithm = json.loads(json.dumps(BASE_ALGORITHM))
    for name in ARMS[: ARMS.index(arm) + 1]:
        algorithm.update(json.loads(json.dumps(CHANGES[name])))
    return {
        "arm": arm,
        "seed": seed,
        "model": {"name": "tiny", "hidden": 64},
        "algorithm": algorithm,
        "run": {"steps": STEPS},
    }


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def step_metrics(arm_index: int, seed: int, step: int) -> dict[str, float]:
    """Deterministic curves: accuracy climbs with the step and the arm; tokens grow per step."""
    acc = 0.1 + 0.05 * arm_index + 0.1 * step + 0.01 * seed
    return {
        mn.ACC_MEAN: acc,
        mn.REWARD_MEAN: 2 * acc - 1,
        mn.ENTROPY_MEAN: 1.5 - 0.1 * step,
        mn.RESPONSE_LENGTH_MEAN: 30.0 + step,
        mn.RESPONSE_CLIP_RATIO: 0.2 - 0.02 * step,
        mn.CLIP_RATIO_HIGH: 0.01 * arm_index,
        mn.CLIP_RATIO_LOW: 0.02,
        mn.KEPT_GROUPS: 0.5 + 0.05 * seed,
        mn.APPROX_KL: 0.001 * step,
        mn.GRAD_NORM: 1.0 + 0.1 * seed,
        mn.ROLLOUT_STEP: float(step + 1),
        mn.GRAD_UPDATES: float(4 * (step + 1)),
        mn.TOKENS_TOTAL: float(1000 * (step + 1) + 100 * seed),
    }


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


def _write_run(
    store: Store, sweep_id: int, arm: str, seed: int, *, failed: bool, running: bool
) -> int:
    config = arm_config(arm, seed)
    run_id = store.start_run(
        sweep_id=sweep_id,
        arm=arm,
        seed=seed,
        config=config,
        config_hash=config_hash(config),
        host="test-host",
        flow_run_id=f"00000000-0000-0000-0000-{sweep_id:04d}{ARMS.index(arm):04d}{seed:04d}",
        checkpoint_dir=f"/ckpt/sweep{sweep_id}/{arm}/seed{seed}",
    )
    sink = store.sink(run_id)
    last_step = 2 if failed else STEPS - 1
    for step in range(last_step + 1):
        sink.log_metrics(step, step_metrics(ARMS.index(arm), seed, step))
        if step in (0, last_step):
            sink.log_samples(step, step_samples(step))
    if not failed and not running:
        final = FINAL_SCORES[(arm, seed)]
        for step, score in ((2, final - 0.1), (last_step, final)):
            sink.log_evaluation(
                step,
                {"dataset": EVAL_DATASET, "k": EVAL_K, "avg_at_k": score,
                 "pass_at_k": min(1.0, score + 0.2), "cons_at_k": score, "n_problems": 30},
            )  # fmt: skip
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
        _write_run(store, other, arm, 0, failed=False, running=False)
    store.set_sweep_status(other, "completed")
    fixture.other_sweep_id = other
    return fixture


def expected_mean(arm: str) -> float:
    """Mean final score (fraction) over the arm's completed seeds, by hand from FINAL_SCORES."""
    scores = [FINAL_SCORES[(arm, s)] for s in SEEDS if (arm, s) in FINAL_SCORES]
    return sum(scores) / len(scores)
