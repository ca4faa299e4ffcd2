"""bench/bench_async.py's memory figures: a process tree's resident memory read from /proc, and
a run's peak and late growth from its samples (by hand)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_async", ROOT / "bench" / "bench_async.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_memory_summary_by_hand(bench: ModuleType) -> None:
    # 6 s of samples: the middle third is [2, 4) s (3, 4: peak 4), the last [4, 6] (9, 2: 9).
    samples = [(0.0, 1), (1.0, 5), (2.0, 3), (3.0, 4), (4.0, 9), (6.0, 2)]
    assert bench.memory_summary(samples) == {"peak_rss": 9.0, "late_growth": 5.0}
    steady = [(float(t), 7) for t in range(9)]
    assert bench.memory_summary(steady) == {"peak_rss": 7.0, "late_growth": 0.0}
    assert bench.memory_summary([]) == {"peak_rss": 0.0, "late_growth": 0.0}


def test_tree_rss_counts_a_child_and_nothing_once_it_is_gone(bench: ModuleType) -> None:
    before = bench.tree_rss_bytes(os.getpid())
    assert before > 10 * MIB  # this interpreter with pytest loaded
    # A child that holds 200 MiB (written, so resident) until its stdin closes.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; b = bytearray(200 * 2**20); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        assert bench.tree_rss_bytes(child.pid) >= 200 * MIB
        assert bench.tree_rss_bytes(os.getpid()) - before >= 190 * MIB
    finally:
        child.communicate("", timeout=60)
    assert bench.tree_rss_bytes(child.pid) == 0


def test_the_actor_modes_options_are_checked_before_anything_runs(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--two-nodes"]) == 2
    assert bench.main(["--rollout-actor", "--two-nodes", "--threads", "4"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: --two-nodes and --only-actor go with --rollout-actor",
        "error: --two-nodes runs on 2 threads (a node of 1 CPU each side)",
    ]
