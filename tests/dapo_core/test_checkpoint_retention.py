"""Issue 22 item 5: checkpoints are deleted as a run goes, and the HF export of N workers is
written at the end and on demand only.

Kept: the last run.keep_checkpoints (default 2), the best held-out evaluation's (checkpoints/
best.json, across resumes), the one `latest` names and the one a resume started from. Checked
on crafted directories (the rule itself), on whole one-worker runs with a resume, and on a
two-worker run (sharded checkpoints: model/ only in the last, written on demand for another).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from test_runner import ListSink, small

from dapo_core.setup.config import ConfigError, ExperimentConfig
from dapo_core.train.checkpoint import (
    BEST,
    ensure_export,
    is_sharded,
    load_sharded_model,
    retain_checkpoints,
)
from dapo_core.train.run_dir import CHECKPOINTS, LATEST, STATE_FILE, has_export
from dapo_core.train.runner import load_checkpoint_policy, load_masters, train

pytestmark = pytest.mark.timeout(600)


def steps_on_disk(run: Path) -> list[int]:
    root = run / CHECKPOINTS
    return sorted(int(p.name[5:]) for p in root.iterdir() if p.name.startswith("step_"))


def _save(root: Path, step: int) -> Path:
    """What save_checkpoint leaves: step_<N> in place, then `latest` naming it."""
    path = root / f"step_{step}"
    path.mkdir(parents=True)
    torch.save({"rollout_step": step}, path / STATE_FILE)
    (root / LATEST).write_text(path.name)
    return path


def test_the_last_k_the_best_latest_and_the_resumed_one_are_kept(tmp_path: Path) -> None:
    root = tmp_path / CHECKPOINTS
    scores = {2: 0.5, 4: 0.3, 6: 0.4}  # held-out avg@k where an evaluation ran
    for step in (1, 2, 3):
        retain_checkpoints(_save(root, step), keep=2, score=scores.get(step))
    assert steps_on_disk(tmp_path) == [2, 3]  # step 1: neither recent nor the best
    resumed = root / "step_3"  # a new start resumes here
    in_progress = root / ".step_7.x1y2"  # another save's temporary directory: never touched
    in_progress.mkdir()
    for step in (4, 5, 6):
        deleted = retain_checkpoints(
            _save(root, step), keep=2, score=scores.get(step), resumed_from=resumed
        )
        assert all(p.name.startswith("step_") for p in deleted)
    # Last 2 (5, 6), the best (2: 0.5 beats 0.3 and 0.4), the resumed-from (3); 1 and 4 gone.
    assert steps_on_disk(tmp_path) == [2, 3, 5, 6]
    assert json.loads((root / BEST).read_text()) == {"step": 2, "score": 0.5}
    assert in_progress.is_dir()
    # `latest` is kept even when it is not among the most recent (a newer directory that a
    # killed save renamed into place before it could move the pointer).
    newer = _save(root, 8)
    (root / LATEST).write_text("step_3")
    retain_checkpoints(newer, keep=1)
    assert steps_on_disk(tmp_path) == [2, 3, 8]
    # A better score moves the best; the old best then goes like any other.
    retain_checkpoints(_save(root, 9), keep=1, score=0.9)
    assert json.loads((root / BEST).read_text()) == {"step": 9, "score": 0.9}
    assert steps_on_disk(tmp_path) == [9]


def test_keep_zero_keeps_every_checkpoint_and_negative_is_refused(tmp_path: Path) -> None:
    root = tmp_path / CHECKPOINTS
    for step in range(1, 6):
        assert retain_checkpoints(_save(root, step), keep=0) == []
    assert steps_on_disk(tmp_path) == [1, 2, 3, 4, 5]
    assert ExperimentConfig().run.keep_checkpoints == 2
    with pytest.raises(ConfigError, match=r"^run.keep_checkpoints=-1 must be >= 0.*0 keeps every"):
        ExperimentConfig().with_overrides({"run.keep_checkpoints": -1})


def test_a_run_keeps_its_last_checkpoints_and_its_best_across_a_resume(tmp_path: Path) -> None:
    every = {
        "run.checkpoint_every": 1,
        "data.eval_every": 1,
        "run.keep_checkpoints": 1,
        "data.eval_problems": 4,
    }
    first = ListSink()
    train(small("grpo", **{**every, "run.steps": 2}), sink=first, out_dir=tmp_path)
    scores = {s: first.evaluations[s]["avg_at_k"] for s in (1, 2)}
    best = max(scores, key=lambda s: (scores[s], -s))  # the first of equal scores stays best
    assert steps_on_disk(tmp_path) == sorted({best, 2})
    recorded = json.loads((tmp_path / CHECKPOINTS / BEST).read_text())
    assert recorded == {"step": best, "score": scores[best]}

    # Resumed at step 2 and run to 3, keeping 1: step_2 (resumed from) stays to the end.
    second = ListSink()
    train(small("grpo", **{**every, "run.steps": 3}), sink=second, out_dir=tmp_path)
    scores[3] = second.evaluations[3]["avg_at_k"]
    best = max(scores, key=lambda s: (scores[s], -s))
    assert steps_on_disk(tmp_path) == sorted({best, 2, 3})
    assert (tmp_path / CHECKPOINTS / LATEST).read_text() == "step_3"
    assert json.loads((tmp_path / CHECKPOINTS / BEST).read_text())["step"] == best


def test_two_workers_export_the_last_checkpoint_and_others_on_demand(tmp_path: Path) -> None:
    from dapo_core.train.distributed import launch_local
    from dapo_core.train.sinks import JsonlSink

    cfg = small("grpo", **{"run.steps": 3, "run.checkpoint_every": 1})
    launch_local(
        cfg, out_dir=tmp_path, workers=2, sink_factory=functools.partial(JsonlSink, tmp_path)
    )
    assert steps_on_disk(tmp_path) == [2, 3]  # the default keeps 2
    middle, last = tmp_path / CHECKPOINTS / "step_2", tmp_path / CHECKPOINTS / "step_3"
    assert is_sharded(middle) and is_sharded(last)
    assert has_export(last) and not has_export(middle)
    # On demand: `dapo eval` of step 2 exports it from dcp/ first, equal to its masters.
    model, _ = load_checkpoint_policy(middle, cfg, "cpu")
    assert has_export(middle) and ensure_export(middle, cfg.model) == middle / "model"
    masters, _ = load_masters(cfg, "cpu")
    load_sharded_model(masters, middle)
    want = dict(masters.named_parameters())
    for name, p in model.named_parameters():
        assert p.equal(want[name].to(p.dtype)), name
