"""`dapo db upgrade`, `dapo db current` and `dapo table`, run as a user runs them: the console
script in a subprocess, against a SQLite file and a PostgreSQL schema."""

from __future__ import annotations

import csv
import io
import os
import socket
import subprocess
from pathlib import Path

import dashboard_fixtures as fx
import pytest
import sqlalchemy as sa
from dapo_cli import dapo

from db import ablation, migrate, table_format
from db import engine as db_engine
from db.mechanism_table import mechanism_table

ROOT = Path(__file__).resolve().parents[2]


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The process failed with exactly one line on stderr, `error: ...`, and no traceback."""
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in done.stderr
    return lines[0]


def test_upgrade_then_current_on_a_new_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    url = f"sqlite:///{path}"
    current = dapo("db", "current", "--url", url)
    assert current.returncode == 0 and "the file does not exist yet" in current.stdout
    assert not path.exists()  # looking does not create it
    done = dapo("db", "upgrade", "--url", url)
    assert done.returncode == 0, done.stderr
    assert f"upgraded schema from (empty) to {migrate.head_revision()}" in done.stdout
    again = dapo("db", "upgrade", url=url)  # the URL from the environment this time
    assert "is at the newest schema revision" in again.stdout
    current = dapo("db", "current", url=url)
    assert f"revision: {migrate.head_revision()} (up to date)" in current.stdout


def test_current_and_upgrade_on_postgres(request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("pg_schemas")()
    assert "revision: none (empty" in dapo("db", "current", url=url).stdout
    assert dapo("db", "upgrade", url=url).returncode == 0
    assert "(up to date)" in dapo("db", "current", url=url).stdout


@pytest.fixture
def filled(store_url: str) -> fx.FixtureStore:
    return fx.build_store(store_url)


def run_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The dispatcher's main() in this process (same code path, no interpreter start)."""
    from dapo_lab.cli import main

    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_table_text_markdown_and_csv(
    filled: fx.FixtureStore, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = ("--sweep", str(filled.sweep_id), "--url", filled.url)
    lines = run_in_process(capsys, "table", *sweep, "--wide").splitlines()
    assert lines[0].startswith(f"sweep {filled.sweep_id} 'ladder' (preset tiny, running)")
    assert "aime2024 avg@4" in lines[0]
    body = [line.split()[0] for line in lines[4 : 4 + len(fx.ARMS)]]
    assert body == fx.ARMS  # ladder order
    grpo, dapo_row = lines[4], lines[3 + len(fx.ARMS)]
    assert "32.0 [6.6, 57.4]" in grpo and "completed" in grpo  # mean [95% t-interval]
    # one seed: a bare number, and what that means said once under the table
    assert "  +7.0  " in dapo_row and "running" in dapo_row and "interval" not in dapo_row
    assert lines[4 + len(fx.ARMS)] == table_format.SINGLE_NOTE
    # the headline under the rows, then the comparisons, then the protocol line last
    assert any(line.startswith("No arm leads significantly: dapo − token_loss") for line in lines)
    assert lines[-1].startswith("protocol: eval aime2024 (50 problems), avg@4")

    md = run_in_process(capsys, "table", *sweep, "--format", "markdown")
    table_md = md.split("\n\n")[0]  # the ablation table; the comparisons' table follows
    rows = [r for r in table_md.splitlines() if r.startswith("| ")]
    assert rows[0].startswith("| arm | adds | n | start | final | gain | parent | Δ parent |")
    assert [r.split(" | ")[0][2:] for r in rows[1:]] == fx.ARMS
    assert "| 44.0 | — |" in rows[4]  # soft_punish: seed 1 failed

    out = run_in_process(capsys, "table", *sweep, "--format", "csv")
    parsed = list(csv.DictReader(io.StringIO(out)))
    engine = db_engine.get_engine(filled.url)
    table = ablation.ablation_table(engine, filled.sweep_id)
    assert [r["arm"] for r in parsed] == fx.ARMS
    for row, (_, expected) in zip(parsed, table.iterrows(), strict=True):
        assert float(row["score_mean_pct"]) == pytest.approx(100 * expected["score_mean"])
        assert row["status"] == expected["status"]
    assert parsed[0]["delta_parent_pct"] == ""
    # dapo − grpo on seed 0 only (50 − 30): a number, and no interval
    assert float(parsed[-1]["delta_base_pct"]) == pytest.approx(20.0)
    assert parsed[-1]["delta_base_low_pct"] == "" and parsed[-1]["delta_base_n"] == "1"
    # token_loss − grpo = (13, 12) pp: 12.5 ± 12.7062 · 0.5 -> [6.146898, 18.853102]
    assert float(parsed[4]["delta_base_low_pct"]) == pytest.approx(6.146898, abs=1e-5)


def test_table_mechanisms_prints_each_arms_own_metrics(
    filled: fx.FixtureStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dapo table --mechanisms`: the same rows as db.mechanisms renders from the store, the
    focus metrics only by default, every metric with --all-metrics; CSV carries the numbers."""
    from db import mechanisms

    sweep = ("--sweep", str(filled.sweep_id), "--url", filled.url)
    frame = mechanism_table(db_engine.get_engine(filled.url), filled.sweep_id, window=3)
    text = run_in_process(capsys, "table", *sweep, "--mechanisms", "--window", "3")
    assert text == mechanisms.render(frame, "text", focus_only=True)
    assert text.startswith("per seed, the metric's mean over the first and the last 3 rollout")
    assert "◆ clip_ratio/high (%)" in text and "acc/mean" not in text
    every = run_in_process(
        capsys, "table", *sweep, "--mechanisms", "--all-metrics", "--window", "3"
    )
    assert "acc/mean" in every and len(every.splitlines()) > len(text.splitlines())
    rows = list(
        csv.DictReader(
            io.StringIO(run_in_process(capsys, "table", *sweep, "--mechanisms", "--format", "csv"))
        )
    )
    # the default window, 10 rollout steps, is cut to the runs' length (fx.STEPS = 5)
    assert {r["arm"] for r in rows} == set(fx.ARMS) and rows[0]["window"] == str(fx.STEPS)
    line = one_error_line(dapo("table", *sweep, "--mechanisms", "--window", "0"))
    assert line == "error: --window 0: at least 1 rollout step"


def test_the_console_script_prints_the_table(filled: fx.FixtureStore) -> None:
    done = dapo("table", "--sweep", str(filled.sweep_id), "--wide", url=filled.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[4 : 4 + len(fx.ARMS)]] == fx.ARMS


def test_table_defaults_to_the_newest_sweep(
    filled: fx.FixtureStore, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_in_process(capsys, "table", "--format", "markdown", "--url", filled.url)
    table_md = out.split("\n\n")[0]  # the ablation table; the comparisons' table follows
    arms = [r.split(" | ")[0][2:] for r in table_md.splitlines()[2:] if r.startswith("| ")]
    assert arms == fx.ARMS[:2]


def test_an_unknown_dataset_or_k_names_those_there_are(filled: fx.FixtureStore) -> None:
    for args in (("--dataset", "nosuch"), ("--k", "99")):
        done = dapo("table", "--sweep", str(filled.sweep_id), *args, url=filled.url)
        line = one_error_line(done)
        assert done.returncode == 2 and "it has: aime2024 avg@4" in line and not done.stdout


def test_a_missing_sweep_is_one_line(filled: fx.FixtureStore) -> None:
    line = one_error_line(dapo("table", "--sweep", "424242", url=filled.url))
    assert line.startswith("error: no sweep with id 424242 in ")


def test_an_empty_store_and_a_missing_file_are_one_line(tmp_path: Path) -> None:
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert dapo("db", "upgrade", url=empty).returncode == 0
    assert "has no sweeps yet" in one_error_line(dapo("table", url=empty))
    missing = tmp_path / "typo.db"
    line = one_error_line(dapo("table", "--url", f"sqlite:///{missing}"))
    assert f"no store at {missing}" in line and not missing.exists()


def test_an_unreachable_server_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg://someone:hunter2@127.0.0.1:{port}/test"
    for args in (("table",), ("db", "current"), ("db", "upgrade")):
        line = one_error_line(dapo(*args, url=url))
        assert line.startswith("error: cannot open the store postgresql+psycopg://someone:***@")
        assert "hunter2" not in line and "Connection refused" in line


@pytest.mark.parametrize(
    "url",
    ["postgresql+psycopg://u@h:notaport/db", "http://example.com/x", "sqlite:////nope/dir/x.db"],
)
def test_malformed_urls_are_one_line(url: str) -> None:
    line = one_error_line(dapo("table", url=url))
    assert any(word in line for word in ("malformed", "unsupported", "no store at"))


def test_a_newer_store_is_refused_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'future.db'}"
    assert dapo("db", "upgrade", url=url).returncode == 0
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0999_future'"))
    engine.dispose()
    line = one_error_line(dapo("table", url=url))
    assert "'0999_future', newer than this dapo-lab" in line
    assert "NEWER than this code" in dapo("db", "current", url=url).stdout
    assert "newer" in one_error_line(dapo("db", "upgrade", url=url))


def test_help_names_the_store() -> None:
    done = dapo("--help")
    assert "DAPO_DB_URL" in done.stdout and "table" in done.stdout and "db" in done.stdout
    assert dapo("db").returncode == 2


def test_every_store_command_takes_store_and_still_takes_url(tmp_path: Path) -> None:
    """One flag name for the store in every command (`--url` stays as a hidden alias)."""
    url = f"sqlite:///{tmp_path / 'flag.db'}"
    assert dapo("db", "upgrade", "--store", url).returncode == 0
    assert "(up to date)" in dapo("db", "current", "--store", url).stdout
    assert "has no sweeps yet" in one_error_line(dapo("table", "--store", url))
    assert "(up to date)" in dapo("db", "current", "--url", url).stdout
    for command in (("db", "upgrade"), ("db", "current"), ("table",)):
        shown = dapo(*command, "--help").stdout
        assert "--store URL" in shown and "--url" not in shown


def test_a_foreign_sqlite_file_is_refused_until_upgraded_on_purpose(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "notes.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.close()
    before = path.read_bytes()
    url = f"sqlite:///{path}"
    line = one_error_line(dapo("sweep", "--arms", "grpo", "--store", url))
    assert line == (
        f"error: {url} is not a DAPO Lab store: it holds 1 other table(s) (notes); point "
        "--store at an empty database, or run `dapo db upgrade --store URL` to add the store's "
        "tables to it"
    )
    assert path.read_bytes() == before
    assert "not a DAPO Lab store: it holds notes" in dapo("db", "current", "--store", url).stdout
    assert dapo("db", "upgrade", "--store", url).returncode == 0
    assert "(up to date)" in dapo("db", "current", "--store", url).stdout


def test_table_reads_a_store_in_a_read_only_directory(tmp_path: Path) -> None:
    """`dapo table` opens the store read-only: nothing is created beside it, and it works
    where nothing can be written at all (a SQLite matter: a server has no directory)."""
    directory = tmp_path / "stores"
    directory.mkdir()
    url = f"sqlite:///{directory / 'dapo.db'}"
    filled = fx.build_store(url)
    db_engine.dispose(url)  # the last connection closes: the WAL is folded into the file
    path = directory / "dapo.db"
    before = sorted(p.name for p in directory.iterdir())
    directory.chmod(0o555)
    mounted = False
    try:
        if os.geteuid() == 0:  # root writes anyway: make it a read-only file system instead
            ro = tmp_path / "ro"
            ro.mkdir()
            subprocess.run(["mount", "--bind", str(directory), str(ro)], check=True)
            mounted = True
            subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
            path = ro / path.name
        url = f"sqlite:///{path}"
        done = dapo("table", "--sweep", str(filled.sweep_id), "--store", url, "--wide")
        assert done.returncode == 0, done.stderr
        assert [line.split()[0] for line in done.stdout.splitlines()[4:] if line.strip()][
            : len(fx.ARMS)
        ] == fx.ARMS
        line = one_error_line(dapo("sweep", "--arms", "grpo", "--store", url))
        assert f"is in a read-only directory ({path.parent})" in line
        assert sorted(p.name for p in path.parent.iterdir()) == before
    finally:
        if mounted:
            subprocess.run(["umount", str(tmp_path / "ro")], check=False)
        directory.chmod(0o755)
