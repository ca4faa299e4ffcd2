"""Alembic environment: migrate the connection db.migrate hands over (inside its transaction).

Run by db.migrate with `config.attributes["connection"]` set; the caller holds the write lock
(SQLite: BEGIN IMMEDIATE; PostgreSQL: an advisory lock), so concurrent first uses of a fresh
store migrate it exactly once. Without a connection (the `alembic` command line pointed at
this directory with `-x url=...`), it opens the URL itself.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from db.models import Base

config = context.config
connection = config.attributes.get("connection")


def run(conn: sa.Connection) -> None:
    context.configure(
        connection=conn,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things in place: batch mode copies the table instead.
        render_as_batch=conn.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; use `dapo db upgrade`")
if connection is not None:
    run(connection)
else:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit(
            "give the store URL: alembic -x url=sqlite:///path/to/dapo.db upgrade head"
        )
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        run(conn)
        conn.commit()
