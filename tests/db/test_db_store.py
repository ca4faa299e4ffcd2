"""The write side of the store (Store, SqlSink) against a SQLite file and a real PostgreSQL.

Every test here runs twice through the `store_url` fixture (tests/conftest.py): once on a
fresh SQLite file, once on a fresh PostgreSQL schema.
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_runs import killed, new_attempt

from db import migrate, reads
from db.engine import get_engine
from db.errors import NotFound, SchemaMismatch
from db.models import TABLES, Base
from db.store import Store

LADDER = [
    {"arm": "grpo", "adds": "naive GRPO", "paper_score": 30},
    {"arm": "clip_higher", "adds": "decoupled clip", "paper_score": 38},
]


def new_sweep(store: Store, **overrides: Any) -> int:
    kwargs: dict[str, Any] = {
        "name": "ladder",
        "preset": "tiny",
        "arms": ["grpo", "clip_higher"],
        "seeds": [0, 1],
        "base_config": {"algo": {"clip_high": 0.2}, "lr": 1e-5},
        "ladder": LADDER,
    }
    return store.create_sweep(**(kwargs | overrides))


def new_run(store: Store, sweep_id: int, arm: str = "grpo", seed: int = 0, **kw: Any) -> int:
    """A new attempt whose driver is gone (killed()): the next one of its (arm, seed) may start
    while it still says "running", and takes it over."""
    return new_attempt(
        store,
        sweep_id,
        arm,
        seed,
        config={"arm": arm, "seed": seed},
        config_hash=kw.pop("config_hash", f"hash-{arm}"),
        holder=killed(),
        **kw,
    )


def metric_rows(store: Store, run_id: int) -> list[tuple[int, str, float | None]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT step, name, value FROM metrics WHERE run_id = :r ORDER BY step, name"),
            {"r": run_id},
        ).all()
    return [(int(s), str(n), v) for s, n, v in rows]


# --- schema ----------------------------------------------------------------------------------


def test_a_fresh_store_is_migrated_on_first_use(store_url: str) -> None:
    engine = get_engine(store_url)
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
        assert set(TABLES) <= set(sa.inspect(conn).get_table_names())
    assert get_engine(store_url) is engine  # cached per URL


def test_the_migrations_build_exactly_the_models(store_url: str) -> None:
    """Alembic's autogenerate finds nothing to change between the migrated database and the
    models: a model edited without a migration fails here."""
    engine = get_engine(store_url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    engine = get_engine(f"sqlite:///{tmp_path / 'pragmas.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0) >= 10_000
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL


# --- sweeps ----------------------------------------------------------------------------------


def test_sweep_round_trip_and_status(store_url: str) -> None:
    store = Store(store_url)
    sweep_id = new_sweep(store, flow_run_id="flow-1", params={"steps": 5, "inf": math.inf})
    sweep = store.get_sweep(sweep_id)
    assert sweep["sweep_id"] == sweep["id"] == sweep_id
    assert (sweep["name"], sweep["preset"], sweep["status"]) == ("ladder", "tiny", "pending")
    assert sweep["arms"] == ["grpo", "clip_higher"] and sweep["seeds"] == [0, 1]
    # parent and grid: the ladder rows of issue 15 (None for a plain ladder)
    assert sweep["ladder"] == [{**rung, "parent": None, "grid": None} for rung in LADDER]
    assert sweep["base_config"] == {"algo": {"clip_high": 0.2}, "lr": 1e-5}
    assert sweep["params"] == {"steps": 5, "inf": "inf"}  # JSON has no infinity
    assert sweep["flow_run_id"] == "flow-1"
    assert sweep["created_at"].tzinfo is not None and sweep["finished_at"] is None

    store.set_sweep_status(sweep_id, "running")
    assert store.get_sweep(sweep_id)["finished_at"] is None
    store.set_sweep_status(sweep_id, "failed", error="boom\ntraceback")
    failed = store.get_sweep(sweep_id)
    assert failed["status"] == "failed" and failed["error"] == "boom\ntraceback"
    assert failed["finished_at"] >= failed["created_at"]
    store.set_sweep_flow_run(sweep_id, "flow-2")
    assert store.get_sweep(sweep_id)["flow_run_id"] == "flow-2"


def test_bad_sweep_input_and_missing_sweeps(store_url: str) -> None:
    store = Store(store_url)
    with pytest.raises(ValueError, match="distinct arms"):
        new_sweep(store, arms=[])
    with pytest.raises(ValueError, match="distinct seeds"):
        new_sweep(store, seeds=[1, 1])
    with pytest.raises(ValueError, match="'arm'"):
        new_sweep(store, ladder=[{"adds": "no arm"}])
    sweep_id = new_sweep(store)
    with pytest.raises(ValueError, match="sweep status must be one of"):
        store.set_sweep_status(sweep_id, "done")
    with pytest.raises(NotFound, match=r"^no sweep with id 999 in ") as caught:
        store.get_sweep(999)
    assert isinstance(caught.value, LookupError) and isinstance(caught.value, ValueError)
    for call in (
        lambda: store.set_sweep_status(999, "running"),
        lambda: store.set_sweep_flow_run(999, "x"),
        lambda: new_run(store, 999),
    ):
        with pytest.raises(NotFound, match="no sweep with id 999"):
            call()


# --- runs ------------------------------------------------------------------------------------


def test_attempts_are_numbered_per_arm_and_seed(store_url: str) -> None:
    store = Store(store_url)
    sweep_id = new_sweep(store)
    first = new_run(store, sweep_id, "grpo", 0, flow_run_id="f1", checkpoint_dir="/ckpt/a")
    run = store.get_run(first)
    assert run["run_id"] == first and run["status"] == "running"
    assert (run["sweep_id"], run["arm"], run["seed"]) == (sweep_id, "grpo", 0)
    assert (run["host"], run["flow_run_id"], run["checkpoint_dir"]) == (
        socket.gethostname(),
        "f1",
        "/ckpt/a",
    )
    assert run["config"] == {"arm": "grpo", "seed": 0} and run["finished_at"] is None
    second = new_run(store, sweep_id, "grpo", 0)
    other_seed = new_run(store, sweep_id, "grpo", 1)
    other_arm = new_run(store, sweep_id, "clip_higher", 0)
    attempts = {r: store.get_run(r)["attempt"] for r in (first, second, other_seed, other_arm)}
    assert attempts == {first: 1, second: 2, other_seed: 1, other_arm: 1}
    assert store.latest_attempt(sweep_id, "grpo", 0)["run_id"] == second  # type: ignore[index]
    assert store.latest_attempt(sweep_id, "dapo", 0) is None


def test_update_run_fields_and_finished_at(store_url: str) -> None:
    store = Store(store_url)
    run_id = new_run(store, new_sweep(store))
    store.update_run(run_id, steps=5, grad_updates=20, tokens=12_345, wall_s=61.5, host="h2")
    run = store.get_run(run_id)
    assert (run["steps"], run["grad_updates"], run["tokens"], run["wall_s"]) == (
        5,
        20,
        12_345,
        61.5,
    )
    assert run["host"] == "h2" and run["finished_at"] is None
    store.update_run(run_id, status="failed", error="RuntimeError: OOM")
    failed = store.get_run(run_id)
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: OOM"
    assert failed["finished_at"] is not None and failed["finished_at"] >= failed["started_at"]
    store.update_run(run_id, status="running", error=None)  # a resume
    assert store.get_run(run_id)["finished_at"] is None
    with pytest.raises(ValueError, match="unknown field"):
        store.update_run(run_id, colour="red")
    with pytest.raises(ValueError, match="run status must be one of"):
        store.update_run(run_id, status="pending")
    with pytest.raises(NotFound, match="no run with id 4242"):
        store.update_run(4242, steps=1)
    with pytest.raises(NotFound, match="no run with id 4242"):
        store.sink(4242)


def test_completed_run_matches_config_hash_and_takes_the_latest(store_url: str) -> None:
    store = Store(store_url)
    sweep_id = new_sweep(store)
    assert store.completed_run(sweep_id, "grpo", 0, "hash-grpo") is None
    first = new_run(store, sweep_id)
    store.update_run(first, status="completed")
    failed = new_run(store, sweep_id)
    store.update_run(failed, status="failed")
    assert store.completed_run(sweep_id, "grpo", 0, "hash-grpo") == first
    second = new_run(store, sweep_id)
    store.update_run(second, status="completed")
    assert store.completed_run(sweep_id, "grpo", 0, "hash-grpo") == second
    assert store.completed_run(sweep_id, "grpo", 0, "another-hash") is None
    assert store.completed_run(sweep_id, "grpo", 1, "hash-grpo") is None


# --- the store's id (issue 14.1) --------------------------------------------------------------


def test_every_store_has_its_own_id_drawn_once(store_url: str, tmp_path: Path) -> None:
    """Run directories are named by it: two stores sharing a runs directory must differ."""
    import uuid

    from db.engine import dispose

    first = Store(store_url).store_id
    assert str(uuid.UUID(first)) == first
    dispose(store_url)
    assert Store(store_url).store_id == first  # stable across opens
    other = Store(f"sqlite:///{tmp_path / 'other.db'}").store_id
    assert other != first


def test_a_store_upgraded_from_0001_gets_an_id_and_keeps_its_rows(store_url: str) -> None:
    from alembic import command

    from db import engine as db_engine

    engine = db_engine.create(store_url)
    with engine.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), "0001_initial")
        conn.execute(
            sa.text(
                "INSERT INTO sweeps (name, preset, status, arms, seeds, ladder, base_config, "
                "created_at, updated_at) VALUES ('old', 'tiny', 'completed', '[]', '[]', '[]', "
                "'{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
        )
    if not store_url.startswith("sqlite"):  # a shared server is migrated on purpose
        with pytest.raises(SchemaMismatch, match="run `dapo db upgrade`"):
            Store(store_url)
        migrate.upgrade(engine, "s")
    engine.dispose()
    store = Store(store_url)  # SQLite: upgraded on first use
    assert len(store.store_id) == 36
    assert store.get_sweep(1)["name"] == "old"


# --- statuses and wall time (issue 14.6) -------------------------------------------------------


def test_a_sweeps_status_follows_its_runs(store_url: str) -> None:
    """An arm that finishes outside its sweep's flow run (the driver was killed) recomputes the
    sweep's status: it used to stay "running" forever."""
    store = Store(store_url)
    sweep_id = new_sweep(store, arms=["grpo"], seeds=[0, 1])
    store.set_sweep_status(sweep_id, "running")  # the driver died here
    assert store.refresh_sweep_status(sweep_id) == "pending"  # nothing runs, nothing done
    stale = new_run(store, sweep_id, "grpo", 0)
    assert store.refresh_sweep_status(sweep_id) == "running"
    done = new_run(store, sweep_id, "grpo", 0)
    assert store.get_run(stale)["superseded_by"] == done  # taken over
    store.update_run(done, status="completed")
    other = new_run(store, sweep_id, "grpo", 1)
    store.update_run(other, status="failed", error="boom")
    assert store.refresh_sweep_status(sweep_id) == "failed"
    failed = store.get_sweep(sweep_id)
    assert failed["error"] == "1 of 2 arm runs failed: grpo s1" and failed["finished_at"]
    store.update_run(new_run(store, sweep_id, "grpo", 1), status="completed")
    assert store.refresh_sweep_status(sweep_id) == "completed"
    sweep = store.get_sweep(sweep_id)
    assert sweep["status"] == "completed" and sweep["error"] is None


