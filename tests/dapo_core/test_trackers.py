"""Trackers beside the store (issue 25, part 1): `run.loggers` names MLflow, W&B, TensorBoard and
Trackio; each run appears there with its config, tags, metrics, evaluations and rollouts, read
back with each library's own reader; a tracker that fails or is missing costs one warning line
and never a store row; `dapo export` replays a stored sweep into a tracker.

One tiny `dapo train` (2 steps, all four trackers at once) feeds the read-back tests."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dapo_common import metric_names as M
from dapo_core.setup.config import ConfigError, ExperimentConfig
from dapo_core.setup.ladders import paper_ladder
from dapo_core.setup.overrides import parse_sets
from dapo_core.train import trackers
from dapo_core.train.trackers import FanoutSink, tracked_run, with_trackers

ROOT = Path(__file__).resolve().parents[2]
DAPO = str(Path(sys.executable).parent / "dapo")
SMALL = [
    "--set=rollout.group_size=4",
    "--set=batch.train_batch_size=4",
    "--set=batch.gen_batch_size=4",
    "--set=batch.mini_batch_size=2",
    "--set=data.eval_problems=8",
    "--set=data.eval_k=2",
    "--set=run.num_threads=1",
]
# Trackio needs pillow<13, which .venv cannot have: its test runs in .venv-trackers, and in .venv
# it is the real missing library of the trained run below.
IN_VENV = ["mlflow", "wandb", "tensorboard"]
MISSING = "trackio"


class ListSink:
    """An in-memory MetricsSink."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.samples: dict[int, list[dict[str, Any]]] = {}
        self.evaluations: dict[int, dict[str, Any]] = {}
        self.closed = False

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.metrics[step] = dict(metrics)

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self.samples[step] = [dict(s) for s in samples]

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        self.evaluations[step] = dict(result)

    def close(self) -> None:
        self.closed = True


class Broken:
    """A tracker that raises on every call."""

    calls = 0

    def __init__(self, run: Any = None) -> None:
        pass

    def _fail(self, *args: Any) -> None:
        Broken.calls += 1
        raise RuntimeError("tracker server said 503\nsecond line never shown")

    log_metrics = log_samples = log_evaluation = close = _fail


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- the config ------------------------------------------------------------------------------
def test_run_loggers_takes_verls_names_and_refuses_others() -> None:
    cfg = ExperimentConfig()
    assert cfg.run.loggers == ()
    # --set takes a JSON list or comma-separated names; JSON's list comes back as a tuple.
    sets = parse_sets(ExperimentConfig, ['run.loggers=["tensorboard","mlflow"]'])
    assert cfg.with_overrides(sets).run.loggers == ("tensorboard", "mlflow")
    sets = parse_sets(ExperimentConfig, ["run.loggers=wandb,trackio"])
    assert cfg.with_overrides(sets).run.loggers == ("wandb", "trackio")
    again = ExperimentConfig.from_dict(json.loads(json.dumps(cfg.with_overrides(sets).to_dict())))
    assert again.run.loggers == ("wandb", "trackio")
    with pytest.raises(
        ConfigError,
        match=r"unknown tracker 'comet' \(use any of mlflow, wandb, tensorboard, trackio\)",
    ):
        cfg.with_overrides({"run.loggers": ["tensorboard", "comet"]})
    with pytest.raises(ConfigError, match="names one twice"):
        cfg.with_overrides({"run.loggers": ["wandb", "wandb"]})


def test_where_a_run_reports_leaves_its_name_and_store_key_alone() -> None:
    # A tracker added to a finished sweep's arm must find the arm's run, directory and checkpoint.
    cfg = paper_ladder().config("dapo", "tiny")
    tracked = cfg.with_overrides({"run.loggers": ["mlflow"], "run.mlflow_uri": "http://x:5000"})
    assert tracked.config_hash() == cfg.config_hash()
    assert cfg.with_overrides({"run.seed": 1}).config_hash() != cfg.config_hash()


