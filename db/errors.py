"""The store's own exceptions, and the one helper every layer uses to put an error in one line.

Each exception is also a built-in the `dapo` dispatcher reports in one line (exit 2).
"""

from __future__ import annotations


class NotFound(LookupError, ValueError):
    """A sweep or run id that the store does not hold (a user mistake, hence also ValueError)."""


class SchemaMismatch(ValueError):
    """The database's schema revision is not the one this code speaks (newer, unknown, older),
    or the database belongs to another application."""


class StoreUnavailable(ConnectionError):
    """The store stayed unreachable for longer than the outage budget (db.transactions)."""


def first_line(error: BaseException, *, with_type: bool = False) -> str:
    """The first line of an exception's message (SQL errors, pydantic and Prefect carry pages
    after it); the class name when the message is empty. `with_type` prefixes the class name,
    as the store's error column and the flows' logs keep it."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    if not line:
        return type(error).__name__
    return f"{type(error).__name__}: {line}" if with_type else line
