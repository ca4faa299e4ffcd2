"""Bad input is one line and exit 2 before anything is written: a model directory whose
config.json is not a model config, a sharded checkpoint that lost a shard, and a run whose
`latest` pointer is damaged (it used to read as "no checkpoint", and the run started over).

Real files throughout: real DCP shards written by torch, real run directories, the `dapo`
console script.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from dapo_cli import dapo
from tokenizers import Tokenizer, models

from dapo_core.train import safe_dcp
from dapo_core.train.run_dir import (
    CHECKPOINTS,
    LATEST,
    OWNER_FILE,
    SHARDS_DIR,
    STATE_FILE,
    check_resumable_dir,
    latest_checkpoint,
    latest_step,
)

ROOT = Path(__file__).resolve().parents[2]
OWNER = {"store": "s", "sweep": 1, "arm": "grpo", "seed": 0, "config_hash": "h"}


# --- dapo train --model DIR with a bad config.json -------------------------------------------


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("[1, 2]", "not a model config (a JSON object)"),
        ('{"vocab_size": 10}', "model_type None is not one transformers knows"),
        ('{"model_type": "no_such_arch"}', "model_type 'no_such_arch' is not one"),
        ('{"model_type": "llama", "vocab_size": "many"}', "vocab_size 'many' is not a positive"),
    ],
)
def test_a_model_directory_with_a_bad_config_is_one_line_before_anything_is_written(
    tmp_path: Path, config: str, said: str
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(config)
    (model / "model.safetensors").write_bytes(b"")
    # A real tokenizer, so that only the config is wrong (3 tokens: fits any vocabulary).
    vocab = {"a": 0, "b": 1, "[UNK]": 2}
    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(model / "tokenizer.json"))
    out = tmp_path / "out"
    result = dapo(
        *("train", "--model", str(model), "--steps", "1", "--out", str(out)),
        cwd=tmp_path,
        DAPO_RUNS_DIR=str(tmp_path / "runs"),
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and str(model / "config.json") in lines[0], lines
    assert not out.exists()  # nothing was written


# --- a sharded checkpoint with a missing shard -------------------------------------------------


def _sharded_run(run: Path, step: int = 2) -> Path:
    """A run directory owned by OWNER whose `latest` names a sharded checkpoint (real DCP)."""
    ckpt = run / CHECKPOINTS / f"step_{step}"
    (ckpt / SHARDS_DIR).mkdir(parents=True)
    torch.save({"rollout_step": step}, ckpt / STATE_FILE)
    with pytest.warns(UserWarning, match="torch.distributed is disabled"):
        dcp.save({"w": torch.arange(6, dtype=torch.float32)}, checkpoint_id=str(ckpt / SHARDS_DIR))
    (run / CHECKPOINTS / LATEST).write_text(ckpt.name)
    (run / OWNER_FILE).write_text(json.dumps(OWNER))
    return ckpt


def test_a_missing_shard_is_named_before_the_resume_starts(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = runs / "run"
    ckpt = _sharded_run(run)
    assert check_resumable_dir(run, OWNER, runs) == run.resolve()  # whole: resumable
    shard = next(p for p in (ckpt / SHARDS_DIR).iterdir() if p.suffix == ".distcp")
    shard.unlink()
    # The flows' check before the new attempt's first row (flows/arm.py) ...
    with pytest.raises(ValueError, match=f"missing its shard file {shard.name}") as caught:
        check_resumable_dir(run, OWNER, runs)
    assert "\n" not in str(caught.value)
    # ... and the trainer's own load say the same, not DCP's report from inside the load.
    with pytest.raises(safe_dcp.MissingShard, match=shard.name):
        safe_dcp.load({"w": torch.zeros(6)}, ckpt / SHARDS_DIR)


# --- a damaged `latest` pointer ----------------------------------------------------------------


@pytest.mark.parametrize("damage", ["missing_step", "no_state", "directory", "garbage"])
def test_a_damaged_latest_pointer_is_said_not_started_over(tmp_path: Path, damage: str) -> None:
    run = tmp_path / "run"
    ckpt = _sharded_run(run)
    pointer = run / CHECKPOINTS / LATEST
    if damage == "missing_step":
        pointer.write_text("step_7")  # a checkpoint that is not there
    elif damage == "no_state":
        (ckpt / STATE_FILE).unlink()  # a checkpoint that is not whole
    elif damage == "directory":
        pointer.unlink()
        pointer.mkdir()
    else:
        pointer.write_bytes(b"\xff\xfe\x00junk")
    for read in (latest_checkpoint, latest_step):
        with pytest.raises(ValueError, match="damaged") as caught:
            read(run)  # used to be None: "no checkpoint", and the run started over
        assert "\n" not in str(caught.value) and str(run) in str(caught.value)
    with pytest.raises(ValueError, match="damaged"):
        check_resumable_dir(run, OWNER, tmp_path)


def test_no_pointer_yet_is_no_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / CHECKPOINTS).mkdir(parents=True)
    assert latest_checkpoint(run) is None and latest_step(run) is None
