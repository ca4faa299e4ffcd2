"""A fresh dashboard process's first page: `python -m streamlit run` against `dapo dashboard`'s
`python -m dashboard.serve run` (the pages' libraries loaded before the server listens).

    .venv/bin/python bench/bench_first_page.py [--rounds 5]

A SQLite store of 2 synthetic sweeps (bench_scale.build). Per round, per page, per command
line: start a fresh server, wait for its health check (the seconds from the start to then are
reported too), load one page in headless Chromium and time it to the page's text on the
browser's clock (dashboard.browser.Page.time_to), stop the server. The command lines
alternate. Printed per page: the median and range of each, and the median of the paired ratios
new / old (lower is faster).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import bench_scale
    import sqlalchemy as sa

    from dapo_common.util import free_port
    from dashboard import browser
    from dashboard.cli import streamlit_command, streamlit_env

    url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='dapo-first-page-')) / 'store.db'}"
    bench_scale.build(url, 2, 130)
    with sa.create_engine(url).connect() as conn:
        sweep = conn.execute(sa.text("SELECT max(id) FROM sweeps")).scalar()
    pages = {
        "ablation": (f"/?sweep={sweep}&live=0", ["Ablation ladder", "token_loss", "leads"]),
        "sweeps": ("/sweeps?live=0", ["sweep(s)", "The best arm is named only"]),
        "curves": (f"/curves?sweep={sweep}", ["seed(s) per arm: line = mean"]),
    }

    def command(which: str, port: int) -> list[str]:
        cmd = streamlit_command(port=port, host="127.0.0.1")
        if which == "old":  # what `dapo dashboard` ran before dashboard.serve
            cmd[cmd.index("dashboard.serve")] = "streamlit"
        return cmd

    loads: dict[tuple[str, str], list[float]] = {(w, p): [] for w in ("old", "new") for p in pages}
    answers: dict[str, list[float]] = {"old": [], "new": []}
    chromium = browser.find_browser()
    if chromium is None:
        print("error: no Chromium on PATH", file=sys.stderr)
        return 2
    with browser.open_page(chromium) as page:
        for _ in range(args.rounds):
            for name, (path, needles) in pages.items():
                for which in ("old", "new"):
                    port = free_port()
                    started = time.perf_counter()
                    server = subprocess.Popen(
                        command(which, port),
                        cwd=ROOT,
                        env=streamlit_env(url),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    try:
                        browser.wait_until_healthy(port, server, 120)
                        answers[which].append(time.perf_counter() - started)
                        page.goto("about:blank")
                        page.goto(f"http://127.0.0.1:{port}{path}")
                        loads[(which, name)].append(page.time_to(needles, timeout_s=120))
                    finally:
                        browser.stop(server)
    print(f"{args.rounds} rounds, a fresh server per load; seconds")
    for which, xs in answers.items():
        print(
            f"  {which}: the server answers {statistics.median(xs):.2f} s after its start (median)"
        )
    print(
        f"{'page':>10} {'old median':>11} {'old range':>12} {'new median':>11} {'new range':>12} {'new/old':>8}"
    )
    for name in pages:
        old, new = loads[("old", name)], loads[("new", name)]
        ratio = statistics.median(n / o for n, o in zip(new, old, strict=True))
        print(
            f"{name:>10} {statistics.median(old):>11.2f} {min(old):>5.2f}-{max(old):<6.2f} "
            f"{statistics.median(new):>11.2f} {min(new):>5.2f}-{max(new):<6.2f} {ratio:>8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