def test_an_attempt_taken_over_is_marked_superseded(store_url: str) -> None:
    store = Store(store_url)
    sweep_id = new_sweep(store)
    stale = new_run(store, sweep_id)  # left "running" by a killed driver
    finished = new_run(store, sweep_id)  # starts over
    run = store.get_run(stale)
    assert run["status"] == "cancelled" and run["superseded_by"] == finished
    assert run["error"] == f"superseded by run {finished}: it started over" and run["finished_at"]
    store.update_run(finished, status="failed", error="RuntimeError: boom")
    # A finished attempt that is resumed keeps its status and error; only the link is added.
    newest = new_run(store, sweep_id, resume_step=0)
    kept = store.get_run(finished)
    assert (kept["status"], kept["error"], kept["superseded_by"]) == (
        "failed",
        "RuntimeError: boom",
        newest,
    )


def test_wall_time_adds_up_over_the_tries_of_an_attempt(store_url: str) -> None:
    """A replaced actor is a second try of the same attempt: its time used to replace the
    first try's instead of adding to it."""
    store = Store(store_url)
    run_id = new_run(store, new_sweep(store))
    before = store.begin_try(run_id)
    assert before == 0.0
    store.set_wall(run_id, before + 40.0)  # the first actor died after 40 s
    before = store.begin_try(run_id)
    assert before == 40.0
    store.set_wall(run_id, before + 25.5)
    run = store.get_run(run_id)
    assert (run["tries"], run["wall_s"]) == (2, 65.5)


