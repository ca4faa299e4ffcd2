"""A character tokenizer and a tiny random Llama: a real policy for the tests, with no download.

Imported by bare name (`from tiny_policy import ...`), like the other shared test modules: pytest
puts tests/ on sys.path (tests/conftest.py's folder), for tests/vllm_engine/ in .venv-vllm too.
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from dapo_core.train.logprobs import token_logprobs_and_entropy

CHARS = "0123456789+-*=?:. abcdefghijklmnopqrstuvwxyzAWS\n"
PAD, EOS = 0, 1


def char_tokenizer(*, padding_side: str = "right") -> PreTrainedTokenizerFast:
    """Character-level: one token per character of CHARS, <pad>=0, <eos>=1, <unk>=2."""
    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": 2}
    for c in CHARS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    out.padding_side = padding_side
    return out


def tiny_llama(
    vocab: int, seed: int | None = 0, *, eos_bias: float = 0.0, **config: Any
) -> LlamaForCausalLM:
    """A random Llama of one layer, 32 wide (`config` overrides any LlamaConfig field), drawn
    after torch.manual_seed(seed) (None: from the global stream as it stands). `eos_bias` > 0
    raises the EOS logit, so that some sampled responses stop before the budget."""
    if seed is not None:
        torch.manual_seed(seed)
    defaults: dict[str, Any] = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "bos_token_id": None,
    }
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, **{**defaults, **config}))
    if eos_bias:
        with torch.no_grad():
            model.lm_head.weight[EOS] += eos_bias * model.model.norm.weight.sign()
    return model


def forward_logprobs(
    model: LlamaForCausalLM, prompt_ids: list[int], token_ids: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """log π(token | prompt, earlier tokens) of each of `token_ids`, `[len(token_ids)]`, from one
    forward pass over the whole sequence: what a rollout engine's reported log-probs must be."""
    ids = torch.tensor([prompt_ids + token_ids])
    resp = torch.zeros_like(ids)
    resp[0, len(prompt_ids) :] = 1
    with torch.no_grad():
        lp, _ = token_logprobs_and_entropy(
            model, ids, torch.ones_like(ids), resp, temperature=temperature
        )
    return lp[0, len(prompt_ids) - 1 :]
