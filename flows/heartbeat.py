"""One try's wall time and the run's heartbeat (flows/arm.py's tries, and flows/ray_jobs.py's).

An attempt's `wall_s` is the sum over its tries of their training time, less the seconds their
store sink spent waiting on a store that was down (db.sink.SqlSink.waited_s, reported by the
actor as `store_wait_s`). A try writes it every WALL_EVERY_S on a clock of its own: that write
is the run row's heartbeat, what keeps the attempt's lease (db.store.live_lease) and what the
read side's "interrupted" is measured against. A heartbeat that finds the run taken over by a
newer attempt sets `TryClock.lost`, which stops the try's actors (ray_worker.run_training's
`cancel`).
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

from dapo_common.util import first_line
from db.store import Store
from flows import progress

# The attempt's wall time is written this often while it trains (whatever the steps do), so a
# driver that dies loses at most this much of it; it is also the run's heartbeat (its lease).
WALL_EVERY_S = 10.0
# Bookkeeping after a failure waits this long for an unreachable store (the failure itself
# is already the answer; the outage budget was spent by whatever failed first).
BOOKKEEPING_OUTAGE_S = 5.0
# The wall time of a try that the store did not take (it was down when the try ended), by run:
# the task's retry, in this process, starts from it, and the attempt's last write carries it
# (else that try's time was lost).
_UNWRITTEN_WALL: dict[int, float] = {}


class TryClock:
    """One try's share of its attempt's wall time, written with the run's heartbeat.

    The try's time is the driver's clock from the start of the try, less the seconds the
    actor's sink reported waiting on a store outage (`waited`). The heartbeat thread writes it
    every WALL_EVERY_S, on a clock of its own, so that a long step, evaluation or placement
    never reads as a dead driver; when the store answers that a newer attempt took the run
    over, `lost` is set (run_training's cancel: the actors stop)."""

    def __init__(self, store: Store, run_id: int, label: str) -> None:
        self.store, self.run_id, self.label = store, run_id, label
        # An earlier try in this process whose last writes met a store outage knows more of
        # the attempt's time than the store does.
        self.before = max(store.begin_try(run_id), _UNWRITTEN_WALL.pop(run_id, 0.0))
        self.t0 = time.monotonic()
        self.store_wait_s = 0.0
        self.lost = threading.Event()
        self._stop = threading.Event()
        # In a copy of this task's context, so that what it says goes to the task's Prefect log.
        self._beat = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._heartbeat,),
            name=f"heartbeat-run{run_id}",
            daemon=True,
        )

    def waited(self, seconds: Any) -> None:
        """The actor's sink has waited this long on the store so far (it only grows)."""
        if seconds is not None:
            self.store_wait_s = max(self.store_wait_s, float(seconds))

    def write(self, *, outage_s: float) -> float:
        wall = self.before + max(0.0, time.monotonic() - self.t0 - self.store_wait_s)
        try:
            held = self.store.set_wall(self.run_id, wall, outage_s=outage_s)
            _UNWRITTEN_WALL.pop(self.run_id, None)
        except Exception as exc:  # the time is bookkeeping: never fail training for it
            _UNWRITTEN_WALL[self.run_id] = wall
            progress.say(
                f"{self.label}  could not record the wall time: {first_line(exc, with_type=True)}"
            )
            return wall
        if held is False and not self.lost.is_set():
            self.lost.set()
            progress.say(
                f"{self.label}  run {self.run_id} was taken over by a newer attempt (its lease "
                "had no heartbeat for too long): stopping its actors",
                level="warning",
            )
        return wall

    def _heartbeat(self) -> None:
        while not self._stop.wait(WALL_EVERY_S):
            self.write(outage_s=0.0)

    def __enter__(self) -> TryClock:
        self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._beat.join(timeout=WALL_EVERY_S)  # a write stuck on a hung store must not hold us
        self.write(outage_s=BOOKKEEPING_OUTAGE_S)


def unwritten_wall(run_id: int) -> dict[str, float]:
    """{"wall_s": ...} when the store missed the last try's time (see _UNWRITTEN_WALL)."""
    wall = _UNWRITTEN_WALL.pop(run_id, None)
    return {} if wall is None else {"wall_s": wall}
