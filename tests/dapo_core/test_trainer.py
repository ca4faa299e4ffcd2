"""The trainer's step (Algorithm 1) with a scripted rollout engine whose outcomes are known.

ScriptedEngine (tests/scripted_engine.py) is a real RolloutEngine: it returns token ids the model
scores, but which groups are informative, which responses are truncated and how long they are is
fixed by a script, so dynamic sampling, the carry-over, the cap, the overlong filter and the LR
schedule can be checked against hand-computed numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
import torch
from scripted_engine import PROBLEMS, ScriptedEngine, make_cfg, make_trainer
from tiny_policy import char_tokenizer, tiny_llama

import dapo_core.train.trainer as trainer_mod
import dapo_core.train.update as update_mod
from dapo_common import metric_names as M
from dapo_core.engines.base import Completion, SamplingParams
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.batching import Seq, gather_rows, pack, scatter_rows
from dapo_core.train.trainer import Trainer


def test_one_step_reads_like_algorithm_1() -> None:
    tok = char_tokenizer()
    # 4 prompts × G=4: correct counts 4, 0, 2, 1 → groups 0 and 1 are uninformative.
    engine = ScriptedEngine(tok, correct=[[4, 0, 2, 1]])
    trainer = make_trainer(make_cfg(), engine)
    result = trainer.step()
    m = result.metrics
    # acc = (4 + 0 + 2 + 1) / 16 = 0.4375; score = 2·acc − 1 = −0.125; no penalty (arm grpo).
    assert m[M.ACC_MEAN] == pytest.approx(7 / 16)
    assert m[M.SCORE_MEAN] == pytest.approx(-0.125)
    assert m[M.REWARD_MEAN] == pytest.approx(-0.125)
    assert m[M.KEPT_GROUPS] == pytest.approx(0.5)
    assert m[M.TRAIN_GROUPS] == 4  # no dynamic sampling: every group trains
    assert m[M.TRAIN_INFORMATIVE] == pytest.approx(0.5)  # ... informative or not
    assert m[M.GEN_BATCHES] == 1
    # 4 groups / mini-batches of 2 groups × 1 epoch = 2 gradient updates
    assert m[M.GRAD_UPDATES] == 2
    assert m[M.ROLLOUT_STEP] == 1
    # "so Answer: 5" + EOS = 13 tokens, "so Answer: 999" + EOS = 15 tokens:
    # 7 correct · 13 + 9 wrong · 15 = 91 + 135 = 226
    assert m[M.TOKENS_TOTAL] == 226
    assert m[M.RESPONSE_LENGTH_MEAN] == pytest.approx(226 / 16)
    assert m[M.RESPONSE_LENGTH_MAX] == 15
    assert m[M.ENTROPY_MEAN] > 0 and m[M.GRAD_NORM] > 0
    assert 0 <= m[M.CLIP_RATIO_HIGH] <= 1 and 0 <= m[M.CLIP_RATIO_LOW] <= 1
    assert len(result.samples) == 3
    assert set(result.samples[0]) == {
        "prompt", "response", "ground_truth", "pred", "reward", "score",
        "overlong_penalty", "correct", "length", "truncated", "group", "member", "advantage",
        "tokens",  # the per-token record of a trained rollout (dapo_core/test_token_colours.py)
    }  # fmt: skip
    # The 3 kept of 16 responses are evenly spaced: 0, 5, 10 -> group 0 member 0, group 1
    # member 1, group 2 member 2. Groups 0 and 1 are constant (advantage exactly 0); group 2
    # is (+1, +1, −1, −1): mean 0, unbiased std √(4/3), so member 2 has −1/1.1547 = −0.866.
    kept = [(s["group"], s["member"], s["correct"]) for s in result.samples]
    assert kept == [(0, 0, True), (1, 1, False), (2, 2, False)]
    assert [s["advantage"] for s in result.samples] == pytest.approx([0.0, 0.0, -0.866025])


def test_dynamic_sampling_carry_over_and_cap(caplog: pytest.LogCaptureFixture) -> None:
    trainer_mod._warned.discard("empty-step")  # an earlier test's empty step said it already
    tok = char_tokenizer()
    G = 4
    informative, solved, failed = 2, G, 0
    engine = ScriptedEngine(
        tok,
        correct=[
            [informative, solved, informative, informative],  # call 1: 3 kept
            [informative, informative, failed, informative],  # call 2: 3 kept → 6, carry 2
            [failed, solved, failed, failed],  # step 2, call 3: 0 kept
            [failed, failed, failed, informative],  # call 4: 1 kept → 2 + 1 = 3
            [solved, solved, solved, solved],  # call 5: 0 kept, the cap (3 batches)
            [failed] * 4,  # step 3: nothing at all
            [failed] * 4,
            [failed] * 4,
        ],
    )
    cfg = make_cfg(**{"algo.dynamic_sampling": True, "algo.max_gen_batches": 3})
    trainer = make_trainer(cfg, engine)

    m1 = trainer.step().metrics
    assert (m1[M.GEN_BATCHES], m1[M.TRAIN_GROUPS], m1[M.CARRIED_GROUPS]) == (2, 4, 2)
    assert m1[M.KEPT_GROUPS] == pytest.approx(6 / 8)
    assert m1[M.TRAIN_INFORMATIVE] == 1.0  # the filter: only informative groups train
    assert m1[M.GRAD_UPDATES] == 2  # 4 groups / 2 per mini-batch
    carried = [g.prompt for g in trainer.carried_groups]
    assert carried == [engine.calls[1][1], engine.calls[1][3]]  # the surplus, oldest first

    # The carry survives a checkpoint round trip.
    state = trainer.state_dict()
    clone = make_trainer(cfg, ScriptedEngine(tok, correct=engine.correct))
    clone.load_state_dict(state)
    assert [g.prompt for g in clone.carried_groups] == carried
    assert clone.carried_groups[0].rollouts[0].completion.token_ids == (
        trainer.carried_groups[0].rollouts[0].completion.token_ids
    )

    with caplog.at_level(logging.WARNING, logger="dapo_core.train.trainer"):
        m2 = trainer.step().metrics
    # carry 2 + 0 + 1 + 0 = 3 < 4 after 3 batches: train on the 3, never crash
    assert (m2[M.GEN_BATCHES], m2[M.TRAIN_GROUPS], m2[M.CARRIED_GROUPS]) == (3, 3, 0)
    assert m2[M.GRAD_UPDATES] == 2 + 2  # 3 groups → mini-batches of 2 and 1
    assert "max_gen_batches=3 with 3/4" in caplog.text
    assert m2[M.GEN_BATCHES_TOTAL] == 5

    with caplog.at_level(logging.WARNING, logger="dapo_core.train.trainer"):
        m3 = trainer.step().metrics
    assert m3[M.TRAIN_GROUPS] == 0
    assert m3[M.GRAD_UPDATES] == 4  # no update
    assert m3[M.POLICY_LOSS] != m3[M.POLICY_LOSS]  # NaN: nothing trained
    assert "kept 0 informative groups out of 12 in 3 generation batches" in caplog.text


def _grads_after_one_minibatch(cfg: ExperimentConfig) -> list[torch.Tensor]:
    tok = char_tokenizer()
    engine = ScriptedEngine(tok, correct=[[3, 1, 2, 0]], truncate=[[1, 0, 2, 1]])
    trainer = make_trainer(cfg, engine)
    grads: list[torch.Tensor] = []

    def capture(opt: Any, args: Any, kwargs: Any) -> None:
        if not grads:
            grads.extend(p.grad.clone() for p in trainer.model.parameters())

    trainer.optimizer.register_step_pre_hook(capture)
    trainer.step()
    return grads


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_gradient_is_exact(agg: str) -> None:
    # One mini-batch of all 4 groups (16 sequences), overlong filter on: micro-batches of 1
    # sequence must give the gradient of one micro-batch of 16.
    common = {
        "algo.loss_agg": agg,
        "algo.overlong_filter": True,
        "batch.mini_batch_size": 4,
        "optim.grad_clip": 1e9,
    }
    one = _grads_after_one_minibatch(make_cfg(**common, **{"batch.micro_batch_size": 1}))
    whole = _grads_after_one_minibatch(make_cfg(**common, **{"batch.micro_batch_size": 16}))
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(one, whole, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_overlong_filter_removes_truncated_rows_from_the_token_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[float, float]] = []
    real = update_mod.policy_loss

    def spy(logprobs, old, adv, mask, **kw):  # type: ignore[no-untyped-def]
        seen.append((float(kw["num_tokens"]), float(mask.sum())))
        return real(logprobs, old, adv, mask, **kw)

    monkeypatch.setattr(update_mod, "policy_loss", spy)
    tok = char_tokenizer()
    # One mini-batch of 4 groups; prompt 1 and 2 have 1 and 2 truncated responses of 24 tokens.
    cfg = make_cfg(**{"batch.mini_batch_size": 4, "batch.micro_batch_size": 64})
    for overlong_filter in (False, True):
        seen.clear()
        c = cfg.with_overrides({"algo.overlong_filter": overlong_filter})
        engine = ScriptedEngine(tok, correct=[[2, 2, 2, 2]], truncate=[[0, 1, 2, 0]])
        m = make_trainer(c, engine).step().metrics
        ((num_tokens, mask_tokens),) = seen
        # correct rows have 13 tokens, wrong ones 15, truncated ones 24 (the budget):
        # without the filter all 16 rows count: 8·13 + 5·15 + 3·24 = 104 + 75 + 72 = 251;
        # with it the 3 truncated rows leave the loss and the count: 251 − 72 = 179.
        assert num_tokens == mask_tokens == (179 if overlong_filter else 251)
        # their share of the loss weight (sample-level mean: 3 of 16 rows), 0 once filtered
        assert m[M.LOSS_TRUNCATED_SHARE] == (0.0 if overlong_filter else pytest.approx(3 / 16))


def test_lr_warm_up_follows_gradient_updates() -> None:
    tok = char_tokenizer()
    engine = ScriptedEngine(tok, correct=[[1, 2, 3, 2]])
    # 4 groups / 2 per mini-batch × μ=2 epochs = 4 updates per rollout step; warm-up 6 updates.
    cfg = make_cfg(**{"optim.warmup_updates": 6, "algo.ppo_epochs": 2, "optim.lr": 0.01})
    trainer = make_trainer(cfg, engine)
    lrs: list[float] = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"])
    )
    trainer.step()
    m = trainer.step().metrics
    # update u (0-based) uses 0.01 · min(1, (u + 1) / 6)
    expected = [0.01 * min(1.0, (u + 1) / 6) for u in range(8)]
    assert lrs == pytest.approx(expected)
    assert m[M.GRAD_UPDATES] == 8 and m[M.ROLLOUT_STEP] == 2


def test_soft_overlong_penalty_enters_the_reward() -> None:
    tok = char_tokenizer()
    engine = ScriptedEngine(tok, correct=[[4, 4, 4, 4]], truncate=[[1, 0, 0, 0]])
    cfg = make_cfg(**{"algo.overlong_penalty": True})
    m = trainer_step_metrics(cfg, engine)
    # L_max 24, L_cache 8: ramp from 16 tokens. 15 correct rows of 13 tokens: 0 penalty;
    # 1 truncated row of 24 tokens: (16 − 24) / 8 = −1. Mean penalty = −1/16.
    assert m[M.OVERLONG_PENALTY_MEAN] == pytest.approx(-1 / 16)
    # (the truncated row's correctness depends on how its repeated text parses, so the
    # reward is checked against the score rather than a constant)
    assert m[M.REWARD_MEAN] == pytest.approx(m[M.SCORE_MEAN] - 1 / 16)
    assert m[M.RESPONSE_CLIP_RATIO] == pytest.approx(1 / 16)


def trainer_step_metrics(cfg: ExperimentConfig, engine: ScriptedEngine) -> dict[str, float]:
    return make_trainer(cfg, engine).step().metrics


def test_single_minibatch_single_epoch_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    tok = char_tokenizer()
    trainer_mod._warned.discard("ratio-one")
    cfg = make_cfg(**{"batch.mini_batch_size": 4})
    with caplog.at_level(logging.WARNING, logger="dapo_core.train.trainer"):
        make_trainer(cfg, ScriptedEngine(tok, correct=[[1, 2, 3, 2]]))
        make_trainer(cfg, ScriptedEngine(tok, correct=[[1, 2, 3, 2]]))
    assert caplog.text.count("importance ratio is exactly 1") == 1


def test_empty_steps_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    # Every group solved or failed by all G responses: dynamic sampling keeps none, step after
    # step. The warning names the first such step and is not repeated for the next ones.
    tok = char_tokenizer()
    trainer_mod._warned.discard("empty-step")
    engine = ScriptedEngine(tok, correct=[[4, 0, 4, 0]])
    cfg = make_cfg(**{"algo.dynamic_sampling": True, "algo.max_gen_batches": 1})
    trainer = make_trainer(cfg, engine)
    with caplog.at_level(logging.WARNING, logger="dapo_core.train.trainer"):
        steps = [trainer.step().metrics for _ in range(3)]
    assert [m[M.TRAIN_GROUPS] for m in steps] == [0, 0, 0]
    assert caplog.text.count("kept 0 informative groups") == 1
    assert "step 1: dynamic sampling kept 0" in caplog.text


# --- packed micro-batches and the first mini-batch's old log-probs ------------------------------
def varied_seqs(n: int = 9, seed: int = 0) -> list[Seq]:
    """Sequences of mixed prompt (2-6) and response (1-12) lengths over the char vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(2, 7, (), generator=gen))
        r = int(torch.randint(1, 13, (), generator=gen))
        ids = torch.randint(3, 40, (p + r,), generator=gen).tolist()
        out.append(Seq(i, ids[:p], ids[p:], False, float(torch.randn((), generator=gen))))
    return out