# --- the fan-out -----------------------------------------------------------------------------
def test_a_tracker_that_raises_is_dropped_with_one_warning_and_the_primary_keeps_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, healthy = ListSink(), ListSink()
    Broken.calls = 0
    sink = FanoutSink(primary, {"broken": Broken(), "healthy": healthy})
    with caplog.at_level(logging.WARNING):
        sink.log_evaluation(0, {"dataset": "d", "k": 2, "avg_at_k": 0.5})
        for step in (1, 2, 3):
            sink.log_metrics(step, {"reward/mean": float(step)})
            sink.log_samples(step, [{"prompt": "p", "response": "r"}])
        sink.close()
    assert sorted(primary.metrics) == [1, 2, 3] and sorted(primary.samples) == [1, 2, 3]
    assert primary.evaluations[0]["avg_at_k"] == 0.5 and primary.closed
    # The tracker after the broken one still gets everything.
    assert sorted(healthy.metrics) == [1, 2, 3] and healthy.closed
    # Dropped at its first failure: called once, then once more to close it quietly.
    assert Broken.calls == 2
    lines = warnings_of(caplog)
    assert len(lines) == 1, lines
    assert "tracker broken" in lines[0] and "503" in lines[0] and "second line" not in lines[0]


def test_the_primary_sinks_errors_are_the_runs_errors() -> None:
    class Down(ListSink):
        def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
            raise ConnectionError("store down")

    healthy = ListSink()
    with pytest.raises(ConnectionError, match="store down"):
        FanoutSink(Down(), {"t": healthy}).log_metrics(1, {"a": 1.0})
    assert healthy.metrics == {}  # the store first: a tracker never holds what the store lacks


def test_a_missing_library_is_one_warning_and_no_tracker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    # None in sys.modules makes `import mlflow` raise ImportError, as on a machine without it.
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    cfg = ExperimentConfig().with_overrides({"run.loggers": ["mlflow"]})
    primary = ListSink()
    with caplog.at_level(logging.WARNING):
        sink = with_trackers(primary, cfg.to_dict(), tmp_path)
        sink.log_metrics(1, {"a": 1.0})
        sink.close()
    assert primary.metrics == {1: {"a": 1.0}}
    lines = warnings_of(caplog)
    assert len(lines) == 1, lines
    assert "mlflow" in lines[0] and "not installed" in lines[0] and "dapo-lab[trackers]" in lines[0]


def test_a_run_refused_before_its_first_number_opens_no_tracker(tmp_path: Path) -> None:
    # e.g. `dapo train --out` another run's directory: refused before step 0 is evaluated.
    cfg = ExperimentConfig().with_overrides({"run.loggers": ["tensorboard"]})
    sink = with_trackers(ListSink(), cfg.to_dict(), tmp_path / "run")
    sink.close()
    assert not (tmp_path / "run").exists()


def test_a_resumed_run_continues_its_tracker_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    cfg = ExperimentConfig().with_overrides({"run.loggers": ["mlflow"]})
    for step in (1, 2):  # a first start, killed after step 1; the resumed start logs step 2
        sink = with_trackers(ListSink(), cfg.to_dict(), tmp_path)
        sink.log_metrics(step, {M.REWARD_MEAN: step / 10})
        sink.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dapo-lab")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, M.REWARD_MEAN)
    assert {m.step: m.value for m in history} == {1: 0.1, 2: 0.2}
    assert json.loads((tmp_path / "trackers.json").read_text()) == {"mlflow": run.info.run_id}


def test_no_loggers_is_the_primary_sink_itself(tmp_path: Path) -> None:
    primary = ListSink()
    assert with_trackers(primary, ExperimentConfig().to_dict(), tmp_path) is primary


def test_tags_and_flat_config(tmp_path: Path) -> None:
    cfg = paper_ladder().config("clip_higher", "tiny")
    run = tracked_run(cfg.to_dict(), tmp_path, {"sweep": 3, "parent": "overlong_filter"})
    assert run.tags == {
        "arm": "clip_higher",
        "preset": "tiny",
        "seed": "0",
        "config_hash": cfg.config_hash(),
        "sweep": "3",
        "parent": "overlong_filter",
    }
    assert run.config["algo.clip_high"] == 0.28 and "algo" not in run.config
    assert run.name == "clip_higher s0 (sweep 3)"