def test_extend_sweep_adds_arms_and_seeds_and_never_drops_them(store_url: str) -> None:
    store = Store(store_url)
    sweep_id = new_sweep(store, params={"seeds": [0, 1]})
    store.extend_sweep(
        sweep_id, arms=["grpo", "clip_higher"], seeds=[0, 1, 5], params={"seeds": [0, 1, 5]}
    )
    sweep = store.get_sweep(sweep_id)
    assert sweep["seeds"] == [0, 1, 5] and sweep["params"] == {"seeds": [0, 1, 5]}
    with pytest.raises(ValueError, match="cannot drop 1"):
        store.extend_sweep(sweep_id, arms=["grpo", "clip_higher"], seeds=[0, 5], params=None)


def test_timestamps_are_aware_utc(store_url: str) -> None:
    store = Store(store_url)
    before = datetime.now(UTC)
    run = store.get_run(new_run(store, new_sweep(store)))
    after = datetime.now(UTC)
    assert run["started_at"].utcoffset().total_seconds() == 0
    assert before <= run["started_at"] <= after


# --- the sink --------------------------------------------------------------------------------


def test_sink_is_the_trainers_metrics_sink(store_url: str) -> None:
    from dapo_core.train.protocols import MetricsSink

    store = Store(store_url)
    with store.sink(new_run(store, new_sweep(store))) as sink:
        assert isinstance(sink, MetricsSink)


