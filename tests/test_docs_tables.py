"""scripts/docs_tables.py: the docs' results tables are rewritten from a store, between their
markers only, as `dapo table --format markdown` prints them.

The store is the dashboard tests' fixture (tests/dashboard_fixtures.py: sweep "ladder", six arms
× two seeds, and the newer sweep "tiny-check"), written through db.store without training.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import dashboard_fixtures as fx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_script(name: str = "docs_tables") -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / f"scripts/{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


dt = _load_script()

PAGE = """# Results

Prose before, with a marker quoted in it: `<!-- table:ladder -->` is not one.

<!-- table:ladder -->
| an old | hand-typed table |
|---|---|
<!-- /table:ladder -->

Prose between.

<!-- table:ladder-mechanisms -->
<!-- /table:ladder-mechanisms -->

```text
<!-- /table:ladder --> inside code, not alone on its line: ignored
```
"""
CONFIG = """
[[table]]
name = "ladder"
page = "docs/results.md"
sweep = "dapo sweep --preset tiny --seeds 0,1 --name ladder"

[[table]]
name = "ladder-mechanisms"
page = "docs/results.md"
sweep = "dapo sweep --preset tiny --seeds 0,1 --name ladder"
flags = ["--mechanisms"]

[[table]]
name = "check"
page = "README.md"
sweep = "dapo sweep --preset tiny --arms grpo,overlong_filter --name=tiny-check"
"""


def _blocks(text: str) -> dict[str, str]:
    """Each marked block's body, by name."""
    out = {}
    for name in dt.marker_names(text):
        start = text.index(f"<!-- table:{name} -->\n") + len(f"<!-- table:{name} -->\n")
        out[name] = text[start : text.index(f"<!-- /table:{name} -->", start)]
    return out


def _outside(text: str) -> str:
    """The page with every marked block's body cut out: what the script must never touch."""
    for name, body in _blocks(text).items():
        text = text.replace(f"<!-- table:{name} -->\n{body}", f"<!-- table:{name} -->\n")
    return text


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('docs-tables') / 'store.db'}"
    fx.build_store(url)
    return url


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A repository root with two pages holding three tables, and their config."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/results.md").write_text(PAGE, encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "# Lab\n\n<!-- table:check -->\nold\n<!-- /table:check -->\n\nThe end.\n", encoding="utf-8"
    )
    (tmp_path / "tables.toml").write_text(CONFIG, encoding="utf-8")
    return tmp_path


def _main(site: Path, store_url: str, *extra: str) -> int:
    args = ["--config", str(site / "tables.toml"), "--root", str(site), "--store", store_url]
    return int(dt.main([*args, *extra]))


def test_tables_are_rewritten_from_the_store_and_nothing_else_moves(
    site: Path, store_url: str
) -> None:
    results, readme = site / "docs/results.md", site / "README.md"
    before = results.read_text(encoding="utf-8"), readme.read_text(encoding="utf-8")

    assert _main(site, store_url, "--check") == 1  # hand-typed tables differ from the store's
    assert (results.read_text(encoding="utf-8"), readme.read_text(encoding="utf-8")) == before

    assert _main(site, store_url) == 0
    text = results.read_text(encoding="utf-8")
    assert _outside(text) == _outside(before[0])  # prose, code and markers byte for byte
    blocks = _blocks(text)
    # The ablation table of sweep "ladder": a row per arm, in ladder order, and its caption.
    ladder = blocks["ladder"]
    first_table = ladder.split("\n\n")[0].splitlines()
    rows = [line.split("|")[1].strip() for line in first_table if line.startswith("| ")]
    assert rows[1:] == fx.ARMS  # rows[0] is the header
    assert "hand-typed" not in ladder and "sweep 1 'ladder'" in ladder
    # grpo's final over seeds 0 and 1 (30 and 34 %) is 32.0: the store's numbers, not retyped.
    assert "| 32.0 [" in ladder
    # The mechanism table of the same sweep, from the entry's own flag.
    assert "response_length/clip_ratio" in blocks["ladder-mechanisms"]
    assert "| arm | parent | changes | metric |" in blocks["ladder-mechanisms"]
    # The other page's table comes from the other sweep (found by `--name=` too).
    readme_text = readme.read_text(encoding="utf-8")
    assert "sweep 2 'tiny-check'" in readme_text and readme_text.endswith("\n\nThe end.\n")

    # Run again: nothing to change, and --check agrees.
    assert _main(site, store_url) == 0
    assert results.read_text(encoding="utf-8") == text
    assert _main(site, store_url, "--check") == 0


