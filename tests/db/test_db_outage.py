"""Store outages (issue 14.3): the sink buffers, retries with back-off and writes every step
back exactly once; past the budget the run stops with one line and keeps what it holds.

The outages are real: PostgreSQL is reached through a TCP proxy (tests/tcp_proxy.py) that the
test takes down (every connection cut, new ones refused, as in a server restart) and brings
back; SQLite is locked by another process holding an exclusive transaction.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from store_outage import LOCKER, assert_every_step_once, log_step, new_run
from tcp_proxy import TcpProxy

from db import engine as db_engine
from db.errors import StoreUnavailable
from db.sink import SPILL_PREFIX, SqlSink
from db.store import Store


def test_a_postgres_outage_loses_and_duplicates_nothing(
    proxy: TcpProxy, pg_urls: tuple[str, str], tmp_path: Path
) -> None:
    direct, through = pg_urls
    store, run_id = new_run(through, outage_s=60)
    sink = store.sink(run_id, spill_dir=tmp_path)
    slowest = 0.0
    for step in range(1, 31):
        if step == 10:
            proxy.stop()  # connections cut mid-run; about 1.5 s of steps go by without a store
        if step == 20:
            assert sink.pending > 0  # the outage was real: writes are waiting for the store
            proxy.start()
        t0 = time.monotonic()
        log_step(sink, step)
        slowest = max(slowest, time.monotonic() - t0)
        time.sleep(0.15)  # a step's training time, during which the store stays down
    sink.close()
    assert sink.pending == 0
    assert slowest < 1.0, f"a step waited {slowest:.1f} s for the store"  # training went on
    assert_every_step_once(direct, run_id, range(1, 31))
    assert not list(tmp_path.iterdir())  # all written back: no spill file is left


def test_a_connection_dropped_between_steps_is_replaced_not_queued(
    proxy: TcpProxy, pg_urls: tuple[str, str], tmp_path: Path
) -> None:
    """A server restart between two steps leaves the sink's held connection dead: the next
    write takes a fresh one at once instead of queueing as if the store were down."""
    direct, through = pg_urls
    store, run_id = new_run(through, outage_s=60)
    sink = store.sink(run_id, spill_dir=tmp_path)
    log_step(sink, 1)
    proxy.stop()  # cuts the held connection, as a restart does ...
    proxy.start()  # ... and the server is back before the next step
    log_step(sink, 2)
    assert sink.pending == 0  # written at once: no outage, no back-off
    sink.close()
    assert_every_step_once(direct, run_id, range(1, 3))


def test_a_long_outage_spills_to_the_run_directory_then_writes_it_back(
    proxy: TcpProxy, pg_urls: tuple[str, str], tmp_path: Path
) -> None:
    direct, through = pg_urls
    store, run_id = new_run(through, outage_s=60)
    sink = SqlSink(store.engine, run_id, where=store.where, spill_dir=tmp_path, memory_writes=4)
    spill = tmp_path / f"{SPILL_PREFIX}{run_id}.jsonl"
    for step in range(1, 26):
        if step == 5:
            proxy.stop()
        if step == 15:
            # ten steps (20+ writes) outgrew the memory of 4: they are on disk, in order
            assert spill.is_file() and len(spill.read_text().splitlines()) == sink.pending > 4
            proxy.start()
        log_step(sink, step)
        time.sleep(0.05)
    sink.close()
    assert not spill.exists()
    assert_every_step_once(direct, run_id, range(1, 26))


def test_past_the_budget_the_run_stops_in_one_line_and_the_store_gets_it_all_back(
    proxy: TcpProxy, pg_urls: tuple[str, str], tmp_path: Path
) -> None:
    direct, through = pg_urls
    store, run_id = new_run(through, outage_s=1.0)
    sink = store.sink(run_id, spill_dir=tmp_path)
    for step in range(1, 6):
        log_step(sink, step)
    proxy.stop()
    step = 5
    with pytest.raises(StoreUnavailable) as caught:
        while step < 100:
            step += 1
            log_step(sink, step)
            time.sleep(0.1)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(
        f"the store {db_engine.safe_url(through)} has been unreachable for more than 1 s"
    )
    spill = tmp_path / f"{SPILL_PREFIX}{run_id}.jsonl"
    assert f"are kept in {spill}" in message and spill.is_file()
    # The store comes back: the next attempt replays what the stopped run kept. The metrics
    # call that raised had its write queued first, so it is kept too.
    proxy.start()
    assert Store(through).replay_spill(run_id, tmp_path) > 0
    assert_every_step_once(direct, run_id, range(1, step + 1), logged=range(1, step))
    assert not spill.exists()


def test_store_calls_wait_out_a_short_outage(proxy: TcpProxy, pg_urls: tuple[str, str]) -> None:
    """The flows' own writes (marking a run done) used to fail on the first dropped
    connection, leaving the run "running"."""
    import threading

    direct, through = pg_urls
    store, run_id = new_run(through, outage_s=30)
    proxy.stop()
    restart = threading.Timer(1.5, proxy.start)
    restart.start()
    store.update_run(run_id, status="completed", steps=3)
    restart.join()
    assert Store(direct).get_run(run_id)["status"] == "completed"
    proxy.stop()
    with pytest.raises(StoreUnavailable) as caught:
        Store(through, outage_s=0.5).update_run(run_id, status="failed")
    assert "\n" not in str(caught.value) and "is unreachable (waited 0.5 s)" in str(caught.value)


def test_a_sqlite_store_locked_for_seconds_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dapo.db'}"
    _store, run_id = new_run(url)  # the store stays open for the test
    # The sink's own engine waits only 50 ms for the lock (the store's waits 30 s), so that a
    # lock of 4 s is an outage to it and not a pause.
    engine = db_engine.create(url, busy_timeout_s=0.05)
    spill_dir = tmp_path / "run"
    sink = SqlSink(engine, run_id, where=url, spill_dir=spill_dir, outage_s=60)
    locker = None
    slowest, held_back = 0.0, 0
    try:
        for step in range(1, 31):
            if step == 5:
                locker = subprocess.Popen(
                    [sys.executable, "-c", LOCKER, str(tmp_path / "dapo.db"), "4"],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert locker.stdout is not None and locker.stdout.readline().strip() == "LOCKED"
            t0 = time.monotonic()
            log_step(sink, step)
            slowest = max(slowest, time.monotonic() - t0)
            if locker is not None and locker.poll() is None:
                held_back = max(held_back, sink.pending)
            time.sleep(0.2)  # a step's training time
        assert locker is not None and locker.wait(timeout=30) == 0
        sink.close()
    finally:
        if locker is not None and locker.poll() is None:
            locker.kill()
        engine.dispose()
    assert held_back > 0  # the lock was an outage to the sink: it queued while locked out ...
    assert slowest < 1.0, f"a step waited {slowest:.1f} s for the lock"  # ... and did not wait
    assert_every_step_once(url, run_id, range(1, 31))


def test_a_spill_file_torn_by_a_crash_is_replayed_up_to_its_last_whole_line(
    tmp_path: Path,
) -> None:
    """A process killed while appending to its spill file leaves half a line: the writes
    before it go to the store, the torn one (whose call never returned) is dropped."""
    import json

    url = f"sqlite:///{tmp_path / 'dapo.db'}"
    store, run_id = new_run(url)
    spill = tmp_path / "run" / f"{SPILL_PREFIX}{run_id}.jsonl"
    spill.parent.mkdir()
    whole = [{"kind": "metrics", "step": s, "items": [["m/00", s * 1.0]]} for s in (1, 2)]
    spill.write_text("".join(json.dumps(w) + "\n" for w in whole) + '{"kind": "metr')
    assert store.replay_spill(run_id, spill.parent) == 2
    assert not spill.exists()
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT step, name, value FROM metrics")).all()
    assert [tuple(r) for r in rows] == [(1, "m/00", 1.0), (2, "m/00", 2.0)]
