"""Issue 21 item 6: a resume reads nothing from outside its run directory.

Crafted directories: a `checkpoints/` folder that is a symlink to another run's checkpoints, and
sharded checkpoints whose DCP metadata names a shard file by `../` or by an absolute path (the
outside file holds real, loadable shard bytes, so without the check the load would succeed).
Each is refused with one line naming what it refused.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dapo_core.train import safe_dcp
from dapo_core.train.checkpoint import resolve_checkpoint
from dapo_core.train.run_dir import CHECKPOINTS, LATEST, STATE_FILE, latest_checkpoint


def _run_with_checkpoint(run: Path, step: int = 2) -> Path:
    ckpt = run / CHECKPOINTS / f"step_{step}"
    ckpt.mkdir(parents=True)
    torch.save({"rollout_step": step}, ckpt / STATE_FILE)
    (run / CHECKPOINTS / LATEST).write_text(ckpt.name)
    return ckpt


def test_a_checkpoints_symlink_out_of_the_run_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "other_run"
    _run_with_checkpoint(elsewhere)
    run = tmp_path / "run"
    run.mkdir()
    (run / CHECKPOINTS).symlink_to(elsewhere / CHECKPOINTS, target_is_directory=True)
    for read in (latest_checkpoint, resolve_checkpoint):
        with pytest.raises(ValueError, match=r"is a symlink to .*outside the run directory") as e:
            read(run)
        assert "\n" not in str(e.value)


def test_a_checkpoints_symlink_inside_the_run_is_followed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ckpt = _run_with_checkpoint(run / "kept")
    (run / CHECKPOINTS).symlink_to(Path("kept") / CHECKPOINTS, target_is_directory=True)
    found = latest_checkpoint(run)
    assert found is not None and found.resolve() == ckpt.resolve()


def _dcp_dir(path: Path) -> dict[str, torch.Tensor]:
    state = {"w": torch.arange(6, dtype=torch.float32)}
    with pytest.warns(UserWarning, match="torch.distributed is disabled"):
        dcp.save(state, checkpoint_id=str(path))
    return state


def _point_shards_at(path: Path, target: str) -> None:
    """Rewrite the metadata so that every shard is read from `target` (as DCP would open it)."""
    meta = path / ".metadata"
    metadata = pickle.loads(meta.read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = target
    meta.write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_a_shard_path_out_of_the_checkpoint_is_refused(tmp_path: Path, how: str) -> None:
    ckpt = tmp_path / "run" / CHECKPOINTS / "step_2" / "dcp"
    _dcp_dir(ckpt)
    shard = next(p for p in ckpt.iterdir() if p.suffix == ".distcp")
    outside = tmp_path / "outside.distcp"  # loadable bytes, outside the run directory
    shutil.move(shard, outside)
    target = "../../../../outside.distcp" if how == "dotdot" else str(outside)
    assert (ckpt / target).resolve() == outside.resolve()
    _point_shards_at(ckpt, target)
    state = {"w": torch.zeros(6)}
    with pytest.raises(safe_dcp.UnsafeCheckpoint, match=r"names the shard file .*outside") as e:
        safe_dcp.load(state, ckpt)
    assert "\n" not in str(e.value) and "outside.distcp" in str(e.value)
    assert torch.equal(state["w"], torch.zeros(6))  # nothing was read
    with pytest.raises(safe_dcp.UnsafeCheckpoint):
        safe_dcp.read_metadata(ckpt)  # what load_sharded_optimizer reads first


def test_a_plain_sharded_checkpoint_still_loads(tmp_path: Path) -> None:
    ckpt = tmp_path / "dcp"
    saved = _dcp_dir(ckpt)
    state = {"w": torch.zeros(6)}
    safe_dcp.load(state, ckpt)
    assert torch.equal(state["w"], saved["w"])
