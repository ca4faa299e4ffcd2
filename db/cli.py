"""`dapo db upgrade`, `dapo db current`, `dapo table`: the store's subcommands.

dapo_lab/cli.py's dispatcher calls `register(subparsers)`. Bad input (a malformed URL, a sweep
that does not exist, a server that does not answer) raises ValueError / ConnectionError /
FileNotFoundError with one line, which the dispatcher prints as `error: ...` (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dapo_common import text
from db import table_format

# sqlalchemy, alembic and pandas are imported by the commands themselves, so that `dapo --help`
# and the other layers' commands do not pay for them.

DEFAULT_WINDOW = 10  # rollout steps at each end of a run in the mechanism table
URL_HELP = "store URL (default: $DAPO_DB_URL, else the SQLite file in the user's data directory)"


def store_argument(parser: argparse.ArgumentParser) -> None:
    """`--store URL`, the one name every dapo command gives the store; `--url`, its old name,
    still works but is not shown."""
    parser.add_argument("--store", metavar="URL", dest="store", default=None, help=URL_HELP)
    parser.add_argument("--url", dest="store", default=None, help=argparse.SUPPRESS)


def register(subparsers: Any) -> None:
    """Add `db` (upgrade, current) and `table` to the `dapo` dispatcher."""
    db_parser = subparsers.add_parser(
        "db",
        help="the experiment store: migrate it, show its schema revision",
        description="Manage the experiment store: $DAPO_DB_URL when set, else a SQLite file in "
        "the user's data directory (`dapo db current` prints which).",
    )
    db_parser.set_defaults(func=_help_of(db_parser))
    actions = db_parser.add_subparsers(dest="db_command", metavar="ACTION")
    upgrade = actions.add_parser(
        "upgrade",
        help="migrate the store to this code's schema (creates a fresh one)",
        description="Run the store's migrations up to the newest revision this code knows. "
        "This is also the one way to add the store's tables to a database that holds other "
        "tables (every other command refuses such a database).",
    )
    store_argument(upgrade)
    upgrade.set_defaults(func=cmd_upgrade)
    current = actions.add_parser(
        "current",
        help="print the store's URL and schema revision",
        description="Print which store the commands use and its schema revision.",
    )
    store_argument(current)
    current.set_defaults(func=cmd_current)

    table = subparsers.add_parser(
        "table",
        help="print a sweep's ablation table",
        description="Print the ablation table of a sweep: per arm, in ladder order, the "
        "starting model's score, the final eval score (mean over seeds with a 95% t-interval) "
        "and the gain over the start, Δ to the parent arm and to the baseline paired by seed "
        "(* when the exact paired sign-flip test gives p < 0.05; one seed: no interval), each seed's score, the "
        "paper's number, steps, updates, tokens, time and status; then which arm leads, if "
        "one does significantly. The CSV format carries every interval.",
    )
    table.add_argument("--sweep", type=int, default=None, help="sweep id (default: the newest)")
    table.add_argument(
        "--format", choices=table_format.FORMATS, default="text", help="output format (text)"
    )
    store_argument(table)
    table.add_argument(
        "--dataset",
        default=None,
        help="evaluation data set to score by (default: the one most runs have; an unknown "
        "one is an error that names those there are)",
    )
    table.add_argument("--k", type=int, default=None, help="the evaluation's k (avg@k)")
    table.add_argument(
        "--mechanisms",
        action="store_true",
        help="instead, the mechanism table: per arm, the training metrics its change is about "
        "(truncation, truncated and long responses' loss shares, clip fractions, entropy, "
        "informative groups, generation batches), first against last --window rollout steps, "
        "with Δ to its parent",
    )
    table.add_argument(
        "--window",
        type=int,
        default=None,
        help=f"rollout steps averaged at each end of a run (--mechanisms; default "
        f"{DEFAULT_WINDOW}, or the runs' length when they are shorter; a longer one than the "
        "runs is an error)",
    )
    table.add_argument(
        "--all-metrics",
        action="store_true",
        help="with --mechanisms: every metric for every arm, not only those its change is about",
    )
    table.add_argument(
        "--efficiency",
        action="store_true",
        help="add sample efficiency: per arm, the mean held-out score over each run's "
        "evaluations (step 0 included: the area under the curve over its length) with its "
        "interval over seeds and Δ to the parent paired by seed, and the gradient updates and "
        "generated tokens until a run's first evaluation at or above --threshold (k/n seeds "
        "reached it); CSV: area_* and *_to_threshold* columns",
    )
    table.add_argument(
        "--threshold",
        type=float,
        default=None,
        metavar="PCT",
        help="the score for --efficiency's updates and tokens to threshold, in percent as the "
        "table shows scores (35 = 35%%; implies --efficiency); default: midway between the "
        "starting model's mean and the best arm's final mean",
    )
    table.add_argument(
        "--holm",
        action="store_true",
        help="say under the table how many Δ parent intervals it starred and which stars Holm's "
        "correction over all of them (family-wise 5%%) takes away; CSV: each Δ parent's p and "
        "Holm-adjusted p",
    )
    table.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="A:B",
        help="a comparison that matters beyond each arm's parent and the baseline (repeatable): "
        "its paired Δ, exact p, MDE and seeds needed join the comparisons under the table",
    )
    table.add_argument(
        "--effect",
        type=float,
        default=None,
        metavar="PP",
        help="an effect in percentage points to plan for (3 = 3 pp): the comparisons say how "
        "many paired seeds would detect it with 80%% power at 5%%",
    )
    table.add_argument(
        "--iqm",
        action="store_true",
        help="an IQM column beside the final score: the interquartile mean over seeds (from 5 "
        "seeds on; shown by default when an arm has them)",
    )
    table.add_argument(
        "--scoreboard",
        action="store_true",
        help="instead, the mechanism scoreboard: per DAPO mechanism, the task where the platform "
        "shows it acting, the metric it moves and its paired Δ, from the newest sweeps of the "
        "names it lists (docs/mechanisms.md), then the detail of the clip checks measured "
        "(Clip-Higher's dose-response, the entropy probe); with --sweep, that sweep's detail only",
    )
    table.add_argument(
        "--wide",
        action="store_true",
        help="text: every column, however wide (default: fit $COLUMNS, else the terminal, "
        "else 120 characters, hiding the least telling columns and saying which)",
    )
    table.set_defaults(func=cmd_table)


def _help_of(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def show(_args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return show


@contextmanager
def _explained(url: str) -> Iterator[None]:
    """Database errors as the one-line exceptions the dispatcher prints."""
    import sqlalchemy as sa

    from db import engine as db_engine

    try:
        yield
    except sa.exc.SQLAlchemyError as error:
        raise db_engine.explain(error, url) from error


def existing_store(url: str) -> None:
    """Read-only commands do not create a SQLite file: a missing one is a mistake to report."""
    from db import engine as db_engine

    parsed = db_engine.parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        return
    path = db_engine.sqlite_path(parsed)
    if path is not None and not path.exists():
        raise FileNotFoundError(
            f"no store at {path} (it is created by the first `dapo sweep`, or `dapo db upgrade`)"
        )


_existing = existing_store  # its earlier name (flows/export.py)


def read_only_store(store: str | None) -> tuple[Any, str]:
    """(engine, url) of an existing store, opened read-only: a table is a look, so it creates,
    migrates and switches nothing (and works on a store in a read-only directory)."""
    from db import engine as db_engine

    url = db_engine.resolve_url(store)
    existing_store(url)
    return db_engine.get_engine(url, read_only=True), url


def sweep_or_latest(engine: Any, url: str, sweep_id: int | None) -> int:
    """The sweep asked for, else the store's latest; a store without sweeps is one line."""
    from db import engine as db_engine
    from db import reads

    if sweep_id is not None:
        return sweep_id
    latest = reads.latest_sweep_id(engine)
    if latest is None:
        raise ValueError(
            f"the store {db_engine.safe_url(url)} has no sweeps yet: start one with `dapo sweep`"
        )
    return int(latest)


