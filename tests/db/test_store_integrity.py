"""Store integrity through outages and hangs: opening waits within the budget, what an outage
queues outlives the process, a run with a hole in its curve is never completed, and a store
that hangs (accepts, never answers; a SQLite file locked by another connection) does not hold
training either.

Real pieces throughout: PostgreSQL through tests/tcp_proxy.py (stopped, or hung: connections
accepted and nothing forwarded), SQLite files locked by another process, processes killed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from store_outage import LOCKER, assert_every_step_once, log_step, new_run
from tcp_proxy import TcpProxy

from db import engine as db_engine
from db.sink import SPILL_PREFIX, IncompleteRun, SqlSink, check_every_step
from db.store import Store

ROOT = Path(__file__).resolve().parents[2]


# --- 1. opening a store waits within the outage budget ------------------------------------------


def test_opening_a_store_during_an_outage_waits_for_it(
    proxy: TcpProxy, pg_urls: tuple[str, str], capfd: pytest.CaptureFixture[str]
) -> None:
    """A restarted actor opens the store while it is down: it used to fail in 0.1 s."""
    _direct, through = pg_urls
    proxy.stop()
    threading.Timer(2.0, proxy.start).start()
    t0 = time.monotonic()
    store = Store(through, outage_s=30)  # the first open of this URL in this process
    assert time.monotonic() - t0 >= 1.5  # it waited for the store ...
    assert len(store.store_id) == 36  # ... and has it
    err = capfd.readouterr().err
    assert "does not answer" in err and "waiting up to 30 s" in err  # and said so, once
    assert err.count("does not answer") == 1


def test_opening_a_store_past_the_budget_is_one_line(
    proxy: TcpProxy, pg_urls: tuple[str, str]
) -> None:
    _direct, through = pg_urls
    proxy.stop()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError) as caught:
        Store(through, outage_s=1.0)
    assert 0.5 <= time.monotonic() - t0 < 10  # it tried for (about) the budget, no longer
    assert "\n" not in str(caught.value) and "cannot open the store" in str(caught.value)


def test_a_wrong_database_name_is_not_waited_for(pg_urls: tuple[str, str]) -> None:
    """Waiting cannot cure a refusal: the front door still says it at once."""
    direct, _through = pg_urls
    wrong = direct.replace("/test?", "/no_such_database_dapo?")
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="no_such_database_dapo"):
        Store(wrong, outage_s=60)
    assert time.monotonic() - t0 < 5


# --- 1. what an outage queued outlives the process ------------------------------------------

KILLED_WRITER = """
import sys, time
sys.path.insert(0, sys.argv[4])
from store_outage import log_step
from db.store import Store
store = Store(sys.argv[1], outage_s=600)
sink = store.sink(int(sys.argv[2]), spill_dir=sys.argv[3])
for step in range(1, 11):
    log_step(sink, step)
    if step == 4:
        print("DOWN?", flush=True)
        sys.stdin.readline()  # the parent stops the store here
print("QUEUED", sink.pending, flush=True)
time.sleep(600)  # killed before it ever writes them back
"""


def test_steps_queued_in_an_outage_survive_the_process_that_queued_them(
    proxy: TcpProxy, pg_urls: tuple[str, str], tmp_path: Path
) -> None:
    """Store outage, then the actor dies: its queued steps were only in its memory (the spill
    file started after 256 writes), so the resumed attempt completed with a hole."""
    direct, through = pg_urls
    _store, run_id = new_run(direct)
    run_dir = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, through, str(run_id), str(run_dir), str(ROOT / "tests")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "DOWN?"
        proxy.stop()
        child.stdin.write("\n")
        child.stdin.flush()
        line = child.stdout.readline().split()
        assert line[0] == "QUEUED" and int(line[1]) > 0, line
    finally:
        child.send_signal(signal.SIGKILL)  # the actor dies mid-outage
        child.wait(timeout=30)
    spill = run_dir / f"{SPILL_PREFIX}{run_id}.jsonl"
    assert spill.is_file()
    proxy.start()
    # The next sink of the run (a retried actor, or the next attempt's replay) writes it back.
    assert Store(through).replay_spill(run_id, run_dir) == int(line[1])
    assert_every_step_once(direct, run_id, range(1, 11))


def test_a_run_missing_steps_is_never_completed(store_url: str) -> None:
    store, run_id = new_run(store_url)
    sink = store.sink(run_id)
    for step in (1, 2, 4, 5):
        log_step(sink, step)
    sink.close()
    with pytest.raises(IncompleteRun) as caught:
        check_every_step(store.engine, run_id, 5, where=store.where)
    message = str(caught.value)
    assert "\n" not in message and "holds the metrics of 4" in message and "steps 3)" in message
    sink = store.sink(run_id)
    log_step(sink, 3)
    sink.close()
    check_every_step(store.engine, run_id, 5, where=store.where)  # whole: no error


def test_the_arm_flow_checks_every_step_before_marking_completed() -> None:
    """The flow's one call site (flows/arm.py is shared): the check comes before "completed"."""
    text = (ROOT / "flows" / "arm.py").read_text()
    check = text.index("check_every_step(store.engine, attempt.run_id")
    assert check < text.index("return finish_arm(")  # finish_arm marks it completed
    assert "latest_checkpoint_step=resumable_step(" in text  # and a resume needs its curve


# --- 3. hangs: the store stops answering without refusing --------------------------------------


