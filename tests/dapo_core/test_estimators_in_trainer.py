"""The advantage estimators and rollout corrections through Trainer.step(): each trains and moves
the weights unlike GRPO on the same rollouts; ReMax's greedy baseline rollout (one greedy response
per prompt, scored by the same reward, temperature 0 on the engine); TRL's sequence mask and
AReaL's decoupled weight measured on known sampler log-probs."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from scripted_engine import ScriptedEngine, make_cfg, make_trainer
from test_trainer import SamplerEngine, _rel, _update_of
from tiny_policy import char_tokenizer, tiny_llama

from dapo_common import metric_names as M
from dapo_core.engines.base import Completion, SamplingParams
from dapo_core.engines.hf import HFEngine, sampling_logprobs
from dapo_core.setup.config import ADV_ESTIMATORS

# --- greedy decoding on the hf engine ---------------------------------------------------------


def test_temperature_zero_is_the_argmax() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    logp = sampling_logprobs(logits, 0.0, 0.3)
    # all the mass on the most probable token, the first of a tie (index 1, not 3)
    assert logp.exp().tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_hf_engine_greedy_matches_an_argmax_loop_and_leaves_the_stream() -> None:
    tok = char_tokenizer()
    model = tiny_llama(len(tok), seed=4, eos_bias=0.3).eval()
    engine = HFEngine(model, tok, max_prompt_len=16, seed=0)
    prompts = ["what is 1+2=", "3*3=", "a"]
    state = engine.state_dict()["cpu_rng"].clone()
    greedy = SamplingParams(n=1, max_tokens=10, temperature=0.0, seed=0)
    out = engine.generate(prompts, greedy)
    assert torch.equal(engine.state_dict()["cpu_rng"], state)  # a seeded call
    again = engine.generate(prompts, SamplingParams(n=1, max_tokens=10, temperature=0.0, seed=7))
    assert [c.token_ids for c in again] == [c.token_ids for c in out]  # no randomness left
    for prompt, c in zip(prompts, out, strict=True):
        ids = tok(prompt)["input_ids"]
        want: list[int] = []
        with torch.no_grad():
            for _ in range(10):
                nxt = int(model(torch.tensor([ids + want])).logits[0, -1].argmax())
                want.append(nxt)
                if nxt == tok.eos_token_id:
                    break
        assert c.token_ids == want
        assert c.logprobs == [0.0] * len(want)  # log 1: the greedy token has all the mass
    with pytest.raises(ValueError, match="must be > 0, or 0 for greedy"):
        engine.generate(prompts, SamplingParams(n=1, max_tokens=4, temperature=-1.0))


# --- every estimator through Trainer.step() ----------------------------------------------------

NEW_ESTIMATORS = [e for e in ADV_ESTIMATORS if e not in ("grpo", "rloo", "grpo_batch_std")]


@pytest.mark.parametrize("estimator", NEW_ESTIMATORS)
def test_every_estimator_trains_and_changes_the_update(estimator: str) -> None:
    """Same rollouts and seed as GRPO's step; a key the trainer ignored, or an estimator that
    fell back to GRPO, would give GRPO's update."""
    base, _ = _update_of({})
    delta, metrics = _update_of({"algo.adv_estimator": estimator})
    assert torch.isfinite(delta).all() and delta.abs().sum() > 0
    assert _rel(delta, base) > 1e-2, estimator
    # clip_ratio/high_natural is a share of the clip-eligible tokens (A > 0): NaN where there are
    # none, as under ReMax here, whose greedy baseline answers every prompt right (Â ≤ 0).
    natural = metrics.pop(M.CLIP_RATIO_HIGH_NATURAL)
    assert math.isnan(natural) == (metrics[M.CLIP_RATIO_HIGH_ELIGIBLE] == 0)
    assert all(math.isfinite(v) for k, v in metrics.items() if not k.startswith("perf/")), metrics


class RecordingEngine(ScriptedEngine):
    """ScriptedEngine that keeps each call's sampling parameters."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params: list[SamplingParams] = []

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        self.params.append(sampling)
        return super().generate(prompts, sampling)


def test_remax_baseline_is_a_greedy_response_per_prompt_scored_by_the_reward() -> None:
    tok = char_tokenizer()
    # Call 0 samples G = 4 per prompt (3, 1, 2, 1 right); call 1 is the greedy one: prompts 0
    # and 2 answered right (+1), 1 and 3 wrong (−1). Â = R − R_greedy:
    #   prompts 0, 2: right 1 − 1 = 0, wrong −1 − 1 = −2; prompts 1, 3: right 2, wrong 0.
    engine = RecordingEngine(tok, correct=[[3, 1, 2, 1], [1, 0, 1, 0]])
    cfg = make_cfg(**{"algo.adv_estimator": "remax", "run.samples_per_step": 16})
    trainer = make_trainer(cfg, engine)
    tokens_before = trainer.tokens_total
    result = trainer.step()
    assert len(engine.calls) == 2
    greedy = engine.params[1]
    assert (greedy.n, greedy.temperature, greedy.max_tokens) == (1, 0.0, 24)
    assert greedy.seed is not None  # the engine's own stream is left as it was
    assert engine.calls[1] == engine.calls[0]  # the batch's prompts, in order
    by_group: dict[int, list[tuple[float, float]]] = {}
    for s in result.samples:
        by_group.setdefault(s["group"], []).append((s["reward"], s["advantage"]))
    greedy_reward = {0: 1.0, 1: -1.0, 2: 1.0, 3: -1.0}
    for g, pairs in by_group.items():
        for reward, advantage in pairs:
            assert advantage == pytest.approx(reward - greedy_reward[g])
    assert {g: sorted({a for _, a in p}) for g, p in by_group.items()} == {
        0: [-2.0, 0.0],
        1: [0.0, 2.0],
        2: [-2.0, 0.0],
        3: [0.0, 2.0],
    }
    # The greedy responses ("so Answer: N" + EOS, 13 tokens, or 15 for the wrong "999") count
    # as generated tokens: 16 sampled responses and 4 greedy ones.
    sampled = 7 * 13 + 9 * 15
    assert trainer.tokens_total - tokens_before == sampled + 2 * 13 + 2 * 15


def test_gdpo_reads_the_overlong_penalty_as_its_own_component() -> None:
    """With the soft overlong penalty on, GDPO normalises it apart from correctness: its update
    differs from GDPO's with the penalty weighted 0, which is whitened GRPO of the score."""
    tok = char_tokenizer()
    on = {"algo.overlong_penalty": True, "algo.adv_estimator": "gdpo"}

    def delta(weights: tuple[float, float]) -> torch.Tensor:
        engine = ScriptedEngine(tok, correct=[[3, 1, 2, 1]], truncate=[[1, 0, 1, 2]])
        trainer = make_trainer(make_cfg(**on, **{"algo.gdpo_reward_weights": weights}), engine)
        before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
        trainer.step()
        return torch.cat([p.detach().flatten() for p in trainer.model.parameters()]) - before

    assert _rel(delta((1.0, 1.0)), delta((1.0, 0.0))) > 1e-2


