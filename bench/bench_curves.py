"""The curves page of one 18-run sweep: where its time goes, in Python and in the browser.

    .venv/bin/python bench/bench_curves.py [--repeat 7] [--baseline DIR] [--no-browser]
        [--store /tmp/bench_curves.db] [--json out.json]

The store: one sweep of bench_scale's shape (6 arms x 3 seeds = 18 runs, 43 metrics x 130
steps, a held-out evaluation every 10 steps), written by bench_scale.build (db.store.Store for
sweeps and runs, the rows bulk-loaded as db.sink.SqlSink writes them) into a SQLite file, kept
and reused when it is there. The page is opened with its defaults: x = gradient updates, EMA
0.6 with the raw line behind, the 95% band, the four headline metrics and the held-out score.

(a) Python: the page script itself (dashboard/views/curves.py) run by Streamlit's AppTest,
    `--repeat` times after one uncounted run, in a fresh process per checkout. Figures: CPU
    seconds of the whole script (time.process_time: the store reads, the pandas work, the
    charts), the CPU of its st.altair_chart calls alone (Altair's spec, Streamlit's Arrow
    copies of the data), what the browser is sent per chart (the Vega-Lite spec's JSON bytes,
    the Arrow bytes and rows of its datasets, its layers), and Altair's own `to_json` of the
    same charts (the data inlined as JSON, the size the issue's goal was written against).
(b) Browser: the real app (`streamlit run`) in headless Chromium over the DevTools protocol
    (dashboard.browser), `--repeat` loads after one uncounted one, from a blank page: seconds
    to the page's caption (the needle bench_scale waits for) and to every chart drawn (each
    `.vega-embed` holds its line marks), and the CPU seconds over the load of the Streamlit
    server and of Chromium's processes (/proc: far less moved by the machine's load than the
    wall clock), with the SVG nodes the charts drew. Beside them, the grid page of the same
    store (its "not a grid" message, no chart): what a page costs here before any chart.

`--baseline DIR`: a copy of the repository's Python packages (dashboard/, db/, dapo_common/,
dapo_core/) as they were before a change; both are measured, loads alternating between the
two served apps, so that load on the shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = "dashboard/views/curves.py"
NEEDLE = "seed(s) per arm: line = mean"  # the caption bench_scale waits for
PAGE_TIMEOUT_S = 120.0
# how many charts hold their line marks (each chart draws a line per arm)
DRAWN_JS = (
    "[...document.querySelectorAll('.vega-embed')]"
    ".filter(e => e.querySelector('g.mark-line path')).length"
)
SVG_NODES_JS = "document.querySelectorAll('.vega-embed svg *').length"
BLANK_JS = "document.body ? document.body.innerText.length : 0"
FLOOR = "grid page (no chart)"


def build_store(path: Path) -> str:
    """The SQLite store of one bench_scale sweep at `path` (built unless already there)."""
    url = f"sqlite:///{path}"
    if not path.exists():
        sys.path.insert(0, str(ROOT / "bench"))
        import bench_scale

        print(f"building {path}: {bench_scale.build(url, 1, 130)}", flush=True)
    return url


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return {"median": statistics.median(ordered), "p95": p95, "n": len(ordered)}


# --- (a) the page's Python, in a process of the checkout measured -----------------------------


def python_only(tree: Path, url: str, repeat: int) -> dict[str, Any]:
    """Run the page `repeat` + 1 times under AppTest (the first uncounted); its figures. The
    process imports `tree`'s packages (PYTHONPATH, set by python_figures)."""
    import pyarrow as pa
    from streamlit.delta_generator import DeltaGenerator
    from streamlit.testing.v1 import AppTest

    charts: list[Any] = []
    chart_cpu = [0.0]
    original = DeltaGenerator.altair_chart

    def timed(self: DeltaGenerator, altair_chart: Any, *args: Any, **kwargs: Any) -> Any:
        charts.append(altair_chart)
        started = time.process_time()
        try:
            return original(self, altair_chart, *args, **kwargs)
        finally:
            chart_cpu[0] += time.process_time() - started

    DeltaGenerator.altair_chart = timed  # type: ignore[method-assign,assignment]
    sweep = _sweep_id(url)
    script, charting = [], []
    sent: dict[str, Any] = {}
    for i in range(repeat + 1):
        charts.clear()
        chart_cpu[0] = 0.0
        at = AppTest.from_file(str(tree / PAGE), default_timeout=PAGE_TIMEOUT_S)
        at.query_params["sweep"] = str(sweep)
        started = time.process_time()
        at.run()
        cpu = time.process_time() - started
        assert not at.exception, [e.value for e in at.exception]
        if i == 0:
            continue
        script.append(cpu)
        charting.append(chart_cpu[0])
        if i == 1:  # what is sent is the same every run
            protos = [c.proto for c in at.get("vega_lite_chart")]
            tables = [
                pa.ipc.open_stream(d.data.data).read_all() for p in protos for d in p.datasets
            ]
            sent = {
                "charts": len(protos),
                "layers": sum(len(json.loads(p.spec).get("layer", [None])) for p in protos),
                "spec JSON bytes": sum(len(p.spec) for p in protos),
                "datasets": len(tables),
                "dataset rows": sum(t.num_rows for t in tables),
                "dataset cells": sum(t.num_rows * t.num_columns for t in tables),
                "dataset Arrow bytes": sum(len(d.data.data) for p in protos for d in p.datasets),
                "altair to_json bytes": sum(len(c.to_json()) for c in charts),
            }
    return {
        "script CPU s": summary(script),
        "st.altair_chart CPU s": summary(charting),
        **sent,
    }


