"""The store's identity bound to where it lives: store_identity.location.

Revision ID: 0003_store_location
Revises: 0002_store_identity
Create Date: 2026-11-25

A copy of a store (a copied SQLite file, a restored backup in another database, pg_dump,
CREATE DATABASE ... TEMPLATE) used to keep the original's store id, and so named the same run
directories as the original: its first sweep resumed the original's checkpoints and recorded
none of their metrics. The id is now bound to the store's location (db.migrate.store_location);
a store opened somewhere else than where its id was bound is a copy and draws an id of its own
(db.migrate.bind_identity). Existing stores are bound on their next open. Added in place (ALTER
TABLE), never by batch mode (see 0002).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003_store_location"
down_revision: str | None = "0002_store_identity"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("store_identity", sa.Column("location", sa.String(length=1000), nullable=True))


def downgrade() -> None:
    op.drop_column("store_identity", "location")
