"""Results tables in the docs, regenerated from the sweeps that made them, never retyped.

    .venv/bin/python scripts/docs_tables.py --store URL [--only NAME ...] [--check]
    .venv/bin/python scripts/docs_tables.py --run [--only NAME ...] [--work DIR]
    .venv/bin/python scripts/docs_tables.py --list

Each table in scripts/docs_tables.toml lives in a page (README.md or docs/*.md) between two
lines, `<!-- table:NAME -->` and `<!-- /table:NAME -->`. The script replaces what lies between
them with `dapo table --format markdown` (and the entry's own flags, e.g. `--mechanisms`) of the
entry's sweep: the newest sweep in the store whose name is the `--name` its sweep command gives.
Nothing outside the markers changes.

--store URL: the sweeps are already in that store (run the commands `--list` prints, or a store
you have). --run: run each distinct sweep command of the chosen tables first, into --store when
given, else into a fresh SQLite store under --work (a new temporary directory by default, kept and
printed), so the tables are what those commands produce today. --check: write nothing; exit 1
when a page would change. Bad input (a missing marker, an unknown sweep name, a malformed
entry) is one line and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = Path(__file__).with_suffix(".toml")
# Flags the script itself gives `dapo table`; an entry naming one would fight it.
OWN_FLAGS = ("--format", "--sweep", "--store")
_NAME = r"[A-Za-z0-9_.-]+"


@dataclass(frozen=True)
class Table:
    """One generated table: its marker name, the page holding it, the `dapo sweep` command that
    makes its sweep, and the flags `dapo table` gets beyond `--format markdown`."""

    name: str
    page: str
    sweep: str
    flags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def sweep_name(self) -> str:
        return sweep_name(self.sweep)


def sweep_name(command: str) -> str:
    """The `--name` a `dapo sweep` command line gives its sweep; ValueError when it gives none
    (without a name the sweep cannot be found again in a store of many)."""
    words = shlex.split(command)
    if words[:2] != ["dapo", "sweep"]:
        raise ValueError(f"not a `dapo sweep` command: {command!r}")
    for i, word in enumerate(words):
        if word == "--name" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--name="):
            return word.split("=", 1)[1]
    raise ValueError(f"the sweep command gives no --name to find its sweep by: {command!r}")


def sweep_argv(command: str, dapo: str, store_url: str) -> list[str]:
    """The argv that runs `command` (`dapo sweep ...`) with the `dapo` at hand, into `store_url`."""
    sweep_name(command)  # validates it
    return [dapo, *shlex.split(command)[1:], "--store", store_url]


def load_config(path: Path) -> list[Table]:
    """The tables of a TOML file of `[[table]]` entries (name, page, sweep, flags)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    tables: list[Table] = []
    for i, entry in enumerate(data.get("table", [])):
        where = f"{path.name}: table {i + 1}"
        missing = [k for k in ("name", "page", "sweep") if not isinstance(entry.get(k), str)]
        if missing:
            raise ValueError(f"{where}: needs {', '.join(missing)} (strings)")
        flags = entry.get("flags", [])
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise ValueError(f"{where} ({entry['name']}): flags must be a list of strings")
        if clash := [f for f in flags if f.split("=")[0] in OWN_FLAGS]:
            raise ValueError(f"{where} ({entry['name']}): the script sets {', '.join(clash)}")
        if not re.fullmatch(_NAME, entry["name"]):
            raise ValueError(f"{where}: a name is letters, digits, _ . -: {entry['name']!r}")
        table = Table(entry["name"], entry["page"], entry["sweep"], tuple(flags))
        table.sweep_name  # noqa: B018 (validates the command: one line if it is wrong)
        tables.append(table)
    names = [t.name for t in tables]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"{path.name}: tables named twice: {', '.join(dupes)}")
    return tables


def _marker(name: str, closing: bool) -> re.Pattern[str]:
    return re.compile(rf"^<!-- {'/' if closing else ''}table:({name}) -->[ \t]*$", re.MULTILINE)


