"""The store's URL and its engine: one per URL per process, checked and migrated on first use.

URL: the argument, else $DAPO_DB_URL, else a SQLite file in the user's data directory
(`~/.local/share/dapo-lab/dapo.db` on Linux). PostgreSQL goes through the psycopg 3 driver:
`postgresql+psycopg://user@host:5432/db` (a bare `postgresql://` URL is taken to mean it).

A fresh database (no tables at all) is migrated on first use; an older SQLite file is upgraded;
an older PostgreSQL database asks for `dapo db upgrade` (a shared server is migrated on
purpose); a database at a revision this code does not know is refused, and so is a non-empty
database of another application (nothing is added to it, its journal mode is left alone)
unless `dapo db upgrade` is run on it. Every failure to open a store is one line: ValueError
(bad URL, wrong schema, foreign database), FileNotFoundError / PermissionError (SQLite path,
read-only directory), ConnectionError (server unreachable, login refused).

`get_engine(url, read_only=True)` opens a store for reading only (`dapo table`): SQLite through
a `mode=ro` URI, so that nothing is created, migrated or switched, even in a read-only
directory.

Hangs. A store that stops answering without refusing (a server behind a dead network path, a
proxy that accepts and never forwards, a SQLite file locked by another connection) is bounded
like one that refuses: PostgreSQL connections carry a connect timeout, TCP keepalives (a dead
peer is noticed in about PG_KEEPALIVE_DEAD_S), a TCP user timeout and a server-side
statement_timeout (PG_STATEMENT_TIMEOUT_S) and an idle-in-transaction timeout
(PG_IDLE_IN_TRANSACTION_S), unless the URL sets its own; a SQLite writer waits
for the lock at most SQLITE_BUSY_TIMEOUT_S, and never longer than the outage budget.
`get_engine(url, outage_s=T)` waits out a store that is down when it is opened for up to T
seconds (db.store.Store passes its outage budget, so a restarted actor whose store is down
waits like a write does), saying once on stderr that it waits.
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import sqlalchemy as sa
from platformdirs import user_data_dir
from sqlalchemy import event
from sqlalchemy.pool import StaticPool

from dapo_common.util import first_line
from db import migrate
from db.transactions import WRITE_OPTION, outage_budget, retrying

ENV_VAR = "DAPO_DB_URL"
APP_NAME = "dapo-lab"
DEFAULT_FILE = "dapo.db"
SUPPORTED = "sqlite:///path/to/dapo.db or postgresql+psycopg://user@host:5432/db"

# A writer waits this long for SQLite's write lock before giving up (then db.transactions retries);
# never longer than the outage budget, so that a lock held forever is an outage, not a stall.
SQLITE_BUSY_TIMEOUT_S = 30.0
# How long a PostgreSQL connection attempt may take before the store is called unreachable.
PG_CONNECT_TIMEOUT_S = 10
# A server-side bound on one statement: a statement stuck behind a lock or a hung client
# transaction ends with an error (an outage to the callers, retried) instead of never.
PG_STATEMENT_TIMEOUT_S = 60
# A session left inside a transaction without a statement this long is ended by the server,
# its locks released: a driver frozen between a write and its COMMIT (SIGSTOP, a hung host)
# would otherwise hold its row lock until its TCP connection dies, which for a live but frozen
# process is never; a takeover of its lease would wait on that lock and end on the statement
# timeout instead. Half the statement timeout, so that the waiting statement outlives it.
PG_IDLE_IN_TRANSACTION_S = 30
# TCP keepalives on every PostgreSQL connection: an idle connection to a peer that vanished
# (host down, network cut without a reset) is found dead after idle + interval * count seconds,
# and a sent packet left unacknowledged that long ends the connection (tcp_user_timeout).
PG_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                 "keepalives_count": 3}  # fmt: skip
PG_KEEPALIVE_DEAD_S = 25
# Errors on opening that say "this will not work" rather than "not now": never waited out.
_REFUSALS = (
    "authentication failed",
    "does not exist",
    "could not translate host name",
    "name or service not known",
    "no pg_hba.conf entry",
    "password",
    "not a database",
    "unable to open database file",
)

_ENGINES: dict[tuple[str, bool], sa.Engine] = {}
_LOCK = threading.RLock()


def default_url() -> str:
    """The SQLite file in the user's data directory (the directory is created)."""
    directory = Path(user_data_dir(APP_NAME, appauthor=False))
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{directory / DEFAULT_FILE}"


