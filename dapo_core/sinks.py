"""JsonlSink: a MetricsSink that appends JSON lines to three files in a run directory.

    metrics.jsonl      {"step": 3, "metrics": {"acc/mean": 0.41, ...}}
    samples.jsonl      {"step": 3, "samples": [{"prompt": ..., "response": ..., ...}, ...]}
    evaluations.jsonl  {"step": 12, "result": {"dataset": ..., "k": 4, "avg_at_k": ...}}

Appending is what makes it crash-safe; replay-idempotence comes from the readers, which keep the
last value per (step, name) — a step replayed after a resume overwrites its earlier values.
"""

from __future__ import annotations

import json
import math
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


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a kill mid-write: the step is replayed anyway
    return out


def _file(path: str | Path, name: str) -> Path:
    p = Path(path)
    return p / name if p.is_dir() else p


def read_jsonl_metrics(path: str | Path) -> dict[tuple[int, str], float | None]:
    """{(step, name): value}, the last write winning; `path` is the run directory or the file."""
    out: dict[tuple[int, str], float | None] = {}
    for record in _lines(_file(path, METRICS_FILE)):
        step = int(record["step"])
        for name, value in record["metrics"].items():
            out[(step, name)] = value
    return out


def read_jsonl_samples(path: str | Path) -> dict[int, list[dict[str, Any]]]:
    """{step: samples}, the last write per step winning."""
    return {int(r["step"]): list(r["samples"]) for r in _lines(_file(path, SAMPLES_FILE))}


def read_jsonl_evaluations(path: str | Path) -> dict[tuple[int, str], dict[str, Any]]:
    """{(step, dataset): result}, the last write winning."""
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for r in _lines(_file(path, EVALUATIONS_FILE)):
        out[(int(r["step"]), str(r["result"].get("dataset", "")))] = dict(r["result"])
    return out
