"""The advantage estimators' and rollout corrections' config keys: validation messages a user can
act on, and every front door (`--set`, `--grid`, a ladder, the Prefect form's overrides, a stored
config) reaching them typed alike."""

from __future__ import annotations

import json

import pytest

from dapo_core.algo.advantages import ADVANTAGE_ESTIMATORS
from dapo_core.algo.correction import MODES
from dapo_core.setup.config import (
    ADV_ESTIMATORS,
    ADV_ESTIMATORS_WITHOUT_TRAINER,
    ROLLOUT_CORRECTIONS,
    AlgoConfig,
    ConfigError,
    ExperimentConfig,
)
from dapo_core.setup.ladders import builtin_ladder, expand_grid
from dapo_core.setup.overrides import parse_grid, parse_sets, type_overrides


@pytest.mark.parametrize("name", ADV_ESTIMATORS)
def test_every_trainable_estimator_is_a_valid_config(name: str) -> None:
    cfg = ExperimentConfig().with_overrides({"algo.adv_estimator": name})
    assert cfg.algo.adv_estimator == name
    assert name in ADVANTAGE_ESTIMATORS


@pytest.mark.parametrize("name", ADV_ESTIMATORS_WITHOUT_TRAINER)
def test_the_optimal_token_baselines_are_refused_with_the_reason(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"algo.adv_estimator='{name}' needs Σ_v π\(v\|s_t\)²"):
        ExperimentConfig().with_overrides({"algo.adv_estimator": name})


def test_an_unknown_estimator_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"algo.adv_estimator='ppo': use one of .*'remax'"):
        ExperimentConfig().with_overrides({"algo.adv_estimator": "ppo"})


def test_corrections_match_the_registry() -> None:
    assert ROLLOUT_CORRECTIONS == MODES
    for mode in ("sequence_mask", "decoupled"):
        cfg = ExperimentConfig().with_overrides({"algo.rollout_correction": mode})
        assert cfg.algo.rollout_correction == mode


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ((1.0, 0.5, 2.0), "give two weights >= 0"),
        ((1.0, -0.5), "give two weights >= 0"),
        ((0.0, 0.0), "at least one of them > 0"),
        ((1.0, float("nan")), "must be a finite number"),
    ],
)
def test_gdpo_weights_are_validated(value: tuple[float, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        AlgoConfig(gdpo_reward_weights=value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"algo\.gdpo_reward_weights"):  # --set and the rest
        ExperimentConfig().with_overrides({"algo.gdpo_reward_weights": value})


def test_gdpo_weights_from_every_front_door_are_one_tuple_and_one_hash() -> None:
    want = ExperimentConfig().with_overrides(
        {"algo.adv_estimator": "gdpo", "algo.gdpo_reward_weights": (1.0, 0.5)}
    )
    assert want.algo.gdpo_reward_weights == (1.0, 0.5)
    # --set text, the form's JSON (a list), TOML (a list), a stored config's JSON
    sets = parse_sets(ExperimentConfig, ["algo.gdpo_reward_weights=1,0.5"])
    form = type_overrides(ExperimentConfig, {"algo.gdpo_reward_weights": [1, 0.5]})
    stored = ExperimentConfig.from_dict(json.loads(json.dumps(want.to_dict())))
    for overrides in (sets, form):
        got = ExperimentConfig().with_overrides({"algo.adv_estimator": "gdpo", **overrides})
        assert got == want and got.config_hash() == want.config_hash()
    assert stored == want and stored.config_hash() == want.config_hash()
    assert isinstance(stored.algo.gdpo_reward_weights, tuple)


def test_a_grid_over_estimators_and_corrections_expands() -> None:
    grids = parse_grid(
        ExperimentConfig,
        ["algo.adv_estimator=grpo,remax,gdpo", "algo.rollout_correction=sequence_mask,decoupled"],
    )
    ladder = expand_grid("dapo", grids)
    assert len(ladder.arms) == 1 + 6  # the base and the six points
    configs = [ladder.config(a.name) for a in ladder.arms[1:]]
    assert {(c.algo.adv_estimator, c.algo.rollout_correction) for c in configs} == {
        (e, m) for e in ("grpo", "remax", "gdpo") for m in ("sequence_mask", "decoupled")
    }


def test_the_estimators_ladder_changes_only_the_estimator_of_one_parent() -> None:
    ladder = builtin_ladder("estimators")
    assert ladder.names == ("grpo", "rloo", "reinforce_plus_plus", "opo", "grpo_passk", "gpg")
    base = ladder.config("grpo")
    assert base.algo.adv_estimator == "grpo" and not base.algo.dynamic_sampling
    for arm in ladder.arms[1:]:
        assert arm.parent == "grpo" and arm.changes == {"algo.adv_estimator": arm.name}
        cfg = ladder.config(arm.name)
        assert (
            cfg.algo
            == ExperimentConfig.from_dict(
                {**base.to_dict(), "algo": {**base.to_dict()["algo"], "adv_estimator": arm.name}}
            ).algo
        )
