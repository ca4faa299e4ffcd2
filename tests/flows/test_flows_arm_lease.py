"""One process trains an arm at a time: the lease on its attempt (integrity item 2).

Two `dapo arm` of the same arm at once both trained one directory (the "still training" guard
asked each command's own local Ray); the newest attempt kept 318 of 474 rows. The guard is now
the store's: the arm's new attempt is claimed in one transaction that takes a lease (host, pid,
since) whose heartbeat is the row's updated_at. Each test runs real driver processes
(tests/arm_driver.py: flows.arm.run_arm with Ray left out, so that the test says when training
ends) against a SQLite file and the PostgreSQL server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from dapo_cli import ROOT, SMALL_OVERRIDES, dapo, stored_sweep

from db.store import Store

DRIVER = str(Path(__file__).resolve().parents[1] / "arm_driver.py")
WAIT_S = 120.0


class Drivers:
    """Driver processes of one arm of one sweep, started and ended by the test."""

    def __init__(self, url: str, tmp: Path) -> None:
        from flows.params import SweepParams, validate

        self.url, self.tmp = url, tmp
        self.store = Store(url)
        params = validate(
            SweepParams,
            {"arms": ["grpo"], "seeds": [0], "steps": 2, "overrides": SMALL_OVERRIDES},
        )
        self.sweep_id = stored_sweep(self.store, params, "lease test")
        self.env = {**os.environ, "DAPO_DB_URL": url, "DAPO_RUNS_DIR": str(tmp / "runs")}
        # The driver's own folder, tests/, comes first on its path: with the repository's root
        # on it too, `flows` and `db` are the packages, not tests/flows/ and tests/db/.
        self.env["PYTHONPATH"] = str(ROOT)
        self.start, self.go = tmp / "start", tmp / "go"
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, *extra: str) -> subprocess.Popen[str]:
        args = [self.url, str(self.sweep_id), "grpo", str(self.start), str(self.go), *extra]
        proc = subprocess.Popen(
            [sys.executable, DRIVER, *args],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def attempts(self) -> list[dict[str, Any]]:
        from db.models import RUNS

        with self.store.engine.connect() as conn:
            rows = conn.execute(sa.select(RUNS).order_by(RUNS.c.attempt)).mappings().all()
        return [dict(row) for row in rows]

    def trainers(self) -> list[int]:
        """The pids that "trained" a run directory of this arm (tests/arm_driver.py)."""
        found = (self.tmp / "runs").rglob("trained-by-*")
        return sorted(int(path.name.removeprefix("trained-by-")) for path in found)

    def close(self) -> None:
        self.go.touch()
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture
def drivers(store_url: str, tmp_path: Path) -> Iterator[Drivers]:
    d = Drivers(store_url, tmp_path)
    try:
        yield d
    finally:
        d.close()


def _until(check: Callable[[], Any], what: str, procs: list[subprocess.Popen[str]]) -> Any:
    """Poll `check` until it is truthy (a condition, not a guess at timing)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    # What an ended driver said is the diagnosis (a refusal's one line, a store error).
    states = [(p.pid, p.poll(), p.communicate()[1][-500:] if p.poll() is not None else "")
              for p in procs]  # fmt: skip
    pytest.fail(f"timed out waiting for {what}; drivers (pid, exit code, stderr) {states}")


def _exited(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=WAIT_S)
    return proc.returncode, out, err


def _age(store: Store, run_id: int, seconds: float, **values: Any) -> None:
    """Make a run row look untouched for `seconds` (a driver that stopped beating)."""
    from datetime import timedelta

    from db.models import RUNS, utcnow

    then = utcnow() - timedelta(seconds=seconds)
    with store.engine.begin() as conn:
        conn.execute(sa.update(RUNS).where(RUNS.c.id == run_id).values(updated_at=then, **values))


