"""Trackers never fail silently (issue 41.4): which trackers each run reached, with the tracker
run's id and where to look, is in the store and in every summary (`dapo table`, the Prefect
summary, the dashboard's Run page); a backend MLflow refuses is one line before anything is
written; two arms opening a fresh SQLite MLflow store at once both reach it; TensorBoard names a
sweep's runs like the table; MLflow gets each tag once. Real MLflow (skinny), TensorBoard and
W&B libraries of .venv; Trackio is the library that is missing there."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from store_runs import new_attempt

from dapo_common import metric_names as M
from dapo_core.setup import tracker_backends
from dapo_core.setup.config import ConfigError
from dapo_core.setup.ladders import paper_ladder
from dapo_core.train import trackers
from db import tracker_status

ROOT = Path(__file__).resolve().parents[2]
DAPO = str(Path(sys.executable).parent / "dapo")
APP = ROOT / "dashboard" / "app.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "WANDB_"))}
    return {**env, "DAPO_DEBUG": "", **extra}


# --- refused before anything is written ------------------------------------------------------
def test_dapo_train_with_mlflows_file_store_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [
            DAPO,
            "train",
            "--steps=1",
            "--set=run.loggers=mlflow",
            f"--set=run.mlflow_uri={tmp_path / 'mlruns'}",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "MLFLOW_ALLOW_FILE_STORE=true" in lines[0] and "sqlite:///" in lines[0], lines[0]
    assert not out.exists() and not (tmp_path / "mlruns").exists()


def test_dapo_sweep_with_mlflows_file_store_is_one_line_and_creates_no_store(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store.db"
    done = subprocess.run(
        [
            DAPO,
            "sweep",
            "--arms",
            "grpo",
            "--steps",
            "1",
            "--set",
            'run.loggers=["mlflow","tensorboard"]',
            "--store",
            f"sqlite:///{store}",
        ],
        capture_output=True,
        text=True,
        env=_env(
            MLFLOW_TRACKING_URI=f"file://{tmp_path / 'mlruns'}",
            DAPO_RUNS_DIR=str(tmp_path / "runs2"),
        ),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "MLFLOW_TRACKING_URI=file://" in lines[0] and "refuses its file store" in lines[0]
    assert not store.exists() and not (tmp_path / "runs2").exists()
    assert not (tmp_path / "mlruns").exists()


def test_the_check_asks_mlflow_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = paper_ladder().config("grpo", "tiny", {"run.loggers": ["mlflow"]}).to_dict()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    tracker_backends.check_trackers(cfg)  # no URI: a SQLite store in the run directory
    for uri in (str(tmp_path / "mlruns"), f"file://{tmp_path}/mlruns", "nosuch://host/x"):
        cfg["run"]["mlflow_uri"] = uri
        with pytest.raises(ConfigError, match=r"^run\.mlflow_uri="):
            tracker_backends.check_trackers(cfg)
    for uri in (f"sqlite:///{tmp_path}/m.db", "http://127.0.0.1:5000", "postgresql+psycopg://h/db"):
        cfg["run"]["mlflow_uri"] = uri
        tracker_backends.check_trackers(cfg)
    # MLflow's own opt-out is honoured, because MLflow is asked.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    cfg["run"]["mlflow_uri"] = str(tmp_path / "mlruns")
    tracker_backends.check_trackers(cfg)


# --- two arms, one fresh SQLite store -----------------------------------------------------------
def _open_mlflow(uri: str, out_dir: str, arm: str, barrier: Any, results: Any) -> None:
    os.environ["MLFLOW_TRACKING_URI"] = uri
    run = trackers.tracked_run(paper_ladder().config(arm, "tiny").to_dict(), out_dir, {"sweep": 1})
    status: dict[str, dict[str, Any]] = {}
    barrier.wait()  # both open the fresh store at the same moment
    opened = trackers.open_trackers(["mlflow"], run, status)
    for sink in opened.values():
        sink.log_metrics(1, {M.REWARD_MEAN: 0.5})
        sink.close()
    results.put(status["mlflow"])


def test_two_arms_opening_a_fresh_sqlite_mlflow_store_at_once_both_reach_it(
    tmp_path: Path,
) -> None:
    # Without the lock this collided in 3 of 3 tries here ("duplicate column name: step", or
    # alembic's "_alembic_tmp_metrics already exists").
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_open_mlflow, args=(uri, str(tmp_path / arm), arm, barrier, results))
        for arm in ("grpo", "dapo")
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    got = [results.get(timeout=5) for _ in procs]
    assert [g["state"] for g in got] == ["reached", "reached"], got
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dapo-lab")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.tags["arm"] for r in runs) == ["dapo", "grpo"]
    assert {r.info.run_id for r in runs} == {g["run_id"] for g in got}


# --- what a sweep's runs reached, read back everywhere ---------------------------------------------
class Broken:
    """A tracker whose library starts but that fails at its first metric."""

    def __init__(self, run: Any) -> None:
        self.where = {"run_id": "b-1"}

    def log_metrics(self, step: int, metrics: Any) -> None:
        raise RuntimeError("503 from the tracker's server\nsecond line")

    def log_samples(self, step: int, samples: Any) -> None:
        pass

    def log_evaluation(self, step: int, result: Any) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def reached(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A stored sweep of grpo and dapo (seed 0) whose runs log through flows' own sink
    (ray_worker.open_sink: the store, fanned out to run.loggers), each in its run directory
    where a sweep puts it; grpo is then started over in a second directory. W&B stands in for a
    tracker that breaks at its first metric; Trackio is not installed in .venv."""
    from db.store import Store
    from flows import plan
    from flows.ray_worker import open_sink

    tmp = tmp_path_factory.mktemp("reached")
    url = f"sqlite:///{tmp / 'store.db'}"
    store = Store(url)
    sweep = store.create_sweep(
        name="trackers",
        preset="tiny",
        arms=["grpo", "dapo"],
        seeds=[0],
        base_config={},
        ladder=paper_ladder().rows(),
        params={"ladder": "paper"},
    )
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI",)}
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow' / 'mlflow.db'}"
    original = trackers.TRACKERS["wandb"]
    trackers.TRACKERS["wandb"] = Broken
    loggers = ["mlflow", "tensorboard", "wandb", "trackio"]
    runs: dict[str, int] = {}
    dirs: dict[str, Path] = {}
    try:
        for arm in ("grpo", "dapo", "grpo"):
            cfg = paper_ladder().config(arm, "tiny", {"run.steps": 2, "run.loggers": loggers})
            holder: dict[str, Path] = {}

            def fresh(run_id: int, arm: str = arm, cfg: Any = cfg, holder: Any = holder) -> str:
                d = plan.fresh_run_dir(
                    tmp / "runs", store.store_id, sweep, arm, 0, cfg.config_hash(), run_id
                )
                holder["dir"] = d
                return str(d)

            run_id = new_attempt(store, sweep, arm, 0, config=cfg.to_dict(), checkpoint_dir=fresh)
            out = holder["dir"]
            out.mkdir(parents=True)
            owner = {"store": store.store_id, "sweep": sweep, "arm": arm, "seed": 0}
            sink = open_sink(url, run_id, str(out), cfg.to_dict(), owner)
            sink.log_evaluation(0, {"dataset": "synthetic-eval", "k": 2, "avg_at_k": 0.25})
            sink.log_metrics(1, {M.REWARD_MEAN: 0.1})
            sink.log_metrics(2, {M.REWARD_MEAN: 0.2})
            sink.log_evaluation(2, {"dataset": "synthetic-eval", "k": 2, "avg_at_k": 0.5})
            sink.close()
            store.update_run(run_id, status="completed")
            key = arm if arm not in runs else f"{arm}-again"
            runs[key], dirs[key] = run_id, out
    finally:
        trackers.TRACKERS["wandb"] = original
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"url": url, "sweep": sweep, "runs": runs, "dirs": dirs, "tmp": tmp}


