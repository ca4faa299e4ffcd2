"""The one table from sweep fields to config keys (dapo_core/setup/sweep_fields.py): the Prefect
form's fields, the flags of `dapo sweep / train / eval / plan` and the overrides a sweep hands
its arms are all made from it, and the flags' older spellings still work."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from dapo_core.setup.config import ExperimentConfig
from dapo_core.setup.overrides import field_types
from dapo_core.setup.sweep_fields import FIELD_OF_KEY, SWEEP_FIELD, SWEEP_FIELDS, field_overrides
from dapo_lab.cli import build_parser, main
from flows.commands import sweep_raw
from flows.params import EvalParams, SweepParams, validate

# SweepParams' fields that set no config value of their own: what to run (preset, ladder,
# arms, seeds: run.seed is set per run), where (resources, store, Ray) and how (force, name);
# `overrides` is any key, by its dotted name.
NOT_ROWS = {
    "preset",
    "ladder",
    "arms",
    "seeds",
    "resources",
    "overrides",
    "adaptive",
    "store_url",
    "ray_address",
    "force",
    "submit",  # how arms run (flows/ray_jobs.py), not a config value
    "name",
}
# A value of each row's type, different from every preset's default.
VALUES: dict[str, Any] = {
    "steps": 3,
    "model": "tiny",
    "train_data": "arithmetic",
    "eval_data": "synthetic-eval",
    "eval_k": 2,
    "eval_problems": 0,
}
# The rows each command has a flag for.
COMMAND_ROWS = {
    "sweep": list(VALUES),
    "train": list(VALUES),
    "eval": ["eval_data", "eval_k", "eval_problems"],
    "plan": ["model"],
}
# Spellings from before the flags were named after the fields, and where they were.
OLD_SPELLINGS = {
    "train": {"--data": "train_data", "--eval": "eval_data"},
    "sweep": {"--data": "train_data", "--eval": "eval_data"},
    "eval": {"--eval": "eval_data", "--k": "eval_k", "--problems": "eval_problems"},
}
REQUIRED = {"eval": ["--ckpt", "x"]}


def _parse(command: str, *argv: str) -> argparse.Namespace:
    return build_parser().parse_args([command, *REQUIRED.get(command, []), *argv])


# --- the table ---------------------------------------------------------------------------------
def test_each_row_is_one_field_and_one_config_key_of_its_type() -> None:
    names = [f.name for f in SWEEP_FIELDS]
    keys = [f.key for f in SWEEP_FIELDS]
    assert len(set(names)) == len(names) and len(set(keys)) == len(keys)
    assert names == list(VALUES)  # VALUES covers every row
    types = field_types(ExperimentConfig)
    for row in SWEEP_FIELDS:
        assert types[row.key] is row.type, row
        assert row.flag == "--" + row.name.replace("_", "-")
        # An int row is a count (>= 1) or a number of items where 0 means all.
        assert (row.minimum in (0, 1)) if row.type is int else row.minimum is None, row
        assert FIELD_OF_KEY[row.key] == row.name and SWEEP_FIELD[row.name] is row


def test_every_sweep_field_that_sets_a_config_key_is_a_row_once() -> None:
    fields = SweepParams.model_fields
    assert set(fields) == set(SWEEP_FIELD) | NOT_ROWS and not set(SWEEP_FIELD) & NOT_ROWS
    for row in SWEEP_FIELDS:
        assert fields[row.name].annotation == (row.type | None), row.name
        assert fields[row.name].description == row.describe("the preset")
    # Every row given: exactly the rows' keys, in the table's order, then the seed.
    p = validate(SweepParams, VALUES)
    assert list(p.config_overrides(5).items()) == [
        *((row.key, VALUES[row.name]) for row in SWEEP_FIELDS),
        ("run.seed", 5),
    ]
    assert validate(SweepParams, {}).config_overrides(0) == {"run.seed": 0}


def test_eval_params_rows_set_the_same_keys_with_the_runs_defaults() -> None:
    fields = EvalParams.model_fields
    rows = [name for name in fields if name in SWEEP_FIELD]
    assert rows == COMMAND_ROWS["eval"]
    for name in rows:
        row = SWEEP_FIELD[name]
        assert fields[name].annotation == (row.type | None)
        assert fields[name].description == row.describe("the run")
    given = {name: VALUES[name] for name in rows}
    p = validate(EvalParams, {"run_id": 1, **given})
    assert field_overrides(p) == {SWEEP_FIELD[n].key: v for n, v in given.items()}
    with pytest.raises(ValueError, match=r"^eval_k: Input should be greater than or equal to 1"):
        validate(EvalParams, {"run_id": 1, "eval_k": 0})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"steps": 0}, "steps: must be >= 1, got 0"),
        ({"eval_k": 0}, "eval_k: must be >= 1, got 0"),
        ({"eval_problems": -1}, "eval_problems: must be >= 0, got -1"),
    ],
)
def test_a_row_below_its_minimum_is_one_line_naming_the_field(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        validate(SweepParams, values)


def test_missing_none_and_blank_text_are_not_given() -> None:
    args = argparse.Namespace(train_data="", eval_data="  ", eval_k=None, eval_problems=0)
    assert field_overrides(args) == {"data.eval_problems": 0}
    assert field_overrides(args, ["eval_k"]) == {}


# --- the flags ---------------------------------------------------------------------------------
@pytest.mark.parametrize("command", list(COMMAND_ROWS))
def test_each_flag_is_the_field_dashed_and_sets_its_key(command: str) -> None:
    rows = COMMAND_ROWS[command]
    argv = [a for name in rows for a in (SWEEP_FIELD[name].flag, str(VALUES[name]))]
    args = _parse(command, *argv)
    # Round trip: the flag stores the field's name, typed like the field.
    assert {name: getattr(args, name) for name in rows} == {name: VALUES[name] for name in rows}
    assert field_overrides(args) == {SWEEP_FIELD[n].key: VALUES[n] for n in rows}
    absent = set(SWEEP_FIELD) - set(rows)
    assert not [name for name in absent if hasattr(args, name)]


@pytest.mark.parametrize("command", list(OLD_SPELLINGS))
def test_the_old_spellings_still_work_and_help_shows_the_new_ones(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for old, name in OLD_SPELLINGS[command].items():
        value = str(VALUES[name])
        assert vars(_parse(command, old, value)) == vars(
            _parse(command, SWEEP_FIELD[name].flag, value)
        )
    with pytest.raises(SystemExit):
        main([command, "--help"])
    shown = capsys.readouterr().out
    for name in COMMAND_ROWS[command]:
        assert SWEEP_FIELD[name].flag + " " in shown
    for old in OLD_SPELLINGS[command]:
        assert f"{old} " not in shown.replace("--set ", "")


def test_the_same_arm_from_old_and_new_flags_has_the_same_config() -> None:
    from dapo_core.cli import config_from_args

    old = config_from_args(_parse("train", "--arm", "grpo", "--data", "arithmetic", "--eval", "x"))
    new = config_from_args(
        _parse("train", "--arm", "grpo", "--train-data", "arithmetic", "--eval-data", "x")
    )
    assert old.config_hash() == new.config_hash() and new.data.train == "arithmetic"
    # The flags win over --set, as before.
    both = config_from_args(_parse("train", "--set", "run.steps=9", "--steps", "2", "--seed", "4"))
    assert (both.run.steps, both.run.seed) == (2, 4)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "--eval-k", "0"], "argument --eval-k: '0' is not a positive integer"),
        (["eval", "--ckpt", "x", "--k", "0"], "argument --k: '0' is not a positive integer"),
        (["train", "--eval-problems", "-1"], "'-1' is not a non-negative integer"),
    ],
)
def test_a_bad_flag_value_is_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and message in err[0]


def test_the_sweep_commands_parameters_are_sweep_params_fields_by_name() -> None:
    argv = [
        a for name in COMMAND_ROWS["sweep"] for a in (SWEEP_FIELD[name].flag, str(VALUES[name]))
    ]
    args = _parse("sweep", "--name", "n", "--force", *argv)
    raw = sweep_raw(args, "paper", None)
    assert list(raw) == list(SweepParams.model_fields)
    p = validate(SweepParams, raw)
    assert (p.name, p.force, p.arms[-1]) == ("n", True, "dapo")
    assert {k: v for k, v in p.config_overrides(0).items() if k != "run.seed"} == {
        SWEEP_FIELD[n].key: v for n, v in VALUES.items()
    }
