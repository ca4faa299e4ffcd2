"""Whole training jobs on the embedded tiny model: every arm runs, a resumed run continues as if
never stopped, the warm start lands where RL has something to do, and `dapo train` turns bad
input into one line."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dapo_common import metric_names as M
from dapo_core.setup.config import ExperimentConfig
from dapo_core.setup.ladders import paper_ladder
from dapo_core.train.checkpoint import checkpoint_step, latest_checkpoint
from dapo_core.train.runner import evaluate_policy, train

# Small enough for a few seconds per run, large enough for several mini-batches per step (so
# the clip acts) and for groups that are all right or all wrong (so dynamic sampling acts).
SMALL = {
    "rollout.group_size": 4,
    "batch.train_batch_size": 4,
    "batch.gen_batch_size": 4,
    "batch.mini_batch_size": 2,
    "data.eval_problems": 8,
    "data.eval_k": 2,
    "run.num_threads": 1,
}


class ListSink:
    """An in-memory MetricsSink."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.samples: dict[int, list[dict[str, Any]]] = {}
        self.evaluations: dict[int, dict[str, Any]] = {}

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.metrics[step] = dict(metrics)

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self.samples[step] = [dict(s) for s in samples]

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        self.evaluations[step] = dict(result)


def small(arm: str, **extra: Any) -> ExperimentConfig:
    return paper_ladder().config(arm, "tiny", {**SMALL, **extra})


@pytest.mark.parametrize("arm", paper_ladder().names)
def test_every_arm_trains_two_steps_on_cpu(arm: str, tmp_path: Path) -> None:
    cfg = small(arm, **{"run.steps": 2})
    sink = ListSink()
    result = train(cfg, sink=sink, out_dir=tmp_path)

    assert result.steps == 2 and sorted(sink.metrics) == [1, 2]
    # 4 groups x 4 responses in mini-batches of 2 groups: 2 updates an epoch, μ epochs a step
    # (the tiny preset's μ = 2: 8 updates in 2 steps).
    assert result.grad_updates == 2 * 2 * cfg.algo.ppo_epochs
    assert sink.metrics[2][M.GRAD_UPDATES] == 2 * 2 * cfg.algo.ppo_epochs
    for step, metrics in sink.metrics.items():
        bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
        assert not bad, f"step {step}: non-finite metrics {bad}"
        assert 0.0 <= metrics[M.ACC_MEAN] <= 1.0
    assert result.final_eval is not None and sink.evaluations[2]["n_problems"] == 8
    assert sink.samples[1], "sampled rollouts are kept"
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and checkpoint_step(ckpt) == 2


def test_a_resumed_run_continues_as_if_never_stopped(tmp_path: Path) -> None:
    # dapo: dynamic sampling's carried-over groups and the engine's random stream must survive
    # the checkpoint too, not only the weights and the optimizer.
    cfg = small("dapo", **{"run.steps": 4, "run.checkpoint_every": 2})
    whole = ListSink()
    train(cfg, sink=whole, out_dir=tmp_path / "whole")

    first, second = ListSink(), ListSink()
    train(cfg.with_overrides({"run.steps": 2}), sink=first, out_dir=tmp_path / "split")
    train(cfg, sink=second, out_dir=tmp_path / "split")

    assert sorted(first.metrics) == [1, 2] and sorted(second.metrics) == [3, 4]
    for step in (3, 4):
        a, b = whole.metrics[step], second.metrics[step]
        compared = [k for k in a if not k.startswith(("time/", "perf/"))]
        assert M.POLICY_LOSS in compared and M.CARRIED_GROUPS in compared
        for name in compared:
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-6), (step, name)
    assert second.evaluations[4] == whole.evaluations[4]


def test_a_resumed_run_refuses_a_changed_config(tmp_path: Path) -> None:
    cfg = small("grpo", **{"run.steps": 1})
    train(cfg, sink=ListSink(), out_dir=tmp_path)
    changed = cfg.with_overrides({"run.steps": 2, "algo.clip_high": 0.3})
    with pytest.raises(ValueError, match=r"different config \(differs in algo\.clip_high\)"):
        train(changed, sink=ListSink(), out_dir=tmp_path)


def test_the_warm_start_leaves_rl_something_to_learn() -> None:
    # The target: RL starts between 20% and 60% held-out accuracy, so that both correct
    # and wrong groups occur (the demonstrator itself scores about 58% at the 40-token budget).
    from dapo_core.models import load_policy

    cfg = paper_ladder().config("grpo", "tiny", {"data.eval_problems": 128, "data.eval_k": 4})
    model, tokenizer = load_policy(cfg.model, "cpu")
    acc = evaluate_policy(cfg, model, tokenizer)["avg_at_k"]
    assert 0.2 <= acc <= 0.6, f"warm-started tiny model: held-out avg@4 {acc:.3f}"


def dapo_train(*args: str) -> subprocess.CompletedProcess[str]:
    dapo = Path(sys.executable).parent / "dapo"
    return subprocess.run(
        [str(dapo), "train", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DAPO_DEBUG": ""},
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--arm", "ppo"], "unknown arm 'ppo'"),
        (["--model", "/nonexistent/model"], "/nonexistent/model does not exist"),
        (["--steps", "0"], "--steps"),
        (["--set", "algo.clip_high=0.1"], "clip"),
        (["--data", "BAD"], "bad.jsonl"),
    ],
)
def test_dapo_train_bad_input_is_one_line_and_exit_2(
    args: list[str], says: str, tmp_path: Path
) -> None:
    if args[-1] == "BAD":
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"prompt": "1+1=?", "answer": "2"}\nnot json\n')
        args = [*args[:-1], str(bad)]
    done = dapo_train(*args, "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert says in lines[0], lines[0]