def test_pack_places_every_token_and_reads_back_per_sequence() -> None:
    seqs = varied_seqs()
    for packed in (False, True):
        p = pack(seqs, 0, "cpu", packed=packed)
        rows, width = p.input_ids.shape
        assert p.tokens == sum(s.length for s in seqs)
        longest = max(s.length for s in seqs)
        if packed:  # several per row, rows 1 to 2 times the longest sequence
            assert width in (longest, longest * 3 // 2, 2 * longest) and rows < len(seqs)
            assert rows * width < len(seqs) * longest  # fewer slots than padding
            assert p.attention_mask is None and p.position_ids is not None
        else:
            assert rows == len(seqs) and p.position_ids is None
        # The response token t of sequence i is input_ids at (its log-prob position) + 1.
        flat = p.input_ids.reshape(-1)
        at = p.response_index + p.response_index // (width - 1) + 1  # [R, C−1] → [R, C] next
        assert flat[at].tolist() == [t for s in seqs for t in s.response_ids]
        assert p.response_mask.sum() == sum(len(s.response_ids) for s in seqs)
        # per_seq / scatter_rows: one sequence per row, the values in order.
        values = [
            torch.arange(len(s.response_ids), dtype=torch.float32) + i for i, s in enumerate(seqs)
        ]
        scattered = scatter_rows(values, p)
        assert scattered.shape == (len(seqs), max(len(s.response_ids) for s in seqs))
        model_layout = torch.zeros(rows * (width - 1))
        model_layout[p.response_index] = torch.cat(values)
        assert torch.equal(p.per_seq(model_layout.view(rows, width - 1)), scattered)
        assert all(
            torch.equal(a, b)
            for a, b in zip(gather_rows(model_layout.view(rows, width - 1), p), values, strict=True)
        )
    # Packed positions restart at 0 with each sequence: a row reads 0..ℓ1−1, 0..ℓ2−1, ...
    p = pack(seqs, 0, "cpu", packed=True)
    starts = (p.position_ids == 0).sum()
    assert starts >= len(seqs)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_packed_logprobs_and_gradients_equal_the_padded_ones(agg: str) -> None:
    # The same sequences, one per right-padded row or several per packed row (block-diagonal
    # attention from the restarting position ids): log-probs, entropies and the gradient of
    # the loss agree to float32 rounding (1e-5; packed and padded shapes round differently).
    from dapo_core.algo.losses import policy_loss
    from dapo_core.train.policy import PolicyForward

    seqs = varied_seqs(12, seed=3)
    results = []
    for packed in (False, True):
        model = tiny_llama(50, seed=5)
        fwd = PolicyForward(model, compute_dtype=torch.float32, temperature=0.8)
        p = pack(seqs, 0, "cpu", packed=packed)
        lp_rows, ent_rows = fwd(p)
        lp, ent = p.per_seq(lp_rows), p.per_seq(ent_rows)
        old = lp.detach() + 0.05 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(0))
        adv = torch.tensor([s.advantage for s in seqs])
        loss, _ = policy_loss(lp, old, adv, p.loss_mask, clip_low=0.2, clip_high=0.28, agg=agg)
        loss.backward()
        grads = torch.cat([q.grad.flatten() for q in model.parameters()])
        results.append((lp.detach(), ent, grads))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=1e-5)
    assert g0.abs().sum() > 0
    torch.testing.assert_close(g1, g0, atol=1e-5, rtol=1e-4)


