"""Screenshots of the dashboard on a real store, for the README (docs/*.png).

    .venv/bin/python scripts/dashboard_screenshots.py [--store URL] [--sweep ID] [--out docs]

Serves the app with `streamlit run` on the store (default: the one `make demo` fills), opens
the ablation table and the curves page in headless Chromium and writes dashboard.png and
curves.png. Run it after `make demo` so that the README shows what the demo really produced.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dashboard.browser import find_browser, open_page, served  # noqa: E402
from db.engine import resolve_url  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--store", default=None, help="store URL (default: $DAPO_DB_URL or the user store)"
    )
    parser.add_argument("--sweep", type=int, default=None, help="sweep id (default: the newest)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    browser = find_browser()
    if browser is None:
        print(
            "error: headless Chromium is not installed (apt-get install -y chromium)",
            file=sys.stderr,
        )
        return 2
    url = resolve_url(args.store)
    query = f"?live=0{f'&sweep={args.sweep}' if args.sweep else ''}"
    # Each page is shot once its content is on the screen (the headline under the table, a
    # metric's name on the curves), not after a fixed time.
    pages = (("dashboard.png", "", "leads"), ("curves.png", "curves", "acc/mean"))
    with tempfile.TemporaryDirectory() as work:
        try:
            with served(url, cwd=Path(work)) as base, open_page(browser) as tab:
                args.out.mkdir(parents=True, exist_ok=True)
                for name, path, marker in pages:
                    shot = args.out / name
                    tab.goto(f"{base}/{path}{query}")
                    tab.wait_for([marker])
                    tab.screenshot(shot)
                    print(f"wrote {shot}")
        except RuntimeError as error:  # the server or the browser failed: one line, no traceback
            print(f"error: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
