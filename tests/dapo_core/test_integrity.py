"""Issue-14 items of the trainer side: nothing lost or wrong, no code run from a checkpoint.

Each test reproduces a failure seen on an earlier build: a torn JSON line that swallowed a step,
a NaN update applied and a traceback one step later, a checkpoint that ran code when loaded, a
`latest` pointer that led outside the run, `--set algo.clip_high=inf` accepted.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from dapo_core.train.checkpoint import (
    load_sharded_model,
    load_sharded_optimizer,
    load_trainer_state,
)
from dapo_core.train.run_dir import (
    SHARDS_DIR,
    NotOwner,
    check_resumable_dir,
    claim,
    latest_checkpoint,
    latest_step,
)
from dapo_core.train.safe_dcp import UnsafeCheckpoint
from dapo_core.train.sinks import EVALUATIONS_FILE, METRICS_FILE, JsonlSink, repair_torn_tail

ROOT = Path(__file__).resolve().parents[2]
DAPO = [sys.executable, "-m", "dapo_lab.cli"]


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


# --- 2. a run killed mid-write -------------------------------------------------------------------
def test_a_torn_last_line_is_cut_before_the_resumed_run_appends(tmp_path: Path) -> None:
    with JsonlSink(tmp_path) as sink:
        for step in (1, 2):
            sink.log_metrics(step, {"acc/mean": 0.5})
    # A kill in the middle of step 3's write leaves half a line without its newline.
    with (tmp_path / METRICS_FILE).open("a") as handle:
        handle.write('{"step": 3, "metrics": {"acc/me')
    with JsonlSink(tmp_path) as sink:  # the resumed run replays step 3, then goes on
        for step in (3, 4):
            sink.log_metrics(step, {"acc/mean": 0.5})
    # Before the repair the resumed step-3 line was glued to the torn one and a reader
    # dropped it: steps [1, 2, 4].
    assert _steps(tmp_path / METRICS_FILE) == [1, 2, 3, 4]


def test_steps_replayed_after_a_resume_replace_the_killed_trys_records(tmp_path: Path) -> None:
    """A try killed at step 6 after its checkpoint at 4: the resumed try replays 5 and 6, and
    each file still holds one record per step, the replayed values."""
    with JsonlSink(tmp_path) as sink:
        sink.log_evaluation(0, {"avg_at_k": 0.1})
        for step in range(1, 7):
            sink.log_metrics(step, {"acc/mean": 0.0})
    with JsonlSink(tmp_path) as sink:  # resumed from step 4's checkpoint
        for step in range(5, 9):
            sink.log_metrics(step, {"acc/mean": 1.0})
        sink.log_evaluation(8, {"avg_at_k": 0.2})
    assert _steps(tmp_path / METRICS_FILE) == list(range(1, 9))
    values = [json.loads(line)["metrics"]["acc/mean"] for line in (tmp_path / METRICS_FILE).open()]
    assert values == [0.0] * 4 + [1.0] * 4
    assert _steps(tmp_path / EVALUATIONS_FILE) == [0, 8]


def test_repair_keeps_a_complete_file_and_empties_a_file_of_one_torn_line(tmp_path: Path) -> None:
    whole = tmp_path / "whole.jsonl"
    whole.write_text('{"a": 1}\n{"a": 2}\n')
    assert repair_torn_tail(whole) == 0 and whole.read_text() == '{"a": 1}\n{"a": 2}\n'
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"a": ' + "x" * 100_000)  # longer than one read block, no newline
    assert repair_torn_tail(torn) == 100_006 and torn.read_text() == ""


# --- 4. non-finite updates ----------------------------------------------------------------------
def test_a_huge_learning_rate_stops_with_one_line_and_keeps_its_metrics(tmp_path: Path) -> None:
    """At lr 1e30 the first update wrecks the weights: the next forwards give NaN, and those
    updates are skipped and counted instead of applied; after optim.max_nonfinite_updates in
    a row the run stops with one line (exit 2), and the step's metrics are on disk. Earlier
    builds applied the NaN update and died with a torch traceback at the next step."""
    out = tmp_path / "run"
    done = subprocess.run(
        [
            *DAPO,
            "train",
            "--preset",
            "tiny",
            "--arm",
            "grpo",
            "--steps",
            "4",
            "--quiet",
            "--out",
            str(out),
            "--set",
            "optim.lr=1e30",
            "--set",
            "data.eval_problems=4",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "training diverged at step 1" in errors[0]
    assert "Traceback" not in done.stderr
    record = json.loads((out / METRICS_FILE).read_text().splitlines()[-1])
    assert record["step"] == 1 and record["metrics"]["optim/nonfinite_skipped"] >= 3


# --- 7. no code from a checkpoint ----------------------------------------------------------------
class _Payload:
    """Unpickling this would create a file: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (self.marker,))


