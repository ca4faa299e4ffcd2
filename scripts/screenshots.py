"""Screenshots of the dashboard for the docs, taken once the pages' content is drawn.

    .venv/bin/python scripts/screenshots.py --store URL [--sweep ID] [--out docs]
    .venv/bin/python scripts/screenshots.py --run [--work DIR] [--out docs]

Serves the dashboard on the store (`dashboard.browser.served`: a real `streamlit run`, waited
for through its health probe), opens each page in headless Chromium and shoots it once its
content is on the screen: read from the page's DOM every POLL_S, the page is ready when
Streamlit has finished its run, no placeholder is left, every table in view has its grid drawn
(a canvas) with at least a header and one row in the grid's accessible table, every chart in
view has its canvas or SVG drawn, the page's own words are there, and all of that has held for
two looks in a row. No fixed sleep: a page that never gets there is an error after --timeout.

--run first runs the 3-seed ladder (the `tiny-ladder` entry of scripts/docs_tables.toml, about
16 min on 2 cores) into a fresh store under --work, then shoots its sweep. Writes dashboard.png
(the ablation table) and curves.png into --out; with --all also the other pages (sweeps,
mechanisms, runs, run, compare, rollouts), e.g. into tests/artifacts to look at a change.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

POLL_S = 0.25  # how often the page's DOM is read while waiting


@dataclass(frozen=True)
class Shot:
    """One page to shoot: the file it becomes, its path in the app, the words that say its
    content is there, and what it must show at least (tables, charts)."""

    file: str
    path: str
    needles: tuple[str, ...]
    min_tables: int = 0
    min_charts: int = 0


PAGES = (
    Shot("dashboard.png", "", ("Ablation ladder",), min_tables=1),
    Shot("curves.png", "curves", ("acc/mean",), min_charts=1),
)
# --all: every other page, for looking at what a change to the dashboard did (the docs show
# only the two above). Each waits for its title and what it draws on the sweep's first screen.
MORE_PAGES = (
    Shot("sweeps.png", "sweeps", ("Sweeps",), min_tables=1),
    Shot("mechanisms.png", "mechanisms", ("Mechanisms", "Each arm's signature"), min_tables=1),
    Shot("runs.png", "runs", ("Runs",), min_tables=1),
    Shot("run.png", "run", ("Run", "What this arm changes")),
    Shot("compare.png", "compare", ("Compare two runs", "Config diff")),
    Shot("rollouts.png", "rollouts", ("Rollouts",)),
)

# What the page shows now, for the elements in the viewport (what a screenshot holds). Streamlit
# draws a table on a canvas (a glide data grid) and keeps its cells in a hidden accessible
# <table>; a chart is Vega's canvas or SVG. Before their code has loaded both are grey skeletons.
_STATE_JS = """(() => {
  const inView = (e) => {
    if (e.checkVisibility && !e.checkVisibility()) return false;
    const r = e.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && r.top < innerHeight && r.bottom > 0;
  };
  const drawn = (e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const all = (sel) => [...document.querySelectorAll(sel)].filter(inView);
  return {
    running: !!document.querySelector('[data-testid="stStatusWidgetRunningIcon"]'),
    skeletons: all('[data-testid="stSkeleton"]').length,
    tables: all('[data-testid="stDataFrame"]').map((f) => ({
      canvas: [...f.querySelectorAll("canvas")].some(drawn),
      rows: [...f.querySelectorAll("table tr")].map((tr) =>
        [...tr.children].map((c) => (c.textContent || "").trim())),
      box: (({x, y, width, height}) => [x, y, width, height])(f.getBoundingClientRect()),
    })),
    charts: all('[data-testid="stVegaLiteChart"]').map(
      (c) => [...c.querySelectorAll("canvas, svg")].some(drawn)),
    text: document.body ? document.body.innerText : "",
  };
})()"""


def is_ready(state: dict[str, Any], shot: Shot) -> bool:
    """Whether the page's state (from _STATE_JS) shows its content drawn."""
    tables, charts = state["tables"], state["charts"]
    return (
        not state["running"]
        and state["skeletons"] == 0
        and len(tables) >= shot.min_tables
        and len(charts) >= shot.min_charts
        and all(t["canvas"] and len(t["rows"]) >= 2 for t in tables)
        and all(charts)
        and all(n in state["text"] for n in shot.needles)
    )


def _settled(state: dict[str, Any]) -> str:
    """What must not change between two looks for the page to count as drawn."""
    return json.dumps({k: v for k, v in state.items() if k != "text"}, sort_keys=True)


def wait_until_drawn(page: Any, shot: Shot, timeout_s: float) -> dict[str, Any]:
    """Poll the page's DOM until `shot`'s content is drawn and has held for two looks; returns
    that state, or raises TimeoutError saying what was missing."""
    end = time.monotonic() + timeout_s
    last, state = "", dict[str, Any]()
    while time.monotonic() < end:
        state = page.evaluate(_STATE_JS) or {}
        if state and is_ready(state, shot):
            now = _settled(state)
            if now == last:
                # Two animation frames, so that what the DOM says is also what is painted.
                page.evaluate(
                    "new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))",
                    wait=True,
                )
                return state
            last = now
        else:
            last = ""
        time.sleep(POLL_S)
    summary = {k: v for k, v in state.items() if k != "text"}
    raise TimeoutError(f"{shot.file}: not drawn after {timeout_s:g} s: {summary}")


def shoot(
    store_url: str,
    out: Path,
    *,
    sweep: int | None = None,
    pages: tuple[Shot, ...] = PAGES,
    timeout_s: float = 120.0,
) -> dict[Path, dict[str, Any]]:
    """Serve the dashboard on `store_url` and write each page's PNG into `out`; returns, per
    file written, the page's DOM state at the moment it was shot."""
    from dashboard.browser import find_browser, open_page, served

    browser = find_browser()
    if browser is None:
        raise RuntimeError("headless Chromium is not installed (apt-get install -y chromium)")
    query = "?live=0" + (f"&sweep={sweep}" if sweep is not None else "")
    out.mkdir(parents=True, exist_ok=True)
    states: dict[Path, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as work:
        env = {"PREFECT_HOME": str(Path(work) / "prefect")}
        with served(store_url, cwd=Path(work), env=env) as base, open_page(browser) as page:
            for shot in pages:
                page.goto(f"{base}/{shot.path}{query}")
                state = wait_until_drawn(page, shot, timeout_s)
                path = out / shot.file
                page.screenshot(path)
                states[path] = state
                print(f"wrote {path}", flush=True)
    return states


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--store", help="store URL (default: $DAPO_DB_URL or the user store)")
    parser.add_argument("--sweep", type=int, help="sweep id (default: the newest)")
    parser.add_argument("--run", action="store_true", help="run the 3-seed ladder first (long)")
    parser.add_argument("--work", type=Path, help="with --run: where its store and runs go")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the PNGs go")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per page")
    parser.add_argument(
        "--all", action="store_true", help="every page of the dashboard, not only the docs' two"
    )
    args = parser.parse_args(argv)
    import docs_tables

    from db.engine import resolve_url

    try:
        store_url, sweep = args.store, args.sweep
        if args.run:
            (ladder,) = [t for t in docs_tables.load_config(docs_tables.CONFIG)
                         if t.name == "tiny-ladder"]  # fmt: skip
            env = dict(os.environ)
            if not store_url:
                work = (args.work or Path(tempfile.mkdtemp(prefix="screenshots-"))).resolve()
                work.mkdir(parents=True, exist_ok=True)
                store_url = f"sqlite:///{work / 'store.db'}"
                env["DAPO_RUNS_DIR"] = str(work / "runs")
            docs_tables.run_sweeps([ladder], store_url, env)
            sweep = docs_tables.find_sweep(store_url, ladder.sweep_name)
        pages = PAGES + MORE_PAGES if args.all else PAGES
        shoot(resolve_url(store_url), args.out, sweep=sweep, pages=pages, timeout_s=args.timeout)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
