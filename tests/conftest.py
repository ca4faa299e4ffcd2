"""Session-wide test settings shared by every suite."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The tiny model's supervised warm-start is computed once per machine and cached here, so
# every test (and every Ray worker or Prefect subprocess, which inherit the environment)
# reuses it instead of training it again.
os.environ.setdefault("DAPO_CACHE_DIR", str(ROOT / ".cache" / "test-tiny"))
os.environ.setdefault("DAPO_DATA_DIR", str(ROOT.parent / "shared" / "data"))
# Keep Ray and Prefect from phoning home or opening browsers during tests.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("PREFECT_UI_ENABLED", "true")
(ROOT / "tests" / "artifacts").mkdir(parents=True, exist_ok=True)
