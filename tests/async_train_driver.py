"""One training run that kills itself, for the async resume test: `runner.train` in this
process with a sink that writes every step to a JSON-lines file, then sends this process
SIGKILL once step KILL_AT is written (before that step's checkpoint, with the rollout worker's
thread holding or making batches ahead).

    python tests/async_train_driver.py CONFIG_JSON OUT_DIR LOG_JSONL KILL_AT
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class KillingSink:
    """Metrics, the trained groups' prompts and evaluations as JSON lines; SIGKILL after step
    `kill_at`'s samples (the loop writes them right after its metrics)."""

    def __init__(self, path: Path, kill_at: int) -> None:
        self.path, self.kill_at = path, kill_at

    def _write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._write({"kind": "metrics", "step": step, "metrics": dict(metrics)})

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self._write({"kind": "samples", "step": step, "samples": [dict(s) for s in samples]})
        if step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        self._write({"kind": "evaluation", "step": step, "result": dict(result)})


def main(argv: list[str]) -> int:
    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.train.runner import train

    config, out_dir, log, kill_at = argv
    cfg = ExperimentConfig.from_dict(json.loads(Path(config).read_text()))
    train(cfg, sink=KillingSink(Path(log), int(kill_at)), out_dir=Path(out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
