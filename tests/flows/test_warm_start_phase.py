"""The tiny model's warm start is a phase of its own (issue 41.3): built once per machine, in the
process of `dapo sweep` / `dapo train`, before any arm starts (so never in an arm's time), with
progress lines on the command's terminal; a cached model says nothing. Also: `--cpus` beyond
this machine fails before Ray starts or the store is opened. The commands as a user types them,
on an empty DAPO_CACHE_DIR, with a 4-step warm start so that the tests take seconds of it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from dapo_cli import DAPO, dapo

from flows.warm import on_this_machine

SMALL = [
    "--set=model.warm_start_steps=4",
    "--set=rollout.group_size=4",
    "--set=batch.train_batch_size=4",
    "--set=batch.gen_batch_size=4",
    "--set=batch.mini_batch_size=2",
    "--set=data.eval_problems=8",
    "--set=data.eval_k=2",
]


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DAPO_DEBUG")}
    return {
        **env,
        "DAPO_CACHE_DIR": str(tmp / "cache"),
        "DAPO_RUNS_DIR": str(tmp / "runs"),
        "COLUMNS": "200",
    }


def _builds(tmp: Path) -> list[dict[str, object]]:
    log = tmp / "cache" / "tiny" / "builds.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_dapo_sweep_warm_starts_once_in_its_own_process_before_the_arms(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            DAPO,
            "sweep",
            "--arms",
            "grpo",
            "--steps",
            "1",
            "--store",
            f"sqlite:///{tmp_path / 'store.db'}",
            *SMALL,
            '--set=run.loggers=["tensorboard"]',
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
    )
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    lines = out.splitlines()
    assert lines[0].startswith("warm start: building the tiny model (4 steps; once per machine")
    assert any(line.startswith("warm start: step 4/4  loss ") for line in lines), out
    done = next(i for i, line in enumerate(lines) if line.startswith("warm start: done in "))
    first_event = next(i for i, line in enumerate(lines) if line.startswith("[0:"))
    # The whole phase comes before the sweep's first event: no arm has started yet.
    assert done < first_event, out
    assert not any(line.startswith("warm start") for line in lines[first_event:]), out
    # Built once, by the sweep's own process (not by an arm's Ray actor).
    (build,) = _builds(tmp_path)
    assert build["pid"] == proc.pid and build["steps"] == 4
    # Where to point TensorBoard, when the sweep starts and, with what its run reached, at its end.
    hint = next(line for line in lines if line.startswith("TensorBoard: tensorboard --logdir "))
    logdir = hint.removeprefix("TensorBoard: tensorboard --logdir ")
    assert Path(logdir).parent.name == "sweep-1" and Path(logdir).name == "tensorboard"
    assert f"tracker tensorboard: 1 of 1 run(s) reached: tensorboard --logdir {logdir}" in lines
    assert (Path(logdir) / "grpo-s0").is_dir()
    assert "Writing model shards" not in out + err


def test_dapo_train_warm_starts_before_its_run_and_a_cached_model_says_nothing(
    tmp_path: Path,
) -> None:
    def train(out: str) -> subprocess.CompletedProcess[str]:
        return dapo(
            "train",
            "--steps",
            "1",
            *SMALL,
            "--out",
            str(tmp_path / out),
            env=_env(tmp_path),
            cwd=tmp_path,
            timeout=600,
        )

    first = train("a")
    assert first.returncode == 0, first.stderr[-3000:]
    lines = first.stdout.splitlines()
    starts = next(i for i, line in enumerate(lines) if line.startswith("training arm "))
    phase = [i for i, line in enumerate(lines) if line.startswith("warm start: ")]
    assert phase and max(phase) < starts, first.stdout
    assert lines[phase[-1]].startswith("warm start: done in ")
    assert len(_builds(tmp_path)) == 1
    again = train("b")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "warm start" not in again.stdout + again.stderr
    assert len(_builds(tmp_path)) == 1


def test_cpus_beyond_this_machine_fail_before_ray_or_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    done = dapo(
        "sweep",
        "--cpus",
        "4096",
        "--arms",
        "grpo",
        "--store",
        f"sqlite:///{store}",
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"error: each arm asks for 4096 CPU(s) but this machine has {os.cpu_count()} (a local "
        "Ray instance gets them all): lower --cpus, or join a bigger cluster (--ray-address)"
    ]
    assert not store.exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("address", "env", "here"),
    [
        (None, {}, True),
        ("local", {}, True),
        ("auto", {}, True),
        ("127.0.0.1:6379", {}, True),
        ("ray://localhost:10001", {}, True),
        (None, {"RAY_ADDRESS": "127.0.0.1:6380"}, True),
        ("10.255.255.1:6379", {}, False),
        (None, {"RAY_ADDRESS": "ray://head.example.invalid:10001"}, False),
    ],
)
def test_the_sweeps_process_builds_only_for_a_cluster_on_this_machine(
    address: str | None, env: dict[str, str], here: bool
) -> None:
    assert on_this_machine(address, env) is here