def test_a_replayed_step_overwrites_and_never_duplicates(store_url: str) -> None:
    store = Store(store_url)
    run_id = new_run(store, new_sweep(store))
    sink = store.sink(run_id)
    sink.log_metrics(0, {"acc/mean": 0.25, "loss": 1.0})
    sink.log_metrics(1, {"acc/mean": 0.5, "loss": float("nan"), "kl": float("inf")})
    # a resume replays step 1 with other values and one metric more
    sink.log_metrics(1, {"acc/mean": 0.75, "loss": 0.5, "grad": 2})
    sink.log_metrics(2, {})
    assert metric_rows(store, run_id) == [
        (0, "acc/mean", 0.25),
        (0, "loss", 1.0),
        (1, "acc/mean", 0.75),
        (1, "grad", 2.0),
        (1, "kl", None),  # inf is stored as NULL
        (1, "loss", 0.5),
    ]
    sink.close()
    with pytest.raises(ValueError, match="closed"):
        sink.log_metrics(3, {"x": 1.0})


def test_nan_is_null_in_the_store_and_nan_in_curves(store_url: str) -> None:
    store = Store(store_url)
    run_id = new_run(store, new_sweep(store))
    with store.sink(run_id) as sink:
        sink.log_metrics(0, {"entropy": float("nan"), "acc": -float("inf")})
    curves = reads.metric_curves(store.engine, [run_id])
    assert curves["value"].isna().all() and len(curves) == 2


