"""The display table (dapo_common.metric_display): every metric has a name and a unit, shares are
shown in percent everywhere, and docs/units.md lists what the table says."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_common import metric_display as D
from dapo_common import metric_names as M
from db import mechanisms

ROOT = Path(__file__).resolve().parents[2]


def logged_names() -> list[str]:
    """Every metric name constant of dapo_common.metric_names (not the prefixes)."""
    return [
        value
        for key, value in vars(M).items()
        if key.isupper() and isinstance(value, str) and "/" in value and not value.endswith("/")
    ]


def test_every_metric_the_trainer_names_has_a_display_name() -> None:
    missing = [name for name in logged_names() if name not in D.DISPLAY]
    # the memory phases and the staleness lags are families, named from their prefix
    families = (M.PEAK_MEM_PREFIX, M.STALENESS_LAG_PREFIX)
    missing = [name for name in missing if not name.startswith(families)]
    assert missing == []
    # no two metrics share a title: an axis must say which one it is
    names = [d.name for d in D.DISPLAY.values()]
    assert len(names) == len(set(names))


def test_a_share_is_shown_in_percent_wherever_the_tables_show_it_so() -> None:
    # the mechanism table's percent metrics (db.mechanisms.PERCENT) are shares here too
    assert {m for m in mechanisms.PERCENT if not D.is_share(m)} == set()
    assert D.scale(M.ACC_MEAN) == 100.0 and D.unit(M.ACC_MEAN) == "%"
    assert D.label(M.ACC_MEAN) == "training accuracy (%)"
    assert D.label(M.EVAL_AVG_AT_K) == "held-out avg@k (%)"
    assert D.held_out(4) == "held-out avg@4 (%)"
    assert D.held_out(8, "pass") == "held-out pass@8 (%)"


@pytest.mark.parametrize(
    ("metric", "value", "shown"),
    [
        (M.ACC_MEAN, 0.4336, "43.4%"),  # the Compare page showed 0.4336 above a table's 43.4
        (M.ENTROPY_MEAN, 1.23456, "1.23 nats"),
        (M.RESPONSE_LENGTH_MEAN, 512.4, "512 tokens"),
        (M.GEN_BATCHES, 3.0, "3"),
        (M.GRAD_NORM, 0.003123, "0.00312"),
        (M.ACC_MEAN, float("nan"), "—"),
        (M.ACC_MEAN, None, "—"),
        ("custom/new_metric", 0.25, "0.25"),  # unknown: as logged, unscaled
    ],
)
def test_values_as_text(metric: str, value: float | None, shown: str) -> None:
    assert D.text(metric, value) == shown


def test_families_and_unknown_names() -> None:
    assert D.label(M.peak_mem("rollout")) == "peak memory, rollout (GiB)"
    assert D.label(M.per_rank(M.UPDATE_S, 1)) == "update time, rank1 (s)"
    assert D.label("custom/new_metric") == "custom/new_metric"
    assert D.scale("custom/new_metric") == 1.0
    assert D.number_format(M.ACC_MEAN) == ".1f"
    assert D.number_format(M.TOKENS_TOTAL) == ",.0f"


def test_docs_units_lists_every_metric_with_its_shown_unit() -> None:
    text = (ROOT / "docs" / "units.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`"): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines()
        if line.startswith("| `")
    }
    for metric, shown in D.DISPLAY.items():
        assert metric in rows, metric
        name, stored, unit = rows[metric]
        assert name == shown.name, metric
        expected = {"%": "%", D.COUNT: "count", "": "—"}.get(shown.unit, shown.unit)
        assert unit == expected, metric
        assert (stored == "fraction, 0–1") == (shown.unit == "%"), metric