def test_a_block_is_what_the_dapo_table_command_prints(site: Path, store_url: str) -> None:
    assert _main(site, store_url, "--only", "ladder-mechanisms") == 0
    printed = subprocess.run(
        [
            str(Path(sys.executable).with_name("dapo")),
            *shlex.split(f"table --store {store_url} --sweep 1 --format markdown --mechanisms"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    body = _blocks((site / "docs/results.md").read_text(encoding="utf-8"))["ladder-mechanisms"]
    assert body == printed.strip() + "\n"
    # --only left the other table as it was.
    assert "hand-typed" in (site / "docs/results.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("page", "problem"),
    [
        ("no markers here\n", "found 0 and 0"),
        ("<!-- table:t -->\n<!-- /table:t -->\n<!-- table:t -->\n", "found 2 and 1"),
        ("<!-- /table:t -->\nx\n<!-- table:t -->\n", "closing marker comes before"),
        ("<!-- table:t -->\n<!-- table:u -->\n<!-- /table:u -->\n<!-- /table:t -->\n", "inside"),
    ],
)
def test_replace_block_refuses_markers_it_cannot_trust(page: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        dt.replace_block(page, "t", "| new |")


def test_replace_block_keeps_the_markers_on_their_own_lines() -> None:
    page = "a\n<!-- table:t -->\nold\nrows\n<!-- /table:t -->\nb\n"
    assert dt.replace_block(page, "t", "\n| new |\n\n") == (
        "a\n<!-- table:t -->\n| new |\n<!-- /table:t -->\nb\n"
    )


def test_an_unknown_sweep_is_one_line_and_exit_2(
    site: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (site / "tables.toml").write_text(
        CONFIG.replace("--name ladder", "--name nowhere"), encoding="utf-8"
    )
    assert _main(site, store_url) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: no sweep named 'nowhere' in the store (its sweeps: ladder, tiny-check)"


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ('name = "t"\npage = "p.md"\nsweep = "dapo sweep --preset tiny"', "gives no --name"),
        ('name = "t"\npage = "p.md"\nsweep = "dapo arm --name x"', "not a `dapo sweep`"),
        ('name = "t"\nsweep = "dapo sweep --name x"', "needs page"),
        (
            'name = "t"\npage = "p.md"\nsweep = "dapo sweep --name x"\nflags = ["--sweep", "3"]',
            "sets --sweep",
        ),
        ('name = "t t"\npage = "p.md"\nsweep = "dapo sweep --name x"', "a name is"),
    ],
)
def test_a_malformed_entry_is_refused(tmp_path: Path, entry: str, problem: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(f"[[table]]\n{entry}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=problem):
        dt.load_config(path)


def test_run_gives_each_sweep_command_the_store() -> None:
    argv = dt.sweep_argv("dapo sweep --preset tiny --seeds 0,1 --name x", "/v/dapo", "sqlite:///s")
    assert argv == ["/v/dapo", "sweep", "--preset", "tiny", "--seeds", "0,1", "--name", "x",
                    "--store", "sqlite:///s"]  # fmt: skip


def test_the_repository_tables_and_their_markers_match() -> None:
    """Every table the config names is marked once in its page, every marker in the README and
    docs has an entry, and every sweep command is one `dapo sweep` accepts."""
    from dapo_lab.cli import build_parser

    tables = dt.load_config(dt.CONFIG)
    pages = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]
    marked = {
        (str(p.relative_to(ROOT)), name)
        for p in pages
        for name in dt.marker_names(p.read_text(encoding="utf-8"))
    }
    # docs/mechanisms.md's tables are scripts/scoreboard.py's (tests/db/test_scoreboard.py)
    scoreboard = {("docs/mechanisms.md", name) for name in _load_script("scoreboard").TABLES}
    assert marked == {(t.page, t.name) for t in tables} | scoreboard
    for table in tables:
        dt.replace_block((ROOT / table.page).read_text(encoding="utf-8"), table.name, "x")
    parser = build_parser()
    for command in {t.sweep for t in tables}:
        args = parser.parse_args(shlex.split(command)[1:])
        assert args.command == "sweep" and args.name == dt.sweep_name(command)
