"""The dashboard process freezes its imported objects once (dashboard.heap), never a test's."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from dashboard import heap

CHILD = """
import gc
from dashboard import heap
heap.freeze_imports()
frozen = gc.get_freeze_count()
heap.freeze_imports()  # app.py runs on every page load: the second call does nothing
assert gc.get_freeze_count() == frozen, (frozen, gc.get_freeze_count())
gc.collect()
print(frozen, len(gc.get_objects()))
"""


def test_a_dashboard_process_freezes_its_libraries_once() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True
    )
    frozen, left = out.stdout.split()
    # Streamlit, pandas, pyarrow and Altair alone are well over 100k objects; what a full
    # collection still walks afterwards is a small remainder.
    assert int(frozen) > 100_000 and int(left) < int(frozen) // 10


def test_under_apptest_the_test_process_is_not_frozen() -> None:
    import streamlit.testing.v1  # noqa: F401  what AppTest imports

    before = gc.get_freeze_count()
    heap.freeze_imports()
    assert gc.get_freeze_count() == before == 0


def test_the_served_dashboard_has_its_pages_libraries_loaded_before_its_first_page(
    tmp_path: Path,
) -> None:
    """`dapo dashboard`'s Streamlit (dashboard.serve) imports what the pages draw with before it
    listens: once it answers, and before any browser has run a page, pyarrow's and pandas'
    compiled libraries are already in the process (plain `streamlit run` loads them on the
    first page, while a user waits)."""
    from dapo_common.util import free_port
    from dashboard.browser import stop, wait_until_healthy
    from dashboard.cli import streamlit_command, streamlit_env

    port = free_port()
    server = subprocess.Popen(
        streamlit_command(port=port, host="127.0.0.1"),
        env=streamlit_env(f"sqlite:///{tmp_path / 'store.db'}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_healthy(port, server, 60.0)
        maps = Path(f"/proc/{server.pid}/maps").read_text()
    finally:
        stop(server)
    assert "libarrow" in maps and "pandas/_libs" in maps