def test_bad_metrics_are_refused_before_anything_is_written(store_url: str) -> None:
    store = Store(store_url)
    run_id = new_run(store, new_sweep(store))
    sink = store.sink(run_id)
    with pytest.raises(ValueError, match="metric 'acc' at step 0: not a number"):
        sink.log_metrics(0, {"loss": 1.0, "acc": "high"})
    with pytest.raises(ValueError, match="metric names"):
        sink.log_metrics(0, {"x" * 201: 1.0})
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        sink.log_metrics(-1, {"loss": 1.0})
    assert metric_rows(store, run_id) == []


def _sample(i: int, **kw: Any) -> dict[str, Any]:
    return {
        "prompt": f"What is {i}+1?",
        "response": f"Answer: {i + 1}",
        "ground_truth": str(i + 1),
        "pred": str(i + 1),
        "reward": 1.0,
        "score": 1.0,
        "overlong_penalty": 0.0,
        "correct": True,
        "length": 7,
        "truncated": False,
    } | kw


def test_samples_of_a_step_are_replaced_and_keep_their_parts(store_url: str) -> None:
    store = Store(store_url)
    run_id = new_run(store, new_sweep(store))
    with store.sink(run_id) as sink:
        sink.log_samples(3, [_sample(i) for i in range(4)])
        sink.log_samples(3, [_sample(7, correct=False, reward=-1.25, score=-1.0,
                                     overlong_penalty=-0.25, truncated=True, response="a\x00b",
                                     tokens=[1, 2])])  # fmt: skip
        sink.log_samples(4, [_sample(1)])
    frame = reads.samples(store.engine, run_id, step=3)
    assert len(frame) == 1
    row = frame.iloc[0]
    assert (row["idx"], row["correct"], row["truncated"]) == (0, False, True)
    assert (row["reward"], row["score"], row["overlong_penalty"]) == (-1.25, -1.0, -0.25)
    assert row["response"] == "a\ufffdb"  # PostgreSQL text cannot hold NUL
    with store.engine.connect() as conn:
        extra = conn.execute(sa.text("SELECT extra FROM samples WHERE step = 3")).scalar()
    assert extra in ({"tokens": [1, 2]}, '{"tokens": [1, 2]}')
    assert reads.sample_steps(store.engine, run_id) == [3, 4]


def test_evaluations_upsert_on_run_dataset_k_step(store_url: str) -> None:
    store = Store(store_url)
    run_id = new_run(store, new_sweep(store))
    result = {"dataset": "aime", "k": 4, "avg_at_k": 0.25, "pass_at_k": 0.5, "cons_at_k": 0.25,
              "n_problems": 30}  # fmt: skip
    with store.sink(run_id) as sink:
        sink.log_evaluation(10, result)
        sink.log_evaluation(10, result | {"avg_at_k": 0.3})  # replayed: overwrites
        sink.log_evaluation(10, result | {"k": 8, "avg_at_k": 0.35})
        sink.log_evaluation(20, result | {"avg_at_k": 0.4, "pass_at_k": float("nan")})
        with pytest.raises(ValueError, match="needs k >= 1"):
            sink.log_evaluation(30, result | {"k": None})
        with pytest.raises(ValueError, match="needs a dataset"):
            sink.log_evaluation(30, result | {"dataset": ""})
    evals = reads.evaluations(store.engine, run_id)
    assert evals[["step", "k", "avg_at_k"]].values.tolist() == [[10, 4, 0.3], [10, 8, 0.35],
                                                                [20, 4, 0.4]]  # fmt: skip
    assert math.isnan(evals["pass_at_k"].iloc[2]) and evals["n_problems"].iloc[0] == 30