def test_a_model_that_ignores_packing_falls_back_to_padding(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A decoder that drops the position ids lets a packed sequence attend to the one before it:
    # the probe sees its log-probs depend on the prefix and the updater pads instead.
    from dapo_core.train.policy import PolicyForward

    model = tiny_llama(50)
    fwd = PolicyForward(model, compute_dtype=torch.float32, temperature=1.0)
    assert fwd.packs_exactly(0, torch.device("cpu"))
    real = model.model.forward

    def ignore_positions(*args, position_ids=None, **kwargs):  # type: ignore[no-untyped-def]
        return real(*args, **kwargs)

    model.model.forward = ignore_positions
    assert not fwd.packs_exactly(0, torch.device("cpu"))
    tok = char_tokenizer()
    trainer = Trainer(
        make_cfg(),
        model,
        tok,
        ScriptedEngine(tok, correct=[[1, 2, 3, 2]]),
        PROBLEMS,
        format_prompt=lambda p: f"{p.prompt}={p.answer}",
    )
    with caplog.at_level(logging.WARNING, logger="dapo_core.train.update"):
        trainer.step()
    assert trainer.updater._packed is False
    assert "padding instead" in caplog.text


def _run_update(reuse: bool, cfg: ExperimentConfig) -> tuple[Any, list[Seq], list[float]]:
    """One `Updater.run` over a scripted batch; the old log-probs the first mini-batch's loss
    saw against its new log-probs, the updated weights and the (row, ratio) of that loss."""
    tok = char_tokenizer()
    engine = ScriptedEngine(tok, correct=[[3, 1, 2, 0]], truncate=[[1, 0, 2, 1]])
    trainer = make_trainer(cfg, engine)
    if not reuse:
        trainer.updater._dropout = True  # as if the model had dropout: the separate pass
    assert trainer.updater.reuses_first_forward == reuse
    ratios: list[float] = []
    real = update_mod.policy_loss

    def spy(lp, old, adv, mask, **kw):  # type: ignore[no-untyped-def]
        if not ratios:  # the first mini-batch of the first epoch
            m = mask.bool()
            ratios.extend(torch.exp(lp.detach() - old)[m].tolist())
        return real(lp, old, adv, mask, **kw)

    update_mod.policy_loss = spy
    try:
        metrics = trainer.step().metrics
    finally:
        update_mod.policy_loss = real
    return metrics, [p.detach().clone() for p in trainer.model.parameters()], ratios


def test_first_minibatch_takes_old_logprobs_from_its_own_forward() -> None:
    # Exact: with the reuse the first mini-batch's importance ratio is 1 bit for bit (θ = θ_old
    # and the same forward), and the step's result equals the separate pass's to float32
    # rounding (there the ratio is 1 ± about 1e-7: another forward of other shapes).
    cfg = make_cfg(**{"algo.ppo_epochs": 2, "algo.overlong_filter": True, "optim.grad_clip": 1e9})
    m_reuse, w_reuse, r_reuse = _run_update(True, cfg)
    m_pass, w_pass, r_pass = _run_update(False, cfg)
    assert r_reuse and set(r_reuse) == {1.0}
    assert max(abs(r - 1) for r in r_pass) < 1e-5
    for a, b in zip(w_reuse, w_pass, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    for key in (M.ENTROPY_MEAN, M.POLICY_LOSS, M.GRAD_NORM, M.CLIP_RATIO_HIGH, M.APPROX_KL):
        assert m_reuse[key] == pytest.approx(m_pass[key], rel=1e-4, abs=1e-7), key
    assert m_reuse[M.GRAD_UPDATES] == m_pass[M.GRAD_UPDATES] == 4


def test_no_reuse_where_the_old_logprobs_are_needed_first() -> None:
    tok = char_tokenizer()
    engine = ScriptedEngine(tok, correct=[[1, 2, 3, 2]])
    assert make_trainer(make_cfg(), engine).updater.reuses_first_forward
    for change in ({"algo.rollout_correction": "tis"}, {"algo.kl_coef": 0.1}):
        assert not make_trainer(make_cfg(**change), engine).updater.reuses_first_forward, change
    model = tiny_llama(len(tok))
    model.config.attention_dropout = 0.1
    trainer = Trainer(make_cfg(), model, tok, engine, PROBLEMS)
    assert not trainer.updater.reuses_first_forward


# --- every registered variant, through Trainer.step() --------------------------------------------
class SamplerEngine(ScriptedEngine):
    """ScriptedEngine whose completions carry sampler log-probs around log(1/V) (a fresh random
    model is close to uniform), so that the sampler-trainer ratio π_old/π_sampler is about 1 at
    positions 2 mod 3, about e^-1.5 ≈ 0.22 at 1 mod 3 (sampler 1.5 nats above) and about
    e^1.5 ≈ 4.5 at 0 mod 3 (1.5 nats below): a cap of 2 caps the last third (TIS) and the
    window [1/2, 2] masks the first two thirds (MIS)."""

    SHIFT: ClassVar[dict[int, float]] = {0: -1.5, 1: 1.5, 2: 0.0}

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        uniform = -float(torch.log(torch.tensor(float(len(self.tok)))))
        out = []
        for c in super().generate(prompts, sampling):
            lps = [uniform + self.SHIFT[t % 3] for t in range(len(c.token_ids))]
            out.append(dataclasses.replace(c, logprobs=lps))
        return out


def _update_of(overrides: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
    """The parameter change of one rollout step under `overrides`, and its metrics."""
    tok = char_tokenizer()
    engine = SamplerEngine(tok, correct=[[3, 1, 2, 1]])
    # Four epochs at a large step: later updates see ratios beyond the clip range, where the
    # losses differ (at ratio 1 vanilla, GSPO and CISPO have the same gradient).
    trainer = make_trainer(
        make_cfg(**{"algo.ppo_epochs": 4, "optim.lr": 2e-2, **overrides}), engine
    )
    before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
    metrics = trainer.step().metrics
    after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return after - before, metrics


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# A rollout correction that changes nothing (MIS keeping every ratio up to 1e9) but takes the
# same path as TIS and MIS: old log-probs from their own pass, not the first forward.
NO_OP_CORRECTION = {"algo.rollout_correction": "mis", "algo.rollout_is_cap": 1e9}
VARIANTS = [
    {"algo.loss_mode": "gspo"},
    {"algo.loss_mode": "cispo"},
    {"algo.adv_estimator": "rloo"},
    {"algo.adv_estimator": "grpo_batch_std"},
    {"algo.entropy_coef": 0.05},
    {"algo.rollout_correction": "tis"},
    {"algo.rollout_correction": "mis"},
]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: "=".join(map(str, *o.items())))
def test_every_variant_trains_and_changes_the_update(overrides: dict[str, Any]) -> None:
    """Each registered variant runs through Trainer.step() and moves the weights differently
    from the default arm on the same rollouts and seed: a key that the trainer ignored would
    give the same update. A correction is compared with a correction that changes nothing,
    so that the old-log-prob path is the same on both sides and only its weights or its mask
    can make the difference."""
    correction = overrides.get("algo.rollout_correction")
    base, base_metrics = _update_of(NO_OP_CORRECTION if correction else {})
    delta, metrics = _update_of(overrides)
    assert base_metrics[M.CLIP_RATIO_HIGH] + base_metrics[M.CLIP_RATIO_LOW] > 0  # it clipped
    assert torch.isfinite(delta).all() and delta.abs().sum() > 0
    assert _rel(delta, base) > 1e-2, overrides
    assert all(math.isfinite(v) for k, v in metrics.items() if not k.startswith("perf/")), metrics
    # The sampler–trainer mismatch is measured whatever the correction: about 1 nat a token
    # (1.5 on two thirds of the tokens, 0 on the rest, up to the model's distance from uniform).
    assert 0.85 < metrics[M.MISMATCH_ABS_LOGP] < 1.15
    assert metrics[M.MISMATCH_KL] > 0
    masked = metrics[M.IS_MASKED_FRAC]
    # 7 correct responses of 13 tokens ("so Answer: 5" + EOS) and 9 wrong ones of 15, 226
    # tokens. TIS caps positions 0 mod 3 (ratio ≈ 4.5 > 2): 5 of 13 and 5 of 15, 80 tokens.
    # MIS also masks positions 1 mod 3 (ratio ≈ 0.22 < 1/2): 9 of 13 and 10 of 15, 153 tokens.
    if correction == "mis":
        assert masked == pytest.approx(153 / 226, abs=1e-9)
    elif correction == "tis":
        assert masked == pytest.approx(80 / 226, abs=1e-9)
    else:
        assert masked == 0.0
    assert base_metrics[M.IS_MASKED_FRAC] == 0.0


def test_the_no_op_correction_is_the_default_update_up_to_rounding() -> None:
    """The control of the test above: the separate old-log-prob pass alone moves the update
    far less than any variant does there."""
    assert _rel(_update_of(NO_OP_CORRECTION)[0], _update_of({})[0]) < 1e-3
