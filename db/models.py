"""The store's tables as SQLAlchemy 2.0 declarative models.

    sweeps        one ablation ladder: arms × seeds, base config, ladder (what each arm adds,
                  the paper's score), status, Prefect flow-run id
    runs          one attempt of one (sweep, arm, seed): config JSON and its hash, status,
                  counters (steps, gradient updates, tokens, wall time), host, checkpoint, error
    metrics       long format (run, step, name) -> value; NULL stands for NaN/inf
    evaluations   (run, dataset, k, step) -> avg@k, pass@k, cons@k, number of problems
    samples       a few rollouts per (run, step), with the reward split into its parts
    store_identity  one row: the store's own id, a UUID drawn when the store was created
    run_metric_summaries  (run, name) -> what a full scan of the run's metric rows gives
                  (rows, steps, min/max, the mean of the first and last SUMMARY_WINDOW steps),
                  written when the run ends (migration 0005 backfills older stores)
    annotations   tags and a note on a sweep or a run, and which sweeps are hidden

Rows are keyed by what they mean ((run, step, name) for a metric) rather than by a surrogate id, so a replayed step
upserts onto its earlier rows and can never duplicate them. The schema is created by the Alembic
migrations in db/migrations (a test checks that they match these models).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SWEEP_STATUSES = ("pending", "running", "completed", "failed", "cancelled")
# What a look of an adaptive sweep decided (db.sequential.DECISIONS).
LOOK_DECISIONS = ("real", "futile", "continue", "undecided")
RUN_STATUSES = ("running", "completed", "failed", "cancelled")
# The status an unfinished attempt gets when a newer attempt of its (arm, seed) takes over
# (resumes its checkpoint, or starts over): runs.superseded_by names the newer attempt.
SUPERSEDED = "cancelled"
TERMINAL_STATUSES = ("completed", "failed", "cancelled")
# Several attempts' statuses as one (an arm over its seeds, a sweep over its arms × seeds): the
# first of these present wins, so "completed" only when every one is (never attempted: pending).
STATUS_PRIORITY = ("running", "failed", "interrupted", "cancelled", "pending", "completed")
# What the read side shows for a run (and a sweep) stored as "running" whose row nobody has
# touched for RUN_LEASE_S: its driver died without a word (SIGKILL, a lost machine). It is
# never stored, so a driver that comes back (its heartbeat writes again) reads "running".
INTERRUPTED = "interrupted"
# A training driver touches its run row every flows.arm.WALL_EVERY_S (10 s, its wall time, on
# a clock of its own, not per step); ten minutes without it outlast any store outage the
# sinks wait out (OUTAGE_S) and any clock skew between machines worth having. It is also how
# long the driver's lease on its attempt (runs.lease_*, db.store.live_lease) outlives its last
# heartbeat before another process may take the arm over.
RUN_LEASE_S = 600.0


def fold_status(statuses: Sequence[str | None]) -> str:
    """One status for several (None: never attempted, counted as pending)."""
    present = {s or "pending" for s in statuses}
    return next((s for s in STATUS_PRIORITY if s in present), "pending")


# Deterministic constraint names, so that migrations can refer to (and drop) them on both backends.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# JSON documents: JSONB on PostgreSQL (indexable, compact), JSON text on SQLite.
JSONType = sa.JSON(none_as_null=True).with_variant(
    postgresql.JSONB(none_as_null=True), "postgresql"
)


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timestamp that is always read back as an aware UTC datetime.

    PostgreSQL keeps `timestamptz`; SQLite keeps the UTC wall time as text, which this type
    tags with UTC again on the way out, so both backends give the same values.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the store keeps aware UTC timestamps")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]
        return value.astimezone(UTC)  # type: ignore[no-any-return]


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    preset: Mapped[str] = mapped_column(sa.String(100))
    status: Mapped[str] = mapped_column(sa.String(16))
    arms: Mapped[list[str]] = mapped_column(JSONType)
    seeds: Mapped[list[int]] = mapped_column(JSONType)
    # [{"arm", "adds", "paper_score"}] in ladder order: the row order of the ablation table.
    ladder: Mapped[list[dict[str, Any]]] = mapped_column(JSONType)
    base_config: Mapped[dict[str, Any]] = mapped_column(JSONType)
    params: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    flow_run_id: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    error: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (sa.CheckConstraint(_in("status", SWEEP_STATUSES), name="status"),)


class Run(Base):
    """One attempt of one (sweep, arm, seed); a rerun is a new row with attempt + 1."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(sa.ForeignKey("sweeps.id", ondelete="CASCADE"))
    arm: Mapped[str] = mapped_column(sa.String(100))
    seed: Mapped[int] = mapped_column(sa.Integer)
    attempt: Mapped[int] = mapped_column(sa.Integer)
    status: Mapped[str] = mapped_column(sa.String(16))
    config: Mapped[dict[str, Any]] = mapped_column(JSONType)
    config_hash: Mapped[str] = mapped_column(sa.String(128))
    host: Mapped[str | None] = mapped_column(sa.String(255), nullable=True)
    flow_run_id: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    checkpoint_dir: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    error: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    steps: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    grad_updates: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    tokens: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    # Wall time of every try of this attempt added up (a try is one actor training it: a
    # replaced actor is a second try), and how many tries there were.
    wall_s: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    tries: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    # The newer attempt of the same (arm, seed) that took over from this unfinished one.
    superseded_by: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    # The lease (migration 0004): the process that claimed this attempt and trains it, and
    # since when; its heartbeat is `updated_at`. Cleared when the attempt ends (see
    # db.store.Store.resume_attempt); NULL on rows that never held one (before 0004).
    lease_host: Mapped[str | None] = mapped_column(sa.String(255), nullable=True)
    lease_pid: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    lease_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (
        # Also the index behind "latest (completed) attempt of (sweep, arm, seed)".
        sa.UniqueConstraint("sweep_id", "arm", "seed", "attempt"),
        sa.CheckConstraint(_in("status", RUN_STATUSES), name="status"),
        sa.CheckConstraint("attempt >= 1", name="attempt_positive"),
    )


