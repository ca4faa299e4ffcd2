"""bench/gpu_check.py loaded by path (bench/ is no package): one measurement for the CPU pin of
the bf16 head (tests/dapo_core/test_bf16_head.py) and the GPU check's own test
(tests/test_gpu_check.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def gpu_check() -> ModuleType:
    """bench/gpu_check.py, loaded by path: one measurement for the CPU pin and the GPU check."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", module)
    spec.loader.exec_module(module)
    return module
