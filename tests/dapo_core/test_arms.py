"""The ladder: each arm is the previous arm plus exactly its own change (paper Table 1)."""

from __future__ import annotations

import pytest

from dapo_common.util import flatten
from dapo_core.setup.config import ConfigError
from dapo_core.setup.ladders import paper_ladder
from dapo_core.setup.presets import PRESETS, preset_config

# The ladder as arms.py held it in Python before it became paper.toml, written out again here
# (name, adds, paper score, change relative to the previous arm): the file must say exactly this.
TODAYS_ARMS = [
    (
        "grpo",
        "naive GRPO: symmetric clip 0.2, sample-level loss, no KL",
        30.0,
        {
            "algo.clip_low": 0.2,
            "algo.clip_high": 0.2,
            "algo.loss_agg": "seq-mean-token-mean",
            "algo.overlong_filter": False,
            "algo.overlong_penalty": False,
            "algo.dynamic_sampling": False,
            "algo.kl_coef": 0.0,
        },
    ),
    (
        "overlong_filter",
        "overlong filtering: truncated samples leave the loss",
        36.0,
        {"algo.overlong_filter": True},
    ),
    ("clip_higher", "Clip-Higher: ε_low 0.2, ε_high 0.28", 38.0, {"algo.clip_high": 0.28}),
    ("soft_punish", "soft overlong punishment (Eq. 13)", 41.0, {"algo.overlong_penalty": True}),
    (
        "token_loss",
        "token-level policy-gradient loss (Eq. 12)",
        42.0,
        {"algo.loss_agg": "token-mean"},
    ),
    (
        "dapo",
        "dynamic sampling: keep groups with 0 < #correct < G",
        50.0,
        {"algo.dynamic_sampling": True},
    ),
]

# What each arm must change relative to the previous arm, written out independently of paper_ladder().arms.
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


def test_the_paper_file_holds_exactly_todays_six_arms() -> None:
    assert [(a.name, a.adds, a.paper_score, a.changes) for a in paper_ladder().arms] == TODAYS_ARMS
    # Types too: a 0 where 0.0 was would change the config hash of every stored run.
    for arm, (*_, changes) in zip(paper_ladder().arms, TODAYS_ARMS, strict=True):
        assert [type(v) for v in arm.changes.values()] == [type(v) for v in changes.values()]
    cumulative: dict = {}
    for arm, (*_, changes) in zip(paper_ladder().arms, TODAYS_ARMS, strict=True):
        cumulative.update(changes)
        assert paper_ladder().changes(arm.name) == cumulative
        for preset in PRESETS:
            # The config (and so its hash, which names runs) is what the Python table built.
            expected = preset_config(preset, arm=arm.name).with_overrides(
                {**cumulative, "arm": arm.name}
            )
            assert paper_ladder().config(arm.name, preset) == expected
            assert paper_ladder().config(arm.name, preset).config_hash() == expected.config_hash()


def test_ladder_rows_carry_each_arms_parent() -> None:
    assert paper_ladder().rows() == [
        {"arm": n, "adds": a, "parent": p, "paper_score": s, "grid": {}}
        for (n, a, s, _), p in zip(TODAYS_ARMS, [None, *paper_ladder().names[:-1]], strict=True)
    ]


def test_ladder_order_and_paper_scores() -> None:
    assert paper_ladder().names == (
        "grpo",
        "overlong_filter",
        "clip_higher",
        "soft_punish",
        "token_loss",
        "dapo",
    )
    assert [a.paper_score for a in paper_ladder().arms] == [30, 36, 38, 41, 42, 50]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_each_arm_differs_from_the_previous_by_exactly_its_change(preset: str) -> None:
    configs = [paper_ladder().config(name, preset).to_dict() for name in paper_ladder().names]
    for prev, cur, name in zip(configs, configs[1:], paper_ladder().names[1:], strict=False):
        assert _diff(prev, cur) == EXPECTED_DIFF[name], name


def test_baseline_is_naive_grpo() -> None:
    algo = paper_ladder().config("grpo").algo
    assert (algo.clip_low, algo.clip_high) == (0.2, 0.2)
    assert algo.loss_agg == "seq-mean-token-mean"
    assert not (algo.overlong_filter or algo.overlong_penalty or algo.dynamic_sampling)
    assert algo.kl_coef == 0.0


def test_dapo_has_every_technique() -> None:
    algo = paper_ladder().config("dapo").algo
    assert (algo.clip_low, algo.clip_high) == (0.2, 0.28)
    assert algo.loss_agg == "token-mean"
    assert algo.overlong_filter and algo.overlong_penalty and algo.dynamic_sampling


def test_user_overrides_move_the_whole_ladder() -> None:
    cfgs = [paper_ladder().config(n, "tiny", {"run.steps": 3}) for n in paper_ladder().names]
    assert {c.run.steps for c in cfgs} == {3}
    assert len({c.config_hash() for c in cfgs}) == len(paper_ladder().names)


def test_unknown_arm() -> None:
    with pytest.raises(ConfigError, match="unknown arm 'dapo2'"):
        paper_ladder().arm("dapo2")
    with pytest.raises(ConfigError):
        paper_ladder().changes("nope")


def test_format_ladder_lists_every_arm() -> None:
    text = paper_ladder().format()
    for arm in paper_ladder().arms:
        assert arm.name in text and f"{arm.paper_score:.0f}" in text
