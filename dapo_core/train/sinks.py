"""JsonlSink: a MetricsSink that appends JSON lines to three files in a run directory.

    metrics.jsonl      {"step": 3, "metrics": {"acc/mean": 0.41, ...}}
    samples.jsonl      {"step": 3, "samples": [{"prompt": ..., "response": ..., ...}, ...]}
    evaluations.jsonl  {"step": 12, "result": {"dataset": ..., "k": 4, "avg_at_k": ...}}

Each record is one line, written and flushed whole, and each file holds one record per step,
in step order, across kills and resumes (the MetricsSink contract: a replayed step overwrites):
- a run killed mid-write can leave a torn last line: the next sink to open the file cuts it back
  to its last complete line before appending, so no record merges with a torn one;
- a resumed run replays the steps after its checkpoint: the first record a sink writes to a file
  cuts that file back to the records before its step, so the replayed steps replace the killed
  try's instead of following them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
EVALUATIONS_FILE = "evaluations.jsonl"


class JsonlSink:
    """MetricsSink writing JSON lines under `path` (a directory, created if missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, IO[str]] = {}
        # A damaged file is said when the run starts, not after its first step's work.
        for name in (METRICS_FILE, SAMPLES_FILE, EVALUATIONS_FILE):
            check_records(self.path / name)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        values = {name: _number(value) for name, value in metrics.items()}
        self._write(METRICS_FILE, {"step": int(step), "metrics": values})

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self._write(SAMPLES_FILE, {"step": int(step), "samples": [dict(s) for s in samples]})

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        self._write(EVALUATIONS_FILE, {"step": int(step), "result": dict(result)})

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()

    def _write(self, name: str, record: dict[str, Any]) -> None:
        handle = self._files.get(name)
        if handle is None:
            repair_torn_tail(self.path / name)
            cut_from_step(self.path / name, int(record["step"]))
            handle = (self.path / name).open("a", encoding="utf-8")
            self._files[name] = handle
        handle.write(json.dumps(record, default=_jsonable) + "\n")
        handle.flush()  # a killed run keeps every step it finished

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _number(value: Any) -> float | None:
    """Floats as JSON numbers; NaN/inf (e.g. a metric with no tokens) as null."""
    x = float(value)
    return x if math.isfinite(x) else None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # torch / numpy scalars
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def repair_torn_tail(path: Path) -> int:
    """Cut a JSON-lines file back to its last complete line; returns the bytes removed."""
    if not path.exists():
        return 0
    with path.open("rb+") as handle:
        size = handle.seek(0, 2)
        if size == 0:
            return 0
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return 0
        # Walk back to the last newline (files are small per step; read in blocks).
        end, block = size, 1 << 16
        keep = 0
        while end > 0:
            start = max(0, end - block)
            handle.seek(start)
            chunk = handle.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
        return size - keep


def check_records(path: Path) -> None:
    """ValueError naming the file and line when a complete line of a JSON-lines file is not a
    record (a torn last line, without its newline, is the next write's to repair)."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if line.endswith(b"\n"):
                _record_step(path, number, line)


def cut_from_step(path: Path, step: int) -> int:
    """Drop the records of `step` and later from a step-ordered JSON-lines file (they are about
    to be written again); returns how many were dropped."""
    if not path.exists():
        return 0
    with path.open("rb+") as handle:
        offset, dropped = 0, 0
        for number, line in enumerate(handle, start=1):
            if _record_step(path, number, line) >= step:
                dropped = 1 + sum(1 for _ in handle)
                break
            offset += len(line)
        if dropped:
            handle.truncate(offset)
            handle.flush()
            os.fsync(handle.fileno())
        return dropped


def _record_step(path: Path, number: int, line: bytes) -> int:
    """The step of one record, or ValueError naming the file and line: a crash on some file
    systems leaves a block of NUL bytes where a record was, and rewriting around it would
    hide which steps are gone."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        what = "NUL bytes" if line.strip(b"\0\n") == b"" else "not a JSON record with a step"
        raise ValueError(
            f"{path}: line {number} is {what}; the file is damaged: move it aside to start its "
            "record over, or cut it back to the last good line"
        ) from None


class NullSink:
    """A MetricsSink that keeps nothing: the ranks of N workers other than rank 0 (which writes
    the run's one row per step) log through it."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        return None

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        return None

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None