def _sweep_id(url: str) -> int:
    from db import reads
    from db.engine import get_engine

    return int(reads.latest_sweep_id(get_engine(url)) or 0)


def python_figures(label: str, tree: Path, url: str, repeat: int, work: Path) -> dict[str, Any]:
    """(a) for the checkout at `tree`, in a fresh process that imports its packages."""
    out = work / f"python-{label.replace(' ', '-')}.json"
    env = _env(tree, url, work)
    command = [sys.executable, __file__, "--python-only", str(tree), "--store-url", url]
    command += ["--repeat", str(repeat), "--json", str(out)]
    done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the page failed under {tree}:\n{done.stderr[-3000:]}")
    return dict(json.loads(out.read_text()))


def _env(tree: Path, url: str, work: Path) -> dict[str, str]:
    """The app's environment: the store, a throw-away Prefect home, `tree`'s packages first."""
    from dashboard.cli import streamlit_env

    env = streamlit_env(url, {**os.environ, "PREFECT_HOME": str(work / "prefect")})
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


# --- (b) the page in headless Chromium --------------------------------------------------------


@contextlib.contextmanager
def served(tree: Path, url: str, work: Path) -> Iterator[tuple[str, int]]:
    """`streamlit run` of `tree`'s dashboard on a free port: (its base URL, its pid)."""
    from dapo_common.util import free_port
    from dashboard import browser

    port = free_port()
    command = [sys.executable, "-m", "streamlit", "run", str(tree / "dashboard" / "app.py")]
    command += ["--server.headless", "true", "--server.port", str(port)]
    command += ["--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"]
    with open(work / f"streamlit-{port}.log", "wb") as log:
        server = subprocess.Popen(
            command, cwd=work, env=_env(tree, url, work), stdout=log, stderr=log
        )
        try:
            browser.wait_until_healthy(port, server, 60.0)
            yield f"http://127.0.0.1:{port}", server.pid
        finally:
            browser.stop(server)


TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """user + system CPU seconds of each live process in `pids` (Linux /proc)."""
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) * TICK_S
    return out


