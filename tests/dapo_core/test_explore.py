"""The explore task (dapo_core.data.explore), its preset, and the two metrics it was built for:
`clip_ratio/high_eligible` (the loss path) and `entropy/decision` (the update), each pinned to
hand-computed cases; then two rollout steps of the preset through the real trainer."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from dapo_common import metric_names as M
from dapo_core.algo.losses import clip_eligible, policy_loss
from dapo_core.algo.rewards import get_grader
from dapo_core.data import explore
from dapo_core.data.loaders import decision_positions, load_problems
from dapo_core.data.synthetic import SumTask
from dapo_core.models import TINY_TASKS, build_tiny_tokenizer
from dapo_core.setup.architectures import TINY_MODELS, resolve_architecture
from dapo_core.setup.ladders import paper_ladder
from dapo_core.setup.presets import preset_config
from dapo_core.train.observers import decision_clip_counts, decision_sums

F64 = torch.float64


# --- the task ---------------------------------------------------------------------------------
def test_the_grader_reads_both_branches_of_the_fork() -> None:
    # 37+4+9+1+8 = 59. The platform's grader (reward.grader = dapo, the one the evaluation uses)
    # reads the last `Answer:` line of either branch.
    grade = get_grader("dapo")
    task = SumTask((37, 4, 9, 1, 8))
    worked = "37+4=41\n+9=50\n50+1=51\n+8=59\nAnswer: 59"
    slipped = "37+4=31\n+9=40\n40+1=41\n+8=49\nAnswer: 49"  # forgot the carry of 37+4
    cases = [
        ("Answer: 59", 1.0),  # at once, right
        ("Answer: 58", 0.0),  # at once, a guess one off
        (worked, 1.0),
        (slipped, 0.0),
        ("37+4=41\n41+9=50\n50+1=5", 0.0),  # truncated: no answer line at all
    ]
    for text, acc in cases:
        assert grade(text, str(task.answer)).acc == acc, text
    assert [explore.branch(t) for t, _ in cases] == ["at_once", "at_once"] + ["working"] * 3


def test_lengths_of_both_branches_in_tokens() -> None:
    tok = build_tiny_tokenizer()
    # An answer at once: `Answer:` (one token), a space, two digits; EOS makes 5.
    assert len(tok(explore.at_once(59))["input_ids"]) + 1 == 5
    task = SumTask((37, 4, 9, 1, 8, 2))  # six terms: 5 lines
    # 8 + 8·j + 6·(4 − j) + 5 for j long lines after the first: 37 (all short) to 45 (all long)
    all_short = task.write([False] * 4, [False] * 5)
    all_long = task.write([True] * 4, [False] * 5)
    assert len(tok(all_short)["input_ids"]) + 1 == 37 == task.length([False] * 4)
    assert len(tok(all_long)["input_ids"]) + 1 == 45 == task.length([True] * 4)
    # The explore preset's budget: the penalty from 44 − 6 = 38 tokens falls on right six-term
    # worked answers with 2 or 3 long lines (41, 43), and all four long (45) is truncated.
    cfg = preset_config("explore")
    assert (cfg.rollout.max_response_len, cfg.algo.overlong_cache_len) == (44, 6)


def test_guesses_and_demonstrations() -> None:
    rng = random.Random(0)
    task = SumTask((37, 4, 9, 1, 8))
    guesses = {explore.guess(task, rng) for _ in range(2_000)}
    spread = explore.GUESS_SPREAD
    assert guesses == set(range(59 - spread, 59 + spread + 1))  # the sum among 7 guesses
    assert explore.guess(SumTask((10, 1)), random.Random(1)) >= 10  # kept two-digit
    n = 4_000
    demos = explore.demonstrations(n, seed=0)
    first = round(n * explore.LEARN_SHARE)
    share = [
        sum(explore.branch(d) == explore.WORKING for _, d in part) / len(part)
        for part in (demos[:first], demos[first:])
    ]
    assert abs(share[0] - explore.LEARN_WORK_RATE) < 0.03
    assert abs(share[1] - explore.WORK_RATE) < 0.03
    assert demos == explore.demonstrations(n, seed=0)


def test_splits_are_disjoint_deterministic_and_loaded_by_name() -> None:
    held_out = load_problems("explore-eval")
    assert len(held_out) == explore.EVAL_SIZE == len({p.prompt for p in held_out})
    train = load_problems("explore", seed=0)
    assert len(train) == explore.TRAIN_SIZE
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert load_problems("explore", seed=1) != train
    assert load_problems("explore-eval", seed=5) == held_out
    for p in train[:50]:
        terms = [int(x) for x in p.prompt.removesuffix("=?\n").split("+")]
        assert int(p.answer) == sum(terms) and 2 <= len(terms) <= 6
    assert decision_positions("explore") == decision_positions("Explore_Eval") == (0,)
    assert decision_positions("synthetic") == ()


# --- the preset ---------------------------------------------------------------------------------
def test_the_preset_builds_every_arm_on_the_explore_model() -> None:
    for arm in paper_ladder().names:
        cfg = paper_ladder().config(arm, "explore")
        assert cfg.model.name_or_path == "tiny-explore"
        assert (cfg.data.train, cfg.data.eval) == ("explore", "explore-eval")
    assert resolve_architecture(preset_config("explore").model).params == (
        resolve_architecture(preset_config("tiny").model).params
    )
    assert set(TINY_MODELS) == set(TINY_TASKS)


# --- clip_ratio/high_eligible -------------------------------------------------------------------
def test_clip_eligible_hand_computed() -> None:
    # ε_high = 0.28: eligible iff A > 0 and p_old < 1 / 1.28 = 0.78125.
    p_old = torch.tensor([[0.05, 0.5, 0.78, 0.79, 0.99, 0.05]], dtype=F64)
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, -1.0]], dtype=F64)
    got = clip_eligible(p_old.log(), adv, clip_high=0.28)
    assert got.tolist() == [[True, True, True, False, False, False]]
    # ε_high = 0.2: the bound is 1 / 1.2 = 0.8333, so 0.79 is eligible too.
    assert clip_eligible(p_old.log(), adv, clip_high=0.2).tolist() == [
        [True, True, True, True, False, False]
    ]


def test_policy_loss_reports_the_eligible_share_over_valid_tokens() -> None:
    # Two sequences of three tokens, the last token of the second masked out.
    #   row 0, A = +1: p_old 0.1, 0.9, 0.5 → eligible, no (0.9 > 0.78), eligible
    #   row 1, A = −1: nothing is eligible (the upper bound binds only where A > 0)
    # 2 eligible of 5 valid tokens = 0.4. The ratio of the first token is 0.35 / 0.1 = 3.5 >
    # 1.28, so it is also clipped high: clip_ratio/high = 1/5 ≤ the eligible share.
    p_old = torch.tensor([[0.1, 0.9, 0.5], [0.2, 0.3, 0.01]], dtype=F64)
    p_new = torch.tensor([[0.35, 0.9, 0.5], [0.2, 0.3, 0.01]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    _, metrics = policy_loss(p_new.log(), p_old.log(), adv, mask, clip_low=0.2, clip_high=0.28)
    counts = metrics.counts
    assert counts.clip_eligible == 2.0 and counts.tokens == 5.0
    assert metrics[M.CLIP_RATIO_HIGH_ELIGIBLE] == pytest.approx(0.4)
    assert metrics[M.CLIP_RATIO_HIGH] == pytest.approx(0.2)


def test_no_token_clips_high_unless_eligible() -> None:
    # r = π/π_old ≤ 1/π_old, so r > 1 + ε_high implies π_old < 1/(1 + ε_high): the clipped set
    # is a subset of the eligible one, whatever the policies.
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        old = torch.log_softmax(torch.randn(8, 30, generator=gen, dtype=F64) * 3, dim=-1)
        new = torch.log_softmax(torch.randn(8, 30, generator=gen, dtype=F64) * 3, dim=-1)
        adv = torch.randn(8, generator=gen, dtype=F64)
        mask = torch.ones(8, 30, dtype=torch.bool)
        c = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.28)[1].counts
        assert c.clip_high <= c.clip_eligible


# --- entropy/decision -----------------------------------------------------------------------------
def test_decision_sums_hand_computed() -> None:
    # Entropy at position 0 of three responses, the third one empty (all masked):
    # (0.5 + 1.5) over 2 tokens; position 3 lies past every row and counts nothing.
    ent = torch.tensor([[0.5, 9.0, 9.0], [1.5, 9.0, 0.0], [7.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert decision_sums(ent, mask, (0,)) == (2.0, 2.0)
    assert decision_sums(ent, mask, (0, 2)) == (11.0, 3.0)
    assert decision_sums(ent, mask, (3,)) == (0.0, 0.0)


def test_decision_clip_counts_hand_computed() -> None:
    # Ratios at position 0: e^0.3 = 1.35 (A > 0: past 1.28), e^0.2 = 1.22 (A > 0: not past),
    # e^0.3 again with A < 0 (the upper clip does not bind), and a masked row past it.
    # At ε_high = 0.28: 1 of 3 loss tokens; at 0.1 (1.105): 2 of 3; position 1 only row 0's
    # e^1 = 2.72 with A > 0 counts; position 5 lies past every row.
    new = torch.tensor([[0.3, 1.0], [0.2, 0.0], [0.3, 0.0], [0.9, 0.0]])
    old = torch.zeros(4, 2)
    adv = torch.tensor([1.0, 0.5, -1.0, 2.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    assert decision_clip_counts(new, old, adv, mask, (0,), clip_high=0.28) == (1.0, 3.0)
    assert decision_clip_counts(new, old, adv, mask, (0,), clip_high=0.1) == (2.0, 3.0)
    assert decision_clip_counts(new, old, adv, mask, (0, 1), clip_high=0.28) == (2.0, 4.0)
    assert decision_clip_counts(new, old, adv, mask, (5,), clip_high=0.28) == (0.0, 0.0)


# --- two steps of the preset ----------------------------------------------------------------------
class _Sink:
    """An in-memory MetricsSink."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.metrics[step] = dict(metrics)

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        pass

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        pass


def test_two_steps_of_the_preset_train_and_log_both_metrics(tmp_path: Path) -> None:
    from dapo_core.train.runner import train

    # A short warm start keeps the test fast (its model is cached like the preset's). The arm
    # has every mechanism but dynamic sampling, so that both steps train whatever the rewards.
    cfg = paper_ladder().config(
        "token_loss",
        "explore",
        {
            "model.warm_start_steps": 20,
            "run.steps": 2,
            "run.num_threads": 1,
            "data.eval_problems": 8,
            "data.eval_k": 1,
        },
    )
    sink = _Sink()
    train(cfg, sink=sink, out_dir=tmp_path)
    assert sorted(sink.metrics) == [1, 2]
    for m in sink.metrics.values():
        assert m[M.TRAIN_GROUPS] == cfg.batch.train_batch_size
        assert 0.0 <= m[M.CLIP_RATIO_HIGH] <= m[M.CLIP_RATIO_HIGH_ELIGIBLE] <= 1.0
        # The entropy at the fork, over a 100-token vocabulary: in (0, log 100).
        assert 0.0 < m[M.ENTROPY_DECISION] < math.log(100)
        assert 0.0 <= m[M.CLIP_RATIO_HIGH_DECISION] <= 1.0
