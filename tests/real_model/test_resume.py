"""The real model's sharded checkpoint resumed on 1 and on 2 workers.

One `dapo train --workers 2 --steps 1` of SmolLM2-135M leaves checkpoints/step_1 with both the
float32 masters as 2 workers' shards (dcp/) and the HF export the ranks gathered from their live
parameters (model/): two independent writes of the same weights. The tiny model's suite
(tests/dapo_core/test_distributed_runs.py) proves resume-equivalence step by step; here what only
the real model has is checked on the paths a resume takes: 30 decoder layers, grouped-query
attention and tied embeddings through FSDP2, DCP and a resharded load.

- The shards, loaded the way each resume loads them (one plain process: runner.OneWorker; two
  gloo ranks: distributed.Ranks), are the export bit for bit, and the export is not the
  starting model (so the equality is the load's doing, not a load that did nothing).
- `dapo train --steps 2` on a copy of that run, once on 1 worker and once on 2, continues from
  step 1: step 1's metrics row is the first run's (not recomputed), the progress counters go on
  from it, step 0 is not evaluated again and step 2 is written once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

if __package__:
    from .conftest import TRAIN_SETS, set_args
else:  # run as a script by the two-rank test, its own folder first on sys.path
    from conftest import TRAIN_SETS, set_args

pytestmark = [pytest.mark.realmodel, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
DAPO = str(Path(sys.executable).parent / "dapo")

# test_train.py's tiny budget: 2 prompts × 4 responses of at most 8 tokens, one gradient update
# per step, a held-out evaluation of 2 problems × 1 sample. Float32 compute (the preset's), so
# the export is the masters themselves and the comparisons are exact. One thread per worker: two
# OpenMP threads that wait on each other on a shared 2-core runner are several times slower.
SETS = {**TRAIN_SETS, "run.num_threads": 1}
ENV = {**os.environ, "DAPO_DEBUG": "1", "OMP_NUM_THREADS": "1"}


def dapo_train(out: Path, *, workers: int, steps: int) -> subprocess.CompletedProcess[str]:
    """`dapo train --preset smollm2-135m --arm grpo --workers W --steps S --out OUT` (SETS)."""
    sets = set_args(SETS)
    args = ["--preset", "smollm2-135m", "--arm", "grpo", "--workers", str(workers)]
    t0 = time.perf_counter()
    done = subprocess.run(
        [DAPO, "train", *args, "--steps", str(steps), "--out", str(out), *sets],
        capture_output=True,
        text=True,
        timeout=400,  # 35-90 s each on the shared 2-core runner (2026-11-25)
        cwd=ROOT,
        env=ENV,
    )
    print(f"dapo train --workers {workers} --steps {steps}: {time.perf_counter() - t0:.0f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def step1(real_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-worker run of one rollout step (its directory): checkpoints/step_1 is sharded and,
    as a run's last checkpoint, exported."""
    out = tmp_path_factory.mktemp("resume") / "run"
    dapo_train(out, workers=2, steps=1)
    return out


def test_the_sharded_checkpoint_loads_as_its_export_in_one_process(step1: Path) -> None:
    from safetensors.torch import load_file

    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.train.checkpoint import is_sharded, load_checkpoint_config, load_sharded_model
    from dapo_core.train.run_dir import MODEL_DIR
    from dapo_core.train.runner import load_masters

    ckpt = step1 / "checkpoints" / "step_1"
    assert is_sharded(ckpt) and (ckpt / "ranks" / "rank_1.pt").is_file()
    export = load_file(str(ckpt / MODEL_DIR / "model.safetensors"))
    # What a 1-worker resume does (runner.OneWorker.build): the starting float32 masters, the
    # 2 workers' shards read over them in a process with no process group.
    cfg = ExperimentConfig.from_dict(load_checkpoint_config(ckpt))
    model, _ = load_masters(cfg, "cpu")
    params = dict(model.named_parameters())  # tied: lm_head is embed_tokens, named once
    assert set(params) == set(export)
    # One AdamW step of lr 5e-6 moved the weights: a load that changed nothing would fail below.
    moved = [name for name, p in params.items() if not p.equal(export[name])]
    assert len(moved) > len(params) // 2, f"{len(moved)} of {len(params)} tensors trained"
    load_sharded_model(model, ckpt)
    differ = [name for name, p in params.items() if not p.equal(export[name])]
    assert not differ, differ[:5]
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied after the load


