"""Ladders as data: the file format's checks (one line each), round trips, built-in ladders,
grids and `dapo arms`."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import pytest

from dapo_common.util import flatten
from dapo_core.setup.config import ConfigError, ExperimentConfig
from dapo_core.setup.ladders import (
    BUILTIN_LADDERS,
    NAME_RE,
    Ladder,
    artifact_slug,
    builtin_ladder,
    expand_grid,
    grid_arm_name,
    paper_ladder,
    resolve_ladder,
)
from dapo_core.setup.presets import PRESETS
from dapo_lab.cli import main

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
# a comment survives nothing, but parses
name = "beyond the paper"
description = "two arms"

[[arms]]
name = "base"
from = "dapo"
adds = "the paper's DAPO"

[[arms]]
name = "eps32"
adds = "epsilon_high 0.32"
set = { "algo.clip_high" = 0.32 }
"""


def _flat(cfg: Any) -> dict[str, Any]:
    out = flatten(cfg.to_dict())
    out.pop("arm")
    return out


def _diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: b[k] for k in a if a[k] != b[k]}


# --- the file format ---------------------------------------------------------------------------
def test_the_issues_example_parses_with_parents_and_cumulative_changes() -> None:
    ladder = Ladder.from_toml(GOOD, source="mine.toml")
    base, eps = ladder.arms
    assert ladder.name == "beyond the paper" and ladder.names == ("base", "eps32")
    # `base` starts from the paper's dapo arm: a root, the same config, the paper's score.
    assert (base.parent, base.start, base.changes) == (None, "dapo", {})
    assert base.paper_score == 50.0
    assert _flat(ladder.config("base")) == _flat(paper_ladder().config("dapo"))
    # `eps32` builds on the previous arm by default and changes exactly one field.
    assert (eps.parent, eps.changes) == ("base", {"algo.clip_high": 0.32})
    assert eps.cumulative == {**paper_ladder().changes("dapo"), "algo.clip_high": 0.32}
    assert _diff(_flat(ladder.config("base")), _flat(ladder.config("eps32"))) == {
        "algo.clip_high": 0.32
    }
    assert ladder.rows() == [
        {
            "arm": "base",
            "adds": "the paper's DAPO",
            "parent": None,
            "paper_score": 50.0,
            "grid": {},
        },
        {
            "arm": "eps32",
            "adds": "epsilon_high 0.32",
            "parent": "base",
            "paper_score": None,
            "grid": {},
        },
    ]


def test_from_names_an_earlier_arm_and_user_overrides_come_last() -> None:
    text = GOOD + '\n[[arms]]\nname = "eps24"\nfrom = "base"\nset = { "algo.clip_high" = 0.24 }\n'
    ladder = Ladder.from_toml(text)
    assert ladder.arm("eps24").parent == "base"
    assert ladder.arm("eps24").adds == "algo.clip_high=0.24"  # the default says what it sets
    cfg = ladder.config("eps24", "tiny", {"run.steps": 3, "algo.clip_high": 0.5})
    assert (cfg.arm, cfg.run.steps, cfg.algo.clip_high) == ("eps24", 3, 0.5)


def test_values_are_typed_like_the_config_fields() -> None:
    text = (
        'name = "t"\n[[arms]]\nname = "a"\nfrom = "grpo"\n'
        'set = { "algo.kl_coef" = 0, "algo.clip_c" = 3, "optim.betas" = [0.9, 0.95] }\n'
        '[[arms]]\nname = "b"\nset = { "algo.clip_c" = "none" }\n'
    )
    ladder = Ladder.from_toml(text)
    a = ladder.arm("a").changes
    # TOML's 0 for a float field stays a float, or the config hash would change with spelling.
    assert a == {"algo.kl_coef": 0.0, "algo.clip_c": 3.0, "optim.betas": (0.9, 0.95)}
    assert all(type(v) is float for v in (a["algo.kl_coef"], a["algo.clip_c"]))
    assert ladder.config("b").algo.clip_c is None  # TOML has no null: "none" unsets


def _bad(arms: str, header: str = 'name = "mine"\n') -> str:
    return header + arms