class Metric(Base):
    """One scalar of one step. The key (run, step, name) keeps a step's rows together: a step's
    upsert touches one or two pages instead of one per metric, which is what makes a step one
    cheap transaction (bench/bench_store.py); a curve reads the run's range and filters names."""

    __tablename__ = "metrics"

    run_id: Mapped[int] = mapped_column(
        sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    value: Mapped[float | None] = mapped_column(sa.Double, nullable=True)

    # SQLite: the key is the table (one B-tree, not a rowid table plus a key index).
    __table_args__ = ({"sqlite_with_rowid": False},)


class Evaluation(Base):
    __tablename__ = "evaluations"

    run_id: Mapped[int] = mapped_column(
        sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    dataset: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    k: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    step: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    avg_at_k: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    pass_at_k: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    cons_at_k: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    n_problems: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    # Any further keys of the evaluation result (kept, never interpreted).
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = ({"sqlite_with_rowid": False},)


class Sample(Base):
    """One rollout kept for the rollout browser: reward = score + overlong_penalty (Eq. 13).
    Its columns after (run_id, step, idx) are the sample record's fields, in the order and of
    the types of dapo_common.samples.SAMPLE_FIELDS; any other key of a record is kept in
    `extra`."""

    __tablename__ = "samples"

    run_id: Mapped[int] = mapped_column(
        sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    idx: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    prompt: Mapped[str] = mapped_column(sa.Text)
    response: Mapped[str] = mapped_column(sa.Text)
    ground_truth: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    pred: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    reward: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    score: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    overlong_penalty: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    correct: Mapped[bool] = mapped_column(sa.Boolean)
    length: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    truncated: Mapped[bool] = mapped_column(sa.Boolean)
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)


# The keys of an evaluation result that have a column of their own in `evaluations` (besides
# run_id and step); any other key is kept in `extra`.
EVALUATION_FIELDS = ("dataset", "k", "avg_at_k", "pass_at_k", "cons_at_k", "n_problems")


class StoreIdentity(Base):
    """The store's own id, drawn once when the store is created (migration 0002). Run
    directories are named by it, so that two stores sharing one runs directory never share a
    run directory (sweep and run ids restart at 1 in every store)."""

    __tablename__ = "store_identity"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    store_id: Mapped[str] = mapped_column(sa.String(36))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Where the id was bound (migration 0003, db.migrate.bind_identity): a store found
    # elsewhere is a copy and draws an id of its own.
    location: Mapped[str | None] = mapped_column(sa.String(1000), nullable=True)

    __table_args__ = (sa.CheckConstraint("id = 1", name="one_row"),)


# The window (rollout steps at each end of a run) whose means a summary keeps: the mechanism
# table's default (db.cli.DEFAULT_WINDOW), so the default table reads summaries, not rows.
SUMMARY_WINDOW = 10


class RunMetricSummary(Base):
    """One metric of one ended run, pre-aggregated (db.summaries, migration 0005): what the read
    side would otherwise scan the run's metric rows for (the names a run logged, the mechanism
    table's window means). Written right after the run's terminal status (a summary is a
    cache: a run without one is read from its rows), and rewritten by every later terminal
    status write. `run_first_step`/`run_last_step` are the run's own bounds (over every name),
    the windows' ends, as db.mechanism_table defines them."""

    __tablename__ = "run_metric_summaries"

    run_id: Mapped[int] = mapped_column(
        sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    n_rows: Mapped[int] = mapped_column(sa.Integer)
    n_values: Mapped[int] = mapped_column(sa.Integer)  # rows with a finite value (not NULL)
    min_step: Mapped[int] = mapped_column(sa.Integer)  # this metric's own first and last step
    max_step: Mapped[int] = mapped_column(sa.Integer)
    min_value: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    max_value: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    run_first_step: Mapped[int] = mapped_column(sa.Integer)  # the run's bounds (every name)
    run_last_step: Mapped[int] = mapped_column(sa.Integer)
    window: Mapped[int] = mapped_column(sa.Integer)
    head_mean: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    tail_mean: Mapped[float | None] = mapped_column(sa.Double, nullable=True)

    __table_args__ = ({"sqlite_with_rowid": False},)


ANNOTATION_KINDS = ("tag", "note", "hidden")


class Annotation(Base):
    """What a researcher says about a sweep or a run (migration 0006, db.annotations): its tags
    (one row each), its note (one row, edited in place) and, for a sweep, that it is hidden
    (a trial sweep the dashboard leaves out unless asked). `run_id` NULL: the sweep itself.

    Keyed by what it means, as every table here: one (target, kind, tag) row, so that tagging
    twice is one tag. The target is the sweep or the run, so the key is two partial unique
    indexes (a NULL run_id would make one plain unique key never conflict). Both ids are
    foreign keys that cascade: deleting a sweep (`dapo sweep rm`) takes its annotations."""

    __tablename__ = "annotations"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(sa.ForeignKey("sweeps.id", ondelete="CASCADE"))
    run_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=True
    )
    kind: Mapped[str] = mapped_column(sa.String(8))
    tag: Mapped[str] = mapped_column(sa.String(64))  # the tag of a "tag" row, else ""
    body: Mapped[str | None] = mapped_column(sa.Text, nullable=True)  # a note's text
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        sa.CheckConstraint(_in("kind", ANNOTATION_KINDS), name="kind"),
        sa.CheckConstraint("kind != 'hidden' OR run_id IS NULL", name="hidden_sweeps_only"),
        sa.Index(
            "uq_annotations_sweep_key",
            "sweep_id",
            "kind",
            "tag",
            unique=True,
            sqlite_where=sa.text("run_id IS NULL"),
            postgresql_where=sa.text("run_id IS NULL"),
        ),
        sa.Index(
            "uq_annotations_run_key",
            "run_id",
            "kind",
            "tag",
            unique=True,
            sqlite_where=sa.text("run_id IS NOT NULL"),
            postgresql_where=sa.text("run_id IS NOT NULL"),
        ),
    )


class SequentialLook(Base):
    """One look of an adaptive sweep (`dapo sweep --until-decided`, db.sequential) at one of its
    planned comparisons: the paired seeds it saw, their mean difference, the exact test's p
    against the look's nominal level, the conditional power and what was decided (migration
    0007). Keyed by (sweep, comparison, look): a look is taken once, so that a resumed or
    rerun sweep never tests the same look again with other data (its α is spent)."""

    __tablename__ = "sequential_looks"

    sweep_id: Mapped[int] = mapped_column(
        sa.ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True
    )
    comparison: Mapped[str] = mapped_column(sa.String(201), primary_key=True)  # "A:B", A − B
    look: Mapped[int] = mapped_column(sa.Integer, primary_key=True)  # 0-based, the design's
    n: Mapped[int] = mapped_column(sa.Integer)
    seeds: Mapped[list[int]] = mapped_column(JSONType)
    mean: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    p: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    nominal: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    conditional_power: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    decision: Mapped[str] = mapped_column(sa.String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (sa.CheckConstraint(_in("decision", LOOK_DECISIONS), name="decision"),)


TABLES = (
    "sweeps",
    "runs",
    "metrics",
    "evaluations",
    "samples",
    "store_identity",
    "run_metric_summaries",
    "annotations",
    "sequential_looks",
)

# The tables themselves, typed as Table for Core statements (`Model.__table__` is typed loosely).
SWEEPS = cast(sa.Table, Sweep.__table__)
RUNS = cast(sa.Table, Run.__table__)
METRICS = cast(sa.Table, Metric.__table__)
EVALUATIONS = cast(sa.Table, Evaluation.__table__)
SAMPLES = cast(sa.Table, Sample.__table__)
STORE_IDENTITY = cast(sa.Table, StoreIdentity.__table__)
RUN_METRIC_SUMMARIES = cast(sa.Table, RunMetricSummary.__table__)
ANNOTATIONS = cast(sa.Table, Annotation.__table__)
SEQUENTIAL_LOOKS = cast(sa.Table, SequentialLook.__table__)
