"""The store at scale (issue 27): per-run summaries equal the full scan they replace, migration
0005 backfills them into an existing store, and downsampled curves keep what they promise.

Each test builds a tiny store (a few runs, tens of steps) on SQLite and PostgreSQL; the bench
(bench/bench_scale.py) is what measures 10M rows.
"""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest
import sqlalchemy as sa
from store_runs import new_attempt

from db import ablation, mechanisms, migrate, reads, summaries, table_format
from db import engine as db_engine
from db.mechanism_table import _window_means, mechanism_table
from db.models import METRICS, RUN_METRIC_SUMMARIES, SUMMARY_WINDOW
from db.store import Store

NAMES = ("acc/mean", "entropy/mean", "clip_ratio/high", "progress/grad_updates")
ARMS = ("grpo", "clip_higher")


def _fill(store: Store, *, steps: dict[tuple[str, int], int], end: bool = True) -> list[int]:
    """A sweep of ARMS x seeds whose runs log NAMES through the real sink for the given number
    of steps each; `entropy/mean` is NaN every 7th step and `clip_ratio/high` starts at step 5
    (a metric logged by only part of the run, so its own bounds differ from the run's)."""
    seeds = sorted({seed for _, seed in steps})
    sweep_id = store.create_sweep(
        name="scale",
        preset="tiny",
        arms=ARMS,
        seeds=seeds,
        base_config={},
        ladder=[{"arm": "grpo"}, {"arm": "clip_higher", "parent": "grpo"}],
    )
    run_ids = []
    for (arm, seed), n in steps.items():
        config = {"algo": {"clip_high": 0.28 if arm == "clip_higher" else 0.2}}
        run_id = new_attempt(store, sweep_id, arm, seed, config=config, config_hash=arm)
        rng = random.Random(run_id)
        with store.sink(run_id) as sink:
            for step in range(1, n + 1):
                values = {name: rng.random() for name in NAMES}
                if step % 7 == 0:
                    values["entropy/mean"] = math.nan
                if step < 5:
                    del values["clip_ratio/high"]
                sink.log_metrics(step, values)
        if end:
            store.end_attempt(run_id, "completed", steps=n)
        run_ids.append(run_id)
    return run_ids


