"""The ladder: each arm is the previous arm plus exactly its own change (paper Table 1)."""

from __future__ import annotations

import pytest

from dapo_core.arms import ARM_NAMES, ARMS, arm_changes, build_arm_config, format_ladder, get_arm
from dapo_core.config import ConfigError, flatten
from dapo_core.presets import PRESETS

# What each arm must change relative to the previous arm, written out independently of ARMS.
EXPECTED_DIFF = {
    "overlong_filter": {"algo.overlong_filter": (False, True)},
    "clip_higher": {"algo.clip_high": (0.2, 0.28)},
    "soft_punish": {"algo.overlong_penalty": (False, True)},
    "token_loss": {"algo.loss_agg": ("seq-mean-token-mean", "token-mean")},
    "dapo": {"algo.dynamic_sampling": (False, True)},
}


def _diff(a: dict, b: dict) -> dict:
    fa, fb = flatten(a), flatten(b)
    return {k: (fa[k], fb[k]) for k in fa if fa[k] != fb[k] and k != "arm"}


def test_ladder_order_and_paper_scores() -> None:
    assert ARM_NAMES == (
        "grpo",
        "overlong_filter",
        "clip_higher",
        "soft_punish",
        "token_loss",
        "dapo",
    )
    assert [a.paper_score for a in ARMS] == [30, 36, 38, 41, 42, 50]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_each_arm_differs_from_the_previous_by_exactly_its_change(preset: str) -> None:
    configs = [build_arm_config(name, preset).to_dict() for name in ARM_NAMES]
    for prev, cur, name in zip(configs, configs[1:], ARM_NAMES[1:], strict=False):
        assert _diff(prev, cur) == EXPECTED_DIFF[name], name


def test_baseline_is_naive_grpo() -> None:
    algo = build_arm_config("grpo").algo
    assert (algo.clip_low, algo.clip_high) == (0.2, 0.2)
    assert algo.loss_agg == "seq-mean-token-mean"
    assert not (algo.overlong_filter or algo.overlong_penalty or algo.dynamic_sampling)
    assert algo.kl_coef == 0.0


def test_dapo_has_every_technique() -> None:
    algo = build_arm_config("dapo").algo
    assert (algo.clip_low, algo.clip_high) == (0.2, 0.28)
    assert algo.loss_agg == "token-mean"
    assert algo.overlong_filter and algo.overlong_penalty and algo.dynamic_sampling


def test_user_overrides_move_the_whole_ladder() -> None:
    cfgs = [build_arm_config(n, "tiny", {"run.steps": 3}) for n in ARM_NAMES]
    assert {c.run.steps for c in cfgs} == {3}
    assert len({c.config_hash() for c in cfgs}) == len(ARM_NAMES)


def test_unknown_arm() -> None:
    with pytest.raises(ConfigError, match="unknown arm 'dapo2'"):
        get_arm("dapo2")
    with pytest.raises(ConfigError):
        arm_changes("nope")


def test_format_ladder_lists_every_arm() -> None:
    text = format_ladder()
    for arm in ARMS:
        assert arm.name in text and f"{arm.paper_score:.0f}" in text