def test_two_drivers_of_one_arm_at_once_one_trains_and_the_other_names_it(
    drivers: Drivers,
) -> None:
    """Two drivers claim the arm at the same moment: exactly one trains; the other exits 2
    with one line naming the holder (host, pid); so does a real `dapo arm` started while the
    first trains, which writes nothing. The holder then completes and releases the lease."""
    a, b = drivers.spawn(), drivers.spawn()
    drivers.start.touch()
    loser = _until(
        lambda: next((p for p in (a, b) if p.poll() is not None), None), "one to end", [a, b]
    )
    winner = b if loser is a else a
    code, out, err = _exited(loser)
    assert code == 2, (out, err)
    (line,) = err.strip().splitlines()
    (row,) = drivers.attempts()
    assert line.startswith(f"error: grpo s0 of sweep {drivers.sweep_id} is held by run {row['id']}")
    assert f"{socket.gethostname()} pid {winner.pid} since " in line
    assert (row["status"], row["lease_pid"], row["lease_host"]) == (
        "running",
        winner.pid,
        socket.gethostname(),
    )
    _until(lambda: drivers.trainers() == [winner.pid], "the winner to train", [winner])

    # The real command, while the winner trains: one line, exit 2, nothing written.
    cli = dapo("arm", "--sweep", str(drivers.sweep_id), "--arm", "grpo", "--quiet", env=drivers.env)
    assert cli.returncode == 2, cli.stdout + cli.stderr
    (line,) = cli.stderr.strip().splitlines()
    assert (
        f"is held by run {row['id']} (attempt 1): {socket.gethostname()} pid {winner.pid}" in line
    )
    assert len(drivers.attempts()) == 1 and drivers.trainers() == [winner.pid]

    drivers.go.touch()
    code, out, err = _exited(winner)
    assert code == 0 and f"completed run {row['id']}" in out, (out, err)
    (done,) = drivers.attempts()
    assert done["status"] == "completed"
    assert (done["lease_host"], done["lease_pid"], done["lease_at"]) == (None, None, None)


def test_a_lease_whose_driver_is_gone_from_this_machine_is_taken_over(drivers: Drivers) -> None:
    """A SIGKILLed driver leaves its attempt "running" with a fresh heartbeat; on the machine
    it ran on, its pid says it is gone, so the next driver takes the arm over at once."""
    drivers.start.touch()
    first = drivers.spawn()
    _until(lambda: drivers.trainers() == [first.pid], "the first driver to train", [first])
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = drivers.spawn()
    _until(lambda: second.pid in drivers.trainers(), "the second driver to train", [second])
    drivers.go.touch()
    code, out, err = _exited(second)
    assert code == 0, (out, err)
    old, new = drivers.attempts()
    assert (old["status"], old["superseded_by"]) == ("cancelled", new["id"])
    assert old["lease_pid"] is None and new["status"] == "completed"


def test_a_stale_lease_is_taken_over_and_its_old_holder_stops(drivers: Drivers) -> None:
    """The holder stops beating (frozen here with SIGSTOP; a driver on another machine that
    hangs, or loses the store, looks the same): once its heartbeat is older than the lease a
    second driver takes the arm over. When the first one wakes, its next heartbeat finds the
    run taken over: it stops training and leaves the takeover's record as it is."""
    from db.models import RUN_LEASE_S

    drivers.start.touch()
    first = drivers.spawn("0.2")  # a heartbeat every 0.2 s
    _until(lambda: drivers.trainers() == [first.pid], "the first driver to train", [first])
    (row,) = drivers.attempts()
    first.send_signal(signal.SIGSTOP)
    try:
        # Its host made foreign too: only the heartbeat's age can free this lease.
        _age(drivers.store, row["id"], RUN_LEASE_S + 60, lease_host="another-machine")
        second = drivers.spawn()
        _until(lambda: second.pid in drivers.trainers(), "the takeover", [second])
    finally:
        first.send_signal(signal.SIGCONT)
    code, out, err = _exited(first)
    assert code != 0 and "LeaseLost" in err, (out, err)
    assert "taken over" in err
    drivers.go.touch()
    code, out, err = _exited(second)
    assert code == 0, (out, err)
    old, new = drivers.attempts()
    assert (old["status"], old["superseded_by"]) == ("cancelled", new["id"])
    assert old["error"] == f"superseded by run {new['id']}: it started over"
    assert new["status"] == "completed" and new["lease_pid"] is None


def test_a_lost_lease_stops_its_own_arms_wait_and_no_other() -> None:
    """run_training's `cancel` (set by the heartbeat that found the run taken over) ends that
    arm's wait with LeaseLost, its actors killed; arms waiting in other threads go on."""
    import threading

    from flows import ray_worker

    had_ray = ray_worker.ray.is_initialized()  # an earlier test in this process may have one
    cancel = threading.Event()
    cancel.set()
    elsewhere: list[bool] = []
    other = threading.Thread(target=lambda: elsewhere.append(ray_worker._stopping()))
    token = ray_worker._CANCEL.set(cancel)
    try:
        other.start()  # a thread of its own: not this call's context
        other.join()
        with pytest.raises(ray_worker.LeaseLost, match="another process took this run over"):
            ray_worker._wait(object(), None, None)
    finally:
        ray_worker._CANCEL.reset(token)
    assert elsewhere == [False] and not ray_worker._stopping()
    # With no Ray in this process the stop kills nothing and starts no Ray: ray.kill would
    # have joined whatever cluster this machine last `ray start`ed (one CI run hung there).
    assert ray_worker.ray.is_initialized() == had_ray