def resolve_url(url: str | None = None) -> str:
    """`url`, else $DAPO_DB_URL, else the default SQLite file; driver-less PostgreSQL URLs get
    the psycopg 3 driver."""
    chosen = (url or "").strip() or os.environ.get(ENV_VAR, "").strip() or default_url()
    return _with_driver(chosen)


def _with_driver(url: str) -> str:
    for bare in ("postgresql://", "postgres://"):
        if url.startswith(bare):
            return "postgresql+psycopg://" + url[len(bare) :]
    return url


def safe_url(url: str | sa.URL) -> str:
    """The URL with its password masked, fit for messages and pages; a read-only engine's
    `file:...?mode=ro` URI (see _read_only_url) reads as the store's own sqlite:/// URL, the
    one the user gave."""
    if isinstance(url, sa.URL):
        return _plain_sqlite(url).render_as_string(hide_password=True)
    try:
        return _plain_sqlite(sa.make_url(url)).render_as_string(hide_password=True)
    except Exception:  # unparseable: mask anything that looks like user:password@
        return re.sub(r"(//[^/:@]*:)[^/@]*@", r"\1***@", url)


def _plain_sqlite(url: sa.URL) -> sa.URL:
    """sqlite:///file:/p/x.db?mode=ro&uri=true -> sqlite:////p/x.db; any other URL as it is."""
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or not database.startswith("file:"):
        return url
    if str(url.query.get("uri", "")).lower() != "true":
        return url
    return url.set(database=unquote(database[len("file:") :]), query={})


def parse_url(url: str) -> sa.URL:
    """A URL the store can use, or ValueError saying what is wrong with it."""
    try:
        parsed = sa.make_url(url)
    except Exception as error:
        raise ValueError(f"malformed store URL {safe_url(url)!r}: expected {SUPPORTED}") from error
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite" and driver in ("", "pysqlite"):
        return parsed
    if backend == "postgresql" and driver == "psycopg":
        if not parsed.database:
            raise ValueError(
                f"store URL {safe_url(parsed)} names no database: expected {SUPPORTED}"
            )
        return parsed
    raise ValueError(f"unsupported store URL {safe_url(parsed)}: expected {SUPPORTED}")


def sqlite_path(url: sa.URL) -> Path | None:
    """The file of a SQLite URL (None for an in-memory database)."""
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database).expanduser()


def create(url: str, *, read_only: bool = False, busy_timeout_s: float | None = None) -> sa.Engine:
    """A configured engine for `url`, without touching the database (no schema check).

    `read_only`: see the module docstring. `busy_timeout_s`: how long a SQLite writer waits
    for the write lock (default SQLITE_BUSY_TIMEOUT_S).
    """
    parsed = parse_url(_with_driver(url))
    if parsed.get_backend_name() == "sqlite":
        timeout = SQLITE_BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
        # A lock held longer than the outage budget is an outage: the wait never exceeds it
        # (with a floor, so that a budget of 0 still lets two writers take turns).
        timeout = min(timeout, max(outage_budget(), 1.0))
        return _sqlite_engine(parsed, read_only=read_only, busy_timeout_s=timeout)
    return _postgres_engine(parsed, read_only=read_only)


