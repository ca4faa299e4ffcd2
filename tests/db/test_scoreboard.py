"""The mechanism scoreboard (db.scoreboard, `dapo table --scoreboard`) on a small store built
here: each check's row from the sweep of its name, the dose-response's updates to 50%, area,
cap-only prediction and Page's trend test, the entropy probe's slopes and verdicts, and the
rows no sweep measures yet. Numbers by hand."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from pathlib import Path

import pytest
from store_runs import new_attempt

from dapo_common import metric_names as M
from dapo_lab.cli import main
from db import scoreboard, stats
from db.store import Store

T2 = 4.302653  # t(0.975, 2)
SEEDS = (0, 1, 2)


def _config(clip_low: float, clip_high: float, train: str = "lookup") -> dict[str, object]:
    return {
        "algo": {"clip_low": clip_low, "clip_high": clip_high, "ppo_epochs": 4},
        "batch": {"train_batch_size": 32, "mini_batch_size": 8},
        "data": {"train": train},
    }


def _run(
    store: Store,
    sweep_id: int,
    arm: str,
    seed: int,
    config: Mapping[str, object],
    metrics: Mapping[int, Mapping[str, float]],
    evals: Mapping[int, float] | None = None,
) -> None:
    run_id = new_attempt(store, sweep_id, arm, seed, config=config, config_hash=f"{arm}-{seed}")
    with store.sink(run_id) as sink:
        for step, values in metrics.items():
            sink.log_metrics(step, dict(values))
        for step, score in (evals or {}).items():
            sink.log_evaluation(step, {"dataset": "lookup-eval", "k": 16, "avg_at_k": score})
    store.update_run(run_id, status="completed", steps=max(metrics))


# The dose sweep: the step (1-4) at which each seed's held-out curve first reaches 50%, 16
# updates a step (4 epochs × 32 / 8), so updates = 16 × step.
REACHED = {
    "eps_high=0.1": (4, 4, 3),
    "eps_high=0.2": (3, 3, 3),
    "eps_high=0.28": (2, 3, 2),
    "eps_high=0.5": (2, 2, 1),
}
HIGHS = {"eps_high=0.1": 0.1, "eps_high=0.2": 0.2, "eps_high=0.28": 0.28, "eps_high=0.5": 0.5}


def _curve(reached: int) -> dict[int, float]:
    """0.15 at step 0, 0.3 until `reached`, 0.6 from it on (steps 0-4)."""
    return {s: 0.15 if s == 0 else (0.6 if s >= reached else 0.3) for s in range(5)}


def build(url: str) -> dict[str, int]:
    store = Store(url)
    ids: dict[str, int] = {}
    arms = list(REACHED)
    ids["dose"] = store.create_sweep(
        name=scoreboard.DOSE_SWEEP,
        preset="lookup",
        arms=arms,
        seeds=list(SEEDS),
        base_config={},
        ladder=[{"arm": a} for a in arms],  # a chain: each arm's parent is the one above
    )
    for arm, steps in REACHED.items():
        for seed, reached in zip(SEEDS, steps, strict=True):
            # clip_ratio/high: 2%·(seed + 1) over the first 5 steps, 9% after (not counted)
            metrics = {
                s: {
                    M.GRAD_UPDATES: 16.0 * s,
                    M.CLIP_RATIO_HIGH: 0.02 * (seed + 1) if s <= 5 else 0.09,
                    M.CLIP_RATIO_HIGH_ELIGIBLE: 0.1,
                    M.CLIP_RATIO_HIGH_NATURAL: 0.5,  # half the eligible tokens passed the bound
                    M.RATIO_MAX: 1.0 + HIGHS[arm] + 0.1 * s,  # moving past it, more each step
                }
                for s in range(1, 7)
            }
            _run(store, ids["dose"], arm, seed, _config(0.1, HIGHS[arm]), metrics, _curve(reached))

    # The entropy probe: entropy/decision = 1.5 + slope × step over 10 steps.
    probe = {
        "eps=0.2_0.2": (-0.010, -0.012, -0.008),
        "eps_high=0.28": (-0.005, -0.006, -0.004),  # Δ +0.005, +0.006, +0.004
        "eps_high=0.5": (-0.007, -0.008, -0.006),  # Δ −0.002 each: opposite
        "eps_low=0.1": (-0.009, -0.013, -0.0085),  # Δ +0.001, −0.001, −0.0005: not decided
    }
    clips = {
        "eps=0.2_0.2": (0.2, 0.2),
        "eps_high=0.28": (0.2, 0.28),
        "eps_high=0.5": (0.2, 0.5),
        "eps_low=0.1": (0.1, 0.2),
    }
    ids["entropy"] = store.create_sweep(
        name=scoreboard.ENTROPY_SWEEP,
        preset="lookup",
        arms=list(probe),
        seeds=list(SEEDS),
        base_config={},
        ladder=[
            {"arm": "eps=0.2_0.2"},
            {"arm": "eps_high=0.28"},
            {"arm": "eps_high=0.5"},
            {"arm": "eps_low=0.1", "parent": "eps=0.2_0.2"},
        ],
    )
    for arm, slopes in probe.items():
        for seed, slope in zip(SEEDS, slopes, strict=True):
            metrics = {
                s: {M.ENTROPY_DECISION: 1.5 + slope * s, M.CLIP_RATIO_HIGH: 0.05}
                for s in range(1, 11)
            }
            config = _config(*clips[arm], train="lookup-coin")
            _run(store, ids["entropy"], arm, seed, config, metrics, {0: 0.15, 10: 0.15})

    # The tiny ladder's first two arms, three seeds: truncated responses' share of the loss
    # 5, 6, 7% under grpo, 0 under the filter.
    ids["tiny"] = store.create_sweep(
        name=scoreboard.TINY_SWEEP,
        preset="tiny",
        arms=["grpo", "overlong_filter"],
        seeds=list(SEEDS),
        base_config={},
        ladder=[{"arm": "grpo"}, {"arm": "overlong_filter"}],
    )
    for seed in SEEDS:
        for arm, share in (("grpo", 0.05 + 0.01 * seed), ("overlong_filter", 0.0)):
            config = {"algo": {"overlong_filter": arm == "overlong_filter"}}
            metrics = {s: {M.LOSS_TRUNCATED_SHARE: share} for s in range(1, 11)}
            _run(store, ids["tiny"], arm, seed, config, metrics, {0: 0.2, 10: 0.3})
    return ids


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, int]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('scoreboard') / 'store.db'}"
    return url, build(url)


def test_cap_only_prediction_by_hand() -> None:
    # ln(0.5 / 0.15) / ln(1 + ε): 1.20397 / 0.09531 = 12.63; / 0.18232 = 6.60; / 0.24686 =
    # 4.88; / 0.40547 = 2.97 (the 12.6, 6.6, 4.9, 3.0)
    got = [scoreboard.cap_only_steps(0.15, 0.5, e) for e in (0.1, 0.2, 0.28, 0.5)]
    assert got == pytest.approx([12.632, 6.604, 4.877, 2.969], abs=1e-3)
    assert scoreboard.cap_only_steps(0.6, 0.5, 0.2) == 0.0  # already there
    assert math.isnan(scoreboard.cap_only_steps(0.0, 0.5, 0.2))


def test_dose_response_by_hand(store: tuple[str, dict[str, int]]) -> None:
    url, ids = store
    dose = scoreboard.dose_response(Store(url).engine, ids["dose"])
    assert [a.arm for a in dose.arms] == list(REACHED)
    assert dose.updates_per_step == 16.0 and dose.start == pytest.approx(0.15)
    by = {a.arm: a for a in dose.arms}
    # updates = 16 × the step reached: ε 0.1 → (64, 64, 48), mean 58.67; 0.5 → (32, 32, 16)
    assert by["eps_high=0.1"].updates.mean == pytest.approx(176 / 3)
    assert by["eps_high=0.5"].steps.mean == pytest.approx(5 / 3)
    assert by["eps_high=0.1"].reached == "3/3"
    # Δ parent (updates) of 0.28 against 0.2: (32 − 48, 48 − 48, 32 − 48) = (−16, 0, −16)
    d = by["eps_high=0.28"].delta_updates
    assert d.mean == pytest.approx(-32 / 3) and d.n == 3
    # area: ε 0.1, seed 0 reached at 4: (0.15 + 0.3 × 3 + 0.6) / 5 = 0.33
    assert by["eps_high=0.1"].area_by_seed[0] == pytest.approx(0.33)
    assert by["eps_high=0.5"].area_by_seed[2] == pytest.approx((0.15 + 0.6 * 4) / 5)
    # clip_ratio/high over the first 5 steps: 2%, 4%, 6% by seed → 4% [4 ± 4.303 · 2/√3]
    early = by["eps_high=0.2"].clip_high_early
    assert early.mean == pytest.approx(0.04)
    assert early.high - early.mean == pytest.approx(T2 * 0.02 / math.sqrt(3), rel=1e-5)
    assert by["eps_high=0.2"].predicted_steps == pytest.approx(6.604, abs=1e-3)
    assert by["eps_high=0.2"].natural_early.mean == pytest.approx(0.5)
    # ratio/max over steps 1-5: 1.2 + 0.1 · (1 + 2 + 3 + 4 + 5) / 5 = 1.5
    assert by["eps_high=0.2"].ratio_max_early.mean == pytest.approx(1.5)
    # Page's L with predicted ranks 4, 3, 2, 1 (updates fall as ε_high grows). Ranks within
    # each seed (ascending updates, ties averaged): seed 0 (64, 48, 32, 32) → 4, 3, 1.5, 1.5;
    # seed 1 (64, 48, 48, 32) → 4, 2.5, 2.5, 1; seed 2 (48, 48, 32, 16) → 3.5, 3.5, 2, 1.
    # Rank sums 11.5, 9, 6, 3.5: L = 4·11.5 + 3·9 + 2·6 + 1·3.5 = 88.5 (at most 90).
    L, p, n = dose.trend_updates
    assert (L, n) == (88.5, 3) and p < 0.01
    assert dose.trend_area[0] == 88.5  # the areas rank the other way round, as predicted
    # interpolated: 0.3 one step before `reached`, 0.6 at it: reached − 1 + 0.2 / 0.3
    assert by["eps_high=0.1"].crossing_by_seed[2] == pytest.approx(2 + 2 / 3)
    assert by["eps_high=0.28"].delta_crossing.mean == pytest.approx(-2 / 3)
    assert dose.trend_crossing[0] == 88.5
    assert scoreboard.monotone([a.updates for a in dose.arms], increasing=False)
    assert scoreboard.monotone([a.area for a in dose.arms], increasing=True)


def test_crossing_by_hand() -> None:
    assert scoreboard.crossing_step({0: 0.15, 1: 0.3, 2: 0.6}, 0.5) == pytest.approx(1 + 2 / 3)
    assert scoreboard.crossing_step({0: 0.15, 1: 0.5}, 0.5) == 1.0  # reached exactly
    assert scoreboard.crossing_step({0: 0.55, 1: 0.7}, 0.5) == 0.0  # there from the start
    # the first crossing counts: 0 + (0.5 − 0.15) / (0.6 − 0.15)
    assert scoreboard.crossing_step({0: 0.15, 1: 0.6, 2: 0.4, 3: 0.9}, 0.5) == pytest.approx(
        0.35 / 0.45
    )
    assert scoreboard.crossing_step({0: 0.15, 1: 0.45}, 0.5) == math.inf


def test_page_trend_counts_a_seed_that_never_reached_as_slowest() -> None:
    never = {0: math.inf, 1: 64.0}
    L, _, n = scoreboard.page_trend(
        [never, {0: 48.0, 1: 48.0}, {0: 32.0, 1: 32.0}], increasing=False
    )
    assert n == 2 and L == 2 * (3 * 3 + 2 * 2 + 1 * 1)  # every seed in the predicted order
    assert math.isnan(scoreboard.page_trend([{0: 1.0}, {0: 2.0}], increasing=True)[1])


def test_entropy_probe_by_hand(store: tuple[str, dict[str, int]]) -> None:
    url, ids = store
    probe = scoreboard.entropy_probe(Store(url).engine, ids["entropy"])
    by = {a.arm: a for a in probe.arms}
    assert [a.arm for a in probe.arms] == ["eps=0.2_0.2", "eps_high=0.28", "eps_high=0.5",
                                           "eps_low=0.1"]  # fmt: skip
    sym = by["eps=0.2_0.2"]
    assert sym.slope.mean == pytest.approx(-0.010) and sym.verdict == "as predicted"
    assert (sym.clip_low, sym.clip_high) == (0.2, 0.2)
    # Δ (+0.005, +0.006, +0.004): mean 0.005, sd 0.001 → ± 4.303 · 0.001/√3, above 0; but
    # over 3 seeds the exact test's smallest p is 2/8 = 0.25: no verdict below 6 seeds
    high = by["eps_high=0.28"].delta_parent
    assert high.mean == pytest.approx(0.005)
    assert high.low == pytest.approx(0.005 - T2 * 0.001 / math.sqrt(3), rel=1e-5)
    assert high.p == pytest.approx(0.25)
    assert by["eps_high=0.28"].verdict == "not decided (p = 0.25); leans as predicted"
    assert by["eps_high=0.5"].parent == "eps_high=0.28"
    assert by["eps_high=0.5"].delta_parent.mean == pytest.approx(-0.002)
    assert by["eps_high=0.5"].verdict == "not decided (p = 0.25); leans the other way"
    assert by["eps_low=0.1"].parent == "eps=0.2_0.2"
    # (+1, −1, −0.5)/1000: |Σ| = 0.5, the smallest any flip gives: p = 1
    assert by["eps_low=0.1"].verdict == "not decided (p = 1); leans the other way"
    # entropy over the first and last 5 of 10 steps: 1.5 + slope × 3 and × 8
    assert sym.first.mean == pytest.approx(1.5 - 0.030) and sym.last.mean == pytest.approx(1.42)


def test_verdicts_follow_the_exact_test() -> None:
    # six differences of one sign: p = 2/64 = 0.031, decided; the first arm's slope is no
    # difference (no p): its interval decides
    up = stats.paired({s: 1.0 + s for s in range(6)}, {s: 0.0 for s in range(6)})
    assert up.p == pytest.approx(2 / 64)
    assert scoreboard._verdict(up, scoreboard.RAISES) == "as predicted"
    assert scoreboard._verdict(up, scoreboard.LOWERS) == "opposite"
    falling = stats.t_interval([-1.0, -1.1, -0.9])  # −1 ± 4.303 · 0.1/√3: below 0
    assert scoreboard._verdict(falling, scoreboard.LOWERS) == "as predicted"
    flat = stats.t_interval([-1.0, 1.0, -0.5])
    assert scoreboard._verdict(flat, scoreboard.LOWERS) == (
        "not decided (interval spans 0); leans as predicted"
    )
    assert scoreboard._verdict(stats.EMPTY, scoreboard.LOWERS) == "not measured"


def test_slope_by_hand() -> None:
    import pandas as pd

    # (1, 1.0), (2, 0.9), (3, 0.5): x̄ 2, ȳ 0.8; Σ(x − x̄)(y − ȳ) = −0.2 + 0 − 0.3 = −0.5 over
    # Σ(x − x̄)² = 2: slope −0.25. Two points are not enough.
    curves = pd.DataFrame(
        {
            "arm": ["a"] * 3 + ["b"] * 2,
            "seed": [0] * 5,
            "step": [1, 2, 3, 1, 2],
            "name": [M.ENTROPY_DECISION] * 5,
            "value": [1.0, 0.9, 0.5, 1.0, 2.0],
        }
    )
    assert scoreboard.per_seed_slope(curves, M.ENTROPY_DECISION) == {"a": {0: pytest.approx(-0.25)}}


def test_scoreboard_rows(store: tuple[str, dict[str, int]]) -> None:
    url, ids = store
    rows = scoreboard.scoreboard(Store(url).engine)
    assert [r.check.mechanism for r in rows] == [c.mechanism for c in scoreboard.CHECKS]
    mechanisms = {r.check.mechanism for r in rows}
    assert {"overlong filter", "Clip-Higher", "soft overlong punishment", "token-level loss",
            "dynamic sampling"} <= mechanisms  # fmt: skip
    by = {(r.check.mechanism, r.check.kind): r for r in rows}
    # overlong filter: (0 − 0.05, 0 − 0.06, 0 − 0.07) over the first 10 steps
    overlong = by[("overlong filter", scoreboard.WINDOW)]
    assert overlong.sweep_id == ids["tiny"] and overlong.delta.n == 3
    assert overlong.delta.mean == pytest.approx(-0.06)
    # the interpolated crossings × 16: (−1, 0, −1) steps, as the discrete ones here
    reach = by[("Clip-Higher", scoreboard.REACH)].delta
    assert reach.mean == pytest.approx(-32 / 3) and reach.keys == SEEDS
    # the exact sign-flip p of (−16, 0, −16): |Σ| = 32 is reached when the two 16s agree,
    # 2 of their 4 sign pairs (× 2 signs of the 0): p = 4/8
    assert reach.p == pytest.approx(0.5)
    area = by[("Clip-Higher", scoreboard.AREA)].delta
    # areas: 0.2 (3, 3, 3) → 0.15 + 0.3·2 + 0.6·2 = 1.95/5 = 0.39; 0.28 (2, 3, 2) → 0.45,
    # 0.39, 0.45: Δ (0.06, 0, 0.06)
    assert area.mean == pytest.approx(0.04)
    slope = by[("Clip-Higher", scoreboard.SLOPE)].delta
    assert slope.mean == pytest.approx(0.005)
    # In the sweep, but without the arms: no completed pair. Not in the store: the command.
    assert by[("soft overlong punishment", scoreboard.WINDOW)].delta.n == 0
    assert by[("soft overlong punishment", scoreboard.WINDOW)].status.startswith("no completed")
    real = by[("Clip-Higher, real model", scoreboard.WINDOW)]
    assert real.sweep_id is None and scoreboard.REAL_COMMAND in real.status


def test_the_newest_sweep_of_a_name_counts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(url)
    kw = {
        "preset": "tiny",
        "arms": ["a"],
        "seeds": [0],
        "base_config": {},
        "ladder": [{"arm": "a"}],
    }
    first = store.create_sweep(name="x", **kw)  # type: ignore[arg-type]
    second = store.create_sweep(name="x", **kw)  # type: ignore[arg-type]
    store.create_sweep(name="y", **kw)  # type: ignore[arg-type]
    assert second > first
    assert scoreboard.find_sweep(store.engine, "x") == second
    assert scoreboard.find_sweep(store.engine, "z") is None


def test_cli_scoreboard(
    store: tuple[str, dict[str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = store
    assert main(["table", "--store", url, "--scoreboard"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(scoreboard.CAPTION)
    assert "overlong_filter − grpo" in out and "-6.00 [" in out  # pp, two decimals
    assert "not measured" in out and scoreboard.REAL_COMMAND in out
    assert "Clip-Higher's dose-response" in out and "The entropy probe" in out
    assert "L = 88.5" in out
    assert "high_natural, first 5 (%)" in out and "ratio/max, first 5" in out
    # one sweep's detail
    assert main(["table", "--store", url, "--scoreboard", "--sweep", str(ids["entropy"])]) == 0
    detail = capsys.readouterr().out
    assert detail.startswith("The entropy probe") and "leans the other way" in detail
    # CSV: one row per check, numbers in the metric's own unit
    assert main(["table", "--store", url, "--scoreboard", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == len(scoreboard.CHECKS)
    assert float(rows[0]["delta_mean"]) == pytest.approx(-0.06) and rows[0]["n"] == "3"
    assert rows[-1]["n"] == "0" and rows[-1]["delta_mean"] == ""
    # Markdown for the docs page
    assert main(["table", "--store", url, "--scoreboard", "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("| mechanism | task |") and f"`{scoreboard.TINY_COMMAND}`" in md


def test_estimates_are_the_stats_modules() -> None:
    # the rows' Δs are db.stats.paired over seeds: the same record the ablation table uses
    got = stats.paired({0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.0})
    assert got.mean == pytest.approx(0.75) and got.keys == (0, 1)


def test_the_docs_page_is_written_from_the_store(
    store: tuple[str, dict[str, int]], tmp_path: Path
) -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "scoreboard.py"
    spec = importlib.util.spec_from_file_location("scoreboard_script", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    url, ids = store
    page = tmp_path / "mechanisms.md"
    names = ("scoreboard", "clip-dose", "clip-entropy")
    page.write_text(
        "# t\n\n"
        + "".join(f"<!-- table:{n} -->\nold\n<!-- /table:{n} -->\nkept {n}\n" for n in names)
    )
    args = ["--store", url, "--page", str(page)]
    assert script.main([*args, "--check"]) == 1  # it would change
    assert script.main(args) == 0
    text = page.read_text()
    assert "old" not in text and all(f"kept {n}" in text for n in names)
    assert "| mechanism | task |" in text and "Clip-Higher's dose-response" in text
    assert f"(sweep {ids['entropy']})" in text
    assert script.main([*args, "--check"]) == 0  # up to date now
    # every check's command is listed once; the real model's only on request
    assert script.commands(real_model=False) == [
        scoreboard.TINY_COMMAND,
        scoreboard.DOSE_COMMAND,
        scoreboard.ENTROPY_COMMAND,
    ]
    assert script.commands(real_model=True)[-1] == scoreboard.REAL_COMMAND
