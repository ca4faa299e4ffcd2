"""`dapo sweep rm ID [--yes]`, `dapo config --arm NAME`, and `dapo train` with a data set that
does not exist: the console script in a subprocess (or the dispatcher's main()), as a user
runs them, against the dashboard's fixture store."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import dashboard_fixtures as fx
import pytest
import sqlalchemy as sa
from dapo_cli import dapo

from db import cleanup, reads
from db.engine import get_engine
from db.models import EVALUATIONS, METRICS, RUNS, SAMPLES, SWEEPS
from db.store import Store

ROOT = Path(__file__).resolve().parents[2]


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def counts(url: str, sweep_id: int) -> dict[str, int]:
    engine = get_engine(url)
    with engine.connect() as conn:
        runs = sa.select(RUNS.c.id).where(RUNS.c.sweep_id == sweep_id)
        out = {
            "sweeps": conn.execute(
                sa.select(sa.func.count()).select_from(SWEEPS).where(SWEEPS.c.id == sweep_id)
            ).scalar_one(),
            "runs": conn.execute(
                sa.select(sa.func.count()).select_from(RUNS).where(RUNS.c.sweep_id == sweep_id)
            ).scalar_one(),
        }
        for name, table in (
            ("metrics", METRICS),
            ("evaluations", EVALUATIONS),
            ("samples", SAMPLES),
        ):
            out[name] = conn.execute(
                sa.select(sa.func.count()).select_from(table).where(table.c.run_id.in_(runs))
            ).scalar_one()
    return out


@pytest.fixture
def laid_out(tmp_path: Path) -> tuple[fx.FixtureStore, Path, dict[str, Path]]:
    """The fixture store, with the newer sweep's two runs given real run directories: grpo's
    owned by the sweep (OWNER.json), overlong_filter's claiming another sweep; and a
    directory outside the runs root named by one of the older sweep's runs."""
    store = fx.build_store(f"sqlite:///{tmp_path / 'store.db'}")
    root = tmp_path / "runs"
    writer = Store(store.url)
    runs = reads.runs_of_sweep(writer.engine, store.other_sweep_id)
    dirs: dict[str, Path] = {}
    for run in runs.itertuples():
        d = root / "sweep" / f"{run.arm}-run{run.run_id}"
        (d / "checkpoints" / "step_5").mkdir(parents=True)
        (d / "checkpoints" / "step_5" / "model.safetensors").write_bytes(b"0" * 64)
        sweep = store.other_sweep_id if run.arm == "grpo" else store.sweep_id
        owner = {"store": writer.store_id, "sweep": sweep, "arm": run.arm, "seed": int(run.seed)}
        (d / "OWNER.json").write_text(json.dumps(owner))
        writer.update_run(int(run.run_id), checkpoint_dir=str(d))
        dirs[str(run.arm)] = d
    return store, root, dirs


def test_rm_without_yes_lists_and_deletes_nothing(
    laid_out: tuple[fx.FixtureStore, Path, dict[str, Path]],
) -> None:
    store, root, dirs = laid_out
    env = {"DAPO_DB_URL": store.url, "DAPO_RUNS_DIR": str(root)}
    before = counts(store.url, store.other_sweep_id)
    done = dapo("sweep", "rm", str(store.other_sweep_id), **env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"would delete from {store.url}: sweep {store.other_sweep_id} 'tiny-check' (completed): "
        f"2 runs, {before['metrics']:,} metric rows, {before['evaluations']:,} evaluations, "
        f"{before['samples']:,} samples, 2 run directories"
    )
    assert f"  {dirs['grpo']}" in lines
    assert f"  {dirs['overlong_filter']}  (kept: its OWNER.json does not name this sweep)" in lines
    assert lines[-1] == "nothing deleted: run again with --yes to delete it"
    assert counts(store.url, store.other_sweep_id) == before and before["runs"] == 2
    assert dirs["grpo"].exists() and dirs["overlong_filter"].exists()


