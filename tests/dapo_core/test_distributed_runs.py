"""`dapo train --workers 2`: whole runs on two gloo workers, their sharded checkpoints resumed on
two workers (exactly like an uninterrupted run), on one, and a one-worker checkpoint on two.

One uninterrupted 2-worker run of 3 steps (checkpoints at steps 2 and 3) is the reference; a run
killed after step 2's checkpoint is that directory without step 3 (what a kill there leaves).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_runner import ListSink

from dapo_common import metric_names as M
from dapo_core.setup.config import ExperimentConfig
from dapo_core.setup.ladders import paper_ladder
from dapo_core.train.checkpoint import (
    checkpoint_step,
    is_sharded,
    latest_checkpoint,
    load_sharded_model,
)
from dapo_core.train.distributed import launch_local
from dapo_core.train.run_dir import CHECKPOINTS, LATEST
from dapo_core.train.runner import load_checkpoint_policy, load_masters, train
from dapo_core.train.sinks import JsonlSink

pytestmark = pytest.mark.timeout(600)

# The tiny preset shrunk for speed; dynamic sampling on (arm dapo), so the carry-over must
# survive the sharded checkpoint too. Every response is kept as a sample, so the samples show
# what the gathered batch held.
SETS = {
    "rollout.group_size": 4,
    "rollout.max_response_len": 24,
    "algo.overlong_cache_len": 8,
    "batch.train_batch_size": 4,
    "batch.gen_batch_size": 4,
    "batch.mini_batch_size": 2,
    "data.eval_problems": 8,
    "data.eval_k": 2,
    "run.samples_per_step": 1000,
    "run.checkpoint_every": 2,
    "run.num_threads": 1,
}


def config(steps: int) -> ExperimentConfig:
    return paper_ladder().config("dapo", "tiny", {**SETS, "run.steps": steps})


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def killed_after_step_2(run: Path, to: Path) -> Path:
    """A copy of `run` as a kill after step 2's checkpoint leaves it: no step 3 anywhere."""
    shutil.copytree(run, to)
    shutil.rmtree(to / CHECKPOINTS / "step_3")
    (to / CHECKPOINTS / LATEST).write_text("step_2")
    for name in ("metrics.jsonl", "samples.jsonl", "evaluations.jsonl"):
        rows = [r for r in read_jsonl(to / name) if r["step"] <= 2]
        (to / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return to


def dapo_train(out: Path, *, workers: int, steps: int) -> subprocess.CompletedProcess[str]:
    """`dapo train --arm dapo --preset tiny --workers W --steps S --out OUT` (with SETS)."""
    sets = [a for k, v in SETS.items() for a in ("--set", f"{k}={v}")]
    dapo = str(Path(sys.executable).parent / "dapo")
    args = ["--arm", "dapo", "--preset", "tiny", "--workers", str(workers), "--steps", str(steps)]
    done = subprocess.run(
        [dapo, "train", *args, "--out", str(out), *sets],
        capture_output=True,
        text=True,
        timeout=500,
        env={**os.environ, "DAPO_DEBUG": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`dapo train --workers 2 --steps 3`, uninterrupted; returns its directory and stdout."""
    out = tmp_path_factory.mktemp("two") / "run"
    return out, dapo_train(out, workers=2, steps=3).stdout


def test_two_workers_write_one_row_per_step_reduced_over_ranks(
    reference: tuple[Path, str],
) -> None:
    out, stdout = reference
    assert "3 steps, 2 workers" in stdout and stdout.count("[2 workers]") == 3
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]  # rank 0 alone writes
    samples = {r["step"]: r["samples"] for r in read_jsonl(out / "samples.jsonl")}
    tokens = 0
    for row in rows:
        m, kept = row["metrics"], samples[row["step"]]
        # Every response of every rank's share: gen_batches × 4 prompts × G = 4 ...
        assert len(kept) == m[M.GEN_BATCHES] * 4 * 4
        assert len({s["prompt"] for s in kept}) == m[M.GEN_BATCHES] * 4
        # ... and acc/mean is their mean, not one rank's.
        assert m[M.ACC_MEAN] == pytest.approx(sum(s["correct"] for s in kept) / len(kept))
        tokens += sum(s["length"] for s in kept)
        assert m[M.TOKENS_TOTAL] == tokens
        assert m[M.TRAIN_GROUPS] <= 4 and m[M.GRAD_UPDATES] >= 1
        for rank in (0, 1):
            assert m[M.per_rank(M.UPDATE_S, rank)] > 0 and m[M.per_rank(M.ROLLOUT_S, rank)] > 0
    evaluations = read_jsonl(out / "evaluations.jsonl")
    assert [e["step"] for e in evaluations] == [0, 3]
    assert evaluations[1]["result"]["n_problems"] == 8
    ckpt = latest_checkpoint(out)
    assert ckpt is not None and checkpoint_step(ckpt) == 3 and is_sharded(ckpt)
    assert sorted(p.name for p in (ckpt / "ranks").iterdir()) == ["rank_0.pt", "rank_1.pt"]


def test_a_sharded_checkpoint_resumes_on_two_workers_exactly(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    out, _ = reference
    run = killed_after_step_2(out, tmp_path / "run")
    launch_local(
        config(3),
        out_dir=run,
        workers=2,
        sink_factory=functools.partial(JsonlSink, run),
    )
    want = read_jsonl(out / "metrics.jsonl")[2]["metrics"]
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    got = rows[2]["metrics"]
    compared = [k for k in want if not k.startswith(("time/", "perf/"))]
    assert M.POLICY_LOSS in compared and M.CARRIED_GROUPS in compared
    for name in compared:
        assert got[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), name
    assert read_jsonl(run / "evaluations.jsonl")[-1] == read_jsonl(out / "evaluations.jsonl")[-1]


def test_a_sharded_checkpoint_resumes_on_one_worker_then_back_on_two(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    out, _ = reference
    run = killed_after_step_2(out, tmp_path / "run")
    # The user's command: `dapo train ... --workers 1 --steps 3` on the 2-worker run's --out.
    done = dapo_train(run, workers=1, steps=3)
    assert "done: 3 steps" in done.stdout, done.stdout
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]  # each once
    assert [r["step"] for r in read_jsonl(run / "evaluations.jsonl")] == [0, 3]
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.name == "step_3" and not is_sharded(ckpt)
    # One worker's checkpoint, resumed on two.
    result = launch_local(
        config(4), out_dir=run, workers=2, sink_factory=functools.partial(JsonlSink, run)
    )
    assert result.steps == 4 and result.grad_updates > 0
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4]
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.name == "step_4" and is_sharded(ckpt)


def test_eval_and_hf_export_from_a_sharded_checkpoint(reference: tuple[Path, str]) -> None:
    out, _ = reference
    ckpt = latest_checkpoint(out)
    assert ckpt is not None
    cfg = config(3)
    exported, _ = load_checkpoint_policy(ckpt, cfg, "cpu")  # what `dapo eval` loads
    masters, _ = load_masters(cfg, "cpu")
    load_sharded_model(masters, ckpt)
    want = dict(masters.named_parameters())
    for name, p in exported.named_parameters():
        assert p.dtype == want[name].dtype  # the compute dtype: float32 in this preset
        assert p.equal(want[name]), name
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dapo"), "eval", "--ckpt", str(out), "--problems", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["n_problems"] == 4 and 0 <= result["avg_at_k"] <= 1


def test_refusals_come_before_any_worker_and_worker_errors_keep_their_type(
    tmp_path: Path,
) -> None:
    # A refused resume (another config in the directory) fails before any worker starts.
    run = tmp_path / "run"
    train(config(1), sink=ListSink(), out_dir=run)
    changed = config(2).with_overrides({"algo.clip_high": 0.3})
    with pytest.raises(ValueError, match=r"differs in algo\.clip_high"):
        launch_local(changed, out_dir=run, workers=2, sink_factory=None)
    # An error inside the workers reaches the caller as itself (the CLI prints one line),
    # with the worker's traceback in its notes.
    missing = config(1).with_overrides({"model.name_or_path": str(tmp_path / "no-such-model")})
    with pytest.raises(FileNotFoundError, match="no-such-model does not exist") as info:
        launch_local(missing, out_dir=tmp_path / "other", workers=2, sink_factory=None)
    assert any("traceback" in note for note in getattr(info.value, "__notes__", []))