def _scan(engine: sa.Engine, run_id: int, window: int) -> pd.DataFrame:
    """What the summaries stand for, computed here from the rows in pandas (not SQL)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(METRICS.c.step, METRICS.c.name, METRICS.c.value).where(
                METRICS.c.run_id == run_id
            )
        ).all()
    frame = pd.DataFrame(rows, columns=["step", "name", "value"]).astype({"value": float})
    lo, hi = frame["step"].min(), frame["step"].max()
    out = []
    for name, group in frame.groupby("name"):
        head = group.loc[group["step"] <= lo + window - 1, "value"].dropna()
        tail = group.loc[group["step"] >= hi - window + 1, "value"].dropna()
        out.append(
            {
                "name": name,
                "n_rows": len(group),
                "n_values": int(group["value"].notna().sum()),
                "min_step": int(group["step"].min()),
                "max_step": int(group["step"].max()),
                "min_value": group["value"].min(),
                "max_value": group["value"].max(),
                "run_first_step": int(lo),
                "run_last_step": int(hi),
                "head_mean": head.mean() if len(head) else math.nan,
                "tail_mean": tail.mean() if len(tail) else math.nan,
            }
        )
    return pd.DataFrame(out).set_index("name").sort_index()


def _stored(engine: sa.Engine, run_id: int) -> pd.DataFrame:
    s = RUN_METRIC_SUMMARIES.c
    with engine.connect() as conn:
        rows = conn.execute(sa.select(RUN_METRIC_SUMMARIES).where(s.run_id == run_id)).all()
    frame = pd.DataFrame(rows, columns=list(summaries.SUMMARY_COLUMNS))
    return frame.drop(columns=["run_id"]).set_index("name").sort_index()


def test_a_runs_summary_equals_the_full_scan(store_url: str) -> None:
    """end_attempt writes each metric's summary; every field equals the pandas scan of the rows
    (NaN rows counted as rows, left out of min, max and the window means)."""
    store = Store(store_url)
    run_ids = _fill(store, steps={("grpo", 0): 23, ("clip_higher", 0): 31})
    for run_id in run_ids:
        stored, scanned = _stored(store.engine, run_id), _scan(store.engine, run_id, 10)
        assert list(stored.index) == sorted(NAMES)
        assert (stored["window"] == SUMMARY_WINDOW).all()
        pd.testing.assert_frame_equal(
            stored.drop(columns=["window"]), scanned, check_dtype=False, rtol=1e-12
        )
    # clip_ratio/high starts at step 5: its own bounds are not the run's
    first = _stored(store.engine, run_ids[0]).loc["clip_ratio/high"]
    assert (first["min_step"], first["run_first_step"]) == (5, 1)


def test_readers_give_the_same_answers_from_summaries_as_from_rows(store_url: str) -> None:
    """metric_names and the mechanism table's window means read summaries for ended runs: the
    same values as the scan of the rows (summaries deleted), and the same rendered table."""
    store = Store(store_url)
    steps = {(arm, seed): 20 + 3 * seed for arm in ARMS for seed in (0, 1)}
    run_ids = _fill(store, steps=steps)
    engine = store.engine
    sweep_id = int(reads.latest_sweep_id(engine) or 0)
    with engine.connect() as conn:
        assert summaries.summarized(conn, run_ids) == set(run_ids)
        from_summaries = _window_means(conn, run_ids, NAMES, SUMMARY_WINDOW)
    names_from_summaries = reads.metric_names(engine, run_ids)
    table_from_summaries = mechanism_table(engine, sweep_id, list(NAMES))
    with engine.begin() as conn:
        conn.execute(sa.delete(RUN_METRIC_SUMMARIES))
    with engine.connect() as conn:
        assert summaries.summarized(conn, run_ids) == set()
        from_rows = _window_means(conn, run_ids, NAMES, SUMMARY_WINDOW)
    assert reads.metric_names(engine, run_ids) == names_from_summaries == sorted(NAMES)
    assert from_summaries.keys() == from_rows.keys()
    for key, (head, tail) in from_rows.items():
        got = from_summaries[key]
        assert got[0] == pytest.approx(head, rel=1e-12, nan_ok=True)
        assert got[1] == pytest.approx(tail, rel=1e-12, nan_ok=True)
    # PostgreSQL may sum a mean's rows in another order (another plan): the last bit of a mean
    # can differ, never what `dapo table --mechanisms` prints (CSV rounds to 9 decimals).
    table_from_rows = mechanism_table(engine, sweep_id, list(NAMES))
    for fmt in table_format.FORMATS:
        assert mechanisms.render(table_from_summaries, fmt) == mechanisms.render(
            table_from_rows, fmt
        )
    for column in ("first", "last", "delta_parent"):
        for a, b in zip(table_from_summaries[column], table_from_rows[column], strict=True):
            assert (a.n, a.keys) == (b.n, b.keys)
            assert a.mean == pytest.approx(b.mean, rel=1e-12, nan_ok=True)


def _last_by_scan(engine: sa.Engine, run_ids: list[int]) -> dict[tuple[int, str], float]:
    """Each (run, metric)'s value at its own last step, from every row the runs have."""
    long = reads.metric_curves(engine, run_ids)
    last = long.sort_values("step").groupby(["run_id", "name"]).tail(1)
    return {
        (int(r), str(n)): float(v)
        for r, n, v in zip(last.run_id, last.name, last.value, strict=True)
    }


