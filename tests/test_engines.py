"""The `hf` rollout engine: grouping, finish reasons, its own random stream, its logprobs."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from dapo_core.config import ExperimentConfig
from dapo_core.engines import HFEngine, RolloutEngine, SamplingParams, make_engine
from dapo_core.engines.vllm_engine import vllm_available
from dapo_core.logprobs import token_logprobs_and_entropy

CHARS = "0123456789+-*=?:. abcdefghijklmnopqrstuvwxyzAWS\n"
EOS = 1
PROMPTS = ["what is 2+3?", "what is 7*6?", "s 1 9 4"]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level: one token per character, <pad>=0, <eos>=1, <unk>=2."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for c in CHARS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    out.padding_side = "left"
    return out


def tiny_model(vocab: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        eos_token_id=EOS,
        pad_token_id=0,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # make EOS likely enough that some responses stop early
        model.lm_head.weight[EOS] += 0.5 * model.model.norm.weight.sign()
    return model


@pytest.fixture(scope="module")
def parts() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tok = tiny_tokenizer()
    return tiny_model(len(tok)), tok


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
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        resp = torch.zeros_like(ids)
        resp[0, len(c.prompt_ids) :] = 1
        with torch.no_grad():
            lp, _ = token_logprobs_and_entropy(
                model, ids, torch.ones_like(ids), resp, temperature=0.7
            )
        torch.testing.assert_close(
            torch.tensor(c.logprobs), lp[0, len(c.prompt_ids) - 1 :], atol=1e-4, rtol=1e-4
        )
    # top-p tiny: only the arg-max survives the nucleus, so every logprob is log 1 = 0 and
    # the tokens are the greedy ones.
    greedy = engine.generate(PROMPTS[:1], SamplingParams(n=2, max_tokens=5, top_p=1e-6))
    assert greedy[0].token_ids == greedy[1].token_ids
    assert max(abs(x) for x in greedy[0].logprobs) < 1e-6


def test_load_weights_shared_is_noop_foreign_is_copied(parts) -> None:
    _, tok = parts
    model = tiny_model(len(tok), seed=1)
    engine = HFEngine(model, tok, max_prompt_len=16)
    engine.load_weights(model.state_dict())  # the same tensors: nothing to do
    other = tiny_model(len(tok), seed=2)
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
