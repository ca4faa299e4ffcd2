"""Whole async runs on the embedded tiny model (rollout.mode=async): staleness 0 is the sync
run bit for bit (with and without dynamic sampling), dynamic sampling's counts stay exact
while the worker runs ahead, and a run killed with batches queued resumes with no step lost
and no sample trained twice."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_runner import ListSink, small

from dapo_common import metric_names as M
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.checkpoint import checkpoint_step, latest_checkpoint, load_trainer_state
from dapo_core.train.runner import train

DRIVER = str(Path(__file__).resolve().parents[1] / "async_train_driver.py")


def async_cfg(arm: str, k: int, **extra: Any) -> ExperimentConfig:
    return small(arm, **{"rollout.mode": "async", "rollout.max_staleness": k, **extra})


def compared(metrics: dict[str, float]) -> dict[str, float]:
    """What a run computes, not how long it took (time/..., perf/...)."""
    return {k: v for k, v in metrics.items() if not k.startswith((M.TIME_PREFIX, "perf/"))}


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def trained_prompts(samples: list[dict[str, Any]]) -> list[str]:
    """The prompts of a step's trained groups, in order (every group is kept: see SAMPLES)."""
    return [s["prompt"] for s in samples if s["member"] == 0]


# Every response of a step kept (4 groups of 4): the samples name every trained prompt.
SAMPLES = {"run.samples_per_step": 16}


@pytest.mark.parametrize("arm", ["grpo", "dapo"])
def test_staleness_zero_is_the_sync_run_bit_for_bit(arm: str, tmp_path: Path) -> None:
    # dapo: dynamic sampling over-samples and carries groups over; grpo: one batch a step.
    steps = {"run.steps": 2}
    sync, asynchronous = ListSink(), ListSink()
    train(small(arm, **steps), sink=sync, out_dir=tmp_path / "sync")
    train(async_cfg(arm, 0, **steps), sink=asynchronous, out_dir=tmp_path / "async")

    assert sorted(asynchronous.metrics) == [1, 2]
    for step in (1, 2):
        a, b = compared(sync.metrics[step]), compared(asynchronous.metrics[step])
        assert M.POLICY_LOSS in a and M.STALENESS_MEAN in a and M.TOKENS_TOTAL in a
        assert set(a) == set(b), (step, set(a) ^ set(b))
        differ = {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}
        assert not differ, (step, differ)  # exactly equal: not approximately
        # The async side reports both sides' waiting.
        assert {M.ROLLOUT_IDLE_S, M.TRAINER_IDLE_S} <= set(asynchronous.metrics[step])
    assert asynchronous.samples == sync.samples
    assert asynchronous.evaluations == sync.evaluations


def test_dynamic_sampling_counts_stay_exact_while_the_worker_runs_ahead(tmp_path: Path) -> None:
    # dapo (dynamic sampling: batches of 4 prompts until 4 informative groups), k = 2: the worker
    # may hold batches made ahead when the run ends; none of them counts.
    cfg = async_cfg("dapo", 2, **{"run.steps": 3, **SAMPLES})
    sink = ListSink()
    result = train(cfg, sink=sink, out_dir=tmp_path)
    G, per_batch = cfg.rollout.group_size, cfg.batch.gen_batch_size

    batches = [sink.metrics[s][M.GEN_BATCHES] for s in (1, 2, 3)]
    assert all(1 <= b <= cfg.algo.max_gen_batches for b in batches)
    assert sink.metrics[3][M.GEN_BATCHES_TOTAL] == sum(batches)
    # The tokens counted are exactly those of the generated responses the steps looked at:
    # response_length/mean is over the step's gen_batches × 4 groups × G responses.
    tokens = sum(
        sink.metrics[s][M.RESPONSE_LENGTH_MEAN] * sink.metrics[s][M.GEN_BATCHES] * per_batch * G
        for s in (1, 2, 3)
    )
    assert sink.metrics[3][M.TOKENS_TOTAL] == pytest.approx(tokens) == result.tokens
    # The checkpoint's stream stands after the prompts the steps took, not after the worker's.
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and checkpoint_step(ckpt) == 3
    data = load_trainer_state(ckpt)["data"]
    assert data == {"epoch": 0, "pos": sum(batches) * per_batch}
    for s in (1, 2, 3):
        m = sink.metrics[s]
        lags = [m[M.staleness_lag(n)] for n in range(4)]  # 0 .. k + 1
        assert sum(lags) == m[M.TRAIN_GROUPS] * G  # every trained sample has a lag
        assert m[M.STALENESS_MAX] <= 3 and m[M.STALE_DROPPED] == 0
        assert m[M.TRAIN_GROUPS] <= cfg.batch.train_batch_size


