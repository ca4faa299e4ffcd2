"""The smaller items of issue 41 that are not the dashboard's, each as a user meets it: the
Prefect table artifact says "no interval" once, not in every cell; the mechanism artifact
gives an arm's changes once; `dapo aa` fits $COLUMNS and calls no 95% floor of 3 splits; `dapo
sweep rm` leaves no empty directory (nor the sweep's TensorBoard folders); `dapo tag --remove`
of a tag the target lacks says so; `dapo serve` prints its store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dashboard_fixtures as fx
import pytest

from db.store import Store

ROOT = Path(__file__).resolve().parents[2]
DAPO = str(Path(sys.executable).parent / "dapo")


def dapo(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "DAPO_DEBUG"}
    return subprocess.run(
        [DAPO, *args],
        capture_output=True,
        text=True,
        env={**environ, **env},
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> fx.FixtureStore:
    return fx.build_store(f"sqlite:///{tmp_path_factory.mktemp('small') / 'store.db'}")


# --- the Prefect artifacts ------------------------------------------------------------------------
def test_the_table_artifact_says_no_interval_once(store: fx.FixtureStore) -> None:
    """The one-seed sweep's artifact, published to the session's Prefect server and read back."""
    import prefect_server
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows import plan
    from flows.publish import publish_sweep

    api = os.environ["PREFECT_API_URL"]
    with temporary_settings(updates={PREFECT_API_URL: api}):
        rows = publish_sweep(store.url, store.other_sweep_id)
    assert rows and all("no interval" not in cell for row in rows for cell in row.values())
    assert rows[0]["final"].replace(".", "").isdigit(), rows[0]  # a bare number
    key = plan.artifact_key("ablation-table", store.other_sweep_id)
    with prefect_server.client(api) as client:
        (latest, *_) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    assert latest.description.count("no interval") == 1, latest.description
    assert "no interval" not in json.dumps(latest.data)


def test_the_mechanism_artifact_gives_an_arms_changes_once(store: fx.FixtureStore) -> None:
    from db.mechanisms import DITTO
    from flows.publish import mechanisms_markdown

    text = mechanisms_markdown(store.url, store.sweep_id)
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ")
    ]
    head, body = rows[0], rows[1:]
    arm, changes = head.index("arm"), head.index("changes")
    per_arm: dict[str, list[str]] = {}
    for row in body:
        per_arm.setdefault(row[arm], []).append(row[changes])
    many = {a: cells for a, cells in per_arm.items() if len(cells) > 1}
    assert many, per_arm  # the fixture has arms with several metric rows
    for cells in many.values():
        assert cells[0] != DITTO and set(cells[1:]) == {DITTO}, cells


# --- dapo aa ----------------------------------------------------------------------------------------
def _aa_sweep(url: str, finals: list[float]) -> int:
    from store_runs import new_attempt

    st = Store(url)
    sweep_id = st.create_sweep(
        name="aa",
        preset="tiny",
        arms=["grpo"],
        seeds=list(range(len(finals))),
        base_config={},
        ladder=[{"arm": "grpo"}],
    )
    for seed, final in enumerate(finals):
        run_id = new_attempt(st, sweep_id, "grpo", seed, config_hash="grpo")
        with st.sink(run_id) as sink:
            for step, score in ((0, 0.1), (4, final)):
                sink.log_evaluation(step, {"dataset": "arith", "k": 4, "avg_at_k": score})
        st.update_run(run_id, status="completed", steps=5)
    return sweep_id


def test_dapo_aa_fits_columns_and_calls_no_floor_of_three_splits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    _aa_sweep(url, [0.1, 0.2, 0.3, 0.6])
    done = dapo("aa", "--store", url, COLUMNS="60")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 60, lines
    text = " ".join(" ".join(lines).split())
    assert "over all 3 ways to halve these seeds the halves' means differ by up to 30.0" in text
    assert "3 ways are too few for a 95% floor (it takes 20" in text
    assert "in 95% of them" not in text
    wide = dapo("aa", "--store", url, COLUMNS="200")
    assert max(len(line) for line in wide.stdout.splitlines()) > 100


def test_dapo_aa_of_eight_seeds_gives_the_95_floor(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    _aa_sweep(url, [0.1 * s for s in range(8)])
    done = dapo("aa", "--store", url, COLUMNS="200")
    assert done.returncode == 0, done.stderr
    assert "over all 35 ways" in done.stdout and "in 95% of them" in done.stdout


# --- dapo sweep rm -------------------------------------------------------------------------------
def test_sweep_rm_leaves_no_empty_directory(tmp_path: Path) -> None:
    from flows import plan

    fixture = fx.build_store(f"sqlite:///{tmp_path / 'store.db'}")
    st = Store(fixture.url)
    root = tmp_path / "runs"
    sweep_id = fixture.other_sweep_id
    folders = []
    from db import reads

    for run in reads.runs_of_sweep(st.engine, sweep_id).itertuples():
        d = plan.fresh_run_dir(root, st.store_id, sweep_id, run.arm, int(run.seed), "h", run.run_id)
        (d / "checkpoints").mkdir(parents=True)
        owner = {"store": st.store_id, "sweep": sweep_id, "arm": run.arm, "seed": int(run.seed)}
        (d / "OWNER.json").write_text(json.dumps(owner))
        st.update_run(int(run.run_id), checkpoint_dir=str(d))
        # Its TensorBoard folder, as dapo_core.train.trackers.tensorboard_dirs makes it.
        board = d.parent / "tensorboard" / f"{run.arm}-s{int(run.seed)}"
        board.mkdir(parents=True)
        (board / ".dapo-run").write_text(f"{d.resolve()}\n")
        (board / "events.out.tfevents.1").write_bytes(b"x")
        folders.append(d)
    # Another sweep's run directory in the same store folder stays, and so does that folder.
    other = plan.fresh_run_dir(root, st.store_id, fixture.sweep_id, "grpo", 0, "h", 1)
    other.mkdir(parents=True)
    dry = dapo("sweep", "rm", str(sweep_id), DAPO_DB_URL=fixture.url, DAPO_RUNS_DIR=str(root))
    assert dry.returncode == 0, dry.stderr
    assert sum("(TensorBoard)" in line for line in dry.stdout.splitlines()) == len(folders)
    done = dapo(
        "sweep", "rm", str(sweep_id), "--yes", DAPO_DB_URL=fixture.url, DAPO_RUNS_DIR=str(root)
    )
    assert done.returncode == 0, done.stderr
    sweep_folder = folders[0].parent
    assert not sweep_folder.exists(), sorted(p.name for p in sweep_folder.rglob("*"))
    assert other.is_dir() and sweep_folder.parent.is_dir()  # the store's other sweep stays


# --- dapo tag --remove ---------------------------------------------------------------------------
def test_tag_remove_of_an_absent_tag_says_so(tmp_path: Path) -> None:
    fixture = fx.build_store(f"sqlite:///{tmp_path / 'store.db'}")
    sweep = str(fixture.sweep_id)
    url = fixture.url
    assert dapo("tag", "--sweep", sweep, "baseline", "paper-fig2", "--store", url).returncode == 0
    typo = dapo("tag", "--sweep", sweep, "--remove", "basline", "--store", url)
    assert typo.returncode == 2
    assert typo.stderr.strip() == (
        f"error: sweep {sweep} has no tag 'basline' (its tags: baseline, paper-fig2); "
        "nothing removed"
    )
    some = dapo("tag", "--sweep", sweep, "--remove", "baseline", "basline", "--store", url)
    assert some.returncode == 0, some.stderr
    assert some.stdout.strip() == f"sweep {sweep}: paper-fig2 (it had no tag 'basline')"


# --- dapo serve ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_serve_prints_its_store(tmp_path: Path) -> None:
    """`dapo serve --store URL`, against the session's Prefect server: the banner names the
    store a form without store_url writes to (then Ctrl-C)."""
    url = f"sqlite:///{tmp_path / 'served.db'}"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DAPO_DEBUG")}
    proc = subprocess.Popen(
        [DAPO, "serve", "--store", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "DAPO_RUNS_DIR": str(tmp_path / "runs")},
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            seen.append(line.rstrip())
            if line.startswith("Stop with Ctrl-C") or time.monotonic() > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert f"Store (a form's empty store_url): {url}" in seen, seen