def test_a_crafted_trainer_state_is_refused_without_running_its_code(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints" / "step_1"
    ckpt.mkdir(parents=True)
    marker = tmp_path / "pwned"
    torch.save({"version": 2, "evil": _Payload(marker)}, ckpt / "trainer_state.pt")
    with pytest.raises(ValueError, match="more than tensors and plain data"):
        load_trainer_state(ckpt)
    assert not marker.exists()
    # Proof that the file really carries code: an unsafe load runs it.
    torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert marker.exists()


def _sharded_checkpoint(ckpt: Path, evil_lr: object = None) -> tuple[nn.Module, Any]:
    """A real one-process DCP checkpoint of a small model and its AdamW states under ckpt/dcp;
    with `evil_lr`, the optimizer's learning rate is that object (DCP saves it as a byte item)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    optim = get_optimizer_state_dict(model, optimizer)
    if evil_lr is not None:
        optim["param_groups"][0]["lr"] = evil_lr
    dcp.save(
        {"model": get_model_state_dict(model), "optim": optim},
        checkpoint_id=str(ckpt / SHARDS_DIR),
    )
    return model, optimizer


def test_a_crafted_sharded_checkpoint_is_refused_without_running_its_code(tmp_path: Path) -> None:
    """torch's own DCP reader unpickles .metadata and byte items with full pickle; ours reads
    a real checkpoint the same and refuses one that carries code, before the code runs."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    ckpt = tmp_path / "step_1"
    model, optimizer = _sharded_checkpoint(ckpt)
    fresh = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    load_sharded_model(fresh, ckpt)
    load_sharded_optimizer(fresh, fresh_opt, ckpt)
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    saved, loaded = (
        get_optimizer_state_dict(m, o) for m, o in ((model, optimizer), (fresh, fresh_opt))
    )
    assert loaded["param_groups"] == saved["param_groups"]
    assert all(
        torch.equal(saved["state"][k]["exp_avg"], loaded["state"][k]["exp_avg"])
        for k in saved["state"]
    )

    # 1. .metadata replaced by a pickle that runs code.
    marker = tmp_path / "pwned-metadata"
    (ckpt / SHARDS_DIR / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(UnsafeCheckpoint, match=r"\.metadata names pathlib\.Path\.touch"):
        load_sharded_model(fresh, ckpt)
    assert not marker.exists()

    # 2. a byte item (the optimizer's learning rate) that runs code when torch.load-ed unsafely.
    marker = tmp_path / "pwned-bytes"
    evil = tmp_path / "step_2"
    _sharded_checkpoint(evil, evil_lr=_Payload(marker))
    assert not marker.exists()
    with pytest.raises(UnsafeCheckpoint, match="refusing checkpoint item optim"):
        load_sharded_optimizer(fresh, fresh_opt, evil)
    assert not marker.exists()
    # Proof that the checkpoint really carries code: torch's own reader runs it.
    import torch.distributed.checkpoint as dcp

    dcp.load(
        {"optim": get_optimizer_state_dict(fresh, fresh_opt)}, checkpoint_id=str(evil / SHARDS_DIR)
    )
    assert marker.exists()


def test_a_latest_pointer_cannot_lead_outside_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    elsewhere = tmp_path / "elsewhere" / "step_9"
    elsewhere.mkdir(parents=True)
    (elsewhere / "trainer_state.pt").write_bytes(pickle.dumps({}))
    (run / "checkpoints").mkdir(parents=True)
    for pointer in ("../elsewhere/step_9", "/etc", "step_9/../../elsewhere/step_9"):
        (run / "checkpoints" / "latest").write_text(pointer)
        for read in (latest_checkpoint, latest_step):  # said, never taken for "none yet"
            with pytest.raises(ValueError, match="not a step_<N> checkpoint"):
                read(run)
    # A step_N that is a symlink out of the run is refused too.
    (run / "checkpoints" / "step_9").symlink_to(elsewhere)
    (run / "checkpoints" / "latest").write_text("step_9")
    with pytest.raises(ValueError, match="outside the run directory"):
        latest_checkpoint(run)


def test_a_resume_reads_only_a_directory_inside_the_runs_dir_that_names_the_run(
    tmp_path: Path,
) -> None:
    """The directory a resume reads comes from the store: before its spill file or its
    checkpoint is read, it must lie inside DAPO_RUNS_DIR and its OWNER.json name this run."""
    mine = {"store": "a1", "sweep": 1, "arm": "grpo", "seed": 0, "config_hash": "h"}
    runs = tmp_path / "runs"
    run = runs / "a1" / "sweep-1" / "grpo-s0-h-run1"
    claim(run, mine)
    assert check_resumable_dir(run, mine, runs) == run.resolve()
    with pytest.raises(NotOwner, match=r"does not belong to this run"):
        check_resumable_dir(run, {**mine, "seed": 1}, runs)
    elsewhere = tmp_path / "elsewhere"
    claim(elsewhere, mine)  # a planted directory with a copied marker
    with pytest.raises(NotOwner, match=r"outside the runs directory"):
        check_resumable_dir(elsewhere, mine, runs)
    with pytest.raises(NotOwner, match=r"outside the runs directory"):
        check_resumable_dir(runs / ".." / "elsewhere", mine, runs)
    unmarked = runs / "old"
    (unmarked / "checkpoints").mkdir(parents=True)
    with pytest.raises(NotOwner, match=r"does not belong to this run"):
        check_resumable_dir(unmarked, mine, runs)


def test_a_directory_owned_by_another_run_is_refused(tmp_path: Path) -> None:
    mine = {"store": "a1", "sweep": 1, "arm": "grpo", "seed": 0, "config_hash": "h"}
    claim(tmp_path / "run", mine)
    claim(tmp_path / "run", dict(mine))  # the same job again (a retry): fine
    with pytest.raises(NotOwner, match=r"store='a1'.*store='b2'"):
        claim(tmp_path / "run", {**mine, "store": "b2"})
    unowned = tmp_path / "old"
    (unowned / "checkpoints").mkdir(parents=True)
    with pytest.raises(NotOwner, match=r"no OWNER\.json"):
        claim(unowned, mine)


# --- 11. non-finite configuration values --------------------------------------------------------
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_non_finite_values_are_one_line_and_exit_2(value: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *DAPO,
            "train",
            "--steps",
            "1",
            "--out",
            str(tmp_path),
            "--set",
            f"algo.clip_high={value}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: algo.clip_high={float(value)}: must be a finite number"
    assert not (tmp_path / METRICS_FILE).exists()


# --- issue 21.11: a damaged JSON-lines file is named, not a JSONDecodeError -------------------
@pytest.mark.parametrize(
    ("bad", "what"),
    [(b"\0" * 64 + b"\n", "NUL bytes"), (b"not json\n", "not a JSON record with a step")],
)
def test_a_damaged_line_names_the_file_and_line_when_the_sink_opens(
    tmp_path: Path, bad: bytes, what: str
) -> None:
    with JsonlSink(tmp_path) as sink:
        sink.log_metrics(1, {"acc/mean": 0.5})
    with (tmp_path / METRICS_FILE).open("ab") as handle:
        handle.write(bad)  # a crash left a block of NULs where step 2's record was
        handle.write(b'{"step": 3, "metrics": {"acc/mean": 0.5}}\n')
    before = (tmp_path / METRICS_FILE).read_bytes()
    with pytest.raises(ValueError) as err:
        JsonlSink(tmp_path)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / METRICS_FILE}: line 2 is {what}")
    assert "\n" not in message
    assert (tmp_path / METRICS_FILE).read_bytes() == before  # nothing rewritten around it
