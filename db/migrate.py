"""Schema revisions: the Alembic migrations shipped in db/migrations, run from code.

No alembic.ini is needed: the configuration is built here and points at the package's own
migrations directory, so `dapo db upgrade` works from any working directory and from a wheel.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from db.errors import SchemaMismatch
from db.models import TABLES
from db.transactions import write_transaction

MIGRATIONS = Path(__file__).with_name("migrations")

# Serialises concurrent migrations of one PostgreSQL database (any constant works; this one
# spells "dapo" in ASCII).
_PG_LOCK_KEY = 0x6461706F


def alembic_config(connection: sa.Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@cache
def script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    head = script_directory().get_current_head()
    assert head is not None, "db/migrations has no revisions"
    return head


def known_revisions() -> set[str]:
    return {script.revision for script in script_directory().walk_revisions()}


def current_revision(conn: sa.Connection) -> str | None:
    """The revision recorded in the database (None for a database Alembic never touched)."""
    return MigrationContext.configure(conn).get_current_revision()


@dataclass(frozen=True)
class SchemaState:
    """Where a database stands: its revision, the code's head, and what to do about it."""

    current: str | None
    head: str
    fresh: bool  # none of the store's tables and no revision: safe to create everything

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    @property
    def newer(self) -> bool:
        return self.current is not None and self.current not in known_revisions()


def schema_state(conn: sa.Connection) -> SchemaState:
    current = current_revision(conn)
    fresh = False
    if current is None:
        present = set(sa.inspect(conn).get_table_names()) & set(TABLES)
        fresh = not present
    return SchemaState(current=current, head=head_revision(), fresh=fresh)


def check(state: SchemaState, where: str) -> None:
    """Refuse what the code cannot safely use or create; `where` names the store in messages."""
    if state.newer:
        raise SchemaMismatch(
            f"the store {where} is at schema revision {state.current!r}, newer than this "
            f"dapo-lab knows (its newest is {state.head!r}): upgrade dapo-lab, or point "
            "DAPO_DB_URL at another store"
        )
    if state.current is None and not state.fresh:
        raise SchemaMismatch(
            f"the store {where} has tables named like the store's ({', '.join(TABLES)}) but no "
            "schema revision: it was not made by dapo-lab; use an empty database"
        )


def _lock(conn: sa.Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


def upgrade(engine: sa.Engine, where: str) -> tuple[str | None, str]:
    """Migrate to head under the store's write lock; returns (revision before, after).

    The state is read again under the lock: of several processes opening a fresh store at
    once, the first migrates and the others find it done.
    """
    with write_transaction(engine) as conn:
        _lock(conn)
        state = schema_state(conn)
        check(state, where)
        if not state.up_to_date:
            command.upgrade(alembic_config(conn), "head")
        return state.current, state.head


def ensure_schema(engine: sa.Engine, where: str, *, upgrade_older: bool) -> SchemaState:
    """Check a store on first use: create a fresh one, refuse a newer or foreign one, and
    upgrade an older one when `upgrade_older` (else say how)."""
    with engine.connect() as conn:
        state = schema_state(conn)
    check(state, where)
    if state.up_to_date:
        return state
    if state.fresh or upgrade_older:
        upgrade(engine, where)
        return SchemaState(current=state.head, head=state.head, fresh=False)
    raise SchemaMismatch(
        f"the store {where} is at schema revision {state.current!r}, older than this code's "
        f"{state.head!r}: run `dapo db upgrade`"
    )