def cmd_upgrade(args: argparse.Namespace) -> int:
    from db import engine as db_engine
    from db import migrate

    url = db_engine.resolve_url(args.store)
    where = db_engine.safe_url(url)
    engine = db_engine.create(url)
    try:
        with _explained(url):
            # Asked for by name: a database of another application gets the store's tables.
            before, after = migrate.upgrade(engine, where, adopt=True)
            db_engine.enable_wal(engine)
    finally:
        engine.dispose()
    db_engine.dispose(url)  # a cached engine of this process would hold the old schema check
    if before == after:
        print(f"store {where} is at the newest schema revision {after}")
    else:
        print(f"store {where}: upgraded schema from {before or '(empty)'} to {after}")
    return 0


def cmd_current(args: argparse.Namespace) -> int:
    from db import engine as db_engine
    from db import migrate

    url = db_engine.resolve_url(args.store)
    where = db_engine.safe_url(url)
    print(f"store: {where}")
    parsed = db_engine.parse_url(url)
    path = db_engine.sqlite_path(parsed) if parsed.get_backend_name() == "sqlite" else None
    if path is not None and not path.exists():
        print("revision: none (the file does not exist yet; the first write creates it)")
        return 0
    engine = db_engine.create(url, read_only=True)  # looking changes nothing
    try:
        with _explained(url), engine.connect() as conn:
            state = migrate.schema_state(conn)
    finally:
        engine.dispose()
    if state.up_to_date:
        note = "up to date"
    elif state.newer:
        note = f"NEWER than this code's {state.head}: upgrade dapo-lab"
    elif state.foreign:
        note = f"not a DAPO Lab store: it holds {', '.join(state.others[:5]) or 'another schema'}"
    elif state.current is None:
        note = f"empty; `dapo db upgrade` (or first use) creates revision {state.head}"
    else:
        note = f"older than this code's {state.head}: run `dapo db upgrade`"
    print(f"revision: {state.current or 'none'} ({note})")
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from db import ablation, reads
    from db.mechanism_table import mechanism_table

    if args.threshold is not None and not 0.0 <= args.threshold <= 100.0:
        raise ValueError(f"--threshold {args.threshold:g}: a score in percent, 0 to 100")
    if args.effect is not None and not 0.0 < abs(args.effect) <= 100.0:
        raise ValueError(f"--effect {args.effect:g}: an effect in percentage points, 0 to 100")
    engine, url = read_only_store(args.store)
    if args.scoreboard:
        from db import scoreboard

        with _explained(url):
            sys.stdout.write(scoreboard.render_all(engine, args.format, sweep_id=args.sweep))
        return 0
    with _explained(url):
        sweep_id = sweep_or_latest(engine, url, args.sweep)
        if args.mechanisms:
            from db import mechanisms

            if args.window is not None and args.window < 1:
                raise ValueError(f"--window {args.window}: at least 1 rollout step")
            steps = reads.runs_of_sweep(engine, sweep_id)["steps"]
            window = mechanism_window(args.window, steps, sweep_id)
            frame = mechanism_table(engine, sweep_id, window=window)
            out = mechanisms.render(
                frame, args.format, focus_only=not args.all_metrics, wide=args.wide
            )
            sys.stdout.write(out)
            return 0
        table = ablation.ablation_table(engine, sweep_id, dataset=args.dataset, k=args.k)
        sweep = reads.sweep_details(engine, sweep_id)
        reached = None
        if args.efficiency or args.threshold is not None:
            from db import efficiency

            asked = None if args.threshold is None else args.threshold / 100.0
            reached = efficiency.reach(engine, sweep_id, table, asked)
    from db import decisions, report

    extra = report.extras(engine, sweep_id, table)
    planned = decisions.parse_pairs(args.compare, [str(a) for a in table["arm"]])
    extra["planned"] = [*extra.get("planned", []), *planned]
    out = table_format.render(
        table,
        args.format,
        sweep,
        wide=args.wide,
        effect=None if args.effect is None else args.effect / 100.0,
        iqm=True if args.iqm else None,
        **extra,
    )
    # Holm's note speaks of the table's stars: right under it, before the efficiency table.
    if args.holm:
        out = _with_holm(out, args.format, ablation.holm_stars(table), wide=args.wide)
    if args.efficiency or args.threshold is not None:
        out = _with_efficiency(out, args.format, table, reached, wide=args.wide)
    if args.format != "csv":  # which trackers the runs reached (run.loggers), one line each
        from db import tracker_status

        lines = tracker_status.of_sweep(engine, sweep_id)
        if lines:
            bullet = "- " if args.format == "markdown" else ""
            out = out.rstrip("\n") + "\n\n" + "\n".join(bullet + line for line in lines) + "\n"
    sys.stdout.write(out)
    return 0


