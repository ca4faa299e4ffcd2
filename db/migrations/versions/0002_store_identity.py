"""The store's own id (a UUID drawn now), and runs' tries and superseded_by.

Revision ID: 0002_store_identity
Revises: 0001_initial
Create Date: 2026-11-23

Run directories are named by the store id, so two stores that share a runs directory never
share a run directory. The id is drawn here, once per store: a store created fresh and one
upgraded from 0001 both get their own.

Columns are added and dropped in place (ALTER TABLE), never by Alembic's batch mode, which on
SQLite rebuilds `runs`: dropping the old table would cascade-delete every metric.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0002_store_identity"
down_revision: str | None = "0001_initial"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    identity = op.create_table(
        "store_identity",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("store_id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_store_identity_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_store_identity")),
    )
    now = datetime.now(UTC)
    if op.get_bind().dialect.name == "sqlite":
        now = now.replace(tzinfo=None)  # SQLite keeps UTC wall time (see db.models.UTCDateTime)
    op.bulk_insert(identity, [{"id": 1, "store_id": str(uuid.uuid4()), "created_at": now}])
    op.add_column("runs", sa.Column("tries", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("superseded_by", sa.Integer(), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE DROP COLUMN (SQLite >= 3.35), not batch mode: see the docstring.
    op.drop_column("runs", "superseded_by")
    op.drop_column("runs", "tries")
    op.drop_table("store_identity")
