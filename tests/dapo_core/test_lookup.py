"""The lookup task (dapo_core.data.lookup), its preset, its coin-flip reward and its two
mechanism ladders: the table fixed by its seed, the decision at response position 0, the warm
start's ~15%, the coin's independence from the answer, and steps through the real trainer."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from dapo_common import metric_names as M
from dapo_core.algo.rewards import math_score
from dapo_core.data import lookup
from dapo_core.data.loaders import (
    Problem,
    decision_positions,
    format_prompt,
    graded_text,
    load_problems,
    response_prefix,
    task_reward,
)
from dapo_core.engines.base import Completion
from dapo_core.models import TINY_TASKS, build_tiny_tokenizer
from dapo_core.setup.architectures import TINY_MODELS
from dapo_core.setup.config import ConfigError, DataConfig
from dapo_core.setup.ladders import builtin_ladder
from dapo_core.setup.presets import preset_config
from dapo_core.train.rollout import ShapedReward
from dapo_core.train.task_reward import CoinReward, training_reward


# --- the table ----------------------------------------------------------------------------------
def test_the_table_is_fixed_by_its_seed() -> None:
    table = lookup.table()
    assert table == lookup.table()  # no hidden state
    assert len(table) == lookup.NUM_KEYS == 32
    assert all(10 <= k <= 99 for k in table) and sorted(table) == list(table)
    assert set(table.values()) <= set(lookup.SYMBOLS) and len(lookup.SYMBOLS) == 8
    # Pinned: the first and last keys of TABLE_SEED 20261128 (a string-seeded random.Random,
    # the same on every machine and Python). A change here must bump TASK_VERSION.
    first = list(table.items())[:3]
    assert first == [(10, "H"), (11, "A"), (12, "C")]
    assert lookup.TASK_VERSION in lookup.RECIPE and lookup.TABLE_SEED in lookup.RECIPE


def test_data_sets_by_name() -> None:
    train, held, coin = (load_problems(n) for n in ("lookup", "lookup-eval", "lookup-coin"))
    assert [p.prompt for p in train] == [p.prompt for p in held]  # the same 32 keys
    assert len(train) == 32 and train[0] == Problem("k=10?\n", "H", "lookup", 0)
    assert load_problems("lookup", seed=7) == train  # the seed shuffles the order, not the set
    assert len(coin) == 32 * lookup.COIN_REPEATS == 8192
    assert [p.idx for p in coin] == list(range(8192))  # one row each: the coin's key
    assert Counter(p.prompt for p in coin) == {p.prompt: 256 for p in train}
    assert (task_reward("lookup"), task_reward("Lookup_Coin")) == ("grader", "coin")
    assert task_reward("explore") == "grader"


# --- the decision --------------------------------------------------------------------------------
def test_the_response_is_the_decision_then_eos() -> None:
    tok = build_tiny_tokenizer()
    problem = load_problems("lookup")[0]
    prompt = format_prompt(problem, "raw-answer", tok)  # type: ignore[arg-type]
    assert prompt == "k=10?\nAnswer: "
    # The prompt's 8 tokens end with `Answer:` (one token) and a space; the reply is one symbol
    # and EOS: 2 loss tokens, the decision at response position 0.
    assert tok.convert_ids_to_tokens(tok(prompt)["input_ids"]) == [
        "k", "=", "1", "0", "?", "\n", "Answer:", " ",
    ]  # fmt: skip
    assert len(tok("H")["input_ids"]) == 1
    assert decision_positions("lookup") == decision_positions("lookup-coin") == (0,)
    assert decision_positions("lookup-eval") == (0,)
    # The grader reads `Answer: H`: right for key 10, wrong for any other symbol.
    assert response_prefix("raw-answer") == "Answer: "
    assert math_score(graded_text("raw-answer", "H"), "H").score == 1.0
    assert math_score(graded_text("raw-answer", "C"), "H").score == -1.0
    # The template is a config value like the others.
    assert DataConfig(prompt_template="raw-answer").prompt_template == "raw-answer"
    with pytest.raises(ConfigError, match="raw-answer"):
        DataConfig(prompt_template="raw_answer")


# --- the demonstrator ----------------------------------------------------------------------------
def test_answer_weights_and_quotas() -> None:
    task = lookup.tasks()[0]  # key 10, answer H
    w = lookup.answer_weights(task)
    assert math.isclose(sum(w.values()), 1.0) and w["H"] == lookup.RIGHT_RATE
    wrong = sorted((v for s, v in w.items() if s != "H"), reverse=True)
    # Each wrong symbol DECAY times the one before: 1, 0.4, 0.16, ... scaled to 1 − 0.175.
    assert all(math.isclose(b / a, lookup.DECAY) for a, b in itertools.pairwise(wrong))
    assert math.isclose(sum(wrong), 1 - lookup.RIGHT_RATE)
    q = lookup.quotas(task)
    assert sum(q.values()) == lookup.ROUND == 40
    # 0.175 × 40 = 7 on the answer; the wrong ones 0.825 × 40 × (1, .4, .16, .064, .0256,
    # .01, .004) / 1.6636 = 19.84, 7.93, 3.17, 1.27, 0.51, 0.20, 0.08: floors 19, 7, 3, 1, 0,
    # 0, 0 (37 with the answer's 7), and the three largest remainders (.93, .84, .51) get one.
    assert q["H"] == 7
    assert sorted((v for s, v in q.items() if s != "H"), reverse=True) == [20, 8, 3, 1, 1, 0, 0]
    assert all(abs(q[s] - w[s] * 40) < 1 for s in lookup.SYMBOLS)


def test_demonstrations_come_in_exact_rounds() -> None:
    n = 32 * 40
    demos = lookup.demonstrations(2 * n, seed=0)
    assert demos == lookup.demonstrations(2 * n, seed=0)
    for part in (demos[:n], demos[n:]):  # each round: every key's quotas exactly
        counts = Counter(part)
        for task in lookup.tasks():
            for symbol, count in lookup.quotas(task).items():
                assert counts[(task.text + "Answer: ", symbol)] == count
    assert demos[:n] != demos[n:]  # shuffled afresh each round


# --- the coin --------------------------------------------------------------------------------
def _completion(text: str) -> Completion:
    return Completion(0, [1], [2, 1], [-1.0, 0.0], "stop", text)


def _coin_reward(seed: int = 0) -> CoinReward:
    reward = training_reward(preset_config("lookup").with_overrides(
        {"data.train": "lookup-coin", "run.seed": seed}
    ))  # fmt: skip
    assert isinstance(reward, CoinReward)
    return reward


def test_the_coin_is_fair_and_independent_of_the_answer() -> None:
    problems = load_problems("lookup-coin")[:500]
    # Two rewards of one run seed: one scores the right answer every time, the other a wrong
    # one. The coins are the same (they never see the response) while acc is the grader's.
    right, wrong = _coin_reward(), _coin_reward()
    heads = []
    for p in problems:
        bad = "A" if p.answer != "A" else "B"
        for _ in range(8):
            a, b = right(_completion(p.answer), p), wrong(_completion(bad), p)
            assert a.score == b.score and (a.acc, b.acc) == (1.0, 0.0)
            heads.append(a.score > 0)
    # 4,000 coins: fair by an exact binomial test (a biased coin of 0.53 fails it, p < 1e-4),
    # and as likely heads for the right answer as for the wrong one (the same coins).
    assert len(heads) == 4000
    assert stats.binomtest(sum(heads), len(heads), 0.5).pvalue > 0.01
    # Responses within a group get independent coins: the 8 of a row are not all one side
    # more often than chance (2 / 2^8 per row → about 2 rows of 500).
    rows = [heads[i : i + 8] for i in range(0, len(heads), 8)]
    assert sum(len(set(r)) == 1 for r in rows) < 10
    # Another run seed, other coins; the same seed, the same coins (deterministic).
    again = _coin_reward()
    assert [again(_completion("A"), p).score > 0 for p in problems[:50] for _ in range(8)] == (
        heads[:400]
    )
    other = _coin_reward(seed=1)
    assert [other(_completion("A"), p).score > 0 for p in problems[:50] for _ in range(8)] != (
        heads[:400]
    )


def test_training_reward_is_the_grader_elsewhere() -> None:
    assert isinstance(training_reward(preset_config("lookup")), ShapedReward)
    assert isinstance(training_reward(preset_config("tiny")), ShapedReward)
    assert lookup.coin(0, 5, 3) == lookup.coin(0, 5, 3)


# --- the preset and the ladders --------------------------------------------------------------
def test_the_preset_and_the_model() -> None:
    cfg = preset_config("lookup")
    assert cfg.model.name_or_path == "tiny-lookup" and "tiny-lookup" in TINY_TASKS
    assert set(TINY_MODELS) == set(TINY_TASKS)
    assert (cfg.data.train, cfg.data.eval, cfg.data.prompt_template) == (
        "lookup", "lookup-eval", "raw-answer",
    )  # fmt: skip
    # Every key once a step, μ > 1: 4 epochs of 4 mini-batches, 16 updates a rollout step.
    assert cfg.batch.train_batch_size == lookup.NUM_KEYS
    assert cfg.algo.ppo_epochs > 1
    assert cfg.algo.ppo_epochs * cfg.batch.train_batch_size // cfg.batch.mini_batch_size == 16


def test_the_mechanism_ladders() -> None:
    dose = builtin_ladder("clip-dose")
    assert dose.names == ("eps_high=0.1", "eps_high=0.2", "eps_high=0.28", "eps_high=0.5")
    highs = [dose.config(n, "lookup").algo.clip_high for n in dose.names]
    assert highs == [0.1, 0.2, 0.28, 0.5]
    assert {dose.config(n, "lookup").algo.clip_low for n in dose.names} == {0.1}
    assert [r["parent"] for r in dose.rows()] == [None, *dose.names[:-1]]  # a chain
    ent = builtin_ladder("clip-entropy")
    clips = {n: (c.algo.clip_low, c.algo.clip_high) for n in ent.names
             for c in [ent.config(n, "lookup")]}  # fmt: skip
    assert clips == {
        "eps=0.2_0.2": (0.2, 0.2),
        "eps_high=0.28": (0.2, 0.28),
        "eps_high=0.5": (0.2, 0.5),
        "eps_low=0.1": (0.1, 0.2),
    }
    assert {ent.config(n, "lookup").data.train for n in ent.names} == {"lookup-coin"}
    assert {ent.config(n, "lookup").run.steps for n in ent.names} == {30}


# --- the warm start and the trainer ----------------------------------------------------------
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


@pytest.mark.slow
def test_the_warm_start_answers_right_about_15_percent() -> None:
    import torch

    from dapo_core.models import load_policy

    # The preset's own warm start (1,000 supervised steps, ~40 s once per machine, cached),
    # measured exactly: the softmax at the decision over every key, no sampling.
    model, tok = load_policy(preset_config("lookup").model, "cpu")
    ids = [tok.convert_tokens_to_ids(s) for s in lookup.SYMBOLS]
    right, entropy, mass = [], [], []
    with torch.no_grad():
        for task in lookup.tasks():
            x = tok(task.text + "Answer: ", return_tensors="pt")["input_ids"]
            p = model(x).logits[0, -1].softmax(-1)
            right.append(float(p[tok.convert_tokens_to_ids(task.answer)]))
            entropy.append(float(-(p * p.clamp_min(1e-30).log()).sum()))
            mass.append(float(p[ids].sum()))
    assert 0.12 <= sum(right) / 32 <= 0.20  # about 15% (measured: 16.3%)
    assert max(right) < 0.5  # no key is learnt yet
    # The decision's entropy is mid-range, room to move either way (log 8 = 2.08 nats).
    assert 1.0 < sum(entropy) / 32 < 1.9
    assert min(mass) > 0.98  # it answers with a symbol


@pytest.mark.slow
@pytest.mark.parametrize("data", ["lookup", "lookup-coin"])
def test_two_steps_through_the_trainer(tmp_path: Path, data: str) -> None:
    from dapo_core.train.runner import train

    cfg = builtin_ladder("clip-dose").config(
        "eps_high=0.2",
        "lookup",
        {"run.steps": 2, "run.num_threads": 1, "data.eval_every": 0, "data.train": data},
    )
    sink = _Sink()
    train(cfg, sink=sink, out_dir=tmp_path)
    assert sorted(sink.metrics) == [1, 2]
    for m in sink.metrics.values():
        assert m[M.GRAD_UPDATES] % 16 == 0
        assert 1.9 <= m[M.RESPONSE_LENGTH_MEAN] <= 2.2  # a symbol and EOS
        assert 0.0 < m[M.ENTROPY_DECISION] < math.log(100)
        # The decision is half the tokens and EOS is near-certain: the entropy over every
        # token is about half the decision's.
        assert m[M.ENTROPY_MEAN] < 0.6 * m[M.ENTROPY_DECISION]
        assert 0.0 <= m[M.CLIP_RATIO_HIGH] <= m[M.CLIP_RATIO_HIGH_ELIGIBLE] <= 0.5
        # The upper clips of the vanilla loss on this task are at the decision (EOS is
        # near-certain, not eligible), fewer tokens than all: its share is the larger.
        assert m[M.CLIP_RATIO_HIGH] <= m[M.CLIP_RATIO_HIGH_DECISION] <= 1.0
    first = sink.metrics[1]
    if data == "lookup-coin":  # rewards ±1 by the coin: about as many +1 as −1
        assert abs(first[M.SCORE_MEAN]) < 0.35
    else:  # the grader: right about 15% of the time, score 2·acc − 1
        assert math.isclose(first[M.SCORE_MEAN], 2 * first[M.ACC_MEAN] - 1)
