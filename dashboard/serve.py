"""`python -m dashboard.serve run APP [options]`: Streamlit's own command line, in a process that
has already imported the libraries the pages draw with.

Streamlit imports a page's libraries when the first browser session runs the script: a fresh
dashboard's first page then waited for pandas, pyarrow, Altair, SQLAlchemy and the dashboard's
own modules to load (1.4-1.9 s of it here: bench/bench_first_page.py), after the user had
opened it. Here they load, and the heap they make is frozen (dashboard.heap), before the server
listens, so `dapo dashboard`'s first page no longer waits for them. Everything after that is
`streamlit run` unchanged.
"""

from __future__ import annotations


def main() -> None:
    from dashboard import heap

    heap.freeze_imports()
    from streamlit.web.cli import main as streamlit_main

    # The arguments are sys.argv's; prog_name as `python -m streamlit` sets it.
    streamlit_main(prog_name="streamlit")


if __name__ == "__main__":
    main()
