"""runs' lease: which process holds an attempt (host, pid, since when).

Revision ID: 0004_run_lease
Revises: 0003_store_location
Create Date: 2026-11-25

An attempt of (sweep, arm, seed) is trained by the one process that claimed it (db.store
Store.resume_attempt); its heartbeat is the row's `updated_at`, written every 10 s while it
trains. A second command for the same arm reads the lease and says who holds it instead of
training the same run directory. Added in place (ALTER TABLE), never by batch mode, which on
SQLite rebuilds `runs` (see 0002).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004_run_lease"
down_revision: str | None = "0003_store_location"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("lease_host", sa.String(length=255), nullable=True))
    op.add_column("runs", sa.Column("lease_pid", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("lease_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE DROP COLUMN (SQLite >= 3.35), not batch mode: see the docstring.
    op.drop_column("runs", "lease_at")
    op.drop_column("runs", "lease_pid")
    op.drop_column("runs", "lease_host")