def test_final_metrics_are_each_series_last_row_from_summaries_or_rows(store_url: str) -> None:
    """Compare's final values: one row per (run, metric) at the metric's own last step, the
    same whether the step comes from the summaries (ended runs), from the rows (a running run,
    a run without summaries) or from both at once; a NaN logged there stays NaN."""
    store = Store(store_url)
    # 21 steps: entropy/mean is NaN at step 21 (every 7th), the run's last
    run_ids = _fill(store, steps={("grpo", 0): 21, ("clip_higher", 0): 16})
    engine = store.engine
    expected = _last_by_scan(engine, run_ids)
    assert len(expected) == 2 * len(NAMES) and math.isnan(expected[(run_ids[0], "entropy/mean")])
    with store.sink(run_ids[1]) as sink:  # a metric that stops before the run's last step
        sink.log_metrics(3, {"early/only": 0.5})
    store.end_attempt(run_ids[1], "completed", steps=16)
    expected[(run_ids[1], "early/only")] = 0.5

    def got() -> dict[tuple[int, str], float]:
        frame = reads.final_metrics(engine, run_ids)
        assert list(frame.columns) == ["run_id", "name", "step", "value"]
        assert not frame.duplicated(["run_id", "name"]).any()
        return {
            (int(r), str(n)): float(v)
            for r, n, v in zip(frame.run_id, frame.name, frame.value, strict=True)
        }

    def same(a: dict[tuple[int, str], float], b: dict[tuple[int, str], float]) -> bool:
        return a.keys() == b.keys() and all(
            (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a
        )

    with engine.connect() as conn:
        assert summaries.summarized(conn, run_ids) == set(run_ids)
    assert same(got(), expected)
    store.update_run(run_ids[0], status="running")  # one from rows, one from its summary
    with engine.connect() as conn:
        assert summaries.summarized(conn, run_ids) == {run_ids[1]}
    assert same(got(), expected)
    with engine.begin() as conn:
        conn.execute(sa.delete(RUN_METRIC_SUMMARIES))
    assert same(got(), expected)
    assert reads.final_metrics(engine, []).empty


def test_a_running_run_is_read_from_its_rows(store_url: str) -> None:
    """No summary speaks for a run that is still writing: a run set back to running loses its
    summary, and a metric it logs afterwards is in metric_names at once."""
    store = Store(store_url)
    (run_id,) = _fill(store, steps={("grpo", 0): 12})
    store.update_run(run_id, status="running")
    assert _stored(store.engine, run_id).empty
    with store.sink(run_id) as sink:
        sink.log_metrics(13, {"late/metric": 1.0})
    with store.engine.connect() as conn:
        assert summaries.summarized(conn, [run_id]) == set()
    assert "late/metric" in reads.metric_names(store.engine, [run_id])
    store.update_run(run_id, status="completed")
    assert "late/metric" in _stored(store.engine, run_id).index


def test_migration_0005_backfills_an_existing_store(store_url: str) -> None:
    """A store written at 0004 (no summaries table) gains, at upgrade, a summary for every
    ended run equal to the scan of its rows; a run still running gets none."""
    from alembic import command

    engine = db_engine.create(store_url)
    with engine.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), "0004_run_lease")
    sweep_id = None
    rng = random.Random(0)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO sweeps (name, preset, status, arms, seeds, ladder, base_config, "
                "created_at, updated_at) VALUES ('old', 'tiny', 'completed', '[\"grpo\"]', "
                "'[0, 1]', '[]', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
        )
        sweep_id = conn.execute(sa.text("SELECT max(id) FROM sweeps")).scalar()
        for seed, status in ((0, "completed"), (1, "running")):
            conn.execute(
                sa.text(
                    "INSERT INTO runs (sweep_id, arm, seed, attempt, status, config, config_hash,"
                    " started_at, updated_at) VALUES (:s, 'grpo', :seed, 1, :st, '{}', 'h', "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                ),
                {"s": sweep_id, "seed": seed, "st": status},
            )
        run_ids = [
            int(r) for r in conn.execute(sa.text("SELECT id FROM runs ORDER BY seed")).scalars()
        ]
        rows = [
            {"run_id": run_id, "step": step, "name": name, "value": rng.random()}
            for run_id in run_ids
            for step in range(1, 26)
            for name in NAMES
        ]
        conn.execute(
            sa.text("INSERT INTO metrics (run_id, step, name, value) VALUES (:run_id, :step, "
                    ":name, :value)"),
            rows,
        )  # fmt: skip
    migrate.upgrade(engine, "s")
    engine.dispose()
    store = Store(store_url)
    done, running = run_ids
    pd.testing.assert_frame_equal(
        _stored(store.engine, done).drop(columns=["window"]),
        _scan(store.engine, done, SUMMARY_WINDOW),
        check_dtype=False,
        rtol=1e-12,
    )
    assert _stored(store.engine, running).empty


