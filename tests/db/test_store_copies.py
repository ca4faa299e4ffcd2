"""A copied store is a store of its own (issue: a copy kept the original's identity, so its
first sweep named the original's run directories, resumed the original's checkpoints and
recorded 0 metrics).

Real copies: a SQLite file copied with its bytes, and `CREATE DATABASE ... TEMPLATE` on the
real PostgreSQL server (databases of this test's own, dropped at the end). A store restored
from an older backup in place keeps its identity, and is caught by the other rule: a
checkpoint is resumed only by a store that holds its metrics.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from store_outage import log_step, new_run

from dapo_core.train.run_dir import NotOwner, check_resumable_dir, claim
from db import engine as db_engine
from db.sink import resumable_step
from db.store import Store
from flows import plan


def _run_directory(runs: Path, store: Store, sweep: int, run_id: int) -> tuple[Path, dict]:
    """The run directory the flows give a fresh attempt, claimed as they claim it."""
    owner = {"store": store.store_id, "sweep": sweep, "arm": "grpo", "seed": 0, "config_hash": "h"}
    run_dir = plan.fresh_run_dir(runs, store.store_id, sweep, "grpo", 0, "h", run_id)
    claim(run_dir, owner)
    (run_dir / "checkpoints").mkdir()
    return run_dir, owner


def test_a_copied_sqlite_file_is_a_store_of_its_own(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    original = tmp_path / "dapo.db"
    url = f"sqlite:///{original}"
    store, run_id = new_run(url)
    first_id = store.store_id
    run_dir, _ = _run_directory(tmp_path / "runs", store, 1, run_id)
    db_engine.dispose(url)  # closed: the file holds everything (no -wal left)
    copy = tmp_path / "copy" / "dapo.db"
    copy.parent.mkdir()
    shutil.copyfile(original, copy)

    copied = Store(f"sqlite:///{copy}")
    assert copied.store_id != first_id  # the copy drew an id of its own ...
    assert "is a copy of store" in capfd.readouterr().err  # ... and said so
    # ... so its runs name directories of their own, and the original's is not its to resume.
    assert plan.fresh_run_dir(tmp_path / "runs", copied.store_id, 1, "grpo", 0, "h", run_id) != (
        run_dir
    )
    mine = {"store": copied.store_id, "sweep": 1, "arm": "grpo", "seed": 0, "config_hash": "h"}
    with pytest.raises(NotOwner):
        check_resumable_dir(run_dir, mine, tmp_path / "runs")
    # The original keeps its id, however often either is opened again.
    db_engine.dispose()
    assert Store(url).store_id == first_id
    assert Store(f"sqlite:///{copy}").store_id == copied.store_id


def test_the_same_file_by_another_path_is_not_a_copy(tmp_path: Path) -> None:
    original = tmp_path / "dapo.db"
    first_id = Store(f"sqlite:///{original}").store_id
    link = tmp_path / "link.db"
    link.symlink_to(original)
    assert Store(f"sqlite:///{link}").store_id == first_id


@pytest.fixture
def pg_databases() -> Iterator[tuple[str, str]]:
    """(URL of a fresh database, URL for a copy of it), both dropped at the end."""
    from conftest import pg_server_url

    server = pg_server_url()
    base = server.rsplit("/", 1)[0]
    names = [f"dapo_copy_{uuid.uuid4().hex[:10]}_{n}" for n in ("src", "dst")]
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{names[0]}"'))
    try:
        yield f"{base}/{names[0]}", f"{base}/{names[1]}"
    finally:
        db_engine.dispose()
        with admin.connect() as conn:
            for name in names:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_a_postgres_database_copied_by_template_is_a_store_of_its_own(
    pg_databases: tuple[str, str], tmp_path: Path
) -> None:
    source, target = pg_databases
    store, run_id = new_run(source)
    first_id = store.store_id
    sink = store.sink(run_id)
    for step in (1, 2, 3):
        log_step(sink, step)
    sink.close()
    db_engine.dispose(source)  # TEMPLATE needs the source database idle
    from conftest import pg_server_url

    admin = sa.create_engine(pg_server_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            sa.text(
                f'CREATE DATABASE "{target.rsplit("/", 1)[1]}" '
                f'TEMPLATE "{source.rsplit("/", 1)[1]}"'
            )
        )
    admin.dispose()

    copied = Store(target)
    assert copied.store_id != first_id
    assert Store(source).store_id == first_id  # the original is bound where it was
    assert Store(target).store_id == copied.store_id  # and so is the copy, now


def test_a_checkpoint_whose_metrics_the_store_lacks_is_not_resumed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """An older backup restored in place keeps the store's identity (it is the same store,
    where it was): the rule that catches it is that a checkpoint is resumed only by a store
    that holds its curve."""
    path = tmp_path / "dapo.db"
    url = f"sqlite:///{path}"
    store, run_id = new_run(url)
    sink = store.sink(run_id)
    for step in (1, 2, 3):
        log_step(sink, step)
    sink.close()
    db_engine.dispose(url)
    backup = tmp_path / "backup.db"
    shutil.copyfile(path, backup)  # taken at step 3
    store = Store(url)
    sink = store.sink(run_id)
    for step in (4, 5, 6):
        log_step(sink, step)
    sink.close()
    assert resumable_step(store.engine, run_id, 6) == 6  # the checkpoint at 6: all there
    db_engine.dispose(url)
    shutil.copyfile(backup, path)  # restored in place: steps 4..6 are gone from the store
    store = Store(url)
    assert resumable_step(store.engine, run_id, 6) is None  # so its checkpoint is not resumed
    assert "holds the metrics of 3 of its 6 steps" in capfd.readouterr().err
    assert resumable_step(store.engine, run_id, 3) == 3
    assert resumable_step(store.engine, run_id, None) is None


def test_users_who_cannot_read_the_cluster_id_agree_on_where_the_store_is() -> None:
    """A superuser sees the cluster's system identifier, another user `?`: one store to both
    (else each would re-identify it in turn); another database or table OID is another place."""
    from db.migrate import same_place

    here = "postgresql:7312:16384:16500:dapo/public"
    assert same_place(here, "postgresql:?:16384:16500:dapo/public")
    assert same_place("postgresql:?:16384:16500:dapo/public", here)
    assert not same_place(here, "postgresql:9999:16384:16500:dapo/public")  # another cluster
    assert not same_place(here, "postgresql:7312:16390:16500:copy/public")  # TEMPLATE copy
    assert not same_place(here, "postgresql:?:16384:16622:dapo/public")  # restored dump
    assert not same_place("sqlite:/a/dapo.db", "sqlite:/b/dapo.db")
