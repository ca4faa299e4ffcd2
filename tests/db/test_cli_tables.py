"""Tables that fit a terminal, one unit everywhere: `dapo table` (and --mechanisms), `dapo
arms`, the progress lines. Run as a user runs them (the console script, its $COLUMNS), against
the dashboard's fixture store, whose numbers tests/dashboard_fixtures.py fixes."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import dashboard_fixtures as fx
import pytest
from dapo_cli import dapo

from dapo_common import text
from db import stats, table_format

ROOT = Path(__file__).resolve().parents[2]


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> fx.FixtureStore:
    return fx.build_store(f"sqlite:///{tmp_path_factory.mktemp('tables') / 'store.db'}")


def widest(out: str) -> int:
    return max(len(line) for line in out.splitlines())


# --- dapo table ---------------------------------------------------------------------------------


def test_table_fits_120_columns_by_default_and_says_what_it_hid(filled: fx.FixtureStore) -> None:
    done = dapo("table", "--sweep", str(filled.sweep_id), url=filled.url)  # a pipe: 120
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert widest(out) <= 120
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("arm "))
    # what a reader needs stays: the arm, its n, the score and the Δ to its parent
    for column in ("arm", "n", "final", "Δ parent"):
        assert column in re.split(r"\s{2,}", header.strip())
    first = next(
        i for i, line in enumerate(lines) if line.startswith("(hidden to fit 120 columns: ")
    )
    last = next(i for i in range(first, len(lines)) if lines[i].endswith("all)"))
    hidden = [" ".join(lines[first : last + 1])]  # the note, wrapped to the width
    assert hidden[0].endswith("--wide shows all)")
    assert "updates" in hidden[0] and "tokens" in hidden[0]  # bookkeeping goes first
    rows = {line.split()[0]: line for line in lines if line.split()[:1] in ([a] for a in fx.ARMS)}
    assert list(rows) == fx.ARMS
    assert "32.0 [6.6, 57.4]" in rows["grpo"]  # (30, 34): 32 ± 12.706 · 2 / √2 -> [6.6, 57.4]


def test_table_honours_columns_and_wide_shows_every_column(filled: fx.FixtureStore) -> None:
    narrow = dapo("table", "--sweep", str(filled.sweep_id), columns=80, url=filled.url).stdout
    assert widest(narrow) <= 80
    assert "(hidden to fit 80 columns: " in narrow
    wide = dapo("table", "--sweep", str(filled.sweep_id), "--wide", columns=80, url=filled.url)
    assert wide.returncode == 0, wide.stderr
    assert "hidden to fit" not in wide.stdout and widest(wide.stdout) > 200
    header = next(line for line in wide.stdout.splitlines() if line.startswith("arm "))
    for column in ("adds", "seed 0", "seed 1", "paper", "updates", "tokens", "status"):
        assert column in header


def test_one_seed_is_a_bare_number_and_the_note_is_said_once(filled: fx.FixtureStore) -> None:
    out = dapo("table", "--sweep", str(filled.other_sweep_id), "--wide", url=filled.url).stdout
    # the newer sweep: grpo 30 and overlong_filter 36, one seed each (start 20)
    assert "no interval)" not in out.replace("(n=1, no interval).", "")  # only the headline's
    assert out.count("n=1: no intervals") == 1
    row = next(line for line in out.splitlines() if line.startswith("overlong_filter"))
    cells = row.split()
    assert "36.0" in cells and "+16.0" in cells and "+6.0" in cells  # final, gain, Δ parent
    # A difference over fewer seeds than its row has still says so: token_loss (seeds 0, 1)
    # − soft_punish (seed 0 only; seed 1 failed) = 43 − 44 on seed 0.
    ladder = dapo("table", "--sweep", str(filled.sweep_id), "--wide", url=filled.url).stdout
    token_loss = next(line for line in ladder.splitlines() if line.startswith("token_loss"))
    assert "-1.0 (n=1)" in token_loss


def test_estimate_text_bare_single() -> None:
    one = stats.Estimate(n=1, mean=0.44)
    assert table_format.estimate_text(one) == "44.0 (n=1, no interval)"  # the dashboard's cell
    assert table_format.estimate_text(one, bare_single=True) == "44.0"
    assert table_format.estimate_text(one, signed=True, n_expected=2, bare_single=True) == (
        "+44.0 (n=1)"
    )
    two = stats.Estimate(n=2, mean=0.32, low=0.066, high=0.574)
    assert table_format.estimate_text(two, bare_single=True) == "32.0 [6.6, 57.4]"


def test_mechanism_table_fits_and_says_n1_once(filled: fx.FixtureStore) -> None:
    sweep = ("--sweep", str(filled.sweep_id))
    done = dapo("table", *sweep, "--mechanisms", "--window", "3", url=filled.url)
    assert done.returncode == 0, done.stderr
    assert widest(done.stdout) <= 120
    assert "(hidden to fit 120 columns: parent" in done.stdout
    assert "no interval)" not in done.stdout  # soft_punish and dapo have one seed: bare
    assert done.stdout.count("n=1: no intervals") == 1
    wide = dapo("table", *sweep, "--mechanisms", "--window", "3", "--wide", url=filled.url)
    assert "hidden to fit" not in wide.stdout and widest(wide.stdout) > 120


def test_a_window_past_the_runs_is_one_line(filled: fx.FixtureStore) -> None:
    # the fixture's runs are fx.STEPS = 5 rollout steps long
    line = one_error_line(
        dapo(
            "table",
            "--sweep",
            str(filled.sweep_id),
            "--mechanisms",
            "--window",
            "6",
            url=filled.url,
        )
    )
    assert line == (
        f"error: --window 6: the runs of sweep {filled.sweep_id} are at most {fx.STEPS} rollout "
        "steps long; use --window 2 or less"
    )
    ok = dapo(
        "table", "--sweep", str(filled.sweep_id), "--mechanisms", "--window", "5", url=filled.url
    )
    assert ok.returncode == 0, ok.stderr


def test_errors_name_the_store_as_given_never_its_read_only_uri(filled: fx.FixtureStore) -> None:
    line = one_error_line(dapo("table", "--sweep", "99", url=filled.url))
    assert line == f"error: no sweep with id 99 in {filled.url}"
    assert "mode=ro" not in line and "file:" not in line


def test_safe_url_of_a_read_only_uri() -> None:
    from db import engine as db_engine

    path = Path("/tmp/some dir/store.db")
    uri = db_engine._read_only_url(path)
    assert "mode=ro" in uri  # what the engine opens ...
    assert db_engine.safe_url(uri) == "sqlite:////tmp/some dir/store.db"  # ... what users read
    assert db_engine.safe_url("sqlite:///rel.db") == "sqlite:///rel.db"
    assert db_engine.safe_url("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"


# --- dapo arms ----------------------------------------------------------------------------------


def test_arms_beyond_dapo_fits_120_columns_and_wide_keeps_one_line_per_arm() -> None:
    done = dapo("arms", "--ladder", "beyond-dapo")
    assert done.returncode == 0, done.stderr
    assert widest(done.stdout) <= 120
    text_ = " ".join(done.stdout.split())
    # every arm's whole description is there, wrapped, not cut
    assert (
        "(Yao et al. 2025, 'Your Efficient RL Framework Secretly Brings You Off-Policy RL Training')"
        in text_
    )
    wide = dapo("arms", "--ladder", "beyond-dapo", "--wide")
    assert widest(wide.stdout) > 120
    assert len(wide.stdout.splitlines()) == 2 + 1 + 7  # title, header, rule, 7 arms
    narrow = dapo("arms", "--ladder", "beyond-dapo", columns=90)
    assert widest(narrow.stdout) <= 90


# --- the fitting rule, and scores in percent ----------------------------------------------------


def test_fit_hides_in_order_and_shrinks_when_that_is_enough() -> None:
    records = [{"a": "x" * 10, "b": "y" * 30, "c": "z" * 10}]
    # 10 + 2 + 30 + 2 + 10 = 54 characters
    assert text.fit(records, None, drop=["c"]) == (records, [])
    shown, hidden = text.fit(records, 40, drop=["c"], shrink={"b": 8})
    # shrinking b by 14 (to 16 >= 8) is enough: nothing hidden, b cut with '…'
    assert hidden == [] and shown[0]["b"] == "y" * 15 + "…"
    shown, hidden = text.fit(records, 20, drop=["c", "b"], shrink={"b": 8})
    # b cannot lose 34; c goes (42 left), then b can lose 22 (to 8): 10 + 2 + 8 = 20
    assert hidden == ["c"] and shown[0] == {"a": "x" * 10, "b": "y" * 7 + "…"}
    shown, hidden = text.fit(records, 5, drop=["b"])
    assert hidden == ["b"] and list(shown[0]) == ["a", "c"]  # what is in no list stays


def test_percent_is_the_one_unit_of_scores() -> None:
    from flows import progress

    assert text.percent(0.4125) == "41.2%" and text.percent(math.nan) == "-"
    line = progress.step_line(
        "grpo s0",
        {
            "step": 3,
            "steps": 12,
            "acc": 0.412,
            "reward": -0.176,
            "tokens_per_s": 1234.0,
            "eta_s": 20,
        },
    )
    assert line == "grpo s0  step 3/12  acc 41.2%  reward -0.176  1234 tok/s  ETA 0:00:20"
    final = {"dataset": "aime2024", "k": 4, "avg_at_k": 0.7125, "pass_at_k": 0.94}
    assert progress.eval_text(final) == "aime2024 avg@4 71.2% pass@4 94.0%"


def test_train_progress_line_in_percent(capsys: pytest.CaptureFixture[str]) -> None:
    from dapo_core.cli import print_progress

    print_progress(
        {
            "step": 1,
            "steps": 2,
            "reward": 0.5,
            "acc": 0.25,
            "entropy": 0.3,
            "response_length": 12.0,
            "tokens_per_s": 10.0,
            "eta_s": 5,
        }
    )
    assert "  acc 25.0%  " in capsys.readouterr().out