def _with_efficiency(out: str, fmt: str, table: Any, reached: Any, *, wide: bool) -> str:
    """The rendered table with the sample-efficiency tables under it (text, Markdown): the
    area, then the updates and tokens to threshold (efficiency.reach; None: no evaluation to
    measure by); or in CSV each arm's area and its paired Δ parent (percent, 95% interval, n,
    significance) and its *_to_threshold columns (efficiency.csv_fields)."""
    from db import ablation, efficiency

    records = ablation.efficiency_records(table)
    if not records:
        return out
    parts = [(ablation.efficiency_caption(table), records, ["parent", "final"])]
    if reached is not None:
        drop = ["parent", "Δ parent (tokens)", "Δ parent (updates)"]
        parts.append((efficiency.reach_caption(reached), efficiency.reach_records(reached), drop))
    if fmt == "text":
        limit = None if wide else text.terminal_width()
        out = out.rstrip(chr(10))
        for caption, cells, drop in parts:
            shown, hidden = text.fit(cells, limit, drop=drop)
            notes = f"{text.hidden_note(hidden, limit)}\n" if hidden else ""
            body = table_format._aligned(shown, left={"arm", "parent"})
            out = f"{out}\n\n{text.wrapped(caption, limit)}\n\n{body}\n{notes}".rstrip(chr(10))
        return out + "\n"
    if fmt == "markdown":
        out = out.rstrip(chr(10))
        for caption, cells, _ in parts:
            body = table_format._markdown(cells, left={"arm", "parent"})
            out = f"{out}\n\n{body}\n\n*{table_format._escape(caption)}*"
        return out + "\n"
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(out)))
    if not rows:
        return out
    by_arm = {str(r["arm"]): r for r in table.to_dict("records")}
    extra = []
    for name in ("area", "area_delta_parent"):
        extra += [f"{name}_pct", f"{name}_low_pct", f"{name}_high_pct", f"{name}_n"]
    extra.append("area_delta_parent_significant")
    to_threshold = efficiency.csv_fields(reached) if reached is not None else {}
    extra += list(next(iter(to_threshold.values()), {}))

    def pct(value: float) -> Any:
        return "" if value != value else round(100.0 * float(value), 6)

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*rows[0], *extra], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        mine = by_arm[row["arm"]]
        for name in ("area", "area_delta_parent"):
            estimate = mine[name]
            row[f"{name}_pct"] = pct(estimate.mean)
            row[f"{name}_low_pct"], row[f"{name}_high_pct"] = pct(estimate.low), pct(estimate.high)
            row[f"{name}_n"] = estimate.n
        row["area_delta_parent_significant"] = int(mine["area_delta_parent"].significant)
        row.update({k: str(v) for k, v in to_threshold.get(row["arm"], {}).items()})
        writer.writerow(row)
    return buffer.getvalue()


