"""The `dapo` console script: one argparse dispatcher over the subcommands each layer provides.

Each layer registers its own subcommands (dapo_core.cli, db.cli, dashboard.cli, flows.commands,
flows.export), imported lazily so that `dapo table` never pays for torch. User mistakes surface
as one line on stderr and exit code 2; set DAPO_DEBUG=1 to see the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from dapo_common.cli_args import USER_ERRORS
from dapo_common.util import first_line

# (module, what it provides) in the order `dapo --help` lists them.
_REGISTRARS: tuple[str, ...] = (
    "dapo_core.cli",
    "dapo_core.config_cli",
    "flows.commands",
    "db.annotations_cli",
    "flows.deploy",
    "db.cli",
    "db.aa_cli",
    "flows.export",
    "dashboard.cli",
)

# `dapo sweep ACTION`: the modules that add actions to flows.commands' `sweep` parser, in the
# order its help lists them. argparse allows a parser one group of sub-actions, so the
# dispatcher makes that group here, once, and hands it to each (`register_sweep_actions`).
_SWEEP_ACTIONS: tuple[str, ...] = ("flows.sweep_rm", "db.annotations_cli")


DESCRIPTION = """\
DAPO Lab: run the DAPO ablation ladder (GRPO → +overlong filter → +clip-higher → +soft overlong
punishment → +token-level loss → DAPO), a ladder of your own (a TOML file) or a grid around
one arm, on any causal LM, and browse the results with their intervals.

The experiment store is $DAPO_DB_URL when set (e.g. postgresql+psycopg://user@host:5432/db),
else a SQLite file in the user's data directory (see `dapo db current`)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (the usage block buries the reason); the
    subcommands' parsers inherit it through add_subparsers."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="dapo", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Every layer ships in the one distribution (pyproject's packages), so each import must
    # succeed: a failure is a broken install and surfaces as such.
    for name in _REGISTRARS:
        importlib.import_module(name).register(sub)
    actions = sub.choices["sweep"].add_subparsers(dest="sweep_action", metavar="ACTION")
    for name in _SWEEP_ACTIONS:
        importlib.import_module(name).register_sweep_actions(actions)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        if os.environ.get("DAPO_DEBUG"):
            raise
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
