"""The real model's suite (`make test-real-model`): SmolLM2-135M-Instruct as `make real-model`
converted it. The model is 538 MB in float32: each module loads it at most once. Modules that
need the model are marked `realmodel` (outside the default run); test_arithmetic_data.py needs
none and runs in the default suite. One `dapo sweep` of the real model (`real_sweep`) is run
once per session for the tests of what it leaves: the store, the HF export, the dashboard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def real_dir() -> Path:
    from dapo_core import real_model

    try:
        return real_model.model_dir()
    except real_model.ModelSetupError as exc:
        pytest.fail(str(exc))


# --- one real-model sweep, shared -------------------------------------------------------------
# Problems in natural language with multi-byte characters (2 bytes: ë é è И; 3 bytes: € —), so
# that the text's path from the tokenizer through the store to the dashboard is checked byte for
# byte. The characters are ones the browser's fonts draw (a screenshot shows them).
MULTIBYTE_PROBLEMS = [
    (
        f"Zoë paid {a} € for a café crème and {b} € for a croissant. How many € is that in "
        "total? (Итого — сколько?)",
        a + b,
    )
    for a, b in [(3, 4), (5, 7), (12, 9), (8, 15), (21, 6), (14, 13), (7, 2), (10, 11)]
]
# The CI budget for 2 rollout steps of the real model through `dapo sweep` (Prefect + Ray,
# a first Prefect start included): 3 minutes on this 2-core machine.
SWEEP_BUDGET_S = 180
# The real model's tests' budget: 2 prompts × 4 responses of at most 8 tokens (a right reply is
# 2-3 tokens), one gradient update per step.
SWEEP_SETS = {
    "batch.train_batch_size": 2,
    "batch.gen_batch_size": 2,
    "batch.mini_batch_size": 2,
    "rollout.group_size": 4,
    "rollout.max_response_len": 8,
    "algo.overlong_cache_len": 2,
}
# The same for `dapo train`, with a held-out evaluation of 2 problems × 1 sample.
TRAIN_SETS = {**SWEEP_SETS, "data.eval_problems": 2, "data.eval_k": 1}


def set_args(sets: dict[str, object]) -> list[str]:
    """`--set key=value` for each item."""
    return [arg for k, v in sets.items() for arg in ("--set", f"{k}={v}")]


@dataclass(frozen=True)
class RealSweep:
    """`dapo sweep --preset smollm2-135m --arms grpo --steps 2` as a test saw it."""

    done: subprocess.CompletedProcess[str]
    seconds: float
    store_url: str
    runs_dir: Path
    env: dict[str, str]

    def run_dir(self) -> Path:
        """The arm's run directory (runs/<store>/sweep-1/grpo-s0-<hash>-run1)."""
        (path,) = self.runs_dir.glob("*/sweep-*/grpo-s0-*")
        return path


@pytest.fixture(scope="session")
def real_sweep(real_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> RealSweep:
    """One sweep of the real model, shared by the tests of what it leaves behind (the store's
    rows, the HF export, the rollout browser): it costs 1.5-2 minutes on 2 shared cores."""
    tmp = tmp_path_factory.mktemp("real-sweep")
    data = tmp / "zoe.jsonl"
    data.write_text(
        "".join(
            json.dumps({"problem": text, "answer": str(answer)}, ensure_ascii=False) + "\n"
            for text, answer in MULTIBYTE_PROBLEMS
        ),
        encoding="utf-8",
    )
    store_url = f"sqlite:///{tmp / 'dapo.db'}"
    env = {
        **os.environ,
        "DAPO_DB_URL": store_url,
        "DAPO_RUNS_DIR": str(tmp / "runs"),
        # Prefect's database as CI sets it (a fresh $PREFECT_HOME), else one kept in .cache/.
        "PREFECT_HOME": os.environ.get("PREFECT_HOME")
        or str(ROOT / ".cache" / "test-prefect-home"),
        "OMP_NUM_THREADS": "1",
        "DAPO_DEBUG": "1",
    }
    env.pop("PREFECT_API_URL", None)  # a temporary server of the command's own
    env.pop("RAY_ADDRESS", None)  # a local Ray of the command's own
    sets = set_args(SWEEP_SETS)
    t0 = time.perf_counter()
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "dapo"),
            *("sweep", "--preset", "smollm2-135m", "--arms", "grpo", "--steps", "2"),
            *("--data", str(data), "--eval-problems", "2", "--eval-k", "2", *sets),
        ],
        capture_output=True,
        text=True,
        timeout=3 * SWEEP_BUDGET_S,  # a loaded runner: up to three times the 3-minute goal
        cwd=ROOT,
        env=env,
    )
    seconds = time.perf_counter() - t0
    print(f"dapo sweep, 2 rollout steps of the real model: {seconds:.0f} s")
    return RealSweep(done, seconds, store_url, tmp / "runs", env)