def test_rm_yes_deletes_the_rows_and_the_sweeps_own_directories(
    laid_out: tuple[fx.FixtureStore, Path, dict[str, Path]],
) -> None:
    store, root, dirs = laid_out
    env = {"DAPO_DB_URL": store.url, "DAPO_RUNS_DIR": str(root)}
    other_before = counts(store.url, store.sweep_id)
    done = dapo("sweep", "rm", str(store.other_sweep_id), "--yes", **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith(f"deleting from {store.url}: sweep ")
    assert (
        done.stdout.splitlines()[-1]
        == f"deleted sweep {store.other_sweep_id} and 1 run directories"
    )
    assert counts(store.url, store.other_sweep_id) == dict.fromkeys(
        ("sweeps", "runs", "metrics", "evaluations", "samples"), 0
    )
    assert counts(store.url, store.sweep_id) == other_before  # the other sweep is untouched
    assert not dirs["grpo"].exists()  # its own directory, checkpoints and all
    assert dirs["overlong_filter"].exists()  # claims another sweep: kept
    again = one_error_line(dapo("sweep", "rm", str(store.other_sweep_id), **env))
    assert again == f"error: no sweep with id {store.other_sweep_id} in {store.url}"


def test_rm_refuses_a_sweep_still_running_and_keeps_dirs_outside_the_root(tmp_path: Path) -> None:
    store = fx.build_store(f"sqlite:///{tmp_path / 'store.db'}")
    env = {"DAPO_DB_URL": store.url, "DAPO_RUNS_DIR": str(tmp_path / "runs")}
    running = store.run_ids[fx.RUNNING]
    line = one_error_line(dapo("sweep", "rm", str(store.sweep_id), "--yes", **env))
    assert line == (
        f"error: sweep {store.sweep_id} has runs still running ({running}): cancel them (or "
        "wait) before removing it"
    )
    assert counts(store.url, store.sweep_id)["runs"] == len(fx.ARMS) * len(fx.SEEDS)
    # A stored directory outside the runs root is never deleted, whatever its OWNER.json says.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    found = cleanup.sweep_footprint(get_engine(store.url), store.sweep_id)
    from flows.sweep_rm import classify

    kept = classify((str(outside),), root=(tmp_path / "runs").resolve(), store_id="x", sweep_id=1)
    assert kept[0].remove is False and kept[0].why.startswith("kept: not inside the runs directory")
    assert found.live_runs == (running,)


def test_rm_bad_input_is_one_line(tmp_path: Path) -> None:
    env = {"DAPO_DB_URL": f"sqlite:///{tmp_path / 'none.db'}"}
    line = one_error_line(dapo("sweep", "rm", "3", **env))
    assert line.startswith("error: no store at ")
    assert not (tmp_path / "none.db").exists()  # a mistyped store is not created
    usage = dapo("sweep", "rm", "zero", **env)  # argparse's one line (OneLineParser)
    assert usage.returncode == 2 and usage.stderr.splitlines() == [
        "dapo sweep rm: error: argument ID: 'zero' is not an integer (see `dapo sweep rm --help`)"
    ]


def test_config_prints_the_resolved_arm_and_its_diff(capsys: pytest.CaptureFixture[str]) -> None:
    from dapo_lab.cli import main

    assert main(["config", "--arm", "clip_higher"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        "arm clip_higher of ladder paper on preset tiny: builds on overlong_filter"
    )
    assert out[2:4] == ["changed from overlong_filter (1 key):", "  algo.clip_high  0.2 -> 0.28"]
    assert "  algo.clip_high = 0.28" in out and "  algo.clip_low = 0.2" in out
    assert any(line.startswith("config (hash ") for line in out)

    # a root that starts from the paper's dapo: its diff is against that arm
    assert main(["config", "--arm", "tis", "--ladder", "beyond-dapo", "--diff-only"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "builds on dapo;" in out[0] or "builds on dapo (paper)" in out[0]
    assert '  algo.rollout_correction  "none" -> "tis"' in out
    assert not any(line.startswith("config (hash") for line in out)


def test_config_bad_arm_is_one_line(tmp_path: Path) -> None:
    line = one_error_line(dapo("config", "--arm", "nosuch"))
    assert line == (
        "error: unknown arm 'nosuch': choose one of grpo, overlong_filter, clip_higher, "
        "soft_punish, token_loss, dapo"
    )
    assert "unknown ladder" in one_error_line(dapo("config", "--arm", "x", "--ladder", "zz"))


def test_train_with_no_such_data_leaves_no_directory(tmp_path: Path) -> None:
    done = dapo("train", "--data", "nosuch", "--steps", "1", cwd=tmp_path)
    line = one_error_line(done)
    assert line.startswith("error: unknown data set 'nosuch'")
    assert list(tmp_path.iterdir()) == []  # no runs/, no run directory
    # an --out given inside a directory that exists: only what the run made goes
    done = dapo("train", "--data", "nosuch", "--out", str(tmp_path / "a" / "b"))
    assert done.returncode == 2 and list(tmp_path.iterdir()) == []
