"""db.stats on scipy gives every table the numbers it gave before, within 1e-9.

The t distribution used to be computed by hand (an incomplete-beta continued fraction and
bisection, kept in tests/legacy_t.py as the reference); it is scipy's now. Checked on the
quantiles themselves, on random intervals, and on every Estimate of the ablation tables of the
suite's fixture stores (the ladder sweep, the two-arm sweep and the grid sweep), computed once
with scipy and once with the legacy quantile patched in.
"""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import legacy_t
import pytest
from dashboard_fixtures import build_grid_sweep, build_store
from hypothesis import given, settings
from hypothesis import strategies as st

from db import ablation, stats
from db.store import Store


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 7, 9, 15, 30, 120, 3.964206])
@pytest.mark.parametrize("p", [0.975, 0.95, 0.9, 0.995, 0.6])
def test_quantiles_equal_the_legacy_ones(df: float, p: float) -> None:
    assert stats.t_quantile(p, df) == pytest.approx(legacy_t.t_quantile(p, df), abs=1e-9)
    assert stats.t_cdf(2.5, df) == pytest.approx(legacy_t.t_cdf(2.5, df), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=20))
def test_intervals_equal_the_legacy_ones(values: list[float]) -> None:
    ours = stats.t_interval(values)
    mean, sd = stats.mean_sd(values)
    half = legacy_t.t_quantile(0.975, len(values) - 1) * sd / math.sqrt(len(values))
    assert ours.low == pytest.approx(mean - half, abs=1e-9)
    assert ours.high == pytest.approx(mean + half, abs=1e-9)


def _estimates(table: object) -> list[stats.Estimate]:
    rows = table.to_dict("records")  # type: ignore[attr-defined]
    return [v for row in rows for v in row.values() if isinstance(v, stats.Estimate)]


def test_every_fixture_table_is_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    fixture = build_store(url)
    grid_url = f"sqlite:///{tmp_path / 'grid.db'}"
    grid = build_grid_sweep(grid_url)
    cases = [
        (url, fixture.sweep_id),
        (url, fixture.other_sweep_id),
        (grid_url, grid.sweep_id),
    ]
    now = [_estimates(ablation.ablation_table(Store(u).engine, s)) for u, s in cases]
    monkeypatch.setattr(stats, "t_quantile", legacy_t.t_quantile)
    before = [_estimates(ablation.ablation_table(Store(u).engine, s)) for u, s in cases]
    compared = 0
    for new_rows, old_rows in zip(now, before, strict=True):
        assert len(new_rows) == len(old_rows)
        for new, old in zip(new_rows, old_rows, strict=True):
            for f in fields(stats.Estimate):
                a, b = getattr(new, f.name), getattr(old, f.name)
                if isinstance(a, float) and math.isnan(a):
                    assert math.isnan(b), f.name
                elif isinstance(a, float):
                    assert a == pytest.approx(b, abs=1e-9), f.name
                    compared += 1
                else:
                    assert a == b, f.name
    assert compared > 50  # the tables hold intervals, not only one-seed values