# Each case: a file and what its one line must say (the file, the arm, what to change).
BAD_FILES: dict[str, tuple[str, list[str]]] = {
    "not_toml": ('name = "x"\n[[arms]\n', ["bad.toml: not valid TOML"]),
    "unknown_top_key": (
        'name = "x"\nladder = 1\n[[arms]]\nname = "a"\n',
        ["bad.toml: unknown key 'ladder'", "name, description, arms"],
    ),
    "no_name": ('[[arms]]\nname = "a"\n', ['bad.toml: missing `name = "..."`']),
    "no_arms": ('name = "x"\n', ["bad.toml: no [[arms]]"]),
    "unknown_arm_key": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\nsett = {}\n'),
        ["bad.toml: arm 'a': unknown key 'sett'", "name, from, adds, set, paper_score, grid"],
    ),
    "arm_without_name": (
        _bad('[[arms]]\nadds = "x"\n'),
        ["bad.toml: arm #1: missing `name"],
    ),
    "unknown_field": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\nset = { "algo.clip_hgh" = 0.3 }\n'),
        ["bad.toml: arm 'a': set algo.clip_hgh: no such config field (algo has:", "clip_high"],
    ),
    "unknown_section": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\nset = { "algorithm.clip_high" = 0.3 }\n'),
        ["bad.toml: arm 'a':", "unknown section 'algorithm'", "algo"],
    ),
    "undotted_key": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\nset = { "clip_high" = 0.3 }\n'),
        ["bad.toml: arm 'a':", "use section.field"],
    ),
    "wrong_type": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\nset = { "algo.clip_high" = "high" }\n'),
        ["bad.toml: arm 'a': set algo.clip_high='high': expected a number"],
    ),
    "bad_value": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\nset = { "algo.clip_high" = 0.1 }\n'),
        ["bad.toml: arm 'a':", "algo.clip_high=0.1 < clip_low=0.2"],
    ),
    "bad_choice": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\nset = { "algo.loss_mode" = "ppo" }\n'),
        ["bad.toml: arm 'a':", "algo.loss_mode='ppo'", "gspo"],
    ),
    "duplicate": (
        _bad(
            '[[arms]]\nname = "a"\nfrom = "dapo"\n[[arms]]\nname = "b"\n'
            'set = { "algo.clip_high" = 0.3 }\n[[arms]]\nname = "a"\nset = { "algo.clip_high" = 0.4 }\n'
        ),
        ["bad.toml: arm 'a': defined twice (arms #1 and #3)", "its own name"],
    ),
    "from_unknown": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo2"\n'),
        ["bad.toml: arm 'a': from = 'dapo2' is unknown", "grpo", "dapo"],
    ),
    "from_later": (
        _bad(
            '[[arms]]\nname = "a"\nfrom = "dapo"\n[[arms]]\nname = "b"\nfrom = "c"\n'
            'set = { "algo.clip_high" = 0.3 }\n[[arms]]\nname = "c"\nfrom = "b"\n'
            'set = { "algo.clip_high" = 0.4 }\n'
        ),
        ["bad.toml: arm 'b': from = 'c' is not an earlier arm", "no cycles"],
    ),
    "from_itself": (
        _bad(
            '[[arms]]\nname = "a"\nfrom = "dapo"\n[[arms]]\nname = "b"\nfrom = "b"\n'
            'set = { "algo.clip_high" = 0.3 }\n'
        ),
        ["bad.toml: arm 'b': from = 'b' is not an earlier arm"],
    ),
    "identical_to_parent": (
        _bad(
            '[[arms]]\nname = "a"\nfrom = "dapo"\n[[arms]]\nname = "b"\n'
            'set = { "algo.clip_high" = 0.28 }\n'
        ),
        ["bad.toml: arm 'b': same config as its parent 'a' on preset 'tiny'", "set"],
    ),
    "identical_by_default_value": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\n[[arms]]\nname = "b"\n'),
        ["bad.toml: arm 'b': same config as its parent 'a'"],
    ),
    "unsafe_name": (
        _bad('[[arms]]\nname = "Eps 32"\nfrom = "dapo"\n'),
        ["bad.toml: arm 'Eps 32': the name must be lowercase letters", "'eps_32'"],
    ),
    "long_name": (
        _bad(f'[[arms]]\nname = "{"a" * 101}"\nfrom = "dapo"\n'),
        ["bad.toml: arm 'aaaa", "at most 100"],
    ),
    "paper_name_with_other_config": (
        _bad('[[arms]]\nname = "dapo"\nfrom = "grpo"\n'),
        ["bad.toml: arm 'dapo': 'dapo' is the paper's arm of that name", 'from = "dapo"'],
    ),
    "set_arm": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\nset = { "arm" = "b" }\n'),
        ["bad.toml: arm 'a': set 'arm': not settable here"],
    ),
    "set_not_table": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\nset = 0.3\n'),
        ["bad.toml: arm 'a': `set` must be a table"],
    ),
    "bad_score": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\npaper_score = "50"\n'),
        ["bad.toml: arm 'a': paper_score='50': expected a number"],
    ),
    "grid_disagrees": (
        _bad('[[arms]]\nname = "a"\nfrom = "dapo"\ngrid = { "algo.clip_high" = 0.3 }\n'),
        ["bad.toml: arm 'a': grid says algo.clip_high=0.3 but its config has 0.28"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_each_mistake_is_one_line_naming_file_arm_and_fix(case: str) -> None:
    text, needles = BAD_FILES[case]
    with pytest.raises(ConfigError) as err:
        Ladder.from_toml(text, source="bad.toml")
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (case, message)


def test_the_first_error_in_file_order_wins() -> None:
    # Arm 1's bad value is reported, not arm 2's unknown key, although configs are built later
    # than keys are read within one arm.
    text = _bad(
        '[[arms]]\nname = "a"\nfrom = "dapo"\nset = { "algo.clip_high" = 0.1 }\n'
        '[[arms]]\nname = "b"\nnope = 1\n'
    )
    with pytest.raises(ConfigError, match="arm 'a'"):
        Ladder.from_toml(text, source="bad.toml")


def test_identical_to_parent_is_judged_on_the_preset() -> None:
    # group_size 16 is the qwen2.5-7b preset's own value, but a change on tiny (8).
    text = _bad(
        '[[arms]]\nname = "a"\nfrom = "dapo"\n[[arms]]\nname = "g16"\n'
        'set = { "rollout.group_size" = 16 }\n'
    )
    assert Ladder.from_toml(text, preset="tiny").names == ("a", "g16")
    with pytest.raises(ConfigError, match=re.escape("parent 'a' on preset 'qwen2.5-7b'")):
        Ladder.from_toml(text, source="bad.toml", preset="qwen2.5-7b")


# --- round trips ---------------------------------------------------------------------------------
def _round_trips(ladder: Ladder) -> None:
    again = Ladder.from_toml(ladder.to_toml(), source="again.toml")
    assert again == ladder
    assert again.rows() == ladder.rows()
    assert Ladder.from_dict(ladder.to_dict()) == ladder
    assert pickle.loads(pickle.dumps(ladder)) == ladder  # Ray and Prefect may pickle it
    for name in ladder.names:
        assert again.config(name).config_hash() == ladder.config(name).config_hash()


@pytest.mark.parametrize("name", BUILTIN_LADDERS)
def test_builtin_ladders_round_trip(name: str) -> None:
    _round_trips(builtin_ladder(name))


def test_files_and_grids_round_trip() -> None:
    _round_trips(Ladder.from_toml(GOOD))
    _round_trips(expand_grid("dapo", [("algo.clip_high", [0.24, 0.28, 0.32])]))
    # A base inside another ladder, a long `set` (written as a sub-table), a tuple, a None.
    _round_trips(
        expand_grid(
            builtin_ladder("beyond-dapo"),
            [("optim.betas", [[0.9, 0.95], [0.9, 0.999]]), ("algo.clip_c", ["none", 3.0])],
            arm="gspo",
        )
    )


def test_to_toml_writes_what_a_person_would() -> None:
    text = Ladder.from_toml(GOOD).to_toml()
    assert 'name = "eps32"\nadds = "epsilon_high 0.32"\nset = { "algo.clip_high" = 0.32 }' in text
    assert 'from = "dapo"' in text and "paper_score = 50.0" in text


# --- built-in ladders ------------------------------------------------------------------------
def test_paper_ladder_is_arms_py() -> None:
    paper = paper_ladder()
    assert paper.names == paper_ladder().names
    assert [r["parent"] for r in paper.rows()] == [None, *paper_ladder().names[:-1]]


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("name", BUILTIN_LADDERS)
def test_builtin_ladders_build_valid_configs_and_each_arm_changes_only_its_own_fields(
    name: str, preset: str
) -> None:
    ladder = resolve_ladder(name, preset=preset)
    assert ladder.source == f"built-in ladder {name!r}"
    for arm in ladder.arms:
        cfg = _flat(ladder.config(arm.name, preset))
        assert NAME_RE.fullmatch(arm.name) and arm.adds
        if arm.parent is None:
            continue
        changed = _diff(_flat(ladder.config(arm.parent, preset)), cfg)
        # Something changes, and only fields the arm names (a key equal to the parent's value
        # may be named for the record, e.g. TIS's cap).
        assert changed, arm.name
        assert set(changed) <= set(arm.changes), arm.name
        assert all(cfg[k] == v for k, v in arm.changes.items()), arm.name


def test_beyond_dapo_is_dapo_plus_tis_then_one_idea_each() -> None:
    ladder = builtin_ladder("beyond-dapo")
    assert ladder.names == ("dapo", "tis", "mis", "gspo", "cispo", "rloo", "batch_std")
    assert [r["parent"] for r in ladder.rows()] == [None, "dapo", *["tis"] * 5]
    assert _flat(ladder.config("dapo")) == _flat(paper_ladder().config("dapo"))
    tis = _flat(ladder.config("tis"))
    expected = {
        "mis": {"algo.rollout_correction": "mis"},
        "gspo": {"algo.loss_mode": "gspo", "algo.clip_low": 0.0003, "algo.clip_high": 0.0004},
        "cispo": {"algo.loss_mode": "cispo"},
        "rloo": {"algo.adv_estimator": "rloo"},
        "batch_std": {"algo.adv_estimator": "grpo_batch_std"},
    }
    for arm, change in expected.items():
        assert _diff(tis, _flat(ladder.config(arm))) == change, arm
        assert re.search(r"arXiv \d{4}\.\d{5}|et al\. 20\d\d", ladder.arm(arm).adds), arm


def test_dr_grpo_is_grpo_then_its_two_fixes() -> None:
    ladder = builtin_ladder("dr-grpo")
    assert ladder.names == ("grpo", "no_std", "dr_grpo")
    grpo, no_std, dr = (_flat(ladder.config(n)) for n in ladder.names)
    assert grpo == _flat(paper_ladder().config("grpo"))
    assert _diff(grpo, no_std) == {"algo.scale_adv_by_std": False}
    assert _diff(no_std, dr) == {"algo.loss_agg": "seq-mean-token-sum-norm"}


def test_resolve_ladder_by_path_and_its_mistakes(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    assert resolve_ladder(str(path)).names == ("base", "eps32")
    with pytest.raises(ConfigError, match=r"^unknown ladder 'papers': give a built-in ladder"):
        resolve_ladder("papers")
    with pytest.raises(ConfigError, match=r"ladder file .*nope\.toml does not exist"):
        resolve_ladder(str(tmp_path / "nope.toml"))


# --- grids ---------------------------------------------------------------------------------------
def test_grid_is_the_cartesian_product_named_by_its_values() -> None:
    grid = expand_grid(
        "dapo", [("algo.clip_high", [0.24, 0.28, 0.32]), ("rollout.group_size", [8, 16])]
    )
    # 3 × 2 points; (0.28, 8) is dapo itself on tiny, so it is the base, not a seventh arm.
    assert grid.names == (
        "dapo",
        "dapo-clip_high=0.24-group_size=8",
        "dapo-clip_high=0.24-group_size=16",
        "dapo-clip_high=0.28-group_size=16",
        "dapo-clip_high=0.32-group_size=8",
        "dapo-clip_high=0.32-group_size=16",
    )
    assert all(NAME_RE.fullmatch(n) for n in grid.names)
    rows = grid.rows()
    assert rows[0]["grid"] == {"algo.clip_high": 0.28, "rollout.group_size": 8}
    assert rows[0]["parent"] is None and rows[0]["paper_score"] == 50.0
    assert {r["parent"] for r in rows[1:]} == {"dapo"}
    assert rows[1]["grid"] == {"algo.clip_high": 0.24, "rollout.group_size": 8}
    assert rows[1]["adds"] == "clip_high=0.24, group_size=8"
    for row in rows[1:]:
        cfg = grid.config(row["arm"])
        assert (cfg.algo.clip_high, cfg.rollout.group_size) == tuple(row["grid"].values())
        assert _diff(_flat(grid.config("dapo")), _flat(cfg)).keys() <= row["grid"].keys()


def test_a_base_outside_the_grid_stays_first_and_keeps_its_own_value() -> None:
    grid = expand_grid("dapo", [("algo.clip_high", [0.3, 0.35])])
    assert grid.names == ("dapo", "dapo-clip_high=0.3", "dapo-clip_high=0.35")
    assert grid.rows()[0]["grid"] == {"algo.clip_high": 0.28}


def test_grid_names_are_deterministic_and_safe() -> None:
    assert grid_arm_name("dapo", {"algo.clip_high": 0.24}) == "dapo-clip_high=0.24"
    assert grid_arm_name("x", {"optim.lr": 1e-6}) == "x-lr=1e-06"
    assert grid_arm_name("x", {"optim.lr": 1e20}) == "x-lr=1e20"  # no '+' in a name
    assert grid_arm_name("x", {"algo.dynamic_sampling": False}) == "x-dynamic_sampling=false"
    assert grid_arm_name("x", {"data.train": "Data/My Set.jsonl"}) == "x-train=data_my_set.jsonl"
    with pytest.raises(ConfigError, match="both give the arm name"):
        expand_grid("grpo", [("data.train", ["a/b.jsonl", "a b.jsonl"])])


@pytest.mark.parametrize(
    ("grids", "needle"),
    [
        ([], "at least one key"),
        ([("algo.clip_high", [])], "needs a list of values"),
        ([("algo.clip_high", [0.3, 0.3])], "lists 0.3 twice"),
        ([("algo.clip_high", [0.3]), ("algo.clip_high", [0.4])], "given twice"),
        ([("algo.clip_hgh", [0.3])], "grid: algo.clip_hgh: no such config field"),
        ([("algo.clip_high", ["x"])], "grid: algo.clip_high='x': expected a number"),
        ([("algo.clip_high", [0.1])], "arm 'dapo-clip_high=0.1': algo.clip_high=0.1 < clip_low"),
    ],
)
def test_grid_mistakes(grids: list[tuple[str, list[Any]]], needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        expand_grid("dapo", grids)


# --- odds and ends -------------------------------------------------------------------------------
def test_artifact_slug_fits_prefect_keys_and_never_merges_two_names() -> None:
    assert artifact_slug("dapo") == "dapo"
    slugs = {artifact_slug(n) for n in ("dapo-clip_high=0.24", "dapo-clip-high-0-24", "a.b")}
    assert len(slugs) == 3
    assert all(re.fullmatch(r"[a-z0-9-]+", s) for s in slugs)


def test_docs_example_ladders_parse() -> None:
    """docs/config_names.md's TOML examples are real ladder files."""
    text = (ROOT / "docs" / "config_names.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    assert blocks
    for block in blocks:
        Ladder.from_toml(block, source="docs/config_names.md", preset="paper")


# --- dapo arms -----------------------------------------------------------------------------------
def test_dapo_arms_prints_the_paper_ladder_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["arms"]) == 0
    out = capsys.readouterr().out
    assert out == paper_ladder().format() + "\n"
    assert out.splitlines()[0].split() == ["arm", "adds", "paper", "AIME24"]


def test_dapo_arms_ladder_and_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    assert main(["arms", "--ladder", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("beyond the paper: 2 arms, valid on preset tiny\n")
    assert "eps32" in out and "epsilon_high 0.32" in out
    assert main(["arms", "--grid", "algo.clip_high=0.24,0.32", "--toml"]) == 0
    grid = Ladder.from_toml(capsys.readouterr().out)
    assert grid.names == ("dapo", "dapo-clip_high=0.24", "dapo-clip_high=0.32")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--ladder", "BAD"], "arm 'b': same config as its parent 'a'"),
        (["--ladder", "nope"], "unknown ladder 'nope'"),
        (["--grid", "algo.clip_high=0.2,x"], "--grid algo.clip_high='x'"),
        (["--arm", "dapo"], "--arm names the base of a --grid"),
    ],
)
def test_dapo_arms_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_FILES["identical_to_parent"][0])
    argv = [str(bad) if a == "BAD" else a for a in argv]
    assert main(["arms", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    if "BAD" in argv or str(bad) in argv:
        assert str(bad) in lines[0]


# --- dapo train / dapo plan --ladder -------------------------------------------------------------
def test_train_and_plan_take_an_arm_of_any_ladder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--ladder resolves --arm in a built-in ladder or a file (default: its last arm); the
    config is the ladder's, the same one a sweep of that ladder runs."""
    import argparse

    from dapo_core.cli import config_from_args

    def cfg(*argv: str) -> ExperimentConfig:
        args = argparse.Namespace(preset="tiny", set=[], arm=None, ladder="paper")
        for flag, value in zip(argv[::2], argv[1::2], strict=True):
            setattr(args, flag.lstrip("-"), value)
        return config_from_args(args)

    assert (
        cfg().arm == "dapo" and cfg().to_dict() == paper_ladder().config("dapo", "tiny").to_dict()
    )
    cispo = cfg("--ladder", "beyond-dapo", "--arm", "cispo")
    assert cispo.algo.loss_mode == "cispo" and cispo.algo.rollout_correction == "tis"
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    mine = cfg("--ladder", str(path))  # the file's last arm
    assert mine.arm == "eps32" and mine.algo.clip_high == 0.32
    assert main(["plan", "--ladder", str(path), "--arm", "eps32"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("plan: preset tiny, arm eps32:")
    assert main(["plan", "--ladder", "dr-grpo", "--arm", "dapo"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: unknown arm 'dapo': choose one of grpo, no_std, dr_grpo"]
