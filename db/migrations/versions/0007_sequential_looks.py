"""sequential_looks: the looks of adaptive sweeps (`dapo sweep --until-decided`).

Revision ID: 0007_sequential_looks
Revises: 0006_annotations
Create Date: 2026-11-28

A new table only (db.models.SequentialLook): nothing existing is altered, so SQLite needs no
batch mode.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007_sequential_looks"
down_revision: str | None = "0006_annotations"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "sequential_looks",
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("comparison", sa.String(length=201), nullable=False),
        sa.Column("look", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column(
            "seeds", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column("mean", sa.Double(), nullable=True),
        sa.Column("p", sa.Double(), nullable=True),
        sa.Column("nominal", sa.Double(), nullable=True),
        sa.Column("conditional_power", sa.Double(), nullable=True),
        sa.Column("decision", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "decision IN ('real', 'futile', 'continue', 'undecided')",
            name=op.f("ck_sequential_looks_decision"),
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"],
            ["sweeps.id"],
            name=op.f("fk_sequential_looks_sweep_id_sweeps"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("sweep_id", "comparison", "look", name=op.f("pk_sequential_looks")),
    )


def downgrade() -> None:
    op.drop_table("sequential_looks")
