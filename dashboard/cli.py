"""`dapo dashboard`: serve the Streamlit app against a store.

The store is checked (and migrated) here first, so that a bad URL ends with one line in the
terminal instead of an error page in the browser.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

APP = Path(__file__).with_name("app.py")


def register(subparsers: Any) -> None:
    """Add the `dashboard` subcommand to the `dapo` dispatcher."""
    from db.cli import store_argument

    parser = subparsers.add_parser(
        "dashboard",
        help="serve the dashboard (ablation table, curves, rollouts, runs)",
        description="Serve the DAPO Lab dashboard with Streamlit and print its URL.",
    )
    store_argument(parser)
    parser.add_argument("--port", type=int, default=8501, help="port to serve on (8501)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.set_defaults(func=run_dashboard)


def streamlit_command(*, port: int, host: str) -> list[str]:
    """The `streamlit run` command line. It names no store: the URL, password and all, goes
    to the app in $DAPO_DB_URL (see streamlit_env), since any user can read a command line
    (`ps`), and only its owner the environment."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
    ]


def streamlit_env(url: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The app's environment: this one, with the store in $DAPO_DB_URL."""
    return {**(os.environ if environ is None else environ), "DAPO_DB_URL": url}


def run_dashboard(args: argparse.Namespace) -> int:
    """Check the store, then run Streamlit in the foreground until interrupted."""
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be between 1 and 65535, got {args.port}")
    from db import engine as db_engine

    url = db_engine.resolve_url(args.store)
    db_engine.get_engine(url)  # ValueError / ConnectionError with one clear line if unusable
    print(f"DAPO Lab dashboard: http://{args.host}:{args.port}  (store: {db_engine.safe_url(url)})")
    print("Press Ctrl+C to stop.", flush=True)
    try:
        return subprocess.call(
            streamlit_command(port=args.port, host=args.host), env=streamlit_env(url)
        )
    except KeyboardInterrupt:
        return 0