def test_a_hung_postgres_connection_does_not_hold_training(
    proxy: TcpProxy, pg_urls: tuple[str, str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    direct, through = pg_urls
    store, run_id = new_run(through, outage_s=60)
    sink = SqlSink(store.engine, run_id, where=store.where, spill_dir=tmp_path, hang_s=3.0)
    # Safety for the old code, whose write waited on the hung socket for as long as it hung.
    safety = threading.Timer(12.0, proxy.unhang)
    safety.start()
    slowest, held_back = 0.0, 0
    try:
        for step in range(1, 41):
            if step == 5:
                proxy.hang()  # connections stay open; nothing comes back
            if step == 30:
                proxy.unhang()
            t0 = time.monotonic()
            log_step(sink, step)
            slowest = max(slowest, time.monotonic() - t0)
            if 5 <= step < 30:
                held_back = max(held_back, sink.pending)
            time.sleep(0.2)  # a step's training time
        sink.close()
    finally:
        safety.cancel()
        proxy.unhang()
    assert held_back > 0  # the hang was an outage to the sink: it queued ...
    assert slowest < 2.0, f"a step waited {slowest:.1f} s for a hung store"  # ... and went on
    assert_every_step_once(direct, run_id, range(1, 41))  # all there once it answered
    err = capfd.readouterr().err
    assert "does not answer" in err and "answers again" in err


def test_a_sqlite_file_locked_by_another_connection_does_not_hold_training(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The store's own engine (busy timeout 30 s): each write used to wait out the lock."""
    url = f"sqlite:///{tmp_path / 'dapo.db'}"
    store, run_id = new_run(url, outage_s=60)
    sink = store.sink(run_id, spill_dir=tmp_path / "run")
    locker = None
    slowest, held_back = 0.0, 0
    try:
        for step in range(1, 31):
            if step == 5:
                locker = subprocess.Popen(
                    [sys.executable, "-c", LOCKER, str(tmp_path / "dapo.db"), "5"],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert locker.stdout is not None and locker.stdout.readline().strip() == "LOCKED"
            t0 = time.monotonic()
            log_step(sink, step)
            slowest = max(slowest, time.monotonic() - t0)
            if locker is not None and locker.poll() is None:
                held_back = max(held_back, sink.pending)
            time.sleep(0.2)
        assert locker is not None and locker.wait(timeout=60) == 0
        sink.close()
    finally:
        if locker is not None and locker.poll() is None:
            locker.kill()
    assert held_back > 0
    assert slowest < 2.0, f"a step waited {slowest:.1f} s for the lock"
    assert_every_step_once(url, run_id, range(1, 31))
    assert "does not answer" in capfd.readouterr().err


def test_postgres_connections_carry_timeouts_and_keep_the_urls_options(
    pg_urls: tuple[str, str],
) -> None:
    """statement_timeout, the idle-in-transaction timeout and keepalives on every connection;
    the URL's search_path stays."""
    direct, _through = pg_urls
    engine = db_engine.create(direct)
    try:
        with engine.connect() as conn:
            timeout = conn.execute(sa.text("SHOW statement_timeout")).scalar()
            idle = conn.execute(sa.text("SHOW idle_in_transaction_session_timeout")).scalar()
            path = conn.execute(sa.text("SHOW search_path")).scalar()
            raw = conn.connection.dbapi_connection
            assert raw is not None
            params = raw.info.get_parameters()  # type: ignore[attr-defined]
    finally:
        engine.dispose()
    assert timeout == f"{db_engine.PG_STATEMENT_TIMEOUT_S // 60}min"
    assert idle == f"{db_engine.PG_IDLE_IN_TRANSACTION_S}s"
    assert str(path).startswith("dapo_test_")
    assert params.get("keepalives") == "1" and params.get("connect_timeout")


def test_a_writer_frozen_inside_its_transaction_loses_its_lock_to_the_next_writer(
    pg_urls: tuple[str, str],
) -> None:
    """A driver stopped between its UPDATE and its COMMIT (seen: SIGSTOP with a heartbeat in
    flight) held its row lock until its connection died, which a frozen process's never does:
    the lease's takeover then waited on the lock and ended on the statement timeout. The
    server now ends the frozen session; the waiting writer goes on and the frozen write is
    rolled back. The URL's own timeout (300 ms here) wins over the default."""
    direct, _through = pg_urls
    url = sa.make_url(direct)
    options = url.query.get("options", "")
    options = " ".join(options) if isinstance(options, tuple) else str(options)
    frozen_url = url.update_query_dict(
        {"options": f"{options} -c idle_in_transaction_session_timeout=300".strip()}
    )
    frozen_engine = db_engine.create(frozen_url.render_as_string(hide_password=False))
    engine = db_engine.create(direct)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE beat (id int PRIMARY KEY, who text)"))
            conn.execute(sa.text("INSERT INTO beat VALUES (1, 'nobody')"))
        frozen = frozen_engine.connect()
        frozen.begin()
        frozen.execute(sa.text("UPDATE beat SET who = 'frozen' WHERE id = 1"))
        # ...and no COMMIT: this writer stops here. The next one waits on its row lock.
        started = time.monotonic()
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE beat SET who = 'next' WHERE id = 1"))
        waited = time.monotonic() - started
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT who FROM beat")).scalar() == "next"
        with pytest.raises(sa.exc.DBAPIError):  # its session was ended under it
            frozen.execute(sa.text("SELECT 1"))
        frozen.close()
    finally:
        frozen_engine.dispose()
        engine.dispose()
    assert waited < db_engine.PG_STATEMENT_TIMEOUT_S


def test_the_sqlite_busy_timeout_never_exceeds_the_outage_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAPO_STORE_OUTAGE_S", "2")
    engine = db_engine.create(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 2000
    finally:
        engine.dispose()
