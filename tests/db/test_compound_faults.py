"""Integrity under compound faults (issue 21): each test reproduces one finding of the
adversarial review and pins its fix, through the real stores where it concerns them.

- 5: two writers of one step's samples (a retried actor beside the one it replaced) on
  PostgreSQL: both upsert, neither raises UniqueViolation, the step is whole.
- 7: `dapo dashboard` keeps the store's password off Streamlit's command line (`ps`).
- 8: a PostgreSQL database whose tables live in another schema is foreign, not empty.
- 9: a parquet file that decodes to too much is refused from its footer or after one batch;
  JSON nested 200,000 deep is one line.
- 10: the NaN guard stops after exactly optim.max_nonfinite_updates skipped updates.
- 13: a run whose driver died without a word shows as interrupted once its heartbeat is
  older than the lease; a completed run keeps no error of a lost try; a try's wall time
  survives an outage; a sample's ground truth and prediction are shown as text, never as
  Markdown.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from store_runs import new_attempt

from db import ablation, reads
from db.store import Store


def _sweep_and_run(store: Store) -> tuple[int, int]:
    sweep_id = store.create_sweep(
        name="compound", preset="tiny", arms=["grpo"], seeds=[0], base_config={},
        ladder=[{"arm": "grpo"}],
    )  # fmt: skip
    run_id = new_attempt(store, sweep_id, "grpo", 0, config_hash="h")
    return sweep_id, run_id


def _sample(idx: int, writer: int) -> dict[str, Any]:
    return {
        "prompt": f"p{idx}",
        "response": f"writer {writer}",
        "ground_truth": "1",
        "pred": "1",
        "reward": float(writer),
        "score": 1.0,
        "overlong_penalty": 0.0,
        "correct": True,
        "length": 3,
        "truncated": False,
    }


# --- 5. two writers of one step --------------------------------------------------------------
STEPS, SAMPLES_PER_STEP = 60, 8


def test_two_writers_of_the_same_steps_samples_never_collide(
    request: pytest.FixtureRequest,
) -> None:
    """Two sinks of one run write the same 60 steps' samples, released together step by step
    (a barrier). The old DELETE-then-INSERT let both find a step empty and the second INSERT
    failed with UniqueViolation (11 in 800 in the review; here most steps collide); upserts
    wait on the row lock instead. Every step ends whole: 8 rows, all from one writer (each
    write is one transaction, and the later one overwrites every row of the earlier)."""
    url = request.getfixturevalue("pg_schemas")()
    store = Store(url)
    _, run_id = _sweep_and_run(store)
    barrier = threading.Barrier(2)
    errors: list[str] = []

    def write(writer: int) -> None:
        with store.sink(run_id) as sink:
            for step in range(STEPS):
                try:
                    barrier.wait(timeout=60)
                    sink.log_samples(step, [_sample(i, writer) for i in range(SAMPLES_PER_STEP)])
                except threading.BrokenBarrierError:
                    return
                except Exception as error:
                    errors.append(f"step {step}: {type(error).__name__}: {error}".splitlines()[0])

    threads = [threading.Thread(target=write, args=(w,)) for w in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert errors == []
    frame = reads.samples(store.engine, run_id, limit=100_000)
    assert len(frame) == STEPS * SAMPLES_PER_STEP
    for step, rows in frame.groupby("step"):
        assert sorted(rows["idx"]) == list(range(SAMPLES_PER_STEP)), step
        assert rows["reward"].nunique() == 1, step  # one writer's whole step


def test_a_step_rewritten_with_fewer_samples_keeps_only_those(store_url: str) -> None:
    """The upsert still replaces a step: rows beyond the new write are dropped."""
    store = Store(store_url)
    _, run_id = _sweep_and_run(store)
    with store.sink(run_id) as sink:
        sink.log_samples(2, [_sample(i, 1) for i in range(5)])
        sink.log_samples(2, [_sample(i, 2) for i in range(2)])
        sink.log_samples(3, [])
    frame = reads.samples(store.engine, run_id, step=2)
    assert list(frame["idx"]) == [0, 1] and set(frame["reward"]) == {2.0}


# --- 7. no password on a command line ---------------------------------------------------------
def test_dashboard_keeps_the_store_password_off_streamlits_command_line(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`dapo dashboard --store URL` with a password: Streamlit's argv (what `ps` shows any user)
    holds neither the password nor the URL; the app finds the store in its environment.
    (The test server trusts loopback logins, so any password opens the store.)"""
    import argparse

    from dashboard import cli, source

    secret = f"pw-{uuid.uuid4().hex[:12]}"
    schema_url = request.getfixturevalue("pg_schemas")()
    url = schema_url.replace("@", f":{secret}@", 1)
    parser = argparse.ArgumentParser(prog="dapo")
    cli.register(parser.add_subparsers(dest="command"))
    from dapo_common.util import free_port

    args = parser.parse_args(["dashboard", "--store", url, "--port", str(free_port())])
    seen: dict[str, Any] = {}

    class FakeStreamlit:  # what would start Streamlit: the command and environment it gets
        def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
            seen.update(cmd=cmd, env=env)

        def wait(self, timeout: float | None = None) -> int:
            return 0

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(cli.subprocess, "Popen", FakeStreamlit)
    assert args.func(args) == 0
    assert not any(secret in part for part in seen["cmd"]), seen["cmd"]
    assert secret not in capsys.readouterr().out
    # What the app itself resolves, from the argv after `streamlit run app.py` and its env.
    app_argv = seen["cmd"][seen["cmd"].index(str(cli.APP)) + 1 :]
    found = source.store_url(app_argv, seen["env"])
    assert found == url
    with source.open_engine(found).connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM runs")).scalar() == 0


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc (children of children too)."""
    from pathlib import Path

    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [child for child, ppid in parents.items() if ppid == parent]
        found += kids
        todo += kids
    return found


def test_the_served_dashboards_processes_show_no_password(
    request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """`DAPO_DB_URL=URL-with-password dapo dashboard` for real: once Streamlit answers, no
    command line of it or its children holds the password (what `ps` shows every user)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from dapo_common.util import free_port
    from dashboard import browser

    secret = f"pw-{uuid.uuid4().hex[:12]}"
    url = request.getfixturevalue("pg_schemas")().replace("@", f":{secret}@", 1)
    port = free_port()
    env = {**os.environ, "DAPO_DB_URL": url, "PREFECT_HOME": str(tmp_path / "prefect")}
    dapo = str(Path(sys.executable).parent / "dapo")
    server = subprocess.Popen(
        [dapo, "dashboard", "--port", str(port)],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        browser.wait_until_healthy(port, server, 120.0)
        pids = [server.pid, *_descendants(server.pid)]
        assert len(pids) >= 2  # dapo, and the Streamlit it started
        for pid in pids:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert not any(secret.encode() in part for part in argv), argv
        assert any(b"dashboard.serve" in Path(f"/proc/{p}/cmdline").read_bytes() for p in pids)
    finally:
        browser.stop(server, group=True)


# --- 8. another application's tables in another schema ---------------------------------------
@pytest.fixture
def scratch_database() -> Iterator[str]:
    """A throwaway PostgreSQL database (its server URL), dropped at the end."""
    from conftest import pg_server_url

    from db import engine as db_engine

    server = pg_server_url()
    name = f"dapo_t21_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = server.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        db_engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_a_database_whose_tables_live_in_another_schema_is_foreign(scratch_database: str) -> None:
    """A database whose application keeps its tables in schema `app` (search path: the default
    `public`) looked empty, and the first sweep created the store in `public` beside them. It
    is refused in one line naming the table, nothing is created, and `dapo dashboard` on it
    ends with that line and exit 2."""
    import subprocess
    import sys
    from pathlib import Path

    from db.errors import SchemaMismatch

    owner = sa.create_engine(scratch_database)
    with owner.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA app"))
        conn.execute(sa.text("CREATE TABLE app.customers (id integer primary key)"))
    try:
        with pytest.raises(SchemaMismatch, match=r"not a DAPO Lab store: .*app\.customers"):
            Store(scratch_database)
        done = subprocess.run(
            [str(Path(sys.executable).parent / "dapo"), "dashboard", "--store", scratch_database],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "not a DAPO Lab store" in done.stderr
        with owner.connect() as conn:
            assert sa.inspect(conn).get_table_names(schema="public") == []
    finally:
        owner.dispose()


def test_an_empty_database_still_becomes_a_store(scratch_database: str) -> None:
    assert len(Store(scratch_database).store_id) == 36


def test_a_store_beside_other_schemas_outside_its_search_path_still_opens(
    request: pytest.FixtureRequest,
) -> None:
    """Only the search path counts: a schema of its own in a shared database is a store's to
    create (every PostgreSQL test store is one, beside the others of the session)."""
    from conftest import pg_server_url

    make = request.getfixturevalue("pg_schemas")
    url, other = make(), make().rsplit("search_path%3D", 1)[1]
    admin = sa.create_engine(pg_server_url())
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE TABLE "{other}".customers (id integer primary key)'))
    admin.dispose()
    assert len(Store(url).store_id) == 36


# --- 13. a sweep whose driver died, a completed run's stale error, text as text ---------------
def _age(store: Store, table: sa.Table, row_id: int, seconds: float) -> None:
    """Make a row look untouched for `seconds` (what a dead driver leaves behind)."""
    from datetime import timedelta

    from db.models import utcnow

    then = utcnow() - timedelta(seconds=seconds)
    with store.engine.begin() as conn:
        conn.execute(sa.update(table).where(table.c.id == row_id).values(updated_at=then))


def test_a_sweep_whose_driver_died_reads_interrupted_once_its_lease_expires(
    store_url: str,
) -> None:
    """A SIGKILLed sweep leaves its sweep and run rows "running", and nothing ever came to
    change them: shown "running" forever. Once no row of it has been touched for the lease
    (a live driver touches its run every 10 s), every reader shows "interrupted"; a run
    whose driver is alive (touched just now) still reads "running"."""
    from db.models import RUN_LEASE_S, RUNS, SWEEPS

    store = Store(store_url)
    sweep_id, dead = _sweep_and_run(store)
    store.set_sweep_status(sweep_id, "running")
    alive_sweep, alive = _sweep_and_run(store)
    store.set_sweep_status(alive_sweep, "running")
    _age(store, RUNS, dead, RUN_LEASE_S + 60)
    _age(store, SWEEPS, sweep_id, RUN_LEASE_S + 60)
    _age(store, SWEEPS, alive_sweep, RUN_LEASE_S + 60)  # its run's heartbeat keeps it alive

    assert reads.run_details(store.engine, dead)["status"] == "interrupted"
    assert list(reads.runs_of_sweep(store.engine, sweep_id)["status"]) == ["interrupted"]
    assert list(reads.arm_attempts(store.engine, sweep_id, "grpo")["status"]) == ["interrupted"]
    assert reads.sweep_details(store.engine, sweep_id)["status"] == "interrupted"
    table = ablation.ablation_table(store.engine, sweep_id)
    assert list(table["status"]) == ["interrupted"]
    sweeps = ablation.list_sweeps(store.engine).set_index("sweep_id")
    assert sweeps.loc[sweep_id, "status"] == "interrupted"
    assert sweeps.loc[sweep_id, "runs_running"] == 0

    assert reads.run_details(store.engine, alive)["status"] == "running"
    assert reads.sweep_details(store.engine, alive_sweep)["status"] == "running"
    assert sweeps.loc[alive_sweep, "status"] == "running"
    # Never stored: the dead run's row still says what its driver last wrote.
    assert store.get_run(dead)["status"] == "running"


def test_a_completed_run_keeps_no_error_of_a_lost_try(store_url: str) -> None:
    """A try lost with its actor writes its line into `error` while the task retries; the
    retry completed, and the run showed `error='ActorLost...'` beside "completed"."""
    store = Store(store_url)
    _, run_id = _sweep_and_run(store)
    store.update_run(run_id, error="ActorLost: the actor of run 1 died (node lost)")
    store.update_run(run_id, status="completed", steps=3)
    assert store.get_run(run_id)["error"] is None
    # A failure's own error is kept, and so is one given with "completed".
    store.update_run(run_id, status="failed", error="ValueError: bad")
    assert store.get_run(run_id)["error"] == "ValueError: bad"
    store.update_run(run_id, status="completed", error="note")
    assert store.get_run(run_id)["error"] == "note"


def test_rollouts_show_ground_truth_and_prediction_as_text(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prediction is model output: `x` **y** [z](http://...) in it rendered as Markdown (a
    backtick ends the code span it sat in, and a link or image is followed). It is shown as
    plain text, character for character, and no Markdown element holds it."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(url)
    _, run_id = _sweep_and_run(store)
    pred = "4` **bold** ![pixel](http://127.0.0.1:9/p.png) [link](http://127.0.0.1:9/)"
    truth = "<b>4</b> _x_"
    with store.sink(run_id) as sink:
        sink.log_samples(1, [{**_sample(0, 1), "pred": pred, "ground_truth": truth}])
    monkeypatch.setenv("DAPO_DB_URL", url)
    app = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    at = AppTest.from_file(str(app), default_timeout=60)
    at.query_params["run"] = str(run_id)
    at.run()
    at.switch_page("views/rollouts.py").run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [t.value for t in at.text]
    assert any(f"ground truth: {truth}" in t and f"predicted: {pred}" in t for t in shown)
    marked = [m.value for m in at.markdown] + [c.value for c in at.caption]
    assert not any("bold" in m or "<b>4</b>" in m for m in marked), marked


# --- 10. the NaN guard counts updates ------------------------------------------------------------
def test_the_nan_guard_stops_after_exactly_max_nonfinite_updates_skipped_updates() -> None:
    """4 gradient updates per rollout step (4 groups, mini-batches of 2, μ = 2); the policy's
    forwards turn NaN after 3 applied updates, so every later loss is NaN. Step 1: updates 1-3
    applied, the 4th skipped (streak 1). Step 2: with optim.max_nonfinite_updates = 3 the run
    must stop after 2 more skipped updates (3 in a row), where the guard used to let all 4 of
    the step's updates be tried and skipped (5 in a row; the review saw 7 for a limit of 3)."""
    import math

    import torch
    from scripted_engine import ScriptedEngine, make_cfg, make_trainer
    from tiny_policy import char_tokenizer

    from dapo_common import metric_names as M

    engine = ScriptedEngine(char_tokenizer(), correct=[[1, 2, 3, 2]])
    cfg = make_cfg(**{"algo.ppo_epochs": 2, "optim.max_nonfinite_updates": 3})
    trainer = make_trainer(cfg, engine)
    applied: list[int] = []
    trainer.optimizer.register_step_post_hook(lambda *_: applied.append(1))

    def poison(_module: Any, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        # NaN embeddings: every hidden state, log-prob and loss after them is NaN too.
        return output * math.nan if len(applied) >= 3 else output

    trainer.updater.fwd.model.get_input_embeddings().register_forward_hook(poison)
    first = trainer.step().metrics
    assert (first[M.GRAD_UPDATES], first[M.NONFINITE_UPDATES]) == (3, 1)
    assert not trainer.diverged
    second = trainer.step().metrics
    assert second[M.NONFINITE_UPDATES] == 2 and len(applied) == 3
    assert trainer.nonfinite_streak == 3 and trainer.diverged
    assert all(torch.isfinite(p).all() for p in trainer.updater.fwd.model.parameters())


# --- 9. crafted data files -----------------------------------------------------------------------
def test_a_parquet_file_that_decodes_to_too_much_is_refused_before_it_is_read_whole(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zstd turns 2,000 copies of a 3 kB problem into a few kB of file; the loader decoded the
    whole table (the review: 38 KB → 3.8 GB) before any size check. Now: a footer that says
    too many rows or bytes is refused before a page is decoded; one whose encoded size is small
    (dictionary encoding) is read a batch at a time and refused as soon as what it decoded
    passes the limit, one batch of 1,024 rows of the two. (The limits are lowered here so that
    the files stay small: the rule is the same.)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dapo_core.data import loaders

    table = pa.Table.from_pylist([{"problem": "x" * 3_000, "answer": "1"}] * 2_000)
    packed, plain = tmp_path / "packed.parquet", tmp_path / "plain.parquet"
    pq.write_table(table, packed, compression="zstd")  # dictionary-encoded: footer says ~9 kB
    pq.write_table(table, plain, compression="zstd", use_dictionary=False)
    assert packed.stat().st_size < 20_000 and plain.stat().st_size < 100_000
    decoded: list[int] = []
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: decoded.append(-1))
    real_batches = pq.ParquetFile.iter_batches

    def batches(self: Any, *args: Any, **kwargs: Any) -> Any:
        for batch in real_batches(self, *args, **kwargs):
            decoded.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", batches)
    monkeypatch.setattr(loaders, "MAX_PARQUET_BYTES", 1_000_000)
    with pytest.raises(ValueError, match=r"plain\.parquet: decodes to [\d,]+ bytes, more than"):
        loaders.load_problems(str(plain))
    assert decoded == []
    with pytest.raises(ValueError, match=r"packed\.parquet: decodes to more than 1,000,000 bytes"):
        loaders.load_problems(str(packed))
    assert decoded == [1_024]
    decoded.clear()
    monkeypatch.setattr(loaders, "MAX_PARQUET_BYTES", 100_000_000)
    monkeypatch.setattr(loaders, "MAX_PARQUET_ROWS", 1_000)
    with pytest.raises(ValueError, match=r"packed\.parquet: 2,000 rows, more than the 1,000"):
        loaders.load_problems(str(packed))
    assert decoded == []
    monkeypatch.setattr(loaders, "MAX_PARQUET_ROWS", 10_000)
    assert len(loaders.load_problems(str(packed))) == 1  # within the limits: read, de-duplicated
    assert decoded == [1_024, 976]


def test_json_nested_200k_deep_is_one_line(tmp_path: Any) -> None:
    """A row of 200,000 nested arrays raised RecursionError (a traceback) from the parser."""
    from dapo_core.data import loaders

    path = tmp_path / "deep.jsonl"
    good = '{"problem": "1+1?", "answer": "2"}'
    path.write_text(good + "\n" + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(ValueError, match=r"deep\.jsonl row 2: JSON nested too deeply"):
        loaders.load_problems(str(path))


def test_a_try_whose_wall_time_met_an_outage_still_counts(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Try 1 trains 50 s, its actor dies, and the store is down when it ends: it could not
    write its time. Try 2 (the task's retry, same process) trains 30 s. The attempt's wall
    time is 80 s; it used to be 30 s (the retry started from what the store last heard)."""
    from types import SimpleNamespace

    from db.errors import StoreUnavailable
    from flows import arm, heartbeat, ray_worker
    from flows.params import Resources

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(url)
    _, run_id = _sweep_and_run(store)
    now = [1_000.0]
    monkeypatch.setattr(heartbeat, "time", SimpleNamespace(monotonic=lambda: now[0]))
    real_set_wall = Store.set_wall

    def down(*_a: Any, **_k: Any) -> None:
        raise StoreUnavailable("the store is unreachable (test)")

    def dies(**_k: Any) -> dict[str, Any]:
        now[0] += 50.0
        raise ray_worker.ActorLost("worker 0 died (test)")

    def finishes(**_k: Any) -> dict[str, Any]:
        now[0] += 30.0
        return {"steps": 2}

    args = (run_id, "grpo s0", {}, url, str(tmp_path / "run"), {}, Resources().model_dump())
    monkeypatch.setattr(Store, "set_wall", down)
    monkeypatch.setattr(ray_worker, "run_training", dies)
    with pytest.raises(ray_worker.ActorLost):
        arm.train_in_ray.fn(*args)
    assert store.get_run(run_id)["wall_s"] is None
    monkeypatch.setattr(Store, "set_wall", real_set_wall)
    monkeypatch.setattr(ray_worker, "run_training", finishes)
    assert arm.train_in_ray.fn(*args) == {"steps": 2}
    run = store.get_run(run_id)
    assert (run["tries"], run["wall_s"]) == (2, 80.0)


def test_a_training_driver_beats_while_a_step_is_still_running(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run row's heartbeat (its wall time, what the lease reads) was written only when a
    step finished: a long step or evaluation read as a dead driver. It is written on a clock:
    here, twice while the (fake) training reports no step at all."""
    from flows import arm, heartbeat, ray_worker
    from flows.params import Resources

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = Store(url)
    _, run_id = _sweep_and_run(store)
    monkeypatch.setattr(heartbeat, "WALL_EVERY_S", 0.01)
    beats: list[float] = []
    twice = threading.Event()
    real_set_wall = Store.set_wall

    def counting(self: Store, run: int, seconds: float, **kw: Any) -> None:
        real_set_wall(self, run, seconds, **kw)
        beats.append(seconds)
        if len(beats) >= 2:
            twice.set()

    def one_long_step(**_k: Any) -> dict[str, Any]:
        return {"beat": twice.wait(timeout=60)}

    monkeypatch.setattr(Store, "set_wall", counting)
    monkeypatch.setattr(ray_worker, "run_training", one_long_step)
    args = (run_id, "grpo s0", {}, url, str(tmp_path / "run"), {}, Resources().model_dump())
    assert arm.train_in_ray.fn(*args) == {"beat": True}
    assert store.get_run(run_id)["wall_s"] == beats[-1]
