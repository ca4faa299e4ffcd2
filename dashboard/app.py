"""The DAPO Lab dashboard: `dapo dashboard`, or `DAPO_DB_URL=URL streamlit run dashboard/app.py`
(`-- --url URL` works too, but puts the URL, password and all, where `ps` shows it).

Pages live in dashboard/views/; this entry point only sets up navigation and turns the errors a
user can act on (bad store URL, unreachable database) into one line instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
import streamlit as st

from dapo_common.util import first_line
from dashboard import heap, notes

heap.freeze_imports()

VIEWS = Path(__file__).parent / "views"

st.set_page_config(page_title="DAPO Lab", page_icon=":material/science:", layout="wide")

pages = [
    st.Page(
        VIEWS / "ablation.py", title="Ablation table", icon=":material/table_chart:", default=True
    ),
    st.Page(VIEWS / "sweeps.py", title="Sweeps", icon=":material/list:", url_path="sweeps"),
    st.Page(VIEWS / "curves.py", title="Curves", icon=":material/show_chart:", url_path="curves"),
    st.Page(
        VIEWS / "mechanisms.py",
        title="Mechanisms",
        icon=":material/settings_suggest:",
        url_path="mechanisms",
    ),
    st.Page(VIEWS / "grid.py", title="Grid", icon=":material/scatter_plot:", url_path="grid"),
    st.Page(VIEWS / "rollouts.py", title="Rollouts", icon=":material/chat:", url_path="rollouts"),
    st.Page(VIEWS / "runs.py", title="Runs", icon=":material/view_list:", url_path="runs"),
    st.Page(VIEWS / "run.py", title="Run", icon=":material/search:", url_path="run"),
    st.Page(
        VIEWS / "compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"
    ),
]
page = st.navigation(pages)
st.sidebar.markdown("**DAPO Lab** · ablations of arXiv 2503.14476")
notes.hidden_switch()  # once here: every page's sweep lists read it
try:
    page.run()
except (ValueError, ConnectionError, sa.exc.SQLAlchemyError) as error:
    # Expected failures (a sweep deleted under our feet, a database gone away) read as one
    # line; anything else is a bug and keeps Streamlit's traceback.
    st.error(first_line(error))
