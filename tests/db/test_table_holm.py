"""`dapo table --holm`: Holm's correction over the table's Δ-parent stars, pinned by hand.

Holm's step-down test on m p-values: sorted, p_(1) against α/m, p_(2) against α/(m − 1), ...,
stopping at the first that fails. The p-values are the exact paired sign-flip test's, which
over 7 seeds are counts of the 2^7 = 128 sign assignments: every number below is by hand.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest
from table_stores import build_holm

from dapo_lab.cli import main
from db import ablation, stats
from db.store import Store

# The ladder a → b → c → d of tests/table_stores.py (build_holm), whose p-values are worked
# out there by hand: all three below 0.05, Holm keeps b's star only.
P = {"b": 2 / 128, "c": 4 / 128, "d": 6 / 128}
ADJUSTED = {"b": 0.046875, "c": 0.0625, "d": 0.0625}


@pytest.fixture
def sweep(tmp_path: Path) -> tuple[str, int]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    return url, build_holm(url)


def test_holm_by_hand() -> None:
    # m = 3 (the NaN is no test): 0.01 < 0.05/3 rejects; 0.03 ≥ 0.05/2 stops; 0.04 stays
    # although 0.04 < 0.05: step-down never passes a failure
    p = {"x": 0.04, "y": 0.01, "z": 0.03, "w": math.nan}
    assert stats.holm(p) == {"x": False, "y": True, "z": False, "w": False}
    adjusted = stats.holm_adjusted(p)
    assert adjusted["y"] == pytest.approx(0.03)  # 3 · 0.01
    assert adjusted["z"] == pytest.approx(0.06)  # 2 · 0.03
    assert adjusted["x"] == pytest.approx(0.06)  # max(0.06, 1 · 0.04)
    assert math.isnan(adjusted["w"])
    # one test: Holm is the unadjusted 5% test
    assert stats.holm({"only": 0.049}) == {"only": True}


def test_holm_stars_of_the_table(sweep: tuple[str, int]) -> None:
    url, sweep_id = sweep
    table = ablation.ablation_table(Store(url).engine, sweep_id)
    result = ablation.holm_stars(table)
    assert result.p == pytest.approx(P, abs=1e-6)
    assert result.adjusted == pytest.approx(ADJUSTED, abs=1e-6)
    assert result.starred == ("b", "c", "d")
    assert result.holm == ("b",)
    assert result.lost == ("c", "d")
    note = ablation.holm_note(result)
    assert note.startswith(
        "Holm over the 3 Δ parent test(s) (family-wise 5%): 3 starred, 1 after Holm; "
        "star lost under Holm: c (p = 0.0312, Holm p = 0.0625), d (p = 0.0469, Holm p = 0.0625)"
    )


def test_cli_holm_in_each_format(
    sweep: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, sweep_id = sweep
    args = ["table", "--store", url, "--sweep", str(sweep_id), "--wide"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert "Holm" not in plain  # the default table is unchanged
    assert main([*args, "--holm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(plain.rstrip("\n"))  # the table as it was, the note under it
    assert "3 starred, 1 after Holm" in out and "star lost under Holm: c" in out
    assert main([*args, "--holm", "--format", "markdown"]) == 0
    assert "*Holm over the 3 Δ parent test(s)" in capsys.readouterr().out
    assert main([*args, "--holm", "--format", "csv"]) == 0
    rows = {r["arm"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert rows["a"]["delta_parent_p"] == ""  # the base arm has no parent: no test
    assert float(rows["c"]["delta_parent_p"]) == pytest.approx(P["c"], abs=1e-6)
    assert float(rows["c"]["delta_parent_holm_p"]) == pytest.approx(ADJUSTED["c"], abs=1e-6)
    assert [rows[a]["delta_parent_holm_significant"] for a in "bcd"] == ["1", "0", "0"]
