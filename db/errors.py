"""The store's own exceptions: each is also a built-in the `dapo` dispatcher reports in one line."""

from __future__ import annotations


class NotFound(LookupError, ValueError):
    """A sweep or run id that the store does not hold (a user mistake, hence also ValueError)."""


class SchemaMismatch(ValueError):
    """The database's schema revision is not the one this code speaks (newer, unknown, older)."""