def test_copy_history_keeps_the_curve_of_a_resumed_attempt(store_url: str) -> None:
    store = Store(store_url)
    sweep_id = new_sweep(store)
    old = new_run(store, sweep_id)
    with store.sink(old) as sink:
        for step in range(5):
            sink.log_metrics(step, {"acc": step / 10, "loss": 1 - step / 10})
            sink.log_samples(step, [_sample(step)])
        sink.log_evaluation(2, {"dataset": "d", "k": 1, "avg_at_k": 0.2})
        sink.log_evaluation(4, {"dataset": "d", "k": 1, "avg_at_k": 0.4})
    store.update_run(old, status="failed")
    new = new_run(store, sweep_id)
    with store.sink(new) as sink:
        sink.log_metrics(3, {"acc": 0.99})  # the new attempt's own number wins
    store.copy_history(old, new, up_to_step=3)
    rows = metric_rows(store, new)
    assert [(s, n) for s, n, _ in rows] == [(s, n) for s in range(4) for n in ("acc", "loss")]
    assert dict(((s, n), v) for s, n, v in rows)[(3, "acc")] == 0.99
    assert reads.sample_steps(store.engine, new) == [0, 1, 2, 3]
    assert reads.evaluations(store.engine, new)["step"].tolist() == [2]
    assert len(metric_rows(store, old)) == 10  # the source is untouched
    store.copy_history(old, new, up_to_step=3)  # copying twice changes nothing
    assert metric_rows(store, new) == rows


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writes=st.lists(
        st.tuples(
            st.integers(0, 5),
            st.dictionaries(
                st.sampled_from(["a", "b", "c/d"]),
                st.floats(allow_nan=True, allow_infinity=True, width=32),
                max_size=3,
            ),
        ),
        max_size=12,
    )
)
def test_the_store_holds_the_last_write_of_every_step_and_name(
    tmp_path_factory: pytest.TempPathFactory, writes: list[tuple[int, dict[str, float]]]
) -> None:
    """Property: after any sequence of (possibly replayed) steps, the store holds exactly one
    row per (step, name) ever written, with the last value written (NaN/inf as NULL)."""
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('prop') / 'p.db'}")
    run_id = new_run(store, new_sweep(store))
    expected: dict[tuple[int, str], float | None] = {}
    with store.sink(run_id) as sink:
        for step, metrics in writes:
            sink.log_metrics(step, metrics)
            for name, value in metrics.items():
                expected[(step, name)] = value if math.isfinite(value) else None
    assert {(s, n): v for s, n, v in metric_rows(store, run_id)} == expected


# --- layering --------------------------------------------------------------------------------

FORBIDDEN = {
    "torch",
    "transformers",
    "dapo_core",
    "flows",
    "dashboard",
    "prefect",
    "ray",
    "streamlit",
}