def test_each_run_records_which_trackers_it_reached(reached: dict[str, Any]) -> None:
    from db.engine import get_engine

    status = tracker_status.of_runs(get_engine(reached["url"]), reached["runs"].values())
    grpo = status[reached["runs"]["grpo"]]
    assert grpo["mlflow"]["state"] == "reached" and len(grpo["mlflow"]["run_id"]) == 32
    assert grpo["mlflow"]["uri"].endswith("mlflow/mlflow.db")
    sweep_dir = reached["dirs"]["grpo"].parent
    assert grpo["tensorboard"] == {
        "state": "reached",
        "logdir": str(sweep_dir / "tensorboard"),
        "run": "grpo-s0",
    }
    assert grpo["wandb"]["state"] == "dropped" and grpo["wandb"]["run_id"] == "b-1"
    assert grpo["wandb"]["error"] == (
        "log_metrics failed at step 1 (RuntimeError: 503 from the tracker's server)"
    )
    assert grpo["trackio"] == {
        "state": "missing",
        "error": "not installed: pip install 'dapo-lab[trackio]'",
    }
    # The key and states db reads are the ones dapo_core writes.
    assert (tracker_status.KEY, tracker_status.REACHED) == (
        trackers.TRACKERS_KEY,
        trackers.REACHED,
    )


