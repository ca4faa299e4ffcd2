"""Peak GPU memory per phase (perf/peak_mem_gib/...): a fake torch.cuda records the calls.

The trainer resets torch's peak counter at the start of each phase of a step and reads
max_memory_allocated at its end, only when its device is CUDA.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from scripted_engine import ScriptedEngine, make_cfg, make_trainer
from tiny_policy import char_tokenizer

import dapo_core.train.trainer as trainer_mod
from dapo_common import metric_names as M
from dapo_core.train.memory import GIB, PhaseMemory


class FakeCuda:
    """Each reset opens a phase; its peak reads as (phases so far) GiB, so a metric's value
    says which reset it followed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.phases = 0

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        self.phases += 1
        self.calls.append(("reset", device))

    def max_memory_allocated(self, device: torch.device) -> int:
        self.calls.append(("max", device))
        return self.phases * (1 << 30)


def test_a_phase_resets_then_reads_and_keeps_its_larger_peak() -> None:
    cuda = FakeCuda()
    mem = PhaseMemory("cuda", cuda=cuda)
    with mem.phase("rollout"):
        pass
    with mem.phase("rollout"):  # a second generation batch: 2 GiB beats 1 GiB
        pass
    with mem.phase("update"):
        pass
    assert [c[0] for c in cuda.calls] == ["reset", "max"] * 3
    assert all(c[1] == torch.device("cuda") for c in cuda.calls)
    assert mem.metrics() == {M.PEAK_MEM_ROLLOUT: 2.0, M.PEAK_MEM_UPDATE: 3.0}
    assert mem.metrics() == {}  # each step reports its own peaks
    assert GIB == 2**30


def test_a_failing_phase_still_reads_its_peak() -> None:
    cuda = FakeCuda()
    mem = PhaseMemory("cuda", cuda=cuda)
    with pytest.raises(RuntimeError), mem.phase("update"):
        raise RuntimeError("out of memory")
    assert mem.metrics() == {M.PEAK_MEM_UPDATE: 1.0}


def test_off_cuda_nothing_is_called_and_unknown_phases_fail() -> None:
    cuda = FakeCuda()
    mem = PhaseMemory("cpu", cuda=cuda)
    with mem.phase("rollout"):
        pass
    assert cuda.calls == [] and mem.metrics() == {}
    with pytest.raises(ValueError, match="unknown memory phase 'old'"), mem.phase("old"):
        pass
    assert M.peak_mem("rollout") == "perf/peak_mem_gib/rollout"
    assert {M.peak_mem(p) for p in M.MEMORY_PHASES} == {
        M.PEAK_MEM_LOAD,
        M.PEAK_MEM_ROLLOUT,
        M.PEAK_MEM_LOGPROB,
        M.PEAK_MEM_UPDATE,
        M.PEAK_MEM_SYNC,
        M.PEAK_MEM_CHECKPOINT,
    }


def test_a_cuda_trainer_step_logs_each_phase_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda()
    monkeypatch.setattr(
        trainer_mod, "PhaseMemory", lambda device: PhaseMemory(torch.device("cuda"), cuda=cuda)
    )
    engine = ScriptedEngine(char_tokenizer(), correct=[[4, 0, 2, 1]])
    trainer = make_trainer(make_cfg(), engine)
    m = trainer.step().metrics
    # Phases in the order of Algorithm 1: generate (1), old log-probs (2), the update (3), the
    # weight sync (4); each its own reset and read.
    peaks = {k: v for k, v in m.items() if k.startswith(M.PEAK_MEM_PREFIX)}
    assert peaks == {
        M.PEAK_MEM_ROLLOUT: 1.0,
        M.PEAK_MEM_LOGPROB: 2.0,
        M.PEAK_MEM_UPDATE: 3.0,
        M.PEAK_MEM_SYNC: 4.0,
    }
    assert [c[0] for c in cuda.calls] == ["reset", "max"] * 4


def test_a_cpu_trainer_logs_no_memory_metrics() -> None:
    engine = ScriptedEngine(char_tokenizer(), correct=[[4, 0, 2, 1]])
    m = make_trainer(make_cfg(), engine).step().metrics
    assert not [k for k in m if k.startswith(M.PEAK_MEM_PREFIX)]
