"""The rollout browser's group view and the compare page's curves across sweeps, run headless by
streamlit's AppTest against small known stores; every number asserted is worked out by hand in
a comment from the rows written here (or from tests/dashboard_fixtures.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dashboard_fixtures as fx
import pytest
from streamlit.testing.v1 import AppTest

from dapo_core.train.rollout import advantages_by_group
from db.store import Store

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
TIMEOUT_S = 60.0

# Group 0 was trained: rewards (+1, −1, −1, +1), mean 0, unbiased std √(4/3) = 1.1547, so its
# advantages are ±1 / 1.1547 = ±0.8660. Group 2 was all wrong: dynamic sampling dropped it, so
# it has no advantage. The rows are stored out of order (idx 0 is group 2's last member), and
# one row is as an older trainer wrote it: no group, member or advantage (grouped by prompt).
A = 1 / math.sqrt(4 / 3)


def sample(prompt: str, reward: float, *, truncated: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "response": f"{prompt} -> {reward:+g}",
        "ground_truth": "5",
        "pred": "5" if reward > 0 else "4",
        "reward": reward,
        "score": 1.0 if reward > 0 else -1.0,
        "overlong_penalty": reward + 1.0 if reward < -1 else 0.0,
        "correct": reward > 0,
        "length": 64 if truncated else 10 + int(abs(reward) * 2),
        "truncated": truncated,
        **extra,
    }


GROUP_SAMPLES = [
    sample("What is 7-2?", -1.5, truncated=True, group=2, member=3, advantage=None),
    sample("What is 2+3?", -1.0, group=0, member=1, advantage=-A),
    sample("What is 2+3?", 1.0, group=0, member=0, advantage=A),
    sample("What is 7-2?", -1.0, group=2, member=1, advantage=None),
    sample("What is 2+3?", 1.0, group=0, member=3, advantage=A),
    sample("What is 2+3?", -1.0, group=0, member=2, advantage=-A),
    sample("Older row", 1.0),
]


@pytest.fixture(scope="module")
def group_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    path = tmp_path_factory.mktemp("group-store") / "store.db"
    url = f"sqlite:///{path}"
    store = Store(url)
    config = fx.arm_config("dapo", 0)  # rollout.group_size 4
    sweep_id = store.create_sweep(
        name="groups", preset="tiny", arms=["dapo"], seeds=[0], base_config=config, ladder=[]
    )
    run_id = store.start_run(
        sweep_id=sweep_id, arm="dapo", seed=0, config=config, config_hash="h", host="test-host"
    )
    with store.sink(run_id) as sink:
        sink.log_samples(1, GROUP_SAMPLES)
    store.update_run(run_id, status="completed", steps=2)
    return url, run_id


def open_page(url: str, page: str, monkeypatch: pytest.MonkeyPatch, **query: object) -> AppTest:
    monkeypatch.setenv("DAPO_DB_URL", url)
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S)
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.run()
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture(autouse=True)
def _no_prefect(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    yield


# --- the rollout group view ------------------------------------------------------------------


def test_group_view_puts_a_prompts_responses_side_by_side(
    group_store: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, run_id = group_store
    at = open_page(url, "rollouts", monkeypatch, run=run_id)
    at.radio(key="rollout-view").set_value("Groups").run()
    assert not at.exception, [e.value for e in at.exception]
    # Groups in the trainer's order: the older row (no group: -1) first, then 0, then 2.
    titles = [m.value for m in at.markdown if m.value.startswith("**") and "Lab" not in m.value]
    assert titles == [
        "**Prompt · 1 of 4 responses stored · 1 correct**",
        "**Group 0 · 4 of 4 responses stored · 2 correct · trained**",
        "**Group 2 · 2 of 4 responses stored · 0 correct · not trained this step**",
    ]
    older, trained, dropped = (at.dataframe[i].value for i in range(3))
    # Members in their place in the group, whatever order they were stored in.
    assert trained["member"].tolist() == [0, 1, 2, 3]
    assert trained["idx"].tolist() == [2, 1, 5, 4]
    assert trained["reward"].tolist() == [1.0, -1.0, -1.0, 1.0]
    assert trained["advantage"].round(4).tolist() == [0.866, -0.866, -0.866, 0.866]
    assert dropped["member"].tolist() == [1, 3]
    assert dropped["truncated"].tolist() == [False, True]
    assert dropped["length"].tolist() == [12, 64]
    assert dropped["advantage"].isna().all() and older["advantage"].isna().all()
    captions = [c.value for c in at.caption]
    # Member 0 of group 0 (idx 2): +1, A = +0.866, length 10 + 2 = 12.
    assert "#2 ✔ · reward +1 · A +0.866 · 12 tokens" in captions
    # Group 2's member 3 (idx 0): −1.5, no advantage, 64 tokens, truncated.
    assert "#0 ✖ · reward -1.5 · A — · 64 tokens · truncated" in captions
    assert any("Per-token importance ratios" in c for c in captions)
    assert "prompt: What is 2+3?" in [t.value for t in at.text]


def test_responses_view_is_the_default_and_keeps_its_filter(
    group_store: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, run_id = group_store
    at = open_page(url, "rollouts", monkeypatch, run=run_id)
    assert at.radio(key="rollout-view").value == "Responses"
    assert len(at.dataframe[0].value) == len(GROUP_SAMPLES)
    at.radio(key="rollout-filter").set_value("Truncated").run()
    assert at.dataframe[0].value["reward"].tolist() == [-1.5]


def test_advantages_by_group_names_the_trained_groups_by_their_generated_index() -> None:
    # Three generated groups of two; the batch trained groups 2 and 0 (in that order) and one
    # carried over from an earlier step, which keep_samples never sees.
    generated = [_Group(2), _Group(2), _Group(2)]
    carried = _Group(2)
    batch = [generated[2], carried, generated[0]]
    advantages = [0.5, -0.5, 1.0, -1.0, 0.7, -0.7]  # [P*G], batch order
    assert advantages_by_group(generated, batch, advantages) == {2: [0.5, -0.5], 0: [0.7, -0.7]}


class _Group:
    """What advantages_by_group reads of a Group: its rollouts (only how many)."""

    def __init__(self, n: int) -> None:
        self.rollouts = [object()] * n


# --- compare: curves across sweeps -----------------------------------------------------------


@pytest.fixture(scope="module")
def ladder_store(tmp_path_factory: pytest.TempPathFactory) -> fx.FixtureStore:
    path = tmp_path_factory.mktemp("cross-sweep-store") / "store.db"
    return fx.build_store(f"sqlite:///{path}")


def series_of(store: fx.FixtureStore, arm: str, *, other: bool = False) -> str:
    """The compare page's label of (sweep, arm): the ladder sweep, or tiny-check (`other`)."""
    sweep = f"#{store.other_sweep_id} tiny-check" if other else f"#{store.sweep_id} ladder"
    return f"{sweep} · {arm}"