def test_tensorboard_names_a_sweeps_runs_like_the_table(reached: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    logdir = reached["dirs"]["grpo"].parent / "tensorboard"
    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    again = f"grpo-s0-run{reached['runs']['grpo-again']}"
    # The attempt started over in a directory of its own does not write into the first's curves.
    assert sorted(mux.Runs()) == sorted(["grpo-s0", "dapo-s0", again])
    assert [e.step for e in mux.Scalars("dapo-s0", M.REWARD_MEAN)] == [1, 2]


def test_mlflow_gets_each_tag_once(reached: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    from db.engine import get_engine

    status = tracker_status.of_runs(get_engine(reached["url"]), [reached["runs"]["dapo"]])
    record = status[reached["runs"]["dapo"]]["mlflow"]
    client = MlflowClient(tracking_uri=f"sqlite:///{reached['tmp'] / 'mlflow' / 'mlflow.db'}")
    tags = client.get_run(record["run_id"]).data.tags
    ours = {k: v for k, v in tags.items() if not k.startswith("mlflow.")}
    assert ours["arm"] == "dapo" and ours["sweep"] == str(reached["sweep"])
    assert not any(k.startswith("dapo.") for k in ours), sorted(ours)
    wanted = {"arm", "seed", "preset", "config_hash", "sweep", "ladder", "parent", "run_id"}
    assert wanted <= set(ours), sorted(ours)


def test_dapo_table_says_which_trackers_the_runs_reached(reached: dict[str, Any]) -> None:
    done = subprocess.run(
        [DAPO, "table", "--store", reached["url"], "--sweep", str(reached["sweep"])],
        capture_output=True,
        text=True,
        env=_env(COLUMNS="200"),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = {line.split(":", 1)[0]: line for line in done.stdout.splitlines() if "tracker " in line}
    logdir = reached["dirs"]["grpo"].parent / "tensorboard"
    # The newest attempt of each arm × seed: the second grpo and dapo.
    assert lines["tracker tensorboard"] == (
        f"tracker tensorboard: 2 of 2 run(s) reached: tensorboard --logdir {logdir}"
    )
    assert lines["tracker mlflow"].startswith("tracker mlflow: 2 of 2 run(s) reached: 2 places")
    assert lines["tracker wandb"] == (
        "tracker wandb: 0 of 2 run(s) reached; not dapo s0: dropped, log_metrics failed at "
        "step 1 (RuntimeError: 503 from the tracker's server) (and 1 more)"
    )
    assert lines["tracker trackio"].startswith("tracker trackio: 0 of 2 run(s) reached; not ")


def test_the_prefect_summary_lists_the_trackers(reached: dict[str, Any]) -> None:
    from db.engine import get_engine
    from flows.publish import ablation, summary_markdown

    table, sweep = ablation(reached["url"], reached["sweep"])
    lines = tracker_status.of_sweep(get_engine(reached["url"]), reached["sweep"])
    text = summary_markdown(table, sweep, None, {"protocol": ""}, trackers=lines)
    assert "- tracker tensorboard: 2 of 2 run(s) reached" in text
    assert "- tracker trackio: 0 of 2 run(s) reached" in text


def test_the_run_page_shows_its_trackers_with_links(
    reached: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("DAPO_DB_URL", reached["url"])
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=90)
    at.run()
    at.query_params.clear()
    at.query_params.update({"run": str(reached["runs"]["dapo"])})
    at.switch_page("views/run.py").run()
    assert not at.exception, [e.value for e in at.exception]
    (line,) = [m.value for m in at.markdown if str(m.value).startswith("Trackers: ")]
    logdir = reached["dirs"]["dapo"].parent / "tensorboard"
    assert f"tensorboard ✓ (`tensorboard --logdir {logdir} (run dapo-s0)`)" in line
    assert "mlflow ✓ (`run " in line and "mlflow ui --backend-store-uri sqlite:///" in line
    assert "wandb ✗ dropped: log_metrics failed at step 1" in line
    assert "trackio ✗ missing: not installed" in line


def test_a_url_is_a_link_on_the_run_page() -> None:
    status = {
        "mlflow": {
            "state": "reached",
            "run_id": "abc",
            "url": "http://mlf:5000/#/experiments/1/runs/abc",
        }
    }
    line = tracker_status.run_line(status, markdown=True)
    assert line == (
        "mlflow ✓ ([http://mlf:5000/#/experiments/1/runs/abc](http://mlf:5000/#/experiments/1/runs/abc))"
    )
    assert trackers.mlflow_run_url("http://mlf:5000/", "1", "abc") == (
        "http://mlf:5000/#/experiments/1/runs/abc"
    )
    assert json.loads(json.dumps(status)) == status
