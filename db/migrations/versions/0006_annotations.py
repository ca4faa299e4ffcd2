"""annotations: tags and notes on sweeps and runs, and hidden (trial) sweeps.

Revision ID: 0006_annotations
Revises: 0005_run_summaries
Create Date: 2026-11-25

A new table only (db.models.Annotation): nothing existing is altered, so SQLite needs no batch
mode. Its key is two partial unique indexes (a sweep's rows, where run_id is NULL, and a run's),
which SQLite (>= 3.8) and PostgreSQL both build and both use for ON CONFLICT.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006_annotations"
down_revision: str | None = "0005_run_summaries"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "annotations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("tag", sa.String(length=64), nullable=False),
        sa.Column("body", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('tag', 'note', 'hidden')", name=op.f("ck_annotations_kind")),
        sa.CheckConstraint(
            "kind != 'hidden' OR run_id IS NULL", name=op.f("ck_annotations_hidden_sweeps_only")
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"],
            ["sweeps.id"],
            name=op.f("fk_annotations_sweep_id_sweeps"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_annotations_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_annotations")),
    )
    op.create_index(
        "uq_annotations_sweep_key",
        "annotations",
        ["sweep_id", "kind", "tag"],
        unique=True,
        sqlite_where=sa.text("run_id IS NULL"),
        postgresql_where=sa.text("run_id IS NULL"),
    )
    op.create_index(
        "uq_annotations_run_key",
        "annotations",
        ["run_id", "kind", "tag"],
        unique=True,
        sqlite_where=sa.text("run_id IS NOT NULL"),
        postgresql_where=sa.text("run_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_annotations_run_key", table_name="annotations")
    op.drop_index("uq_annotations_sweep_key", table_name="annotations")
    op.drop_table("annotations")
