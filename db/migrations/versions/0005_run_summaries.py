"""run_metric_summaries: per (run, metric) aggregates, backfilled for every ended run.

Revision ID: 0005_run_summaries
Revises: 0004_run_lease
Create Date: 2026-11-25

The read side scanned every metric row of a sweep's runs on each page load (the names they
logged, the mechanism table's window means); db.summaries keeps those aggregates per run once
it has ended. This revision creates the table and fills it for the runs an older store already
holds whose stored status is terminal (one GROUP BY over `metrics`, the same SELECT the writer
runs at a run's end); running runs get theirs when they end, and are read from their rows
until then. A new table, so nothing else is rebuilt.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from db.summaries import SUMMARY_COLUMNS, summary_select

revision: str = "0005_run_summaries"
down_revision: str | None = "0004_run_lease"
branch_labels: str | None = None
depends_on: str | None = None

# The window of the stored means, frozen here: a later change of db.models.SUMMARY_WINDOW comes
# with a revision of its own that rewrites the summaries.
WINDOW = 10
TERMINAL = ("completed", "failed", "cancelled")


def upgrade() -> None:
    summaries = op.create_table(
        "run_metric_summaries",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("n_rows", sa.Integer(), nullable=False),
        sa.Column("n_values", sa.Integer(), nullable=False),
        sa.Column("min_step", sa.Integer(), nullable=False),
        sa.Column("max_step", sa.Integer(), nullable=False),
        sa.Column("min_value", sa.Double(), nullable=True),
        sa.Column("max_value", sa.Double(), nullable=True),
        sa.Column("run_first_step", sa.Integer(), nullable=False),
        sa.Column("run_last_step", sa.Integer(), nullable=False),
        sa.Column("window", sa.Integer(), nullable=False),
        sa.Column("head_mean", sa.Double(), nullable=True),
        sa.Column("tail_mean", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_run_metric_summaries_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "name", name=op.f("pk_run_metric_summaries")),
        sqlite_with_rowid=False,
    )
    # The backfill, on table objects of this revision's own (not the models of whatever code
    # runs it later).
    metrics = sa.table(
        "metrics",
        sa.column("run_id", sa.Integer),
        sa.column("step", sa.Integer),
        sa.column("name", sa.String),
        sa.column("value", sa.Double),
    )
    runs = sa.table("runs", sa.column("id", sa.Integer), sa.column("status", sa.String))
    ended = sa.select(runs.c.id).where(runs.c.status.in_(TERMINAL))
    query = summary_select(metrics, None, WINDOW).where(metrics.c.run_id.in_(ended))
    op.get_bind().execute(sa.insert(summaries).from_select(list(SUMMARY_COLUMNS), query))


def downgrade() -> None:
    op.drop_table("run_metric_summaries")
