"""Schema revisions: the Alembic migrations shipped in db/migrations, run from code.

No alembic.ini is needed: the configuration is built here and points at the package's own
migrations directory, so `dapo db upgrade` works from any working directory and from a wheel.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from db.errors import SchemaMismatch
from db.models import STORE_IDENTITY, TABLES
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
    fresh: bool  # no tables at all and no revision: safe to create everything
    ours: frozenset[str] = frozenset()  # the store's tables present
    others: tuple[str, ...] = ()  # every other table or view present, sorted

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    @property
    def newer(self) -> bool:
        """A revision this code does not know, in a database that holds the store's tables."""
        return (
            self.current is not None and self.current not in known_revisions() and bool(self.ours)
        )

    @property
    def foreign(self) -> bool:
        """Another application's database: other tables (or another Alembic history), none of
        the store's."""
        if self.ours:
            return False
        return bool(self.others) or (
            self.current is not None and self.current not in known_revisions()
        )


def schema_state(conn: sa.Connection) -> SchemaState:
    """Read-only: what the database holds (no table is created, no PRAGMA is changed)."""
    current = current_revision(conn)
    inspector = sa.inspect(conn)
    present = set(inspector.get_table_names()) | set(inspector.get_view_names())
    present.discard("alembic_version")
    ours = frozenset(present & set(TABLES))
    beside = _other_schemas_tables(conn)
    others = tuple(sorted(present - ours)) + beside
    fresh = current is None and not present and not beside
    return SchemaState(current=current, head=head_revision(), fresh=fresh, ours=ours, others=others)


def _other_schemas_tables(conn: sa.Connection) -> tuple[str, ...]:
    """PostgreSQL, a store in `public`: the tables and views (as schema.name) of the database's
    other schemas.

    Tables in the search path are seen as the store's own names are; but a database whose
    application keeps its tables in a schema of its own (`app.orders`, search path `public`)
    would look empty, and the store would settle in `public` beside them. A store in `public`
    claims the database, so those count as another application's. A store in a schema of its
    own (`?options=-csearch_path%3Dmine`) claims only its search path: several stores, and
    other applications, can then share one database."""
    if conn.dialect.name != "postgresql":
        return ()
    if conn.execute(sa.text("SELECT current_schema()")).scalar() != "public":
        return ()
    rows = conn.execute(
        sa.text(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema NOT IN ('public', 'information_schema') "
            "AND table_schema NOT LIKE 'pg\\_%' ORDER BY 1, 2"
        )
    ).all()
    return tuple(f"{schema}.{name}" for schema, name in rows)


