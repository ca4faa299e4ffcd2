"""The small protocols through which the trainer talks to the outside world.

The outer layers (db/, flows/) implement them structurally: they never import dapo_core's
classes, they only provide objects with these methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class MetricsSink(Protocol):
    """Where a run's numbers go. Writes must be idempotent on (step, name): a step replayed
    after a resume overwrites its earlier values and never duplicates them."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """All scalar metrics of one rollout step (names from dapo_common.metric_names)."""

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """A few rollouts of the step. Keys: prompt, response, ground_truth, pred, reward,
        score, overlong_penalty, correct (bool), length (int), truncated (bool)."""

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        """One evaluation. Keys: dataset, k, avg_at_k, pass_at_k, cons_at_k, n_problems, and
        correct_per_problem (correct samples of k per problem, in the eval set's order)."""

    def close(self) -> None:
        """Flush and release resources."""
