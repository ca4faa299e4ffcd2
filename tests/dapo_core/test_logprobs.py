"""Chunked per-token log-probs / entropy equal the naive full-vocabulary computation."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_policy import tiny_llama
from torch import nn

from dapo_core.train.logprobs import (
    linear_logprobs_and_entropy,
    naive_logprobs_and_entropy,
    token_logprobs_and_entropy,
)


def test_hand_computed_two_token_vocabulary() -> None:
    # head = identity on 2 dims, hidden = [0, ln 3] → logits [0, ln 3] → p = [1/4, 3/4].
    head = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(2))
    hidden = torch.tensor([[[0.0, math.log(3.0)]]])
    lp, ent = linear_logprobs_and_entropy(hidden, head, torch.tensor([[1]]))
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    # H = −(1/4 ln 1/4 + 3/4 ln 3/4) = 0.25·1.3863 + 0.75·0.2877 = 0.5623
    assert ent.item() == pytest.approx(0.5623351, abs=1e-6)
    # temperature 2: logits [0, ln 3 / 2] → p1 = √3 / (1 + √3) = 0.6340
    lp_t, _ = linear_logprobs_and_entropy(hidden, head, torch.tensor([[1]]), temperature=2.0)
    assert lp_t.item() == pytest.approx(math.log(math.sqrt(3) / (1 + math.sqrt(3))), abs=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 5, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_matches_naive_values_and_gradients(chunk_size: int, bias: bool) -> None:
    torch.manual_seed(0)
    B, T, H, V = 3, 7, 16, 50
    hidden = torch.randn(B, T, H, requires_grad=True)
    head = nn.Linear(H, V, bias=bias)
    targets = torch.randint(0, V, (B, T))
    mask = torch.rand(B, T) > 0.3
    weights = torch.randn(B, T)  # a generic upstream gradient

    lp, ent = linear_logprobs_and_entropy(
        hidden, head, targets, mask, temperature=0.7, chunk_size=chunk_size
    )
    (lp * weights).sum().backward()
    got = [hidden.grad.clone(), head.weight.grad.clone()]
    if bias:
        got.append(head.bias.grad.clone())
    hidden.grad = None
    head.zero_grad()

    ref_lp, ref_ent = naive_logprobs_and_entropy(head(hidden), targets, temperature=0.7)
    ref_lp, ref_ent = ref_lp * mask, ref_ent * mask
    (ref_lp * weights).sum().backward()
    want = [hidden.grad, head.weight.grad] + ([head.bias.grad] if bias else [])

    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert not ent.requires_grad
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()


def test_masked_positions_get_no_gradient() -> None:
    torch.manual_seed(1)
    hidden = torch.randn(1, 4, 8, requires_grad=True)
    head = nn.Linear(8, 11, bias=False)
    mask = torch.tensor([[True, False, True, False]])
    lp, _ = linear_logprobs_and_entropy(hidden, head, torch.zeros(1, 4, dtype=torch.long), mask)
    lp.sum().backward()
    assert hidden.grad[0, 1].abs().sum() == 0 and hidden.grad[0, 3].abs().sum() == 0
    assert hidden.grad[0, 0].abs().sum() > 0


def test_model_level_logprobs_match_full_logits_with_right_padding() -> None:
    # No padding row (pad_token_id None): every row of the tied embedding is random.
    model = tiny_llama(
        40,
        seed=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        tie_word_embeddings=True,
        pad_token_id=None,
    )
    ids = torch.randint(3, 40, (2, 9))
    attn = torch.ones_like(ids)
    attn[1, 7:] = 0  # row 1 is 7 tokens long, right-padded
    resp = torch.zeros_like(ids)
    resp[0, 4:] = 1  # prompt 4 tokens, response 5
    resp[1, 3:7] = 1  # prompt 3 tokens, response 4
    lp, ent = token_logprobs_and_entropy(model, ids, attn, resp, chunk_size=3)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    ref_lp, ref_ent = naive_logprobs_and_entropy(logits, ids[:, 1:])
    m = resp[:, 1:].bool()
    torch.testing.assert_close(lp[m], ref_lp[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[m], ref_ent[m], atol=1e-5, rtol=1e-5)
    assert (lp[~m] == 0).all()
    # Tied embeddings: the gradient reaches the shared matrix through the head and the input.
    lp.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None


def test_entropy_gradient_matches_autograd_of_the_full_softmax() -> None:
    """With entropy_grad the chunked entropy is differentiable (the entropy bonus needs it):
    ∂H/∂z_j = −p_j (log p_j + H), checked against autograd through a full log_softmax."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    head = torch.nn.Linear(8, 11, bias=True).double()
    targets = torch.randint(0, 11, (2, 5))
    w_lp, w_ent = torch.randn(2, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)

    lp, ent = linear_logprobs_and_entropy(
        hidden, head, targets, temperature=0.7, chunk_size=3, entropy_grad=True
    )
    ours = torch.autograd.grad((lp * w_lp).sum() + (ent * w_ent).sum(), [hidden, head.weight])

    logp = torch.log_softmax(head(hidden) / 0.7, dim=-1)
    ref_lp = logp.gather(-1, targets[..., None]).squeeze(-1)
    ref_ent = -(logp.exp() * logp).sum(-1)
    ref = torch.autograd.grad(
        (ref_lp * w_lp).sum() + (ref_ent * w_ent).sum(), [hidden, head.weight]
    )
    torch.testing.assert_close(ent.double(), ref_ent, rtol=1e-5, atol=1e-6)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-6)


def test_entropy_has_no_gradient_by_default() -> None:
    hidden = torch.randn(1, 3, 4, requires_grad=True)
    head = torch.nn.Linear(4, 5)
    _, ent = linear_logprobs_and_entropy(hidden, head, torch.zeros(1, 3, dtype=torch.long))
    assert not ent.requires_grad


def test_packed_rows_score_each_sequence_as_if_alone() -> None:
    # Two sequences in one row, position ids restarting at the second (no attention mask):
    # transformers builds a block-diagonal causal mask, so each scores what it scores alone.
    model = tiny_llama(40, seed=4, num_hidden_layers=2, num_attention_heads=4, pad_token_id=None)
    a, b = torch.randint(3, 40, (6,)), torch.randint(3, 40, (5,))
    row = torch.cat([a, b])[None, :]
    positions = torch.cat([torch.arange(6), torch.arange(5)])[None, :]
    resp = torch.zeros_like(row)
    resp[0, 2:6] = 1  # a: prompt 2 tokens, response 4
    resp[0, 8:] = 1  # b: prompt 2 tokens, response 3
    lp, ent = token_logprobs_and_entropy(model, row, None, resp, position_ids=positions)
    for seq, start, prompt in ((a, 0, 2), (b, 6, 2)):
        alone = torch.zeros_like(seq)[None, :]
        alone[0, prompt:] = 1
        ref_lp, ref_ent = token_logprobs_and_entropy(
            model, seq[None, :], torch.ones_like(seq)[None, :], alone
        )
        n = len(seq) - 1
        got = lp[0, start : start + n][alone[0, 1:].bool()]
        torch.testing.assert_close(got, ref_lp[0][alone[0, 1:].bool()], atol=1e-5, rtol=1e-5)
        got_ent = ent[0, start : start + n][alone[0, 1:].bool()]
        torch.testing.assert_close(got_ent, ref_ent[0][alone[0, 1:].bool()], atol=1e-5, rtol=1e-5)