def _named(names: tuple[str, ...], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return f"{shown}, and {len(names) - most} more" if len(names) > most else shown


def check(state: SchemaState, where: str, *, adopt: bool = False) -> None:
    """Refuse what the code cannot safely use or create; `where` names the store in messages.

    A database of another application is refused unless `adopt` (an explicit
    `dapo db upgrade`): the store's tables are then added beside the others.
    """
    if state.foreign and not adopt:
        found = (
            f"{len(state.others)} other table(s) ({_named(state.others)})"
            if state.others
            else "no tables"
        )
        history = (
            f" and another application's schema revision {state.current!r}"
            if state.current is not None
            else ""
        )
        raise SchemaMismatch(
            f"{where} is not a DAPO Lab store: it holds {found}{history}; point --store at an "
            f"empty database, or run `dapo db upgrade --store URL` to add the store's tables to it"
        )
    if state.foreign and state.current is not None:
        raise SchemaMismatch(
            f"{where} carries another application's schema revision {state.current!r}: the "
            "store's migrations cannot share its alembic_version table; use another database"
        )
    if state.newer:
        raise SchemaMismatch(
            f"the store {where} is at schema revision {state.current!r}, newer than this "
            f"dapo-lab knows (its newest is {state.head!r}): upgrade dapo-lab, or point "
            "DAPO_DB_URL at another store"
        )
    if state.current is None and state.ours:
        raise SchemaMismatch(
            f"the store {where} has tables named like the store's ({', '.join(sorted(state.ours))}) "
            "but no schema revision: it was not made by dapo-lab; use an empty database"
        )


def _lock(conn: sa.Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


def upgrade(engine: sa.Engine, where: str, *, adopt: bool = False) -> tuple[str | None, str]:
    """Migrate to head under the store's write lock; returns (revision before, after).

    The state is read again under the lock: of several processes opening a fresh store at
    once, the first migrates and the others find it done. `adopt`: see check().
    """
    with write_transaction(engine) as conn:
        _lock(conn)
        state = schema_state(conn)
        check(state, where, adopt=adopt)
        if not state.up_to_date:
            command.upgrade(alembic_config(conn), "head")
        return state.current, state.head


def ensure_schema(
    engine: sa.Engine, where: str, *, upgrade_older: bool, read_only: bool = False
) -> SchemaState:
    """Check a store on first use: create a fresh one, refuse a newer or foreign one, and
    upgrade an older one when `upgrade_older` (else say how). `read_only`: change nothing;
    a store that is not at this code's revision is refused with what to run."""
    with engine.connect() as conn:
        state = schema_state(conn)
    check(state, where)
    if state.up_to_date:
        return state
    if read_only:
        if state.fresh:
            raise SchemaMismatch(
                f"the store {where} is empty (it is created by the first `dapo sweep`, or "
                "`dapo db upgrade`)"
            )
        raise SchemaMismatch(
            f"the store {where} is at schema revision {state.current!r}, older than this "
            f"code's {state.head!r}: run `dapo db upgrade` (reading it changes nothing)"
        )
    if state.fresh or upgrade_older:
        upgrade(engine, where)
        return SchemaState(current=state.head, head=state.head, fresh=False)
    raise SchemaMismatch(
        f"the store {where} is at schema revision {state.current!r}, older than this code's "
        f"{state.head!r}: run `dapo db upgrade`"
    )


# --- the store's identity, bound to where it lives --------------------------------------------


def store_location(conn: sa.Connection) -> str | None:
    """Where this store lives, as its identity is bound to it (None: nowhere that lasts, an
    in-memory database). A copied file, a restored dump or a CREATE DATABASE ... TEMPLATE copy
    each live elsewhere.

    SQLite: `sqlite:<absolute path>`. PostgreSQL: `postgresql:<cluster>:<database OID>:<table
    OID>:<database>/<schema>`, where the cluster is the server's system identifier when this
    user may read it (else `?`, which matches any: two users of one store must not disagree
    about where it is) and the table is store_identity (a restored dump creates it anew)."""
    if conn.dialect.name == "sqlite":
        rows = conn.exec_driver_sql("PRAGMA database_list").all()
        path = next((str(row[2]) for row in rows if row[1] == "main"), "")
        return f"sqlite:{Path(path).resolve()}" if path else None
    cluster = "?"
    readable = conn.execute(
        sa.text("SELECT has_function_privilege('pg_control_system()', 'EXECUTE')")
    ).scalar()
    if readable:
        cluster = str(
            conn.execute(sa.text("SELECT system_identifier FROM pg_control_system()")).scalar()
        )
    oid, table, name, schema = conn.execute(
        sa.text(
            "SELECT d.oid, 'store_identity'::regclass::oid, d.datname, current_schema() "
            "FROM pg_database d WHERE d.datname = current_database()"
        )
    ).one()
    return f"postgresql:{cluster}:{oid}:{table}:{name}/{schema}"


def same_place(bound: str, here: str) -> bool:
    """Whether a store bound at `bound` and found at `here` is the same store where it was:
    the same location, the same SQLite file by another path (a symlink, a bind mount), or the
    same PostgreSQL database seen by a user who may not read the cluster's identifier."""
    if bound == here:
        return True
    if bound.startswith("sqlite:") and here.startswith("sqlite:"):
        try:
            return os.path.samefile(bound[len("sqlite:") :], here[len("sqlite:") :])
        except OSError:
            return False
    was, now = bound.split(":", 2), here.split(":", 2)
    if len(was) < 3 or len(now) < 3 or was[0] != now[0]:
        return False
    clusters_agree = "?" in (was[1], now[1]) or was[1] == now[1]
    return clusters_agree and was[2] == now[2]


def bind_identity(engine: sa.Engine) -> str | None:
    """Bind the store's id to its location on first use; when the store is found somewhere
    else than its id was bound (it is a copy), draw it an id of its own, so that it names run
    directories of its own and never resumes the original's checkpoints (whose metrics it may
    not hold). Returns a line saying so when it re-identified the store, else None.

    Under the write lock, and conditional on the row read: of several processes opening one
    copy at once, one draws the new id and the others find it bound."""
    table = STORE_IDENTITY
    query = sa.select(table.c.store_id, table.c.location).where(table.c.id == 1)
    with engine.connect() as conn:  # read first: a bound store takes no write lock
        here = store_location(conn)
        row = conn.execute(query).first()
    if here is None or row is None or (row.location and same_place(row.location, here)):
        return None
    with write_transaction(engine) as conn:
        row = conn.execute(query).first()
        if row is None or row.location == here:
            return None  # bound meanwhile by another process
        if row.location is None:
            conn.execute(sa.update(table).where(table.c.id == 1).values(location=here))
            return None
        if same_place(row.location, here):
            return None  # the same store, seen another way: its binding stays as it was
        new_id = str(uuid.uuid4())
        conn.execute(sa.update(table).where(table.c.id == 1).values(store_id=new_id, location=here))
    return (
        f"this store is a copy of store {row.store_id} (bound to {row.location}; found at "
        f"{here}): it is now store {new_id}, and never resumes the original's run directories"
    )
