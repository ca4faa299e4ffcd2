"""The initial schema: sweeps, runs, metrics, evaluations, samples.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-23

Types are spelled out here rather than imported from db.models, so that this revision keeps
meaning what it meant when later revisions change the models.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _stamp() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("preset", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("arms", _json(), nullable=False),
        sa.Column("seeds", _json(), nullable=False),
        sa.Column("ladder", _json(), nullable=False),
        sa.Column("base_config", _json(), nullable=False),
        sa.Column("params", _json(), nullable=True),
        sa.Column("flow_run_id", sa.String(length=64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", _stamp(), nullable=False),
        sa.Column("updated_at", _stamp(), nullable=False),
        sa.Column("finished_at", _stamp(), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'completed', 'failed', 'cancelled')",
            name=op.f("ck_sweeps_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("arm", sa.String(length=100), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("config", _json(), nullable=False),
        sa.Column("config_hash", sa.String(length=128), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("flow_run_id", sa.String(length=64), nullable=True),
        sa.Column("checkpoint_dir", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=True),
        sa.Column("grad_updates", sa.BigInteger(), nullable=True),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("wall_s", sa.Double(), nullable=True),
        sa.Column("started_at", _stamp(), nullable=False),
        sa.Column("updated_at", _stamp(), nullable=False),
        sa.Column("finished_at", _stamp(), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'completed', 'failed', 'cancelled')",
            name=op.f("ck_runs_status"),
        ),
        sa.CheckConstraint("attempt >= 1", name=op.f("ck_runs_attempt_positive")),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name=op.f("fk_runs_sweep_id_sweeps"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint(
            "sweep_id", "arm", "seed", "attempt", name=op.f("uq_runs_sweep_id_arm_seed_attempt")
        ),
    )
    op.create_table(
        "metrics",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_metrics_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", "name", name=op.f("pk_metrics")),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "evaluations",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("dataset", sa.String(length=200), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("avg_at_k", sa.Double(), nullable=True),
        sa.Column("pass_at_k", sa.Double(), nullable=True),
        sa.Column("cons_at_k", sa.Double(), nullable=True),
        sa.Column("n_problems", sa.Integer(), nullable=True),
        sa.Column("extra", _json(), nullable=True),
        sa.Column("created_at", _stamp(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_evaluations_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "dataset", "k", "step", name=op.f("pk_evaluations")),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "samples",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("ground_truth", sa.Text(), nullable=True),
        sa.Column("pred", sa.Text(), nullable=True),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("score", sa.Double(), nullable=True),
        sa.Column("overlong_penalty", sa.Double(), nullable=True),
        sa.Column("correct", sa.Boolean(), nullable=False),
        sa.Column("length", sa.Integer(), nullable=True),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("extra", _json(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_samples_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", "idx", name=op.f("pk_samples")),
    )


def downgrade() -> None:
    for table in ("samples", "evaluations", "metrics", "runs", "sweeps"):
        op.drop_table(table)