# --- the new rollout corrections through the update ---------------------------------------------


@pytest.mark.parametrize(
    ("mode", "masked"),
    [
        # SamplerEngine: log ρ ≈ +1.5 at positions 0 mod 3, −1.5 at 1 mod 3, 0 at 2 mod 3.
        # A right response (13 tokens: five 0 mod 3, four 1 mod 3) has Σ log ρ ≈ 1.5 > ln 2:
        # the sequence mask zeroes all 7 of them (91 tokens); a wrong one (15 tokens, five and
        # five) has Σ ≈ 0 and is kept. 226 tokens in all.
        ("sequence_mask", 7 * 13 / 226),
        # AReaL's weight is zeroed where ρ ≈ 4.5 > 2: positions 0 mod 3, 5 of 13 and 5 of 15.
        ("decoupled", 80 / 226),
    ],
)
def test_sequence_mask_and_decoupled_weights_act_in_the_update(mode: str, masked: float) -> None:
    base, _ = _update_of({"algo.rollout_correction": "mis", "algo.rollout_is_cap": 1e9})
    delta, metrics = _update_of({"algo.rollout_correction": mode, "algo.rollout_is_cap": 2.0})
    assert torch.isfinite(delta).all() and delta.abs().sum() > 0
    assert _rel(delta, base) > 1e-2
    assert metrics[M.IS_MASKED_FRAC] == pytest.approx(masked, abs=1e-9)
    assert 0.85 < metrics[M.MISMATCH_ABS_LOGP] < 1.15


def test_sampler_engine_sequences_are_as_the_masked_share_assumes() -> None:
    """The control of the test above: the log ratios' sums per response under SamplerEngine's
    shifts alone (the model's own distance from uniform is what the bounds leave room for)."""
    shift = SamplerEngine.SHIFT
    right = -sum(shift[t % 3] for t in range(13))  # log ρ = −shift
    wrong = -sum(shift[t % 3] for t in range(15))
    assert right == pytest.approx(1.5) and wrong == pytest.approx(0.0)
    assert right > math.log(2.0) > wrong


class ThreadRanks:
    """Two ranks as two threads: all_gather_object meets at a barrier (the collective's
    contract: every rank's object, in rank order)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.slots: list[Any] = [None] * world
        self.barrier = threading.Barrier(world)

    def rank(self, r: int) -> Any:
        outer = self

        class Rank:
            rank, world_size = r, outer.world

            def all_gather_object(self, obj: Any) -> list[Any]:
                outer.slots[r] = obj
                outer.barrier.wait()
                out = list(outer.slots)
                outer.barrier.wait()
                return out

        return Rank()


def test_greedy_rewards_on_two_ranks_answer_each_share_and_gather_in_order() -> None:
    tok = char_tokenizer()
    cfg = make_cfg(**{"algo.adv_estimator": "remax"})
    # 5 groups; rank 0 answers groups 0, 2, 4 and rank 1 groups 1, 3 (shard: every 2nd).
    # Each rank's engine answers its k-th prompt right when k is even.
    groups = make_trainer(cfg, ScriptedEngine(tok, correct=[[4] * 5])).source(5)
    ranks = ThreadRanks(2)
    engines = [RecordingEngine(tok, correct=[[1, 0, 1]]) for _ in range(2)]
    out: dict[int, list[float]] = {}
    tokens: dict[int, int] = {}

    def run(r: int) -> None:
        trainer = make_trainer(cfg, engines[r])
        trainer.source.dist = ranks.rank(r)
        before = trainer.source.tokens
        out[r] = trainer.source.greedy_rewards(groups)
        tokens[r] = trainer.source.tokens - before

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert engines[0].calls == [[groups[i].prompt for i in (0, 2, 4)]]
    assert engines[1].calls == [[groups[i].prompt for i in (1, 3)]]
    # rank 0: groups 0 (right), 2 (wrong), 4 (right); rank 1: groups 1 (right), 3 (wrong)
    want = [1.0, 1.0, -1.0, -1.0, 1.0]
    assert out[0] == out[1] == want
    assert tokens[0] == tokens[1] == 3 * 13 + 2 * 15  # every rank counts every greedy token
