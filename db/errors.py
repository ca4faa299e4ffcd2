"""The store's own exceptions (dapo_common.util.first_line puts any error in one line).

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
