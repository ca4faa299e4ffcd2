"""Write transactions that take the lock up front, and retries for the few errors worth retrying.

SQLite lets many readers and one writer work at once (WAL). A transaction that starts as a
reader and later writes must upgrade its lock, and when another writer got there first SQLite
fails it at once with "database is locked" (the busy timeout cannot help: waiting could not
make its snapshot current). So every write transaction of the store begins with BEGIN IMMEDIATE,
which queues on the busy timeout instead; reads keep a plain deferred BEGIN. db.engine emits
the BEGIN (the sqlite3 driver's own transaction handling is switched off there).

Outages: a server restart, a dropped network path or a file system that stops answering is not
a lock. `retrying(..., outage_s=T)` waits those out with exponential back-off for up to T seconds
(every write of the store is idempotent or numbered under a unique key, so a transaction whose
COMMIT may or may not have landed can be run again). The default budget is OUTAGE_S, or
$DAPO_STORE_OUTAGE_S.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import sqlalchemy as sa

# Execution option that makes db.engine's "begin" hook emit BEGIN IMMEDIATE on SQLite.
WRITE_OPTION = "dapo_write"

# PostgreSQL: serialization failure, deadlock detected (both say "try again").
_RETRY_SQLSTATES = {"40001", "40P01"}
_RETRIES = 8

# How long the store may be unreachable before a write gives up: the guarantee the README
# states (no step lost or duplicated across an outage up to this long).
OUTAGE_S = 300.0
OUTAGE_ENV = "DAPO_STORE_OUTAGE_S"
# Back-off between attempts to reach a store that is down: doubling from the first to the last.
OUTAGE_FIRST_WAIT_S, OUTAGE_LONGEST_WAIT_S = 0.25, 5.0

T = TypeVar("T")


def outage_budget(environ: dict[str, str] | None = None) -> float:
    """$DAPO_STORE_OUTAGE_S when set to a number >= 0, else OUTAGE_S."""
    raw = (os.environ if environ is None else environ).get(OUTAGE_ENV, "").strip()
    if not raw:
        return OUTAGE_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{OUTAGE_ENV}={raw!r} is not a number of seconds") from None
    if not value >= 0:
        raise ValueError(f"{OUTAGE_ENV}={raw!r} must be >= 0 seconds")
    return value


@contextmanager
def write_transaction(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection inside a write transaction: committed on success, rolled back on error."""
    with engine.connect() as conn:
        conn.execution_options(**{WRITE_OPTION: True})
        with conn.begin():
            yield conn


def is_transient(error: BaseException) -> bool:
    """True for lock and serialization errors that a retry of the same transaction can cure."""
    if not isinstance(error, sa.exc.DBAPIError):
        return False
    orig = getattr(error, "orig", None)
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if sqlstate in _RETRY_SQLSTATES:
        return True
    text = str(orig or error).lower()
    return "database is locked" in text or "database table is locked" in text


def is_outage(error: BaseException) -> bool:
    """True when the store could not be reached or stopped answering (connection refused or
    dropped, server shutting down, SQLite file unreadable) rather than refusing the statement.

    psycopg and sqlite3 raise OperationalError for exactly those (and InterfaceError for a
    connection closed under them); constraint violations, bad SQL and bad data are other
    classes and are never retried.
    """
    if not isinstance(error, sa.exc.DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    return isinstance(error, sa.exc.OperationalError | sa.exc.InterfaceError) and not is_transient(
        error
    )


def outage_wait(failures: int) -> float:
    """The pause before the next attempt after `failures` failed ones (exponential, capped)."""
    return min(OUTAGE_LONGEST_WAIT_S, OUTAGE_FIRST_WAIT_S * 2 ** max(0, failures - 1))


def retrying(
    work: Callable[[], T],
    *,
    retries: int = _RETRIES,
    outage_s: float = 0.0,
    on_outage: Callable[[sa.exc.DBAPIError], bool] | None = None,
) -> T:
    """Run `work` (one whole transaction), again after a short random back-off when it fails
    with a transient error, and, for up to `outage_s` seconds, after an outage (see
    is_outage); other errors, and the last transient or outage one, propagate.
    `on_outage(error)` is asked before each wait: False propagates the error at once."""
    attempt = outages = 0
    outage_since: float | None = None
    while True:
        try:
            return work()
        except sa.exc.DBAPIError as error:
            if is_transient(error) and attempt < retries:
                attempt += 1
                # back-off with jitter so that writers that collided do not collide again
                time.sleep(min(2.0, 0.01 * 2 ** (attempt - 1)) * (0.5 + random.random()))
                continue
            if not (outage_s > 0 and is_outage(error)):
                raise
            if on_outage is not None and not on_outage(error):
                raise
            now = time.monotonic()
            outage_since = now if outage_since is None else outage_since
            outages += 1
            wait = outage_wait(outages)
            if now + wait - outage_since > outage_s:
                raise
            time.sleep(wait)