@pytest.fixture(scope="module")
def sync_reference(tmp_path_factory: pytest.TempPathFactory) -> ListSink:
    cfg = small("grpo", **{"run.steps": 4, "run.checkpoint_every": 2, **SAMPLES})
    sink = ListSink()
    train(cfg, sink=sink, out_dir=tmp_path_factory.mktemp("sync"))
    return sink


def read_log(path: Path) -> dict[str, dict[int, Any]]:
    out: dict[str, dict[int, Any]] = {"metrics": {}, "samples": {}, "evaluation": {}}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        kind = record["kind"]
        out[kind][record["step"]] = record.get(
            "metrics", record.get("samples", record.get("result"))
        )
    return out


@pytest.mark.parametrize("k", [0, 2])
def test_a_killed_async_run_resumes_with_no_step_lost_and_no_sample_trained_twice(
    k: int, tmp_path: Path, sync_reference: ListSink
) -> None:
    cfg = async_cfg("grpo", k, **{"run.steps": 4, "run.checkpoint_every": 2, **SAMPLES})
    config, log, out = tmp_path / "config.json", tmp_path / "killed.jsonl", tmp_path / "run"
    config.write_text(json.dumps(cfg.to_dict()))
    # Killed (SIGKILL) once step 3 is logged: its checkpoint is step 2's, and with k = 2 the
    # worker holds or is making the batches of steps 4 and 5.
    done = subprocess.run(
        [sys.executable, DRIVER, str(config), str(out), str(log), "3"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    killed = read_log(log)
    assert sorted(killed["metrics"]) == [1, 2, 3]
    ckpt = latest_checkpoint(out)
    assert ckpt is not None and checkpoint_step(ckpt) == 2
    assert load_trainer_state(ckpt)["progress"]["policy_version"] == 3

    resumed = ListSink()
    result = train(cfg, sink=resumed, out_dir=out)
    assert result.steps == 4 and sorted(resumed.metrics) == [3, 4]  # no step lost

    # The prompts each step trained: steps 1-2 from the killed run, 3-4 from the resumed one,
    # are the sync run's, step by step; step 3 trains again exactly what it trained when killed.
    steps = {**{s: killed["samples"][s] for s in (1, 2)}, **{s: resumed.samples[s] for s in (3, 4)}}
    trained = {s: trained_prompts(v) for s, v in steps.items()}
    assert trained == {s: trained_prompts(sync_reference.samples[s]) for s in (1, 2, 3, 4)}
    assert trained_prompts(killed["samples"][3]) == trained[3]
    every = [p for s in (1, 2, 3, 4) for p in trained[s]]
    assert len(every) == 16 and len(set(every)) == 16  # no sample trained twice
    # Counters continue from the checkpoint: the batches queued at the kill are not counted.
    m2, m3, m4 = killed["metrics"][2], resumed.metrics[3], resumed.metrics[4]
    new_tokens = sum(m[M.RESPONSE_LENGTH_MEAN] * 16 for m in (m3, m4))
    assert m4[M.TOKENS_TOTAL] == pytest.approx(m2[M.TOKENS_TOTAL] + new_tokens)
    assert m4[M.GEN_BATCHES_TOTAL] == 4
    assert m4[M.GRAD_UPDATES] == 2 * m2[M.GRAD_UPDATES]
    assert all(m[M.STALENESS_MAX] <= k and m[M.STALE_DROPPED] == 0 for m in (m3, m4))
    if k == 0:
        # Staleness 0 resumes as the sync run continues: bit for bit.
        for s in (3, 4):
            a, b = compared(sync_reference.metrics[s]), compared(resumed.metrics[s])
            assert {n: a[n] for n in a if not same(a[n], b[n])} == {}, s
        assert resumed.evaluations[4] == sync_reference.evaluations[4]
