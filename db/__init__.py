"""The experiment store of DAPO Lab: every number the platform shows lives here.

- `db.engine`: the store URL ($DAPO_DB_URL, else a SQLite file in the user's data directory) and
  one cached, migrated engine per URL.
- `db.store.Store`: the write side (sweeps, run attempts) and `SqlSink`, the trainer's metrics
  sink (one transaction per step, idempotent on (run, step, name)). Guarantee: a store outage
  of up to 5 minutes (db.transactions.OUTAGE_S; $DAPO_STORE_OUTAGE_S) loses no step and
  duplicates none; a longer one stops the run with one line naming the store, and the steps
  it held wait in the run directory's spill file for the next attempt (see db.sink).
- The read side, as DataFrames: `db.reads` (sweeps, runs and attempts, evaluations, curves,
  samples: the run pages), and the three tables built on it, `db.ablation` (the ablation table
  and the sweep list), `db.mechanism_table` (each arm's change in its own metrics) and
  `db.grids` (a grid's points).
- `db.summaries`: per-run metric summaries written when a run ends (migration 0005 backfills
  them), which the names and mechanism-table reads use instead of scanning ended runs' rows.
- `db.stats`: the table's statistics (t-intervals over seeds, paired differences, the leader);
  `db.table_format`: its one set of columns, for `dapo table`, the dashboard and Prefect.
- `db.cleanup`: what a sweep holds and its deletion in one transaction (`dapo sweep rm`).
- `db.cli`: `dapo db upgrade`, `dapo db current`, `dapo table`.

db/ is the only package that speaks SQL. It imports nothing from dapo_core (no torch): configs
arrive as plain JSON-able dicts and the sink matches the trainer's protocol structurally; the
metric names and small helpers it shares with the trainer come from dapo_common.
"""