# --- a tiny `dapo train` into MLflow, W&B and TensorBoard at once ----------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`dapo train` (clip_higher, 2 steps) with run.loggers = mlflow, wandb, tensorboard; W&B
    offline, MLflow in its default place (out/mlruns)."""
    tmp = tmp_path_factory.mktemp("trained")
    out = tmp / "out"
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "DAPO_DEBUG": "",
    }
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY", "WANDB_PROJECT"):
        env.pop(name, None)
    done = subprocess.run(
        [
            DAPO,
            "train",
            "--arm",
            "clip_higher",
            "--steps",
            "2",
            *SMALL,
            "--set",
            f"run.loggers={json.dumps([*IN_VENV, MISSING])}",
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = {
        r["step"]: r["metrics"]
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    }
    evals = {
        r["step"]: r["result"]
        for r in map(json.loads, (out / "evaluations.jsonl").read_text().splitlines())
    }
    samples = {
        r["step"]: r["samples"]
        for r in map(json.loads, (out / "samples.jsonl").read_text().splitlines())
    }
    cfg = json.loads((out / "config.json").read_text())
    return {
        "out": out,
        "tmp": tmp,
        "stderr": done.stderr,
        "metrics": metrics,
        "evals": evals,
        "samples": samples,
        "hash": ExperimentConfig.from_dict(cfg).config_hash(),
    }


def test_the_trained_run_warns_once_for_the_missing_library(trained: dict[str, Any]) -> None:
    assert sorted(trained["metrics"]) == [1, 2] and sorted(trained["evals"]) == [0, 2]
    lines = [line for line in trained["stderr"].splitlines() if "tracker" in line]
    assert len(lines) == 1, trained["stderr"][-3000:]
    assert "tracker trackio: its library is not installed" in lines[0]
    assert "dapo-lab[trackio]" in lines[0]


def test_tensorboard_reads_back_every_metric(trained: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(trained["out"] / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    compared = 0
    for step, metrics in trained["metrics"].items():
        for name, value in metrics.items():
            if value is None:  # NaN / inf: the store keeps null, the trackers nothing
                continue
            events = {e.step: e.value for e in acc.Scalars(name)}
            # TensorBoard keeps float32.
            assert math.isclose(events[step], value, rel_tol=1e-6, abs_tol=1e-6), (name, step)
            compared += 1
    assert compared >= 2 * 20, compared
    assert M.REWARD_MEAN in scalars
    start = {e.step: e.value for e in acc.Scalars("eval/synthetic-eval/avg_at_2")}
    assert math.isclose(start[0], trained["evals"][0]["avg_at_k"], abs_tol=1e-6)
    # Text summaries are tensors to the reader: the rollouts as a markdown table per step.
    assert {"run/config/text_summary", "run/tags/text_summary"} <= set(acc.Tags()["tensors"])
    texts = {
        e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("samples/text_summary")
    }
    assert sorted(texts) == [1, 2]
    for step, samples in trained["samples"].items():
        assert texts[step].count(f"\n| {step} | ") == len(samples) > 0


def test_mlflow_reads_back_params_tags_and_history(trained: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{trained['out'] / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dapo-lab")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["algo.clip_high"] == "0.28"
    assert run.data.params["run.steps"] == "2"
    assert run.data.tags["arm"] == "clip_higher" and run.data.tags["seed"] == "0"
    assert run.data.tags["ladder"] == "paper" and run.data.tags["parent"] == "overlong_filter"
    assert run.data.tags["config_hash"] == trained["hash"]
    history = client.get_metric_history(run.info.run_id, M.REWARD_MEAN)
    got = {m.step: m.value for m in history}
    assert got == pytest.approx({s: m[M.REWARD_MEAN] for s, m in trained["metrics"].items()})
    evals = client.get_metric_history(run.info.run_id, "eval/synthetic-eval/avg_at_2")
    assert {m.step for m in evals} == {0, 2}
    tables = [a.path for a in client.list_artifacts(run.info.run_id, "samples")]
    assert tables == ["samples/step_000001.json", "samples/step_000002.json"], tables


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a W&B offline run file (`run-<id>.wandb`): a 7-byte header, then
    LevelDB's log format (32 KiB blocks of chunks: crc32, length, type FULL/FIRST/MIDDLE/LAST).
    wandb 0.31 ships no Python reader of its own; `wandb sync` uploads these files."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, pos, buf, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            records.append(record)
    return records


def wandb_key(item: Any) -> str:
    """An item's key: `key`, or (as wandb writes some) its `nested_key` parts."""
    return str(item.key or "/".join(item.nested_key))


