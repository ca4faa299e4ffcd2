"""Where the dashboard reads from: the store URL (CLI argument or environment) and its engine."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

import sqlalchemy as sa

from db import engine as db_engine

# One masking rule for every layer: the store's own (it also masks URLs it cannot parse).
from db.engine import safe_url as safe_url


def store_url(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> str:
    """`streamlit run app.py -- --url URL` beats $DAPO_DB_URL, which beats db's default file."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--url", default=None)
    known, _ = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if known.url:
        return str(known.url)
    env = os.environ if environ is None else environ
    return db_engine.resolve_url(env.get("DAPO_DB_URL") or None)


def open_engine(url: str) -> sa.Engine:
    """The store's engine (db.engine caches one per URL and migrates a fresh database)."""
    return db_engine.get_engine(url)
