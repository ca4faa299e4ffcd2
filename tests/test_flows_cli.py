"""`dapo sweep` and `dapo arm` from a terminal: ephemeral Prefect, a local Ray, the real store.

The commands run as subprocesses, exactly as a user types them. Prefect's local database lives
in .cache/ so that only the first run on a machine pays its set-up.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DAPO = str(Path(sys.executable).parent / "dapo")
FAST = [
    "--set",
    "batch.train_batch_size=4",
    "--set",
    "batch.gen_batch_size=4",
    "--set",
    "batch.mini_batch_size=2",
    "--set",
    "rollout.group_size=4",
    "--set",
    "run.checkpoint_every=1",
    "--eval-problems",
    "8",
    "--eval-k",
    "2",
]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    out = {
        **os.environ,
        "DAPO_DB_URL": f"sqlite:///{tmp_path / 'dapo.db'}",
        "DAPO_RUNS_DIR": str(tmp_path / "runs"),
        "PREFECT_HOME": str(ROOT / ".cache" / "test-prefect-home"),
    }
    for name in ("PREFECT_API_URL", "RAY_ADDRESS"):
        out.pop(name, None)
    return out


def dapo(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DAPO, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "grpo", "nope"], "error: arms: unknown arm 'nope': choose among grpo"),
        (
            ["--arms", "grpo", "--set", "optim.lr=-1"],
            "error: grpo seed 0: optim.lr=-1.0 must be > 0",
        ),
        (["--ray-address", "127.0.0.1:9"], "error: cannot reach the Ray cluster at 127.0.0.1:9"),
        (["--model", "./no/such/model"], "error: model path"),
        (["--store", "postgresql+psycopg://nobody@127.0.0.1:9/x"], "error: cannot open the store"),
    ],
)
def test_bad_sweep_input_is_one_line_and_exit_2(
    env: dict[str, str], args: list[str], message: str
) -> None:
    result = dapo(env, "sweep", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    if Path(env["DAPO_DB_URL"].removeprefix("sqlite:///")).exists():  # opened, never written
        from db import queries
        from db.engine import get_engine

        assert queries.latest_sweep_id(get_engine(env["DAPO_DB_URL"])) is None


def test_dapo_arm_on_an_empty_store_says_what_to_do(env: dict[str, str]) -> None:
    result = dapo(env, "arm", "--arm", "grpo")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: the store holds no sweep yet: run `dapo sweep` first, or pass --sweep ID"
    )


def test_sweep_help_says_where_run_directories_go(env: dict[str, str]) -> None:
    result = dapo(env, "sweep", "--help")
    assert result.returncode == 0
    assert "$DAPO_RUNS_DIR, default" in result.stdout and "dapo-lab/runs" in result.stdout


@pytest.mark.slow
def test_sweep_then_run_it_again_then_rerun_one_arm(env: dict[str, str]) -> None:
    from db import queries
    from db.store import Store

    first = dapo(env, "sweep", "--arms", "grpo,clip_higher", "--steps", "2", "--name", "cli", *FAST)
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    # Progress in words, then the table, then the time split.
    assert "grpo s0  step 2/2  acc" in out and "tok/s  ETA" in out
    assert re.search(r"clip_higher s0  run \d completed: 2 steps", out)
    assert "sweep 1 'cli'" in out and "completed" in out
    table_lines = [line for line in out.splitlines() if line.startswith(("grpo ", "clip_higher "))]
    assert len(table_lines) == 2
    assert "orchestration ≈" in out
    store = Store(env["DAPO_DB_URL"])
    runs = queries.runs_of_sweep(store.engine, 1)
    assert list(runs["status"]) == ["completed", "completed"]
    assert all(Path(d).is_relative_to(env["DAPO_RUNS_DIR"]) for d in runs["checkpoint_dir"])

    # The same sweep again: both arms already completed with the same config → skipped.
    again = dapo(env, "sweep", "--sweep", "1")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("skipped: already completed with config") == 2
    assert len(queries.runs_of_sweep(store.engine, 1)) == 2

    # One arm forced: a new attempt in its own directory; the table follows it.
    rerun = dapo(env, "arm", "--arm", "grpo", "--force", "--quiet")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    attempts = queries.arm_attempts(store.engine, 1, "grpo")
    assert list(attempts["attempt"]) == [1, 2] and list(attempts["status"]) == [
        "completed",
        "completed",
    ]
    table = queries.ablation_table(store.engine, 1)
    newest = int(attempts["run_id"].iloc[-1])
    assert list(table.loc[table["arm"] == "grpo", "run_ids"].iloc[0]) == [newest]