def _read_only_url(path: Path) -> str:
    """A `mode=ro` URI for the file: SQLite neither creates it nor writes to it.

    In a directory this user cannot write, SQLite cannot create the `-shm` file a WAL reader
    needs; when no `-wal` file is there either (a store closed cleanly), every change is in the
    file itself and `immutable=1` lets SQLite read it without one.
    """
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    wal = path.with_name(path.name + "-wal")
    if not os.access(path.parent, os.W_OK) and not wal.exists():
        uri += "&immutable=1"
    return f"sqlite:///{uri}&uri=true"


def _sqlite_engine(url: sa.URL, *, read_only: bool, busy_timeout_s: float) -> sa.Engine:
    path = sqlite_path(url)
    kwargs: dict[str, Any] = {"connect_args": {"timeout": busy_timeout_s}}
    target: str | sa.URL = url
    if path is None:
        # One shared connection, so that every checkout sees the same in-memory database.
        kwargs = {"connect_args": {"check_same_thread": False}, "poolclass": StaticPool}
    elif read_only:
        if not path.is_file():
            raise FileNotFoundError(
                f"no store at {path} (it is created by the first `dapo sweep`, or `dapo db upgrade`)"
            )
        if not os.access(path, os.R_OK):
            raise PermissionError(f"cannot read the SQLite store {path}")
        target = _read_only_url(path)
    else:
        if not path.parent.is_dir():
            raise FileNotFoundError(
                f"no directory {path.parent} for the SQLite store {safe_url(url)}"
            )
        if not os.access(path.parent, os.W_OK | os.X_OK):
            # SQLite writes its journal (the -wal and -shm files) beside the store: without
            # that, the first write would fail with "unable to open database file".
            raise PermissionError(
                f"the SQLite store {path} is in a read-only directory ({path.parent}): SQLite "
                "must write its journal beside it; move the store to a writable directory "
                "(`dapo table` can still read it where it is)"
            )
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            raise PermissionError(
                f"cannot read and write the SQLite store {path} (`dapo table` can still read it)"
            )
    engine = sa.create_engine(target, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # db.transactions emits BEGIN itself (see there why); the driver's own, which defers
        # BEGIN until the first write, would let two writers deadlock on a lock upgrade.
        # Nothing here changes the file: WAL is switched on only once the database has been
        # found to be a store (enable_wal), so a foreign file is left as it was.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if path is not None and not read_only:
            # FULL sync: a step is on disk when log_metrics returns (one fsync per
            # transaction), as with PostgreSQL's synchronous_commit; NORMAL would be faster
            # and could lose the last steps to a power cut.
            cursor.execute("PRAGMA synchronous = FULL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def enable_wal(engine: sa.Engine) -> None:
    """Switch a SQLite store file to WAL (readers never block the writer nor it them).

    The mode is kept in the file, so this runs once the database is known to be a store (never
    on another application's file) and not inside a transaction (SQLite refuses that): on the
    raw connection, whose driver-level transactions db.engine switched off.
    """
    if engine.dialect.name != "sqlite" or sqlite_path(engine.url) is None:
        return
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()
    finally:
        raw.close()


def _postgres_engine(url: sa.URL, *, read_only: bool = False) -> sa.Engine:
    connect_args: dict[str, Any] = {}
    if "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    for name, value in PG_KEEPALIVES.items():
        if name not in url.query:
            connect_args[name] = value
    if "tcp_user_timeout" not in url.query:
        connect_args["tcp_user_timeout"] = PG_KEEPALIVE_DEAD_S * 1000
    options = url.query.get("options", "")
    options = " ".join(options) if isinstance(options, tuple) else str(options)
    # libpq's `options` are the server's -c settings; the URL's own (a search_path) stay.
    settings = {
        "statement_timeout": PG_STATEMENT_TIMEOUT_S,
        "idle_in_transaction_session_timeout": PG_IDLE_IN_TRANSACTION_S,
    }
    added = [f"-c {name}={s * 1000}" for name, s in settings.items() if name not in options]
    if added:
        connect_args["options"] = " ".join([options, *added]).strip()
    # pre-ping: a worker that outlives a server restart reconnects instead of failing a step
    engine = sa.create_engine(url, connect_args=connect_args, pool_pre_ping=True)
    if read_only:
        # Every transaction of this engine is READ ONLY: the server refuses any write.
        return engine.execution_options(postgresql_readonly=True)
    return engine


def explain(error: Exception, url: str | sa.URL) -> Exception:
    """The one-line exception a user should see for a failure to open or use the store."""
    where = safe_url(url)
    if isinstance(error, ValueError | OSError):
        return error
    orig: BaseException = getattr(error, "orig", None) or error
    first = first_line(orig)
    if isinstance(error, sa.exc.DatabaseError) and "file is not a database" in first:
        return ValueError(f"{where} is not a SQLite database ({first})")
    if "attempt to write a readonly database" in first or "readonly database" in first:
        return PermissionError(f"the store {where} cannot be written: {first}")
    if isinstance(error, sa.exc.OperationalError | sa.exc.InterfaceError):
        return ConnectionError(f"cannot open the store {where}: {first}")
    if isinstance(error, sa.exc.SQLAlchemyError):
        return ConnectionError(f"the store {where} failed: {first}")
    return error


def is_refusal(error: BaseException) -> bool:
    """An error opening a store that waiting cannot cure (a wrong password, host or database
    name, a file that is not a database): said at once, never waited out."""
    orig = getattr(error, "orig", None) or error
    text = str(orig).lower()
    return any(phrase in text for phrase in _REFUSALS)


def get_engine(
    url: str | None = None, *, read_only: bool = False, outage_s: float = 0.0
) -> sa.Engine:
    """The engine of the store at `url` (see resolve_url), cached per URL in this process.

    On first use the schema is checked and, for a fresh database, created (see the module
    docstring for the rules). `read_only`: check only, create and change nothing.
    `outage_s`: how long a store that does not answer (refused or hung connection) is waited
    for before the open fails; 0 (the default, for commands a user is watching) fails at once.
    An error waiting cannot cure (is_refusal) is never waited out.
    """
    resolved = resolve_url(url)
    key = (resolved, read_only)
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is not None:
            return engine
        engine = create(resolved, read_only=read_only)
        where = safe_url(resolved)
        said = False

        def open_once() -> None:
            is_sqlite = engine.dialect.name == "sqlite"
            migrate.ensure_schema(engine, where, upgrade_older=is_sqlite, read_only=read_only)
            if not read_only:
                enable_wal(engine)
                copied = migrate.bind_identity(engine)
                if copied:
                    print(f"the store {where}: {copied}", file=sys.stderr, flush=True)

        def waiting(error: sa.exc.DBAPIError) -> bool:
            nonlocal said
            if is_refusal(error):
                return False
            if not said:
                said = True
                orig = getattr(error, "orig", None) or error
                # stderr, not a logger: the one process that waits may be a Ray actor, whose
                # stderr is what its driver shows.
                print(
                    f"the store {where} does not answer ({first_line(orig)}): waiting up to "
                    f"{outage_s:g} s for it ($DAPO_STORE_OUTAGE_S)",
                    file=sys.stderr,
                    flush=True,
                )
            return True

        try:
            retrying(open_once, outage_s=outage_s, on_outage=waiting)
        except Exception as error:
            engine.dispose()
            raise explain(error, resolved) from error
        _ENGINES[key] = engine
        return engine


def _forget_after_fork() -> None:
    """In a forked child (multiprocessing, some Ray and Prefect workers), the parent's pooled
    connections must not be used, nor closed under it: drop them and start afresh."""
    for engine in _ENGINES.values():
        engine.dispose(close=False)
    _ENGINES.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def dispose(url: str | None = None) -> None:
    """Close the pooled connections of one cached engine (or of all with url=None) and forget
    it; the next get_engine opens (and checks) the store again."""
    with _LOCK:
        wanted = None if url is None else resolve_url(url)
        for key in [k for k in _ENGINES if wanted is None or k[0] == wanted]:
            engine = _ENGINES.pop(key, None)
            if engine is not None:
                engine.dispose()
