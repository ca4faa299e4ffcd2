"""The rollout browser's group view, run headless by streamlit's AppTest against a small known
store; every number asserted is worked out by hand in a comment from the rows written here (or
from tests/dashboard_fixtures.py). Runs of several sweeps together: test_dashboard_runs.py. The
group view's per-token colouring is also opened in headless Chromium (skipped without it, as in
test_dashboard_browser), its screenshot kept as tests/artifacts/rollout-tokens.png."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dashboard_fixtures as fx
import pytest
import rollout_fixtures as rf
from store_runs import new_attempt
from streamlit.testing.v1 import AppTest

from dapo_core.train.rollout import advantages_by_group
from dashboard import browser
from dashboard import token_colours as tc
from dashboard.rollouts import NO_TOKENS
from db.store import Store

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


# Per-token records (dapo_core.train.rollout.token_record) of group 0's members 0 and 1, ε_low
# 0.2, ε_high 0.28. Member 0 (A > 0): its "5" rose from p 0.1 to 0.14, r = 1.4 > 1.28, clipped
# at the high bound, and eligible (0.1 < 1 / 1.28); ": " is eligible (0.5), unclipped.
# Member 1 (A < 0): its "4" fell, r = 0.7 < 0.8, clipped at the low bound. Members 2 and 3
# have none (shown as plain text), as have the rows of step 0 (a run recorded before).
TOKENS_0 = {
    "text": ["Answer", ": ", "5", "</s>"],
    "p_old": [0.9, 0.5, 0.1, 0.95],
    "ratio": [1.0, 1.1, 1.4, 1.0],
    "clip": [0, 0, 1, 0],
    "entropy": [0.3, 1.2, 2.0, 0.1],
    "eligible": [0, 1, 1, 0],
}
TOKENS_1 = {
    "text": ["Answer", ": ", "4", "</s>"],
    "p_old": [0.9, 0.5, 0.6, 0.95],
    "ratio": [1.0, 0.9, 0.7, 1.0],
    "clip": [0, 0, -1, 0],
    "entropy": [0.3, 1.0, 1.5, 0.1],
    "eligible": [0, 0, 0, 0],
}

GROUP_SAMPLES = [
    sample("What is 7-2?", -1.5, truncated=True, group=2, member=3, advantage=None),
    sample("What is 2+3?", -1.0, group=0, member=1, advantage=-A, tokens=TOKENS_1),
    sample("What is 2+3?", 1.0, group=0, member=0, advantage=A, tokens=TOKENS_0),
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
    run_id = new_attempt(store, sweep_id, "dapo", 0, config=config, config_hash="h")
    with store.sink(run_id) as sink:
        sink.log_samples(1, GROUP_SAMPLES)
        sink.log_samples(0, [{k: v for k, v in s.items() if k != "tokens"} for s in GROUP_SAMPLES])
    store.update_run(run_id, status="completed", steps=2)
    return url, run_id


def open_page(url: str, page: str, monkeypatch: pytest.MonkeyPatch, **query: object) -> AppTest:
    monkeypatch.setenv("DAPO_DB_URL", url)
    return fx.open_page(page, **query)


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
    # advantages as text: never "None" where the trainer recorded none
    assert trained["advantage"].tolist() == ["+0.866", "-0.866", "-0.866", "+0.866"]
    assert dropped["member"].tolist() == [1, 3]
    assert dropped["truncated"].tolist() == [False, True]
    assert dropped["length"].tolist() == [12, 64]
    assert dropped["advantage"].tolist() == ["—", "—"] and older["advantage"].tolist() == ["—"]
    captions = [c.value for c in at.caption]
    # Member 0 of group 0 (idx 2): +1, A = +0.866, length 10 + 2 = 12.
    assert "#2 ✔ · reward +1 · A +0.866 · 12 tokens" in captions
    # Group 2's member 3 (idx 0): −1.5, no advantage, 64 tokens, truncated.
    assert "#0 ✖ · reward -1.5 · A — · 64 tokens · truncated" in captions
    assert NO_TOKENS not in captions  # this step has per-token records
    assert "prompt: What is 2+3?" in [t.value for t in at.text]


def token_html(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if 'class="dapo-token"' in m.value]


def plain_html(at: AppTest) -> list[str]:
    """The responses shown as plain text (no per-token record), each in its scrolling box."""
    return [
        m.value
        for m in at.markdown
        if 'class="dapo-response"' in m.value and 'class="dapo-token"' not in m.value
    ]


def test_group_view_colours_each_token(
    group_store: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, run_id = group_store
    at = open_page(url, "rollouts", monkeypatch, run=run_id)
    at.radio(key="rollout-view").set_value("Groups").run()
    colour = at.radio(key="rollout-token-colour")
    assert colour.value == "ratio" and colour.options == list(tc.MODES.values())
    # Group 0's members 0 and 1 as coloured spans (in member order), the other responses as
    # text; one legend for group 0, the only group with records.
    member0, member1 = token_html(at)
    assert member0.count('class="dapo-token"') == member1.count('class="dapo-token"') == 4
    assert "&lt;/s&gt;" in member0 and "</s>" not in member0.replace("</span>", "")
    # Ratio: 1.4 is log 1.4 / log 1.5 = 0.83 of full red, 0.7 is log(1/0.7) / log 1.5 = 0.88
    # of full blue; r = 1 is white.
    assert f"background-color:{tc.mix(tc.RATIO_ABOVE, math.log(1.4) / math.log(1.5))}" in member0
    assert f"background-color:{tc.mix(tc.RATIO_BELOW, -math.log(0.7) / math.log(1.5))}" in member1
    assert "background-color:#ffffff" in member0
    legends = [m.value for m in at.markdown if 'class="dapo-legend"' in m.value]
    assert len(legends) == 1 and "ratio" in legends[0]
    assert "#0 ✖ · reward -1.5 · A — · 64 tokens · truncated" in [c.value for c in at.caption]
    # member 3: no record, plain (escaped) text in its box
    assert any("What is 2+3? -&gt; +1" in html for html in plain_html(at))

    at.radio(key="rollout-token-colour").set_value("clip").run()
    assert not at.exception, [e.value for e in at.exception]
    member0, member1 = token_html(at)
    # Only the clipped tokens are coloured: "5" at the high bound, "4" at the low bound.
    assert member0.count("background-color") == 1 and f"background-color:{tc.CLIP_HIGH}" in member0
    assert member1.count("background-color") == 1 and f"background-color:{tc.CLIP_LOW}" in member1
    # The hover title of "5" holds all its values.
    assert (
        'title="token 2: &#x27;5&#x27;&#10;p_old 0.1&#10;ratio 1.4 · clipped at the high bound'
        '&#10;entropy 2 nats&#10;clip-eligible yes"' in member0
    )

    at.radio(key="rollout-token-colour").set_value("eligible").run()
    member0, member1 = token_html(at)
    assert member0.count(f"background-color:{tc.ELIGIBLE}") == 2  # ": " and "5"
    assert "background-color" not in member1  # A < 0: nothing is eligible

    at.radio(key="rollout-token-colour").set_value("entropy").run()
    member0, _ = token_html(at)
    # One scale for the group: its largest entropy, 2 nats ("5" is full purple).
    assert f"background-color:{tc.mix(tc.ENTROPY_HIGH, 1.0)}" in member0
    assert f"background-color:{tc.mix(tc.ENTROPY_HIGH, 0.6)}" in member0  # 1.2 / 2


def test_a_step_recorded_before_tokens_says_so(
    group_store: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, run_id = group_store
    at = open_page(url, "rollouts", monkeypatch, run=run_id)
    at.selectbox(key="rollout-step").set_value(0).run()
    at.radio(key="rollout-view").set_value("Groups").run()
    assert not at.exception, [e.value for e in at.exception]
    assert NO_TOKENS in [c.value for c in at.caption]
    assert not token_html(at)
    assert not [r for r in at.radio if r.key == "rollout-token-colour"]
    assert any("What is 2+3? -&gt; +1" in html for html in plain_html(at))


CLICK_JS = """(() => {{ const label = Array.from(document.querySelectorAll('label'))
  .find(l => l.innerText.trim() === {text!r});
  if (!label) return false; label.click(); return true; }})()"""


@pytest.mark.browser
def test_token_view_in_chromium(group_store: tuple[str, int], tmp_path: Path) -> None:
    from chromium import ARTIFACTS, find_chromium

    exe = find_chromium()
    url, run_id = group_store
    env = {"PREFECT_HOME": str(tmp_path / "prefect")}
    with (
        open(tmp_path / "streamlit.log", "wb") as log,
        browser.served(url, cwd=tmp_path, env=env, log=log) as base,
        browser.open_page(exe) as page,
    ):
        page.set_viewport(1440, 1000)
        page.goto(f"{base}/rollouts?run={run_id}")
        page.wait_for(["Rollouts", "Groups"])
        assert page.evaluate(CLICK_JS.format(text="Groups"))
        page.wait_for(["Colour tokens by", "hover a token"])
        assert page.evaluate(CLICK_JS.format(text="clipped"))
        text = page.wait_for(["clipped (DAPO Eq. 10)", "Answer", "</s>"])
        assert "Traceback" not in text
        read = (
            "Array.from(document.querySelectorAll('.dapo-token'))"
            ".map(s => [s.textContent, s.style.backgroundColor, s.title])"
        )
        # Streamlit redraws the two responses one after the other: the legend can show the new
        # colouring while the second response still has the old one. Read until every response is
        # redrawn (no colour on "</s>", which the ratio colouring paints white) or time is up.
        end = time.monotonic() + TIMEOUT_S
        spans = page.evaluate(read)
        while time.monotonic() < end and any(bg for t, bg, _ in spans if t == "</s>"):
            time.sleep(browser.POLL_S)
            spans = page.evaluate(read)
        # 8 token spans (group 0's members 0 and 1); the clipped ones coloured in the page.
        assert len(spans) == 8
        by_text = {(t, bg) for t, bg, _ in spans}
        assert ("5", "rgb(244, 165, 130)") in by_text  # CLIP_HIGH #f4a582
        assert ("4", "rgb(146, 197, 222)") in by_text  # CLIP_LOW #92c5de
        assert any("clipped at the high bound" in title for _, _, title in spans)
        page.evaluate("document.querySelector('.dapo-legend').scrollIntoView()")
        data = page.screenshot(tmp_path / "rollout-tokens.png")
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "rollout-tokens.png", ARTIFACTS / "rollout-tokens.png")


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


# --- whole groups: filters and pages -----------------------------------------------------------


@pytest.fixture(scope="module")
def many_groups(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, int]:
    url = f"sqlite:///{tmp_path_factory.mktemp('many-groups') / 'store.db'}"
    sweep_id, run_id = rf.build_many_groups(url, size=16)
    return url, sweep_id, run_id


def group_titles(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if m.value.startswith(("**Group", "**Prompt"))]


def test_groups_are_filtered_by_their_signal_and_paged(
    many_groups: tuple[str, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, sweep_id, run_id = many_groups
    # ?sweep= picks the run's sweep (the page once ignored it); its one run is then picked
    at = open_page(url, "rollouts", monkeypatch, sweep=sweep_id)
    assert at.selectbox(key="rollout-run").value == run_id
    at.radio(key="rollout-view").set_value("Groups").run()
    assert not at.exception, [e.value for e in at.exception]
    shown = texts(at)
    assert "16 group(s) stored: 6 mixed, 5 all right, 5 all wrong" in shown
    # G = 16: two whole groups a page (32 responses), 8 pages
    assert group_titles(at) == [
        "**Group 0 · 16 of 16 responses stored · 8 correct · trained**",
        "**Group 1 · 16 of 16 responses stored · 8 correct · trained**",
    ]
    assert at.number_input(key="rollout-group-page").label == "Page (of 8)"
    at.radio(key="rollout-group-filter").set_value("All wrong").run()
    assert at.number_input(key="rollout-group-page").label == "Page (of 3)"
    assert [t.split(" · ")[0] for t in group_titles(at)] == ["**Group 11", "**Group 12"]
    at.number_input(key="rollout-group-page").set_value(3).run()
    assert [t.split(" · ")[0] for t in group_titles(at)] == ["**Group 15"]
    # an all-wrong group was not trained: its advantages read "—", never "None"
    table = at.dataframe[0].value
    assert table["advantage"].tolist() == ["—"] * 16
    at.radio(key="rollout-group-filter").set_value("Mixed (0 < correct < G)").run()
    at.number_input(key="rollout-group-page").set_value(1).run()
    table = at.dataframe[0].value
    # ±1 / √(16/15) = ±0.968
    assert table["advantage"].tolist() == ["+0.968"] * 8 + ["-0.968"] * 8
    # every response in a box that scrolls past RESPONSE_BOX_EM (40 lines would not fit):
    # group 0's first two members coloured by token, the other 30 as text
    boxes = [m.value for m in at.markdown if 'class="dapo-response"' in m.value]
    assert len(boxes) == 32 and len(plain_html(at)) == 30
    assert all("max-height:10em;overflow-y:auto" in html for html in boxes)


def texts(at: AppTest) -> str:
    return "\n".join([m.value for m in at.markdown] + [c.value for c in at.caption])


def test_the_legend_reads_its_apostrophe(
    group_store: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, run_id = group_store
    at = open_page(url, "rollouts", monkeypatch, run=run_id)
    at.radio(key="rollout-view").set_value("Groups").run()
    (legend,) = [m.value for m in at.markdown if 'class="dapo-legend"' in m.value]
    # escaped once: "&#x27;" (the browser shows "token's"), not "&&#35;x27;" ("token&#x27;s")
    assert "token&#x27;s update step" in legend and "&&#35;" not in legend
