"""rollout.mode=async on two gloo workers: each rank's rollout worker makes its share of every
batch ahead, the shares are gathered when the trainer takes the batch. Staleness 0 is the
2-worker sync run bit for bit (dynamic sampling on), and a sharded checkpoint resumes it
exactly (each rank's engine stream from its cursor)."""

from __future__ import annotations

import functools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_distributed_runs import SETS

from dapo_common import metric_names as M
from dapo_core.setup.ladders import paper_ladder
from dapo_core.train.checkpoint import checkpoint_step, is_sharded, latest_checkpoint
from dapo_core.train.distributed import launch_local
from dapo_core.train.run_dir import CHECKPOINTS, LATEST
from dapo_core.train.sinks import JsonlSink

pytestmark = pytest.mark.timeout(600)


def run(out: Path, mode: str, *, resume: bool = False) -> dict[int, dict[str, float]]:
    """Two dapo steps on 2 workers (checkpoint after each); metrics by step."""
    extra = {"rollout.mode": mode, "rollout.max_staleness": 0 if mode == "async" else 1}
    cfg = paper_ladder().config(
        "dapo", "tiny", {**SETS, "run.steps": 2, "run.checkpoint_every": 1, **extra}
    )
    launch_local(
        cfg, out_dir=out, workers=2, sink_factory=functools.partial(JsonlSink, out), resume=resume
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["metrics"] for r in rows}


def computed(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith((M.TIME_PREFIX, "perf/"))}


def differ(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    both = set(a) | set(b)
    return {
        k: (a.get(k), b.get(k))
        for k in both
        if not (a.get(k) == b.get(k) or (math.isnan(a.get(k, 0)) and math.isnan(b.get(k, 0))))
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("workers")
    return {
        "sync": run(root / "sync", "sync"),
        "async": run(root / "async", "async"),
        "async_dir": root / "async",
    }


def test_staleness_zero_on_two_workers_is_the_sync_run_bit_for_bit(runs: dict[str, Any]) -> None:
    sync, asynchronous = runs["sync"], runs["async"]
    assert sorted(asynchronous) == [1, 2]
    for step in (1, 2):
        assert differ(computed(sync[step]), computed(asynchronous[step])) == {}, step
        # Each rank reports its own waits, like its other timings.
        for rank in (0, 1):
            assert M.per_rank(M.ROLLOUT_IDLE_S, rank) in asynchronous[step]


def test_a_sharded_async_checkpoint_resumes_exactly(runs: dict[str, Any], tmp_path: Path) -> None:
    # A kill after step 1's checkpoint: the run directory without step 2.
    out = tmp_path / "run"
    shutil.copytree(runs["async_dir"], out)
    shutil.rmtree(out / CHECKPOINTS / "step_2")
    (out / CHECKPOINTS / LATEST).write_text("step_1")
    rows = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("".join(r + "\n" for r in rows if json.loads(r)["step"] < 2))
    ckpt = latest_checkpoint(out)
    assert ckpt is not None and is_sharded(ckpt) and checkpoint_step(ckpt) == 1

    resumed = run(out, "async", resume=True)
    assert differ(computed(runs["async"][2]), computed(resumed[2])) == {}
