"""The dashboard process's heap: its long-lived objects kept out of the garbage collector's way.

Python's full collection walks every tracked object. In the dashboard process those are mostly
the imported libraries' (Streamlit, pandas, pyarrow, Altair's thousands of schema classes,
SQLAlchemy): ~180k objects that live as long as the process, walked again at every full
collection (90-140 ms each here), in the middle of whichever page load triggered it.
`gc.freeze()` moves them to the permanent generation once: later collections walk only what the
pages themselves create. A page's own garbage is still collected as before.
"""

from __future__ import annotations

import gc
import sys

_frozen = False


def freeze_imports() -> None:
    """Once per process (app.py runs on every page load): import the libraries the pages draw
    with, collect what is garbage now, and freeze the rest. Not under Streamlit's AppTest: the
    process is then a test runner's, whose heap is not the dashboard's to freeze."""
    global _frozen
    if _frozen or "streamlit.testing.v1" in sys.modules:
        return
    import altair  # noqa: F401  the charts' library, imported by the chart pages anyway
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401

    from dashboard import curves, shaping, widgets  # noqa: F401

    gc.collect()
    gc.freeze()
    _frozen = True