def _with_holm(out: str, fmt: str, result: Any, *, wide: bool) -> str:
    """The rendered table with Holm's note under it (text, Markdown) or, in CSV, two more
    columns per arm: its Δ parent's Holm-adjusted p, and whether Holm keeps its star."""
    from db import ablation

    note = ablation.holm_note(result)
    if fmt == "text":
        limit = None if wide else text.terminal_width()
        return f"{out.rstrip(chr(10))}\n\n{text.wrapped(note, limit)}\n"
    if fmt == "markdown":
        return f"{out.rstrip(chr(10))}\n\n*{note}*\n"
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(out)))
    if not rows:
        return out
    buffer = io.StringIO()
    # delta_parent_p (the exact test's) is a column of every CSV already
    extra = ["delta_parent_holm_p", "delta_parent_holm_significant"]
    writer = csv.DictWriter(buffer, fieldnames=[*rows[0], *extra], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        arm = row["arm"]
        tested = arm in result.p
        row["delta_parent_holm_p"] = round(result.adjusted[arm], 9) if tested else ""
        row["delta_parent_holm_significant"] = int(arm in result.holm) if tested else ""
        writer.writerow(row)
    return buffer.getvalue()


def mechanism_window(asked: int | None, steps: Any, sweep_id: int) -> int:
    """The mechanism table's window (`dapo table --mechanisms`, the Prefect artifact). One
    asked for that is longer than every run of the sweep would average each whole run twice and call it "first" and "last": a mistake to say, not
    a table to print. The default is cut to the longest run instead, so short runs (a smoke
    test) still get a table. Runs that have not logged a step say nothing about length."""
    lengths = [int(s) for s in steps if s is not None and s == s and int(s) > 0]
    longest = max(lengths, default=None)
    if asked is None:
        return DEFAULT_WINDOW if longest is None else min(DEFAULT_WINDOW, longest)
    if longest is not None and asked > longest:
        raise ValueError(
            f"--window {asked}: the runs of sweep {sweep_id} are at most {longest} "
            f"rollout steps long; use --window {max(1, longest // 2)} or less"
        )
    return asked
