"""Screenshots of the dashboard on a real store, for the README (docs/*.png).

    .venv/bin/python scripts/dashboard_screenshots.py [--store URL] [--sweep ID] [--out docs]

Serves the app with `streamlit run` on the store (default: the one `make demo` fills), opens
the ablation table and the curves page in headless Chromium and writes dashboard.png and
curves.png. Run it after `make demo` so that the README shows what the demo really produced.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dashboard import cli  # noqa: E402
from dashboard.browser import find_browser, free_port, open_page, wait_until_healthy  # noqa: E402
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
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    query = f"?live=0{f'&sweep={args.sweep}' if args.sweep else ''}"
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, DAPO_DB_URL=url)
        server = subprocess.Popen(
            cli.streamlit_command(url, port=port, host="127.0.0.1"),
            cwd=work,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            try:
                wait_until_healthy(port, server, deadline_s=60)
            except RuntimeError as error:
                print(f"error: {error}", file=sys.stderr)
                return 1
            args.out.mkdir(parents=True, exist_ok=True)
            # Each page is shot once its content is on the screen (the headline under the
            # table, a metric's name on the curves), not after a fixed time.
            pages = (("dashboard.png", "", "leads"), ("curves.png", "curves", "acc/mean"))
            with open_page(browser) as tab:
                for name, path, marker in pages:
                    shot = args.out / name
                    tab.goto(f"{base}/{path}{query}")
                    tab.wait_for([marker])
                    tab.screenshot(shot)
                    print(f"wrote {shot}")
        finally:
            server.terminate()
            server.wait(timeout=15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