def test_importing_db_pulls_in_no_training_stack_nor_other_layers() -> None:
    """What the modules import on the page is tests/test_layers.py's; this is what importing
    them brings into a process, third-party imports included."""
    code = (
        "import sys, db.cli, db.store, db.reads, db.ablation, db.mechanism_table, db.grids, "
        "db.table_format; "
        f"print(sorted(m for m in {sorted(FORBIDDEN)!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"


# --- the lease on an attempt (integrity item 2) -------------------------------------------------
def _claim(store: Store, sweep_id: int, after: int | None, **kw: Any) -> Any:
    return store.resume_attempt(
        sweep_id=sweep_id,
        arm="grpo",
        seed=0,
        config={"arm": "grpo"},
        config_hash="hash-grpo",
        after=after,
        resume_step=kw.pop("resume_step", None),
        checkpoint_dir=kw.pop("checkpoint_dir", lambda run_id: f"/runs/run{run_id}"),
        **kw,
    )


def test_resume_attempt_claims_the_arm_in_one_transaction(store_url: str) -> None:
    """The claim holds the new attempt for its process; a second claim is RunHeld naming it;
    a claim planned on an older newest attempt is AttemptChanged; ending the attempt releases
    the lease; resuming copies the curve up to the checkpoint and carries time and tries on."""
    from db.models import RUN_LEASE_S
    from db.store import AttemptChanged, Holder, RunHeld

    store = Store(store_url)
    sweep_id = new_sweep(store)
    here, other = Holder("host-a", 101), Holder("host-b", 202)
    first = _claim(store, sweep_id, None, holder=here)
    row = store.get_run(first.run_id)
    assert (first.attempt, first.checkpoint_dir, first.superseded) == (
        1,
        f"/runs/run{first.run_id}",
        None,
    )
    assert (row["status"], row["lease_host"], row["lease_pid"]) == ("running", "host-a", 101)
    assert row["checkpoint_dir"] == first.checkpoint_dir and row["lease_at"] is not None

    with pytest.raises(
        RunHeld,
        match=r"grpo s0 of sweep \d+ is held by run \d+ \(attempt 1\): host-a pid 101 since",
    ):
        _claim(store, sweep_id, first.run_id, holder=other)
    assert store.lease_of(sweep_id, "grpo", 0).pid == 101  # type: ignore[union-attr]
    with store.sink(first.run_id) as sink:
        sink.log_metrics(1, {"m": 1.0})
        sink.log_metrics(2, {"m": 2.0})
    store.set_wall(first.run_id, 30.0)
    store.begin_try(first.run_id)

    assert store.end_attempt(first.run_id, "failed", error="boom")
    failed = store.get_run(first.run_id)
    assert (failed["status"], failed["lease_pid"], failed["lease_at"]) == ("failed", None, None)
    assert store.lease_of(sweep_id, "grpo", 0) is None
    with pytest.raises(AttemptChanged, match="newest attempt is run"):
        _claim(store, sweep_id, None, holder=other)

    resumed = _claim(
        store, sweep_id, first.run_id, holder=other, resume_step=1, checkpoint_dir="/runs/a"
    )
    assert (resumed.attempt, resumed.superseded, resumed.wall_s, resumed.tries) == (
        2, first.run_id, 30.0, 1,
    )  # fmt: skip
    assert metric_rows(store, resumed.run_id) == [(1, "m", 1.0)]
    assert store.get_run(first.run_id)["superseded_by"] == resumed.run_id
    # A newer attempt took it over: the old holder's heartbeat and its end write nothing.
    assert not store.set_wall(first.run_id, 99.0) and not store.end_attempt(first.run_id, "failed")
    assert store.get_run(first.run_id)["wall_s"] == 30.0

    # A lease whose heartbeat is older than RUN_LEASE_S is free, and is taken over.
    from datetime import timedelta

    from db.models import RUNS, utcnow

    with store.engine.begin() as conn:
        conn.execute(
            sa.update(RUNS)
            .where(RUNS.c.id == resumed.run_id)
            .values(updated_at=utcnow() - timedelta(seconds=RUN_LEASE_S + 1))
        )
    assert store.lease_of(sweep_id, "grpo", 0) is None
    third = _claim(store, sweep_id, resumed.run_id, holder=here)
    stale = store.get_run(resumed.run_id)
    assert (stale["status"], stale["superseded_by"], stale["lease_pid"]) == (
        "cancelled", third.run_id, None,
    )  # fmt: skip
    assert stale["error"] == f"superseded by run {third.run_id}: it started over"
