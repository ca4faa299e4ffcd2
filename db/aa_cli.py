"""`dapo aa`: print a sweep's A/A noise floor (db.aa).

    dapo sweep --preset explore --arms grpo --seeds 0,1,2,3,4,5   the arm on 2n seeds
    dapo aa                                                       its A/A check (latest sweep)
    dapo aa --sweep 7 --arm grpo --dataset arith-eval --k 4

Read-only, like `dapo table`: it trains nothing and writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dapo_common.cli_args import positive_int
from db.cli import store_argument


def register(subparsers: Any) -> None:
    """Add `aa` to the `dapo` dispatcher."""
    p = subparsers.add_parser(
        "aa",
        help="the A/A noise floor: one arm's seeds split in two halves",
        description="An A/A check: one arm of a sweep, run on at least four seeds, split into "
        "two disjoint halves. Prints the halves' scores, their Δ with the table's paired "
        "t-interval (a star is a false positive), and the noise floor: the 95th percentile of "
        "the halves' difference over every way to split the seeds. Run the arm on twice the "
        "seeds you use per arm first: `dapo sweep --arms ARM --seeds 0,1,2,3,4,5`.",
    )
    p.add_argument("--sweep", type=positive_int, metavar="ID", help="sweep id (default: latest)")
    p.add_argument("--arm", help="the arm to split (default: the sweep's one arm with 4+ seeds)")
    p.add_argument("--dataset", help="score on this eval set (default: the table's)")
    p.add_argument("--k", type=positive_int, help="score avg@k with this k (default: the table's)")
    store_argument(p)
    p.set_defaults(func=cmd_aa)


def cmd_aa(args: argparse.Namespace) -> int:
    from db import aa
    from db.cli import _explained, read_only_store, sweep_or_latest

    engine, url = read_only_store(args.store)
    with _explained(url):
        sweep_id = sweep_or_latest(engine, url, args.sweep)
        check = aa.aa_check(engine, sweep_id, args.arm, dataset=args.dataset, k=args.k)
    sys.stdout.write(aa.render(check))
    return 0
