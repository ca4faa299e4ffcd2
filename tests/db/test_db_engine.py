"""Opening a store: URL resolution, the schema check on first use, one-line errors."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
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
    assert migrate.head_revision() == "0007_sequential_looks"
    project = tomllib.loads((root.parent / "pyproject.toml").read_text())
    assert "*.mako" in project["tool"]["setuptools"]["package-data"]["*"]


# --- another application's database (issue 14.8) ----------------------------------------------


def _foreign_sqlite(path: Path) -> bytes:
    """Another application's SQLite file, in rollback-journal mode: its bytes."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("CREATE TABLE tags (note INTEGER, tag TEXT)")
        conn.execute("INSERT INTO notes (body) VALUES ('buy milk')")
    conn.close()
    return path.read_bytes()


def test_another_applications_sqlite_file_is_left_alone(tmp_path: Path) -> None:
    """It used to get the store's tables added and its journal switched to WAL."""
    path = tmp_path / "notes.db"
    before = _foreign_sqlite(path)
    with pytest.raises(SchemaMismatch) as caught:
        Store(f"sqlite:///{path}")
    message = str(caught.value)
    assert message.startswith(f"sqlite:///{path} is not a DAPO Lab store: it holds 2 other")
    assert "(notes, tags)" in message and "dapo db upgrade" in message and "\n" not in message
    assert path.read_bytes() == before  # not a byte changed: no tables, no WAL
    assert not path.with_name("notes.db-wal").exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_another_applications_schema_on_postgres_is_left_alone(
    request: pytest.FixtureRequest,
) -> None:
    url = request.getfixturevalue("pg_schemas")()
    engine = db_engine.create(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE invoices (id integer primary key)"))
    with pytest.raises(SchemaMismatch, match=r"is not a DAPO Lab store: it holds 1 other table"):
        Store(url)
    with engine.connect() as conn:
        assert sa.inspect(conn).get_table_names() == ["invoices"]
    engine.dispose()


def test_an_explicit_upgrade_adds_the_store_to_a_foreign_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    _foreign_sqlite(path)
    engine = db_engine.create(f"sqlite:///{path}")
    migrate.upgrade(engine, "s", adopt=True)
    engine.dispose()
    store = Store(f"sqlite:///{path}")  # now a store (beside the notes)
    assert len(store.store_id) == 36
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT body FROM notes").fetchone() == ("buy milk",)
    conn.close()


def test_another_applications_alembic_history_is_not_called_newer(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('ae1027a6acf')")
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    conn.close()
    with pytest.raises(SchemaMismatch, match="is not a DAPO Lab store: it holds 1 other table"):
        db_engine.get_engine(f"sqlite:///{path}")


# --- a store in a read-only directory (issue 14.12) ---------------------------------------------


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[tuple[Path, Callable[[], None]]]:
    """A directory, and a function that makes it read-only for this process. As root,
    permissions do not bind, so it is a small tmpfs remounted read-only; otherwise chmod 555."""
    directory = tmp_path / "ro"
    directory.mkdir()
    mounted = False
    if os.geteuid() == 0:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(directory)], check=True
        )
        mounted = True

    def make_read_only() -> None:
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
        else:
            directory.chmod(0o555)

    try:
        yield directory, make_read_only
    finally:
        if mounted:
            subprocess.run(["umount", str(directory)], check=False)
        else:
            directory.chmod(0o755)


def test_a_store_in_a_read_only_directory_says_so_and_reads(
    read_only_dir: tuple[Path, Callable[[], None]],
) -> None:
    directory, make_read_only = read_only_dir
    url = f"sqlite:///{directory / 'dapo.db'}"
    store = Store(url)
    sweep_id = store.create_sweep(
        name="ro", preset="tiny", arms=["grpo"], seeds=[0], base_config={}, ladder=[{"arm": "grpo"}]
    )
    db_engine.dispose(url)  # the last connection closes: the WAL is folded into the file
    make_read_only()
    listing = sorted(p.name for p in directory.iterdir())
    assert listing == ["dapo.db"]

    with pytest.raises(PermissionError) as caught:
        Store(url)
    assert str(caught.value) == (
        f"the SQLite store {directory / 'dapo.db'} is in a read-only directory ({directory}): "
        "SQLite must write its journal beside it; move the store to a writable directory "
        "(`dapo table` can still read it where it is)"
    )
    engine = db_engine.get_engine(url, read_only=True)
    with engine.connect() as conn:
        names = conn.execute(sa.text("SELECT name FROM sweeps WHERE id = :i"), {"i": sweep_id})
        assert names.scalar() == "ro"
    assert sorted(p.name for p in directory.iterdir()) == listing  # nothing created
    db_engine.dispose(url)


def test_reading_read_only_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    with pytest.raises(FileNotFoundError, match=f"no store at {missing}"):
        db_engine.get_engine(f"sqlite:///{missing}", read_only=True)
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(SchemaMismatch, match="is empty"):
        db_engine.get_engine(f"sqlite:///{empty}", read_only=True)
    assert empty.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]
