"""One typer for dotted config values (dapo_core.setup.overrides): --set, --grid, a ladder's
`set` table, the Prefect form's overrides and with_overrides all type a value the same way."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from dapo_common.util import flatten
from dapo_core.setup.config import ConfigError, ExperimentConfig
from dapo_core.setup.ladders import Ladder, paper_ladder
from dapo_core.setup.overrides import (
    field_types,
    parse_grid,
    parse_sets,
    split_top_level,
    type_overrides,
    type_value,
)
from flows.params import SweepParams, validate


# A schema of its own, so that every kind of field the rule knows is pinned here even when the
# real config has no field of that kind (today only algo.clip_c is optional).
@dataclass(frozen=True)
class _Section:
    flag: bool = False
    count: int = 1
    rate: float = 0.5
    name: str = "x"
    pair: tuple[float, float] = (0.9, 0.999)
    bound: float | None = None
    label: str | None = None
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Schema:
    arm: str = "a"
    s: _Section = field(default_factory=_Section)


def typed(key: str, value: Any) -> Any:
    return type_value(_Schema, f"s.{key}", value)


def test_field_types_read_the_dataclass_hints() -> None:
    assert field_types(_Schema) == {
        "s.flag": bool,
        "s.count": int,
        "s.rate": float,
        "s.name": str,
        "s.pair": tuple[float, float],
        "s.bound": float | None,
        "s.label": str | None,
        "s.names": tuple[str, ...],
    }
    real = field_types(ExperimentConfig)
    assert real["algo.clip_high"] is float and real["algo.clip_c"] == float | None
    assert "arm" not in real  # the top-level fields are not dotted config fields


@pytest.mark.parametrize(
    ("key", "value", "want"),
    [
        # text (a command line, a form's text box): parsed as the field's type
        ("flag", "true", True),
        ("flag", "Off", False),
        ("flag", "1", True),
        ("count", "8", 8),
        ("count", " 8 ", 8),
        ("rate", "0.28", 0.28),
        ("rate", "3", 3.0),
        ("name", "token-mean", "token-mean"),
        ("name", "none", "none"),  # a plain str field keeps the word
        ("pair", "[0.9,0.95]", (0.9, 0.95)),
        ("pair", "0.9,0.95", (0.9, 0.95)),
        ("bound", "none", None),
        ("bound", "NULL", None),
        ("bound", "", None),
        ("bound", "3", 3.0),
        ("label", "none", None),
        ("label", "abc", "abc"),
        ("names", "mlflow,wandb", ("mlflow", "wandb")),
        ("names", '["mlflow"]', ("mlflow",)),
        ("names", "", ()),
        # typed values (TOML, JSON, Python): checked, an int widened, a list made a tuple
        ("flag", False, False),
        ("count", 8, 8),
        ("rate", 1, 1.0),
        ("pair", [0.9, 0.95], (0.9, 0.95)),
        ("pair", (1, 0), (1.0, 0.0)),
        ("bound", None, None),
        ("bound", 2, 2.0),
        ("names", ["a", "b"], ("a", "b")),
        ("names", [], ()),
    ],
)
def test_values_are_typed_as_their_field(key: str, value: Any, want: Any) -> None:
    got = typed(key, value)
    assert got == want and type(got) is type(want)
    if isinstance(want, tuple):
        assert [type(v) for v in got] == [type(v) for v in want]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("flag", 1, "s.flag=1: expected true or false"),
        ("flag", "maybe", "s.flag='maybe': expected true or false"),
        ("count", 2.5, "s.count=2.5: expected an integer"),
        ("count", True, "s.count=True: expected an integer"),
        ("count", "2.5", "s.count='2.5': expected an integer"),
        ("rate", "x", "s.rate='x': expected a number"),
        ("rate", True, "s.rate=True: expected a number"),
        ("rate", [1], "s.rate=[1]: expected a number"),
        ("name", 3, "s.name=3: expected a string"),
        ("pair", [0.9], "s.pair=[0.9]: expected a list of 2 numbers"),
        ("pair", "[0.9", "s.pair='[0.9': expected a list of 2 numbers"),
        ("names", 5, "s.names=5: expected a list of strings"),
        ("names", [1], "s.names=1: expected a string"),
        ("pair", "0.9,x", "s.pair='x': expected a number"),
        ("bound", "x", "s.bound='x': expected a number"),
    ],
)
def test_a_value_that_cannot_be_typed_is_one_line_naming_the_key(
    key: str, value: Any, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        typed(key, value)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("key", "needle"),
    [
        ("algo.clip_hgh", "algo.clip_hgh: no such config field (algo has: adv_eps,"),
        ("algorithm.clip_high", "unknown section 'algorithm' (sections: algo, batch,"),
        ("clip_high", "clip_high: not a config field: use section.field"),
    ],
)
def test_unknown_keys_name_what_there_is(key: str, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        type_value(ExperimentConfig, key, 0.3)


def test_the_real_config_clip_c_is_optional_without_a_special_case() -> None:
    # --set used to special-case algo.clip_c because its default None has no type to copy.
    assert parse_sets(ExperimentConfig, ["algo.clip_c=none"]) == {"algo.clip_c": None}
    assert parse_sets(ExperimentConfig, ["algo.clip_c=3"]) == {"algo.clip_c": 3.0}
    with pytest.raises(ValueError, match=re.escape("--set algo.clip_c='big': expected a number")):
        parse_sets(ExperimentConfig, ["algo.clip_c=big"])


def test_parse_sets() -> None:
    assert parse_sets(
        ExperimentConfig,
        ["algo.clip_high=0.3", "run.steps = 4", "algo.dynamic_sampling=yes", "data.train=a=b"],
    ) == {
        "algo.clip_high": 0.3,
        "run.steps": 4,
        "algo.dynamic_sampling": True,
        "data.train": "a=b",  # only the first = splits
    }
    for bad, message in [
        ("algo.clip_high", "--set 'algo.clip_high': expected section.field=value"),
        ("=3", "--set '=3': expected section.field=value"),
        ("batch.micro_batch_size=two", "--set batch.micro_batch_size='two': expected an integer"),
        ("arm=mine", "--set arm: not settable as an override (choose the arm itself)"),
    ]:
        with pytest.raises(ValueError) as info:
            parse_sets(ExperimentConfig, [bad])
        assert str(info.value) == message


def test_parse_grid_types_values_like_set() -> None:
    assert parse_grid(
        ExperimentConfig,
        [
            "algo.clip_high=0.24,0.28",
            "rollout.group_size=8,16",
            "algo.overlong_filter=true,false",
            "optim.betas=[0.9,0.95],[0.9,0.999]",
            "algo.clip_c=none,3",
        ],
    ) == [
        ("algo.clip_high", [0.24, 0.28]),
        ("rollout.group_size", [8, 16]),
        ("algo.overlong_filter", [True, False]),
        ("optim.betas", [(0.9, 0.95), (0.9, 0.999)]),
        ("algo.clip_c", [None, 3.0]),
    ]
    for bad, needle in [
        ("algo.clip_high", "expected section.field=v1,v2"),
        ("algo.clip_high=0.2,,0.3", "expected section.field=v1,v2"),
        ("algo.clip_high=0.2,x", "--grid algo.clip_high='x': expected a number"),
        ("algo.nope=1", "--grid algo.nope: no such config field"),
    ]:
        with pytest.raises(ValueError, match=re.escape(needle)):
            parse_grid(ExperimentConfig, [bad])


def test_split_top_level_keeps_bracketed_lists_whole() -> None:
    assert split_top_level("0.1, 0.2") == ["0.1", "0.2"]
    assert split_top_level("[0.9,0.95],[0.9,0.99]") == ["[0.9,0.95]", "[0.9,0.99]"]
    assert split_top_level("") == []


def test_type_overrides_refuses_the_top_level_fields_and_non_text_keys() -> None:
    assert type_overrides(ExperimentConfig, {"optim.lr": 1, "run.steps": "3"}) == {
        "optim.lr": 1.0,
        "run.steps": 3,
    }
    with pytest.raises(ValueError, match="preset: not settable as an override"):
        type_overrides(ExperimentConfig, {"preset": "tiny"})
    with pytest.raises(ValueError, match="a config key is text"):
        type_overrides(ExperimentConfig, {1: 2})


# --- every door types the same way ----------------------------------------------------------------
def test_with_overrides_types_text_and_names_a_bad_value() -> None:
    cfg = ExperimentConfig().with_overrides({"algo.clip_high": "0.28", "optim.betas": [0.9, 0.95]})
    assert cfg.algo.clip_high == 0.28 and cfg.optim.betas == (0.9, 0.95)
    # An int for a float field is widened, so it hashes like the float (a run's name).
    assert (
        ExperimentConfig().with_overrides({"optim.lr": 1}).config_hash()
        == ExperimentConfig().with_overrides({"optim.lr": 1.0}).config_hash()
    )
    with pytest.raises(ConfigError) as info:
        ExperimentConfig().with_overrides({"algo.clip_high": "high"})
    assert str(info.value) == "override algo.clip_high='high': expected a number"


def test_a_ladder_set_table_takes_text_like_set() -> None:
    text = '[[arms]]\nname = "a"\nfrom = "dapo"\nset = { "algo.clip_high" = "0.32" }\n'
    ladder = Ladder.from_toml('name = "t"\n' + text)
    assert ladder.arm("a").changes == {"algo.clip_high": 0.32}
    assert ladder.config("a").algo.clip_high == 0.32


def test_the_form_types_overrides_before_anything_runs() -> None:
    """The Prefect form sends JSON; `overrides` is typed when SweepParams validates (the same
    pydantic validation the served flow runs), so "0.28" is 0.28 and a bad value one line."""
    params = validate(SweepParams, {"arms": ["grpo"], "overrides": {"algo.clip_high": "0.28"}})
    assert params.overrides == {"algo.clip_high": 0.28}
    cfg = params.parsed_ladder.config("grpo", params.preset, params.config_overrides(0))
    assert cfg.algo.clip_high == 0.28
    # Stored with the sweep as JSON and validated again by each arm: the same typed values.
    again = validate(SweepParams, params.model_dump(mode="json"))
    assert again.overrides == params.overrides
    for bad, message in [
        ({"algo.clip_high": "high"}, "overrides: algo.clip_high='high': expected a number"),
        (
            {"algo.dynamic_sampling": 1},
            "overrides: algo.dynamic_sampling=1: expected true or false",
        ),
        ({"arm": "dapo"}, "overrides: arm: not settable as an override (choose the arm itself)"),
    ]:
        with pytest.raises(ValueError) as info:
            validate(SweepParams, {"overrides": bad})
        assert str(info.value) == message


def test_typing_a_typed_config_changes_nothing() -> None:
    """Every built-in arm's config, written out as dotted values and typed back, is the same
    config with the same hash: the typer inside with_overrides moves no run's name."""
    paper = paper_ladder()
    for arm in paper.names:
        cfg = paper.config(arm)
        flat = flatten(cfg.to_dict())
        again = ExperimentConfig().with_overrides(flat)
        assert again.config_hash() == cfg.config_hash(), arm