def test_downsampled_curves_keep_the_grid_and_each_series_ends(store_url: str) -> None:
    """max_points: every kept row is a stored row; the steps lo + k*s of the common grid are
    kept for every series that logged them (seeds and the x-axis stay aligned), and so is each
    series' first and last step; at most max_points + 2 rows per series; a read that fits is
    the full read."""
    store = Store(store_url)
    run_ids = _fill(store, steps={("grpo", 0): 97, ("grpo", 1): 90})
    engine = store.engine
    full = reads.metric_curves(engine, run_ids, names=list(NAMES))
    few = reads.metric_curves(engine, run_ids, names=list(NAMES), max_points=10)
    key = ["run_id", "name", "step"]
    merged = few.merge(full, on=key, suffixes=("", "_full"), how="left", indicator=True)
    assert (merged["_merge"] == "both").all() and len(merged) == len(few)
    same = merged["value"] == merged["value_full"]
    assert (same | (merged["value"].isna() & merged["value_full"].isna())).all()
    lo, hi = int(full["step"].min()), int(full["step"].max())
    stride = (hi - lo) // 10 + 1  # 97 steps from 1: s = 10, grid 1, 11, ..., 91
    for (run_id, name), series in full.groupby(["run_id", "name"]):
        kept = set(few[(few["run_id"] == run_id) & (few["name"] == name)]["step"])
        steps = set(series["step"])
        wanted = {s for s in steps if (s - lo) % stride == 0} | {min(steps), max(steps)}
        assert kept == wanted, (run_id, name)
        assert len(kept) <= 10 + 2
    assert list(few.columns) == list(full.columns) and few.equals(
        few.sort_values(key).reset_index(drop=True)
    )
    pd.testing.assert_frame_equal(
        reads.metric_curves(engine, run_ids, names=list(NAMES), max_points=200), full
    )
    # the grid's bounds come from the summaries of ended runs, else from the rows: the same
    with engine.begin() as conn:
        conn.execute(sa.delete(RUN_METRIC_SUMMARIES))
    pd.testing.assert_frame_equal(
        reads.metric_curves(engine, run_ids, names=list(NAMES), max_points=10), few
    )
    with pytest.raises(ValueError, match="max_points"):
        reads.metric_curves(engine, run_ids, max_points=0)


def test_the_sweep_list_of_ended_sweeps_is_kept_until_a_row_under_it_changes(
    store_url: str,
) -> None:
    """list_sweeps keeps an ended sweep's row (db.ablation._ENDED_ROWS) and gives what it gives
    cold; a new evaluation, a rerun, or a sweep's status change is there on the next call."""
    ablation._ENDED_ROWS.clear()
    store = Store(store_url)
    run_ids = _fill(store, steps={(arm, seed): 12 for arm in ARMS for seed in (0, 1)})
    for run_id in run_ids:
        with store.sink(run_id) as sink:
            sink.log_evaluation(12, {"dataset": "heldout", "k": 1, "avg_at_k": 0.1 * run_id})
    engine = store.engine
    cold = ablation.list_sweeps(engine)
    assert len(ablation._ENDED_ROWS) == 1
    pd.testing.assert_frame_equal(ablation.list_sweeps(engine), cold)
    # the best arm changes with one new evaluation of the other arm: the kept row is not used
    before = cold.iloc[0]["leader"].best_mean
    with store.sink(run_ids[0]) as sink:
        sink.log_evaluation(12, {"dataset": "heldout", "k": 1, "avg_at_k": 0.99})
    warm = ablation.list_sweeps(engine)
    ablation._ENDED_ROWS.clear()
    pd.testing.assert_frame_equal(warm, ablation.list_sweeps(engine))
    assert warm.iloc[0]["leader"].best_mean != before
    # a rerun in flight: counted as running, and not kept
    sweep_id = int(cold.iloc[0]["sweep_id"])
    new_attempt(store, sweep_id, "grpo", 0, config_hash="grpo")
    again = ablation.list_sweeps(engine)
    assert int(again.iloc[0]["runs_running"]) == 1  # not the kept row
    store.set_sweep_status(sweep_id, "failed", error="stopped")
    assert ablation.list_sweeps(engine).iloc[0]["status"] == "failed"
    # every page's picker reads only sweep_choices: the same sweeps, names and statuses
    choices, listed = ablation.sweep_choices(engine), ablation.list_sweeps(engine)
    for column in ("sweep_id", "name", "status"):
        assert list(choices[column]) == list(listed[column])
