"""Step-level progress and ETA of running runs, read from the store as the trainer writes it
(db.live); every number worked out by hand from the rows written here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from store_runs import new_attempt

from dapo_common import metric_names as M
from db import live
from db.engine import get_engine
from db.store import Store


def config(steps: int) -> dict[str, object]:
    return {"run": {"steps": steps, "seed": 0}, "rollout": {"group_size": 4}}


def write_steps(store: Store, run_id: int, times: list[float], *, first: int = 1) -> None:
    """Steps first, first + 1, ... as the trainer logs them: the counter and the step's time."""
    with store.sink(run_id) as sink:
        for i, seconds in enumerate(times):
            step = first + i
            sink.log_metrics(step, {M.ROLLOUT_STEP: float(step), M.STEP_S: seconds})


@pytest.fixture()
def store(tmp_path: Path) -> tuple[str, dict[str, int]]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(url)
    sweep = store.create_sweep(
        name="live", preset="tiny", arms=["grpo", "dapo"], seeds=[0, 1], base_config=config(4),
        ladder=[],
    )  # fmt: skip
    ids: dict[str, int] = {}
    # grpo: done, 4 of 4 steps
    ids["done"] = new_attempt(store, sweep, "grpo", 0, config=config(4), config_hash="a")
    write_steps(store, ids["done"], [1.0] * 4)
    store.update_run(ids["done"], status="completed", steps=4)
    # dapo: running, 12 of 20 steps; the first two slow (a cold start), then 2 s, then 4 s
    ids["running"] = new_attempt(store, sweep, "dapo", 0, config=config(20), config_hash="b")
    write_steps(store, ids["running"], [30.0, 30.0] + [2.0] * 5 + [4.0] * 5)
    # a rerun of grpo's done pair, one step in: it must not count twice in the sweep's progress
    ids["rerun"] = new_attempt(store, sweep, "grpo", 0, config=config(4), config_hash="a")
    write_steps(store, ids["rerun"], [1.5])
    # one that has stored nothing yet
    ids["fresh"] = new_attempt(store, sweep, "dapo", 1, config=config(20), config_hash="c")
    ids["sweep"] = sweep
    return url, ids


def test_a_running_run_reads_its_step_and_an_eta_at_its_recent_pace(
    store: tuple[str, dict[str, int]],
) -> None:
    url, ids = store
    engine = get_engine(url)
    progress = live.run_progress(engine, [ids["running"], ids["done"], ids["fresh"]])
    assert progress["run_id"].tolist() == [ids["running"], ids["done"], ids["fresh"]]
    running = progress.iloc[0]
    assert (running["step"], running["steps"]) == (12, 20.0)
    assert running["fraction"] == pytest.approx(0.6)
    # the last ETA_WINDOW = 10 steps: five of 2 s and five of 4 s -> 3 s a step (the two
    # 30 s steps of the cold start are left out); 8 steps left -> 24 s
    assert running["step_s"] == pytest.approx(3.0)
    assert running["eta_s"] == pytest.approx(24.0)
    done = progress.iloc[1]
    assert (done["step"], done["fraction"], done["eta_s"]) == (4, 1.0, 0.0)
    fresh = progress.iloc[2]
    assert fresh["step"] == 0 and fresh["fraction"] == 0.0 and math.isnan(fresh["eta_s"])
    assert live.run_progress(engine, []).empty


def test_the_sweep_moves_by_steps_and_a_rerun_counts_once(
    store: tuple[str, dict[str, int]],
) -> None:
    url, ids = store
    engine = get_engine(url)
    running = live.running_runs(engine)
    assert running == [ids["running"], ids["rerun"], ids["fresh"]]
    assert live.running_runs(engine, [ids["sweep"] + 1]) == []
    progress = live.run_progress(engine, running)
    rerun = progress[progress["run_id"] == ids["rerun"]].iloc[0]
    assert bool(rerun["replaces_done"]) and rerun["fraction"] == pytest.approx(0.25)
    # 2 arms x 2 seeds = 4 pairs: grpo s0 done (1) + dapo s0 at 12/20 (0.6) + dapo s1 at 0
    # + grpo s1 not started -> 1.6 / 4 = 40%, where counting finished runs reads 1/4; the
    # rerun of grpo s0 (one step in) adds nothing, its pair is done
    assert live.sweep_fraction(1, 4, progress, ids["sweep"]) == pytest.approx(0.4)
    # with nothing finished ("0/4 · 0%" before) the steps still count: 0.6 / 4
    assert live.sweep_fraction(0, 4, progress, ids["sweep"]) == pytest.approx(0.15)
    assert math.isnan(live.sweep_fraction(0, 0, progress, ids["sweep"]))
