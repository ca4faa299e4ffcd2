"""The mechanism scoreboard of docs/mechanisms.md, from the sweeps that measure it, never retyped.

    .venv/bin/python scripts/scoreboard.py --run [--real-model] [--store URL | --work DIR]
    .venv/bin/python scripts/scoreboard.py --store URL [--check]
    .venv/bin/python scripts/scoreboard.py --list

--run: run the sweep command of every check in db.scoreboard.CHECKS first (each distinct one
once; the real model's, minutes a step on a 2-core CPU, only with --real-model), into --store
when given, else into a fresh SQLite store under --work (a new temporary directory by default,
kept and printed). Then the scoreboard (`dapo table --scoreboard --format markdown`'s first
table) and the detail of each clip check's sweep (`--sweep ID`) replace what lies between their markers in
docs/mechanisms.md (`<!-- table:scoreboard -->`, `<!-- table:clip-dose -->`,
`<!-- table:clip-entropy -->`, each closed by `<!-- /table:NAME -->`); nothing else changes.
--check: write nothing; exit 1 when the page would change. --list: the commands, one a line.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "mechanisms.md"
sys.path.insert(0, str(ROOT))

from db import scoreboard  # noqa: E402

# marker name -> the sweep whose detail it holds (None: the scoreboard itself)
TABLES: dict[str, str | None] = {
    "scoreboard": None,
    "clip-dose": scoreboard.DOSE_SWEEP,
    "clip-entropy": scoreboard.ENTROPY_SWEEP,
}


def commands(real_model: bool) -> list[str]:
    """Every check's sweep command, each once, in the scoreboard's order."""
    out: list[str] = []
    for check in scoreboard.CHECKS:
        if check.sweep == scoreboard.REAL_SWEEP and not real_model:
            continue
        if check.command not in out:
            out.append(check.command)
    return out


def dapo() -> str:
    here = Path(sys.executable).with_name("dapo")
    return str(here) if here.exists() else "dapo"


def rewrite(text: str, name: str, body: str, page: str = PAGE.name) -> str:
    pattern = re.compile(
        rf"(<!-- table:{re.escape(name)} -->\n)(.*?)(<!-- /table:{re.escape(name)} -->)", re.S
    )
    if not pattern.search(text):
        raise SystemExit(f"error: {page} has no <!-- table:{name} --> ... markers")
    return pattern.sub(lambda m: f"{m.group(1)}{body}\n{m.group(3)}", text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default=None, help="the store (default with --run: a new one)")
    parser.add_argument("--run", action="store_true", help="run the sweep commands first")
    parser.add_argument("--real-model", action="store_true", help="the real model's sweep too")
    parser.add_argument("--work", default=None, help="--run's directory for a new store")
    parser.add_argument("--check", action="store_true", help="exit 1 when the page would change")
    parser.add_argument("--list", action="store_true", help="print the sweep commands")
    parser.add_argument("--page", default=str(PAGE), help="the page to write (docs/mechanisms.md)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(commands(real_model=True)))
        return 0
    store = args.store
    if args.run:
        if store is None:
            work = Path(args.work or tempfile.mkdtemp(prefix="dapo-scoreboard-"))
            work.mkdir(parents=True, exist_ok=True)
            store = f"sqlite:///{work / 'store.db'}"
            print(f"store: {store}", flush=True)
        for command in commands(args.real_model):
            print(f"$ {command}", flush=True)
            words = shlex.split(command)
            subprocess.run(
                [dapo(), *words[1:], "--store", store, "--quiet"], check=True, env=dict(os.environ)
            )
    if store is None:
        print("error: give --store URL (the sweeps' store) or --run", file=sys.stderr)
        return 2
    from db.engine import get_engine

    engine = get_engine(store, read_only=True)
    page = Path(args.page)
    text = page.read_text(encoding="utf-8")
    new = text
    for name, sweep in TABLES.items():
        if sweep is None:  # what `dapo table --scoreboard --format markdown` starts with
            body = scoreboard.render_scoreboard(scoreboard.scoreboard(engine), "markdown")
        else:  # `dapo table --scoreboard --sweep ID --format markdown`
            found = scoreboard.find_sweep(engine, sweep)
            if found is None:
                continue
            body = scoreboard.detail(engine, found, "markdown")
        new = rewrite(new, name, body.strip(), page.name)
    if args.check:
        if new != text:
            print(f"{page} would change", file=sys.stderr)
            return 1
        return 0
    if new != text:
        page.write_text(new, encoding="utf-8")
        print(f"wrote {page}")
    else:
        print(f"{page} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