def browser_pids() -> list[int]:
    """This process's descendants that are Chromium's (the browser, its renderers, ...)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                names[int(entry)] = stat[stat.index("(") + 1 : stat.rindex(")")]
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    mine = {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in mine} - mine
        mine |= more
        grew = bool(more)
    return [pid for pid in mine if names.get(pid, "").startswith("chrom")]


def cpu_since(before: dict[int, float], pids: list[int]) -> float:
    """CPU seconds the processes alive now used since `before` (one that started since counts
    from 0; one that ended since is lost, a renderer left behind on the blank page)."""
    now = cpu_by_pid(pids)
    return sum(value - before.get(pid, 0.0) for pid, value in now.items())


def load(page: Any, url: str, needle: str, charts: int, server: int) -> dict[str, float]:
    """One load from a blank page: seconds to `needle` on the screen and to `charts` charts
    drawn, and the CPU seconds of the dashboard's server and of the browser in between."""
    page.goto("about:blank")
    end = time.monotonic() + 10
    while page.evaluate(BLANK_JS) and time.monotonic() < end:
        time.sleep(0.05)
    server_cpu, browser_cpu = cpu_by_pid([server]), cpu_by_pid(browser_pids())
    started = time.perf_counter()
    page.goto(url)
    # the browser's clock from navigation start (dashboard.browser.Page.time_to)
    caption = page.time_to([needle], timeout_s=PAGE_TIMEOUT_S)
    while page.evaluate(DRAWN_JS) < charts:
        if time.perf_counter() - started > PAGE_TIMEOUT_S:
            raise TimeoutError(f"{charts} charts not drawn after {PAGE_TIMEOUT_S:g} s")
        time.sleep(0.05)
    drawn = time.perf_counter() - started
    return {
        "caption s": caption,
        "charts drawn s": drawn,
        "server CPU s": cpu_since(server_cpu, [server]),
        "browser CPU s": cpu_since(browser_cpu, browser_pids()),
        "chart SVG nodes": float(page.evaluate(SVG_NODES_JS)),
    }


def browser_figures(
    trees: dict[str, Path], url: str, repeat: int, charts: dict[str, int], work: Path
) -> dict[str, Any]:
    """(b): the curves page of each checkout, and the grid page of the last (its message, no
    chart: what any page costs on this machine at this time), loads alternating."""
    from dashboard import browser

    exe = browser.find_browser()
    if exe is None:
        print("no Chromium: the page loads are not measured", file=sys.stderr)
        return {}
    sweep = _sweep_id(url)
    with contextlib.ExitStack() as stack:
        servers = {
            label: stack.enter_context(served(tree, url, work)) for label, tree in trees.items()
        }
        page = stack.enter_context(browser.open_page(exe))
        plan = [
            (label, f"{base}/curves?sweep={sweep}", NEEDLE, charts[label], pid)
            for label, (base, pid) in servers.items()
        ]
        base, pid = servers[list(trees)[-1]]
        plan.append((FLOOR, f"{base}/grid?sweep={sweep}", "is not a grid", 0, pid))
        loads: dict[str, list[dict[str, float]]] = {label: [] for label, *_ in plan}
        for _ in range(repeat + 1):  # the first of each uncounted
            for label, path, needle, drawn, server in plan:
                loads[label].append(load(page, path, needle, drawn, server))
    out: dict[str, Any] = {}
    for label, runs in loads.items():
        out[label] = {
            key: summary([r[key] for r in runs[1:]]) | {"first": runs[0][key]} for key in runs[0]
        }
    return out


# --- report -----------------------------------------------------------------------------------


def report(figures: dict[str, Any]) -> None:
    labels = list(figures)
    print(f"\n{'figure':34s}" + "".join(f"{label:>24s}" for label in labels))
    keys = list(dict.fromkeys(key for label in labels for key in figures[label]))
    for key in keys:
        cells = []
        for label in labels:
            value = figures[label].get(key)
            if isinstance(value, dict):
                cells.append(f"{value['median']:.3f} / {value['p95']:.3f}")
            else:
                cells.append(f"{value:,}" if value is not None else "-")
        print(f"{key:34s}" + "".join(f"{c:>24s}" for c in cells))
    print("(timed figures: median / p95)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--baseline", type=Path, default=None, help="the checkout before")
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument(
        "--store", type=Path, default=Path(tempfile.gettempdir()) / "bench_curves.db"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--python-only", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store-url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.python_only is not None:  # (a), in the process of the checkout measured
        args.json.write_text(json.dumps(python_only(args.python_only, args.store_url, args.repeat)))
        return 0
    sys.path.insert(0, str(ROOT))
    url = build_store(args.store)
    trees = {"this checkout": ROOT}
    if args.baseline is not None:
        trees = {"baseline": args.baseline.resolve(), **trees}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for label, tree in trees.items():
            figures[label] = python_figures(label, tree, url, args.repeat, work)
        if not args.no_browser:
            charts = {label: int(figures[label]["charts"]) for label in trees}
            pages = browser_figures(trees, url, args.repeat, charts, work)
            for label in pages:
                figures.setdefault(label, {}).update(pages[label])
    print(f"load average at end: {os.getloadavg()}")
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
