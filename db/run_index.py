"""Every run of every sweep as one table: the dashboard's Runs page, W&B's runs table.

One row per attempt (`latest` marks the newest of each (sweep, arm, seed), the one a rerun
replaced the others with), with its sweep's name and preset, the tags on it and on its sweep,
its bookkeeping (status, steps, tokens, wall time) and its held-out score: avg@k of its last
evaluation and of its step-0 one (the starting model), on the (data set, k) it was evaluated
on most. Its config is read apart (`run_configs`, flattened to dotted keys: the columns a
researcher filters and groups by), and a metric's last value on demand (`final_values`).

What a load costs: the runs' rows, one grouped read of the evaluations' keys and a key lookup
per run for the two scores, the tags; never a metric row but the one asked for per run. Configs
never change once a run starts, so each is read once per process (`_CONFIGS`, checked against
the run's hash and start time, which a reused id would not share).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd
import sqlalchemy as sa

from dapo_common.util import flatten
from db.models import ANNOTATIONS, EVALUATIONS, RUNS, SWEEPS
from db.reads import RUN_COLUMNS, final_metrics, run_select, to_frame

RUN_INDEX_COLUMNS = [
    *RUN_COLUMNS,
    "sweep",  # the sweep's name
    "preset",  # the sweep's preset
    "hidden",  # the sweep is hidden (a trial: the dashboard lists it only when asked)
    "latest",  # the newest attempt of its (sweep, arm, seed)
    "tags",  # the run's own tags and its sweep's, sorted (a tuple)
    "eval_dataset",  # the (data set, k) it was evaluated on most
    "eval_k",
    "start",  # avg@k at step 0 (the starting model), a fraction; NaN without one
    "final",  # avg@k of its last evaluation after step 0, a fraction (running: its latest)
    "final_step",
    "evals",  # how many evaluations on (eval_dataset, eval_k)
]

# (store URL, run id) -> (config hash, start time, the flattened config)
_CONFIGS: dict[tuple[str, int], tuple[str, Any, dict[str, Any]]] = {}
_CONFIGS_MAX = 100_000


def run_index(engine: sa.Engine, run_ids: Sequence[int] | None = None) -> pd.DataFrame:
    """RUN_INDEX_COLUMNS, one row per run attempt of the store (or of `run_ids`), by run id."""
    r, s, a = RUNS.c, SWEEPS.c, ANNOTATIONS.c
    query = (
        run_select()
        .add_columns(s.name, s.preset)
        .join_from(RUNS, SWEEPS, r.sweep_id == s.id)
        .order_by(r.id)
    )
    tag_rows = sa.select(a.sweep_id, a.run_id, a.kind, a.tag).where(a.kind.in_(["tag", "hidden"]))
    ids = None if run_ids is None else [int(i) for i in run_ids]
    if ids is not None:
        query = query.where(r.id.in_(ids))
    with engine.connect() as conn:
        runs = to_frame(conn.execute(query).all(), [*RUN_COLUMNS, "sweep", "preset"])
        if ids is not None:
            mine = sa.select(r.sweep_id).where(r.id.in_(ids))
            tag_rows = tag_rows.where(
                sa.or_(a.run_id.in_(ids), sa.and_(a.run_id.is_(None), a.sweep_id.in_(mine)))
            )
        tags = conn.execute(tag_rows).all()
        scores = _scores(conn, ids)
        newest = _newest_attempts(conn, ids)
    if runs.empty:
        return pd.DataFrame(columns=RUN_INDEX_COLUMNS)
    key = list(zip(runs["sweep_id"], runs["arm"], runs["seed"], strict=True))
    runs["latest"] = [newest.get((int(w), str(a), int(s))) == int(n)
                      for (w, a, s), n in zip(key, runs["attempt"], strict=True)]  # fmt: skip
    sweep_tags: dict[int, set[str]] = {}
    run_tags: dict[int, set[str]] = {}
    hidden: set[int] = set()
    for sweep_id, run_id, kind, tag in tags:
        if kind == "hidden":
            hidden.add(int(sweep_id))
        elif run_id is None:
            sweep_tags.setdefault(int(sweep_id), set()).add(str(tag))
        else:
            run_tags.setdefault(int(run_id), set()).add(str(tag))
    runs["hidden"] = runs["sweep_id"].isin(hidden)
    runs["tags"] = [
        tuple(sorted(run_tags.get(int(i), set()) | sweep_tags.get(int(w), set())))
        for i, w in zip(runs["run_id"], runs["sweep_id"], strict=True)
    ]
    runs = runs.merge(scores, on="run_id", how="left")
    runs["evals"] = runs["evals"].fillna(0).astype(int)
    return runs[RUN_INDEX_COLUMNS].reset_index(drop=True)


def _newest_attempts(conn: sa.Connection, ids: list[int] | None) -> dict[tuple[int, str, int], int]:
    """(sweep, arm, seed) -> its newest attempt number (of the pairs of `ids`, or of all)."""
    r = RUNS.c
    query = sa.select(r.sweep_id, r.arm, r.seed, sa.func.max(r.attempt)).group_by(
        r.sweep_id, r.arm, r.seed
    )
    if ids is not None:
        pairs = sa.select(r.sweep_id, r.arm, r.seed).where(r.id.in_(ids)).subquery()
        query = query.join(
            pairs,
            sa.and_(r.sweep_id == pairs.c.sweep_id, r.arm == pairs.c.arm, r.seed == pairs.c.seed),
        )
    return {(int(w), str(a), int(s)): int(n) for w, a, s, n in conn.execute(query)}


def _scores(conn: sa.Connection, ids: list[int] | None = None) -> pd.DataFrame:
    """Per run (of `ids`, or every run): its most evaluated (data set, k), with avg@k at step
    0 and at its last step."""
    e = EVALUATIONS.c
    # Per (run, data set, k): how many evaluations and the last step, from the keys alone;
    # then the two rows each needs (step 0 and the last), looked up by their keys.
    grouped = sa.select(
        e.run_id,
        e.dataset,
        e.k,
        sa.func.count().label("n"),
        sa.func.max(e.step).label("last"),
    )
    if ids is not None:
        grouped = grouped.where(e.run_id.in_(ids))
    groups = grouped.group_by(e.run_id, e.dataset, e.k).subquery()
    g = groups.c
    query = sa.select(g.run_id, g.dataset, g.k, g.n, g.last, e.step, e.avg_at_k).join_from(
        groups,
        EVALUATIONS,
        sa.and_(
            e.run_id == g.run_id,
            e.dataset == g.dataset,
            e.k == g.k,
            sa.or_(e.step == g.last, e.step == 0),
        ),
    )
    rows = pd.DataFrame(
        conn.execute(query).all(),
        columns=["run_id", "eval_dataset", "eval_k", "evals", "final_step", "step", "value"],
    )
    columns = ["run_id", "eval_dataset", "eval_k", "start", "final", "final_step", "evals"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    rows["value"] = rows["value"].astype(float)
    pairs = rows.drop_duplicates(["run_id", "eval_dataset", "eval_k"])
    # one pair a run: the most evaluated, then by data set and k
    pairs = pairs.sort_values(["run_id", "evals", "eval_dataset", "eval_k"],
                              ascending=[True, False, True, True])  # fmt: skip
    pairs = pairs.drop_duplicates("run_id")[["run_id", "eval_dataset", "eval_k", "evals",
                                             "final_step"]]  # fmt: skip
    mine = rows.merge(pairs[["run_id", "eval_dataset", "eval_k"]], how="inner")
    start = mine[mine["step"] == 0].set_index("run_id")["value"]
    last = mine[mine["step"] == mine["final_step"]].set_index("run_id")["value"]
    out = pairs.assign(
        start=pairs["run_id"].map(start).astype(float),
        # a run evaluated only at step 0 (it failed, or is still on its first steps) has a
        # starting score and no score of its own yet
        final=pairs["run_id"].map(last).astype(float).where(pairs["final_step"] > 0),
    )
    return out[columns].reset_index(drop=True)


def run_configs(engine: sa.Engine, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """run id -> its config flattened to dotted keys ({"algo.clip_high": 0.28, ...}); a
    config is read from the store once per process (see _CONFIGS)."""
    ids = [int(i) for i in dict.fromkeys(run_ids)]
    if not ids:
        return {}
    store, r = str(engine.url), RUNS.c
    out: dict[int, dict[str, Any]] = {}
    with engine.connect() as conn:
        keys = conn.execute(sa.select(r.id, r.config_hash, r.started_at).where(r.id.in_(ids)))
        stale = []
        for run_id, config_hash, started in keys:
            cached = _CONFIGS.get((store, int(run_id)))
            if cached is not None and cached[:2] == (config_hash, started):
                out[int(run_id)] = cached[2]
            else:
                stale.append(int(run_id))
        for at in range(0, len(stale), 900):  # below SQLite's bound-parameter limit
            chunk = stale[at : at + 900]
            rows = conn.execute(
                sa.select(r.id, r.config_hash, r.started_at, r.config).where(r.id.in_(chunk))
            )
            for run_id, config_hash, started, config in rows:
                flat = flatten(config or {})
                out[int(run_id)] = flat
                if len(_CONFIGS) >= _CONFIGS_MAX:
                    _CONFIGS.clear()
                _CONFIGS[(store, int(run_id))] = (config_hash, started, flat)
    return {i: out[i] for i in ids if i in out}


def cell(value: Any) -> Any:
    """A config value as a table cell: numbers, text and booleans as they are, lists and
    mappings as JSON text, None as None."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def config_frame(
    configs: dict[int, dict[str, Any]], keys: Sequence[str] | None = None
) -> pd.DataFrame:
    """run_configs' result as a frame: run_id, then one column per dotted key (`keys`, else
    every key any run has), cells as `cell` writes them (a key a run lacks: None)."""
    every = keys if keys is not None else sorted({k for flat in configs.values() for k in flat})
    rows = [{"run_id": i, **{k: cell(flat.get(k)) for k in every}} for i, flat in configs.items()]
    return pd.DataFrame(rows, columns=["run_id", *every])


def varying_keys(frame: pd.DataFrame, *, leave_out: Sequence[str] = ()) -> list[str]:
    """The config columns of a config_frame whose value differs between its runs (a missing
    key counts as a value), sorted: what tells the runs apart."""
    out = []
    for key in frame.columns:
        if key == "run_id" or key in leave_out:
            continue
        if frame[key].map(lambda v: json.dumps(v, sort_keys=True, default=str)).nunique() > 1:
            out.append(str(key))
    return out


def final_values(engine: sa.Engine, run_ids: Sequence[int], name: str) -> pd.DataFrame:
    """(run_id, step, value): `name`'s value at its own last logged step, per run (db.reads
    final_metrics for one name: one key lookup a run, whatever its length)."""
    return final_metrics(engine, run_ids, names=[name])[["run_id", "step", "value"]]