def test_compare_overlays_arms_of_two_sweeps(
    ladder_store: fx.FixtureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = ladder_store.run_ids
    # Run A in the ladder sweep, run B in tiny-check (its run ids follow the ladder's 12).
    a, b = ids[("grpo", 0)], max(ids.values()) + 1
    at = open_page(ladder_store.url, "compare", monkeypatch, a=a, b=b)
    # The sweeps of the two runs, and their two arms, are the starting point.
    assert sorted(at.multiselect(key="xs-sweeps").value) == sorted(
        [ladder_store.sweep_id, ladder_store.other_sweep_id]
    )
    grpo_ladder, grpo_check = (
        series_of(ladder_store, "grpo"),
        series_of(ladder_store, "grpo", other=True),
    )
    assert at.multiselect(key="xs-series").value == [grpo_ladder, grpo_check]
    at.multiselect(key="xs-series").select(series_of(ladder_store, "clip_higher")).run()
    at.selectbox(key="xs-metric").set_value("acc/mean").run()
    assert not at.exception, [e.value for e in at.exception]
    last = at.dataframe[-1].value.set_index("series")
    # acc/mean at the last step (4) = 0.1 + 0.05·arm index + 0.1·4 + 0.01·seed:
    # ladder grpo seeds 0, 1 -> (0.50 + 0.51) / 2 = 0.505; tiny-check grpo (seed 0 only) 0.50;
    # ladder clip_higher (index 2) -> (0.60 + 0.61) / 2 = 0.605.
    assert last.loc[grpo_ladder, "mean"] == pytest.approx(0.505)
    assert last.loc[grpo_ladder, "seeds"] == 2
    assert last.loc[grpo_check, "mean"] == pytest.approx(0.50)
    assert last.loc[grpo_check, "seeds"] == 1
    assert last.loc[series_of(ladder_store, "clip_higher"), "mean"] == pytest.approx(0.605)
    assert set(last["step"]) == {fx.STEPS - 1}

    # Only runs whose config has Clip-Higher's ε_high: of the three series, clip_higher.
    at.text_input(key="xs-filter").input("algo.clip_high=0.28").run()
    last = at.dataframe[-1].value
    assert last["series"].tolist() == [series_of(ladder_store, "clip_higher")]
    # Overlong filtering is on from its own arm on (cumulative): clip_higher has it too.
    at.text_input(key="xs-filter").input("algo.overlong_filter=true").run()
    assert at.dataframe[-1].value["series"].tolist() == [series_of(ladder_store, "clip_higher")]
    # A filter no chosen run matches (only dapo samples dynamically) says so; a malformed one
    # is a warning, not a failure.
    at.text_input(key="xs-filter").input("algo.dynamic_sampling=true").run()
    assert any("No runs of these arms with algo.dynamic_sampling" in i.value for i in at.info)
    at.text_input(key="xs-filter").input("clip_high").run()
    assert any("write it as key=value" in w.value for w in at.warning)
    assert not at.exception


def test_config_filter_values_are_typed() -> None:
    from dashboard import sweep_compare as sc

    assert sc.parse_filter("  ") is None
    assert sc.parse_filter("algo.clip_high = 0.28") == ("algo.clip_high", 0.28)
    assert sc.parse_filter("algo.loss_agg=token-mean") == ("algo.loss_agg", "token-mean")
    config = {"algo": {"clip_high": 0.28, "dynamic_sampling": True, "loss_agg": "token-mean"}}
    assert sc.matches(config, "algo.clip_high", 0.28)
    assert sc.matches(config, "algo.clip_high", "0.28")
    assert not sc.matches(config, "algo.clip_high", 0.2)
    assert sc.matches(config, "algo.dynamic_sampling", True)
    assert not sc.matches(config, "algo.dynamic_sampling", 1)  # true is not the number 1
    assert sc.matches(config, "algo.loss_agg", "token-mean")
    assert not sc.matches(config, "algo.kl_coef", 0.0)  # a key the config lacks