def test_the_sharded_checkpoint_loads_as_its_export_on_two_ranks(step1: Path) -> None:
    # What a 2-worker resume does (distributed.Ranks.build), in two processes of this file (see
    # load_on_rank): the shards resharded into FSDP2, gathered back whole, equal the export.
    from dapo_common.util import free_port

    ckpt = step1 / "checkpoints" / "step_1"
    init = f"tcp://127.0.0.1:{free_port()}"
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, str(rank), init, str(ckpt)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=ENV,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=300)[0] for p in ranks]
    finally:
        for p in ranks:  # a rank left waiting for its peer
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, output in zip(ranks, outputs, strict=True):
        assert p.returncode == 0, output[-3000:]
    assert "tensors equal to the export" in outputs[0], outputs[0][-2000:]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_resume_continues_from_step_1(step1: Path, workers: int, tmp_path: Path) -> None:
    # The same step-1 checkpoint for each: the first run's directory copied as it is.
    run = tmp_path / "run"
    shutil.copytree(step1, run)
    done = dapo_train(run, workers=workers, steps=2)
    # One progress line, step 2's: step 1 is not run again.
    assert "step 2/2" in done.stdout and "step 1/2" not in done.stdout, done.stdout
    assert "done: 2 steps" in done.stdout, done.stdout
    first = read_jsonl(step1 / "metrics.jsonl")
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0] == first[0]  # step 1's row as the first run wrote it, not recomputed
    # The counters go on from the checkpoint's (a resume from step 0 would restart them).
    before, after = first[0]["metrics"], rows[1]["metrics"]
    assert after["progress/rollout_step"] == 2 and after["progress/gen_batches"] == 2
    assert after["progress/grad_updates"] == before["progress/grad_updates"] + 1
    assert after["progress/tokens"] > before["progress/tokens"]
    # Step 0's evaluation is the first run's; the resume evaluates its last step only.
    assert [e["step"] for e in read_jsonl(run / "evaluations.jsonl")] == [0, 1, 2]
    assert [s["step"] for s in read_jsonl(run / "samples.jsonl")] == [1, 2]
    from dapo_core.train.checkpoint import is_sharded, latest_checkpoint

    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.name == "step_2"
    assert is_sharded(ckpt) == (workers == 2)  # each number of workers writes its own kind
    assert (ckpt / "model" / "model.safetensors").is_file()  # exported: the run's last step
    assert (run / "checkpoints" / "step_1").is_dir()  # a resume keeps what it started from


def load_on_rank(rank: int, init_method: str, ckpt: Path) -> None:
    """Rank `rank` of 2: the masters sharded and the checkpoint loaded as distributed.Ranks
    builds them for the hf engine; rank 0 compares the gathered weights with the export."""
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file

    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.train.checkpoint import load_checkpoint_config, load_sharded_model
    from dapo_core.train.collective import full_tensor
    from dapo_core.train.distributed import init_distributed, shard_policy
    from dapo_core.train.policy import compute_dtype
    from dapo_core.train.run_dir import MODEL_DIR
    from dapo_core.train.runner import load_masters

    torch.set_num_threads(1)
    cfg = ExperimentConfig.from_dict(load_checkpoint_config(ckpt))
    device = init_distributed(rank, 2, init_method, device="cpu", timeout_s=300)
    try:
        model, _ = load_masters(cfg, "cpu")
        shard_policy(model, dtype=compute_dtype(cfg.model.dtype), device=device)
        load_sharded_model(model, ckpt)
        export = load_file(str(ckpt / MODEL_DIR / "model.safetensors")) if rank == 0 else {}
        differ: list[str] = []
        names = []
        for name, p in model.named_parameters():  # every rank gathers each, in one order
            whole = full_tensor(p)
            names.append(name)
            if rank == 0 and not whole.equal(export[name]):
                differ.append(name)
        if rank == 0:
            assert set(names) == set(export), set(names) ^ set(export)
            assert not differ, f"{len(differ)} tensors differ from the export: {differ[:5]}"
            print(f"rank 0: {len(names)} tensors equal to the export", flush=True)
    finally:
        dist.destroy_process_group()


# One rank of test_the_sharded_checkpoint_loads_as_its_export_on_two_ranks.
if __name__ == "__main__":
    load_on_rank(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