def test_wandb_offline_files_hold_the_run(trained: dict[str, Any]) -> None:
    runs = sorted((trained["out"] / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    (log_file,) = runs[0].glob("*.wandb")
    history: dict[int, dict[str, Any]] = {}
    config: dict[str, Any] = {}
    tags: list[str] = []
    for record in wandb_records(log_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {wandb_key(i): json.loads(i.value_json) for i in record.history.item}
            history.setdefault(int(items["_step"]), {}).update(items)
        elif kind == "run":
            config.update(
                {wandb_key(i): json.loads(i.value_json) for i in record.run.config.update}
            )
            tags = list(record.run.tags)
    for step, metrics in trained["metrics"].items():
        assert history[step][M.REWARD_MEAN] == pytest.approx(metrics[M.REWARD_MEAN])
        assert history[step]["samples/_type"] == "table-file"  # the step's rollouts
    assert history[0]["eval/synthetic-eval/avg_at_2"] == pytest.approx(
        trained["evals"][0]["avg_at_k"]
    )
    assert config["algo.clip_high"] == 0.28 and config["dapo/arm"] == "clip_higher"
    assert "parent:overlong_filter" in tags and "ladder:paper" in tags
    assert len(list(runs[0].glob("files/media/table/samples_*.table.json"))) == 2


@pytest.mark.trackers
def test_trackio_local_store_holds_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # .venv-trackers (make test-trackers): Trackio reads $TRACKIO_DIR when it is imported.
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.delenv("TRACKIO_PROJECT", raising=False)
    from trackio.sqlite_storage import SQLiteStorage

    cfg = paper_ladder().config("clip_higher", "tiny", {"run.loggers": ["trackio"]})
    primary = ListSink()
    with caplog.at_level(logging.WARNING, logger="dapo_core"):
        sink = with_trackers(primary, cfg.to_dict(), tmp_path / "run", {"sweep": 7})
        assert isinstance(sink, FanoutSink) and not sink.trackers  # started by the first call
        sink.log_evaluation(0, {"dataset": "synthetic-eval", "k": 2, "avg_at_k": 0.25})
        assert list(sink.trackers) == ["trackio"]
        for step in (1, 2):
            sink.log_metrics(step, {M.REWARD_MEAN: step / 4, M.ACC_MEAN: float("nan")})
            sink.log_samples(step, [{"prompt": "1+1", "response": "Answer: 2", "reward": 1.0}])
        sink.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert sorted(primary.metrics) == [1, 2]

    name = f"clip_higher s0 (sweep 7) {cfg.config_hash()}"
    assert SQLiteStorage.get_runs("dapo-lab") == [name]
    logs = SQLiteStorage.get_logs("dapo-lab", name)
    by_step: dict[int, dict[str, Any]] = {}
    for entry in logs:
        by_step.setdefault(int(entry["step"]), {}).update(entry)
    assert by_step[0]["eval/synthetic-eval/avg_at_2"] == pytest.approx(0.25)
    assert by_step[1][M.REWARD_MEAN] == pytest.approx(0.25)
    assert by_step[2][M.REWARD_MEAN] == pytest.approx(0.5)
    assert M.ACC_MEAN not in by_step[1]  # NaN: the store keeps null, the trackers nothing
    assert "samples" in by_step[1] and "samples" in by_step[2]
    config = SQLiteStorage.get_run_config("dapo-lab", name) or {}
    assert config["algo.clip_high"] == 0.28 and config["dapo/sweep"] == "7"


# --- a failing tracker in a real run, the store's rows complete ------------------------------
def test_a_tracker_failing_in_training_leaves_the_store_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from dapo_core.train.runner import train
    from db import reads
    from db.store import Store

    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    sweep = store.create_sweep(
        name="t",
        preset="tiny",
        arms=["grpo"],
        seeds=[0],
        base_config={},
        ladder=paper_ladder().rows(),
        params={},
    )
    overrides = {
        "rollout.group_size": 4,
        "batch.train_batch_size": 4,
        "batch.gen_batch_size": 4,
        "batch.mini_batch_size": 2,
        "data.eval_problems": 8,
        "data.eval_k": 2,
        "run.num_threads": 1,
        "run.steps": 2,
        "run.loggers": ["tensorboard"],
    }
    cfg = paper_ladder().config("grpo", "tiny", overrides)
    # here, not at the top: the trackers-marked test of this module runs in .venv-trackers,
    # which has no store (db/) dependencies
    from store_runs import new_attempt

    run_id = new_attempt(
        store, sweep, "grpo", 0, config=cfg.to_dict(), config_hash=cfg.config_hash()
    )
    Broken.calls = 0
    monkeypatch.setitem(trackers.TRACKERS, "tensorboard", Broken)
    recorded = ListSink()
    sink = with_trackers(store.sink(run_id), cfg.to_dict(), tmp_path / "run")
    assert isinstance(sink, FanoutSink)
    sink.trackers["recorder"] = recorded  # what the trainer sent, to compare the store with
    with caplog.at_level(logging.WARNING):
        try:
            train(cfg, sink=sink, out_dir=tmp_path / "run")
        finally:
            sink.close()
    engine = store.engine
    curves = reads.metric_curves(engine, [run_id])
    assert sorted(set(curves["step"])) == [1, 2]
    for step, metrics in recorded.metrics.items():
        stored = curves[curves["step"] == step].set_index("name")["value"]
        assert len(stored) == len(metrics)
        assert stored[M.REWARD_MEAN] == pytest.approx(metrics[M.REWARD_MEAN])
    assert list(reads.evaluations(engine, run_id)["step"]) == [0, 2]
    assert reads.sample_steps(engine, run_id) == [1, 2]
    lines = warnings_of(caplog)
    assert len([line for line in lines if "tracker" in line]) == 1, lines


# --- dapo export ------------------------------------------------------------------------------
@pytest.fixture
def stored_sweep(tmp_path: Path) -> dict[str, Any]:
    """A store holding one sweep of two arms, numbers written through the store's own sink."""
    from db.store import Store

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(url)
    sweep = store.create_sweep(
        name="exported",
        preset="tiny",
        arms=["grpo", "clip_higher"],
        seeds=[0],
        base_config={},
        ladder=paper_ladder().rows(),
        params={"ladder": "paper"},
    )
    from store_runs import new_attempt

    runs = {}
    for i, arm in enumerate(("grpo", "clip_higher")):
        cfg = paper_ladder().config(arm, "tiny", {"run.steps": 3})
        run_id = new_attempt(
            store, sweep, arm, 0, config=cfg.to_dict(), config_hash=cfg.config_hash()
        )
        with store.sink(run_id) as sink:
            sink.log_evaluation(
                0,
                {
                    "dataset": "synthetic-eval",
                    "k": 2,
                    "avg_at_k": 0.25 + i,
                    "pass_at_k": 0.5,
                    "cons_at_k": 0.25,
                    "n_problems": 2,
                    "correct_per_problem": [1, 0],
                },
            )
            for step in (1, 2, 3):
                sink.log_metrics(step, {M.REWARD_MEAN: step / 10 + i, M.ACC_MEAN: 0.5})
                sink.log_samples(
                    step,
                    [
                        {
                            "prompt": "1+1",
                            "response": "Answer: 2",
                            "ground_truth": "2",
                            "pred": "2",
                            "reward": 1.0,
                            "score": 1.0,
                            "overlong_penalty": 0.0,
                            "correct": True,
                            "length": 3,
                            "truncated": False,
                        }
                    ],
                )
        store.update_run(run_id, status="completed")
        runs[arm] = run_id
    return {"url": url, "sweep": sweep, "runs": runs, "tmp": tmp_path}


def test_export_replays_a_sweep_into_tensorboard(
    stored_sweep: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dapo_lab.cli import main

    out = stored_sweep["tmp"] / "export"
    argv = ["export", "--to", "tensorboard", "--sweep", str(stored_sweep["sweep"])]
    assert main([*argv, "--store", stored_sweep["url"], "--out", str(out)]) == 0
    for i, arm in enumerate(("grpo", "clip_higher")):
        run_dir = out / f"{arm}-s0-run{stored_sweep['runs'][arm]}" / "tensorboard"
        acc = EventAccumulator(str(run_dir))
        acc.Reload()
        got = {e.step: e.value for e in acc.Scalars(M.REWARD_MEAN)}
        assert got == pytest.approx({1: 0.1 + i, 2: 0.2 + i, 3: 0.3 + i})
        start = acc.Scalars("eval/synthetic-eval/avg_at_2")
        assert [(e.step, e.value) for e in start] == [(0, pytest.approx(0.25 + i))]
    # Replaying into a directory that holds an export already would mix two copies.
    capsys.readouterr()
    assert main([*argv, "--store", stored_sweep["url"], "--out", str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_export_replays_a_sweep_into_mlflow_with_its_tags(stored_sweep: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    from dapo_lab.cli import main

    out = stored_sweep["tmp"] / "export"
    argv = ["export", "--to", "mlflow", "--sweep", str(stored_sweep["sweep"])]
    assert main([*argv, "--store", stored_sweep["url"], "--out", str(out)]) == 0
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dapo-lab")
    assert experiment is not None
    runs = {r.data.tags["arm"]: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == ["clip_higher", "grpo"]
    tags = runs["clip_higher"].data.tags
    assert tags["sweep"] == str(stored_sweep["sweep"]) and tags["ladder"] == "paper"
    assert tags["parent"] == "grpo"  # overlong_filter is not in this sweep
    assert tags["run_id"] == str(stored_sweep["runs"]["clip_higher"])
    history = client.get_metric_history(runs["grpo"].info.run_id, M.REWARD_MEAN)
    assert {m.step: m.value for m in history} == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3})


def test_export_needs_no_torch_to_start() -> None:
    code = "import sys, dapo_lab.cli as c; c.build_parser(); import flows.export; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr


def test_export_of_a_missing_sweep_is_one_line(stored_sweep: dict[str, Any]) -> None:
    done = subprocess.run(
        [DAPO, "export", "--to", "tensorboard", "--sweep", "99", "--store", stored_sweep["url"]],
        capture_output=True,
        text=True,
        cwd=stored_sweep["tmp"],
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no sweep with id 99" in lines[0], done.stderr


# --- the flows' sink: the store's, fanned out, tagged from the store --------------------------
def test_an_arms_sink_fans_out_with_tags_from_the_store(stored_sweep: dict[str, Any]) -> None:
    # What ArmTrainer.train opens for a run whose config names a tracker (`dapo sweep --set
    # run.loggers='["tensorboard"]'`, checked end to end by hand: see the report).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from db import reads
    from flows.ray_worker import open_sink

    run_id = stored_sweep["runs"]["clip_higher"]
    cfg = paper_ladder().config("clip_higher", "tiny", {"run.loggers": ["tensorboard"]})
    out = stored_sweep["tmp"] / "run"
    owner = {"store": "s", "sweep": stored_sweep["sweep"], "arm": "clip_higher", "seed": 0}
    sink = open_sink(stored_sweep["url"], run_id, str(out), cfg.to_dict(), owner)
    assert isinstance(sink, FanoutSink)
    sink.log_metrics(4, {M.REWARD_MEAN: 0.75})
    sink.close()
    stored = reads.metric_curves(sink.primary.engine, [run_id], [M.REWARD_MEAN])  # type: ignore[attr-defined]
    assert 4 in set(stored["step"])  # the store's row first
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars(M.REWARD_MEAN)] == [(4, 0.75)]
    tags = acc.Tensors("run/tags/text_summary")[0].tensor_proto.string_val[0].decode()
    for row in ("| ladder | paper |", "| parent | grpo |", f"| run_id | {run_id} |", "| sweep |"):
        assert row in tags, tags
    # No tracker named: the store's sink itself, as before.
    plain = open_sink(
        stored_sweep["url"],
        run_id,
        str(out),
        paper_ladder().config("grpo", "tiny").to_dict(),
        owner,
    )
    assert not isinstance(plain, FanoutSink)
    plain.close()
