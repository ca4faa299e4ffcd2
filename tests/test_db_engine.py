"""Opening a store: URL resolution, the schema check on first use, one-line errors."""

from __future__ import annotations

import socket
import sqlite3
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from db import engine as db_engine
from db import migrate
from db.errors import SchemaMismatch
from db.store import Store


def test_url_comes_from_the_argument_then_the_environment_then_the_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DAPO_DB_URL", "sqlite:///from-env.db")
    assert db_engine.resolve_url("sqlite:///given.db") == "sqlite:///given.db"
    assert db_engine.resolve_url() == "sqlite:///from-env.db"
    monkeypatch.delenv("DAPO_DB_URL")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    expected = tmp_path / "xdg" / "dapo-lab" / "dapo.db"
    assert db_engine.resolve_url() == f"sqlite:///{expected}"
    assert expected.parent.is_dir()  # the data directory is created
    monkeypatch.setenv("DAPO_DB_URL", "  ")  # blank counts as unset
    assert db_engine.resolve_url() == f"sqlite:///{expected}"


def test_a_bare_postgresql_url_gets_the_psycopg3_driver() -> None:
    assert db_engine.resolve_url("postgresql://u@h:5432/d") == "postgresql+psycopg://u@h:5432/d"
    assert db_engine.resolve_url("postgres://u@h/d") == "postgresql+psycopg://u@h/d"


def test_passwords_are_masked_in_messages() -> None:
    assert "secret" not in db_engine.safe_url("postgresql+psycopg://u:secret@h/d")
    assert "secret" not in db_engine.safe_url("postgresql+psycopg://u:secret@h:port/d")


@pytest.mark.parametrize(
    ("url", "kind", "message"),
    [
        ("not a url", ValueError, "malformed store URL"),
        ("postgresql+psycopg://u:secret@h:notaport/d", ValueError, "malformed store URL"),
        ("nosuchdialect://x", ValueError, "unsupported store URL nosuchdialect://x"),
        ("mysql://u@h/d", ValueError, "unsupported store URL"),
        ("postgresql+psycopg2://u@h/d", ValueError, "unsupported store URL"),
        ("postgresql+psycopg://u@h:5432", ValueError, "names no database"),
        ("sqlite:////no/such/dir/dapo.db", FileNotFoundError, "no directory /no/such/dir"),
    ],
)
def test_unusable_urls_are_one_clear_line(url: str, kind: type[Exception], message: str) -> None:
    with pytest.raises(kind, match=message) as caught:
        db_engine.get_engine(url)
    assert "\n" not in str(caught.value) and "secret" not in str(caught.value)


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 100)
    with pytest.raises(ValueError, match="is not a SQLite database"):
        db_engine.get_engine(f"sqlite:///{path}")


def test_an_unreachable_server_is_a_connection_error_in_one_line() -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=f"cannot open the store .*:{port}/") as caught:
        db_engine.get_engine(f"postgresql+psycopg://u:secret@127.0.0.1:{port}/test")
    assert time.monotonic() - start < db_engine.PG_CONNECT_TIMEOUT_S
    assert "\n" not in str(caught.value) and "secret" not in str(caught.value)


def test_a_missing_postgres_database_is_a_connection_error() -> None:
    from conftest import pg_server_url

    url = pg_server_url().rsplit("/", 1)[0] + "/no_such_database_dapo"
    with pytest.raises(ConnectionError, match="no_such_database_dapo"):
        db_engine.get_engine(url)


def _stamp(url: str, revision: str) -> None:
    engine = db_engine.create(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": revision})
    engine.dispose()


def test_a_store_at_a_newer_revision_is_refused(store_url: str) -> None:
    Store(store_url)
    db_engine.dispose(store_url)
    _stamp(store_url, "9999_from_the_future")
    with pytest.raises(SchemaMismatch, match="'9999_from_the_future', newer than this dapo-lab"):
        db_engine.get_engine(store_url)
    engine = db_engine.create(store_url)
    with pytest.raises(SchemaMismatch, match="newer"):
        migrate.upgrade(engine, "store")
    engine.dispose()


def test_tables_without_a_revision_are_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, what TEXT)")
    with pytest.raises(SchemaMismatch, match="not made by dapo-lab"):
        db_engine.get_engine(f"sqlite:///{path}")


def test_an_older_sqlite_file_is_upgraded_and_an_empty_postgres_schema_created(
    store_url: str,
) -> None:
    """A store Alembic knows at no revision (the state before 0001) is created on first use;
    running the upgrade twice is harmless."""
    engine = db_engine.create(store_url)
    assert migrate.upgrade(engine, "s") == (None, migrate.head_revision())
    assert migrate.upgrade(engine, "s") == (migrate.head_revision(), migrate.head_revision())
    engine.dispose()
    Store(store_url)  # opens without complaint


def test_concurrent_first_use_migrates_once(store_url: str) -> None:
    """Four threads open the same fresh store at once (each with its own engine, as separate
    processes would): the migration lock makes exactly one of them create the tables."""
    import threading

    engines = [db_engine.create(store_url) for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_it(engine: sa.Engine) -> None:
        try:
            barrier.wait()
            migrate.ensure_schema(engine, "s", upgrade_older=True)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=open_it, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    with engines[0].connect() as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
    for e in engines:
        e.dispose()


def test_the_migrations_ship_inside_the_package() -> None:
    """No alembic.ini in the working directory is needed, and package data covers the files."""
    import tomllib

    root = Path(migrate.__file__).parent
    assert (root / "migrations" / "env.py").is_file()
    assert (root / "migrations" / "__init__.py").is_file()
    assert (root / "migrations" / "versions" / "__init__.py").is_file()  # found as a package
    assert migrate.head_revision() == "0001_initial"
    project = tomllib.loads((root.parent / "pyproject.toml").read_text())
    assert "*.mako" in project["tool"]["setuptools"]["package-data"]["*"]
