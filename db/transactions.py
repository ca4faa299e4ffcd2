"""Write transactions that take the lock up front, and retries for the few errors worth retrying.

SQLite lets many readers and one writer work at once (WAL). A transaction that starts as a
reader and later writes must upgrade its lock, and when another writer got there first SQLite
fails it at once with "database is locked" (the busy timeout cannot help: waiting could not
make its snapshot current). So every write transaction of the store begins with BEGIN IMMEDIATE,
which queues on the busy timeout instead; reads keep a plain deferred BEGIN. db.engine emits
the BEGIN (the sqlite3 driver's own transaction handling is switched off there).
"""

from __future__ import annotations

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

T = TypeVar("T")


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


def retrying(work: Callable[[], T], *, retries: int = _RETRIES) -> T:
    """Run `work` (one whole transaction), again after a short random back-off when it fails
    with a transient error; other errors, and the last transient one, propagate."""
    for attempt in range(retries + 1):
        try:
            return work()
        except sa.exc.DBAPIError as error:
            if attempt == retries or not is_transient(error):
                raise
            # back-off with jitter so that writers that collided do not collide again
            time.sleep(min(2.0, 0.01 * 2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")