def marker_names(text: str) -> list[str]:
    """The names of the tables a page marks (opening markers, in order)."""
    return [m.group(1) for m in _marker(_NAME, closing=False).finditer(text)]


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the lines between `<!-- table:name -->` and `<!-- /table:name -->` (each alone
    on its line) replaced by `body`; ValueError unless each marker is there exactly once, in
    that order."""
    opens = list(_marker(re.escape(name), closing=False).finditer(text))
    closes = list(_marker(re.escape(name), closing=True).finditer(text))
    if len(opens) != 1 or len(closes) != 1:
        raise ValueError(
            f"table {name!r}: expected one `<!-- table:{name} -->` line and one "
            f"`<!-- /table:{name} -->` line, found {len(opens)} and {len(closes)}"
        )
    start, end = opens[0].end(), closes[0].start()
    if end < start:
        raise ValueError(f"table {name!r}: its closing marker comes before its opening one")
    inner = text[start:end]
    if marker_names(inner):
        raise ValueError(f"table {name!r}: another table's marker lies inside it")
    return f"{text[:start]}\n{body.strip()}\n{text[end:]}"


def find_sweep(store_url: str, name: str) -> int:
    """The id of the newest sweep named `name` in the store; ValueError naming those there are."""
    from db import engine as db_engine
    from db.ablation import sweep_choices

    sweeps = sweep_choices(db_engine.get_engine(store_url, read_only=True))
    named = sweeps[sweeps["name"] == name]
    if named.empty:
        there = ", ".join(sorted({str(n) for n in sweeps["name"]})) or "none"
        raise ValueError(f"no sweep named {name!r} in the store (its sweeps: {there})")
    return int(named["sweep_id"].max())


def render(store_url: str, sweep_id: int, flags: Iterable[str]) -> str:
    """What `dapo table --format markdown` prints for the sweep (run in this process: the same
    function the command runs); RuntimeError with the command's error line when it fails."""
    from dapo_lab.cli import main as dapo

    argv = ["table", "--store", store_url, "--sweep", str(sweep_id), "--format", "markdown"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = dapo([*argv, *flags])
        except SystemExit as exit_:  # argparse's own errors
            code = int(exit_.code or 0)
    if code != 0:
        raise RuntimeError(f"`dapo {shlex.join([*argv, *flags])}`: {err.getvalue().strip()}")
    return out.getvalue()


def dapo_executable() -> str:
    """The `dapo` console script beside this interpreter (the project's venv), else on PATH."""
    beside = Path(sys.executable).with_name("dapo")
    found = str(beside) if beside.exists() else shutil.which("dapo")
    if not found:
        raise RuntimeError("no `dapo` command: install the project (make install)")
    return found


def run_sweeps(tables: Sequence[Table], store_url: str, env: dict[str, str]) -> None:
    """Run each distinct sweep command of `tables` once, in order, into `store_url`."""
    dapo = dapo_executable()
    for command in dict.fromkeys(t.sweep for t in tables):
        argv = sweep_argv(command, dapo, store_url)
        print(f"$ {shlex.join(argv)}", flush=True)
        done = subprocess.run(argv, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"`{command}` ended with exit code {done.returncode}")


def regenerate(tables: Sequence[Table], store_url: str, root: Path, *, check: bool) -> list[Path]:
    """Rewrite each table's block from the store; returns the pages whose text changed (with
    `check`, the pages that would change; nothing is written)."""
    by_page: dict[str, list[Table]] = {}
    for table in tables:
        by_page.setdefault(table.page, []).append(table)
    changed = []
    for page, entries in by_page.items():
        path = root / page
        if not path.is_file():
            raise ValueError(f"no page {page} (table {entries[0].name})")
        before = path.read_text(encoding="utf-8")
        text = before
        for table in entries:
            body = render(store_url, find_sweep(store_url, table.sweep_name), table.flags)
            text = replace_block(text, table.name, body)
        if text != before:
            changed.append(path)
            if not check:
                path.write_text(text, encoding="utf-8")
        names = ", ".join(t.name for t in entries)
        state = "would change" if check and text != before else "unchanged"
        print(f"{'wrote' if text != before and not check else state}: {page} ({names})")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--store", help="the store holding the tables' sweeps")
    parser.add_argument(
        "--run", action="store_true", help="run each table's sweep command first (long)"
    )
    parser.add_argument("--work", type=Path, help="with --run and no --store: where to run")
    parser.add_argument("--only", action="append", metavar="NAME", help="only this table")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on a change")
    parser.add_argument("--list", action="store_true", help="print each table and its sweep")
    parser.add_argument("--config", type=Path, default=CONFIG, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        tables = load_config(args.config)
        if args.only:
            unknown = sorted(set(args.only) - {t.name for t in tables})
            if unknown:
                raise ValueError(f"no table named {', '.join(unknown)} in {args.config.name}")
            tables = [t for t in tables if t.name in args.only]
        if args.list:
            for table in tables:
                flags = f" {shlex.join(table.flags)}" if table.flags else ""
                print(f"{table.name} ({table.page}): {table.sweep}\n    dapo table{flags}")
            return 0
        if not args.store and not args.run:
            raise ValueError("give --store URL (a store holding the sweeps) or --run")
        store_url = args.store
        if args.run:
            env = dict(os.environ)
            if not store_url:
                work = args.work or Path(tempfile.mkdtemp(prefix="docs-tables-"))
                work.mkdir(parents=True, exist_ok=True)
                store_url = f"sqlite:///{work.resolve() / 'store.db'}"
                env["DAPO_RUNS_DIR"] = str(work.resolve() / "runs")
                print(f"running the sweeps into {store_url}", flush=True)
            run_sweeps(tables, store_url, env)
        changed = regenerate(tables, store_url, args.root, check=args.check)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
