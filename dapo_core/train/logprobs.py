"""Per-token log-probabilities and entropy without a full-vocabulary logits tensor.

The policy loss needs log π_θ(o_t | q, o_<t) for every response token, and the entropy metric
needs H(π_θ(· | q, o_<t)). The naive way, `log_softmax(lm_head(hidden))`, materialises a
[B, T, V] float tensor — plus its copy kept for the backward pass — which for a 150k vocabulary
dwarfs the model's activations. Here the LM head is applied to chunks of `chunk_size` tokens:
each chunk's logits [chunk, V] live only inside the loop, in forward and again in backward
(recomputed there from the saved hidden states and per-token logsumexp). Only the response
tokens are selected before the head, so prompt positions cost nothing either. Entropy comes
from the same chunked logits, under no_grad: no extra forward pass.

Memory: O(chunk_size × V) for logits instead of O(B × T × V) twice. By default the chunk
holds about 2^24 logits (64 MiB in float32) whatever the vocabulary: 524 tokens at V = 32k,
110 at V = 152k. The chunk's buffer is reused in place (log-softmax, then p for the gradient),
so forward and backward each hold about two chunks of logits at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from dapo_core.setup.plan import auto_chunk_size

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class _ChunkedLinearLogprob(torch.autograd.Function):
    """logprob_i = log softmax((h_i W^T + b) / T)[y_i] and its entropy, chunked over tokens.

    Gradient: with z = (hW^T + b)/T and p = softmax(z), ∂logprob/∂z = onehot(y) − p, so
    ∂/∂h = ((onehot − p) g / T) W, ∂/∂W = ((onehot − p) g / T)^T h, ∂/∂b = Σ (onehot − p) g / T.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,  # [N, H]
        weight: Tensor,  # [V, H]
        bias: Tensor | None,  # [V]
        targets: Tensor,  # [N] long
        inv_temperature: float,
        chunk_size: int,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        logprobs = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _chunk_logits(hidden[s:e], weight, bias, inv_temperature)  # [c, V] float32
            lse_c = torch.logsumexp(z, dim=-1)  # [c]
            logp = z.sub_(lse_c[:, None])  # in place: log softmax, no second [c, V] buffer
            logprobs[s:e] = logp.gather(-1, targets[s:e, None]).squeeze(-1)
            entropy[s:e] = -(logp.exp().mul_(logp)).sum(-1)  # H = −Σ p log p
            lse[s:e] = lse_c
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.inv_temperature = inv_temperature
        ctx.chunk_size = chunk_size
        # The backward (outside autocast, as the update runs it) recomputes the logits at the
        # weights' own precision; when the forward's were lower, its normaliser is recomputed.
        ctx.recompute_lse = _lower_precision_forward(hidden, weight)
        ctx.set_materialize_grads(False)  # an unused output (usually entropy) costs nothing
        return logprobs, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logprobs: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        inv_t: float = ctx.inv_temperature
        n = hidden.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        # Accumulate weight / bias gradients in float32 across chunks; cast once at the end.
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        )
        grad_b = (
            torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
            if need_b and bias is not None
            else None
        )
        for s in range(0, n, ctx.chunk_size):
            e = min(s + ctx.chunk_size, n)
            h = hidden[s:e]
            z = _chunk_logits(h, weight, bias, inv_t)  # recomputed, [c, V] float32
            # Normalised by the recomputed logits' own log-sum-exp, not the forward's: under
            # bf16 autocast the forward's logits were bf16 and this backward's are float32, and
            # p = exp(z_fp32 − lse_bf16) would not sum to 1 (off by up to |max logit| · 2^-8,
            # ~6% of p at logits near 30: a biased gradient). In float32 both are the same
            # numbers, so a float32 run's gradient is unchanged bit for bit.
            lse_c = lse[s:e] if not ctx.recompute_lse else torch.logsumexp(z, dim=-1)
            logp = z.sub_(lse_c[:, None])
            if grad_entropy is None:  # the usual case: reuse the logits buffer in place
                assert grad_logprobs is not None
                gl = grad_logprobs[s:e, None].float()
                g = logp.exp_().neg_().mul_(gl)  # −p · g
                g.scatter_add_(-1, targets[s:e, None], gl)  # + onehot · g
            else:  # entropy bonus: ∂H/∂z_j = −p_j (log p_j + H)
                p = logp.exp()
                ent = entropy[s:e] if not ctx.recompute_lse else -(p * logp).sum(-1)
                g = p * (logp + ent[:, None]) * (-grad_entropy[s:e, None].float())
                if grad_logprobs is not None:
                    gl = grad_logprobs[s:e, None].float()
                    g.sub_(p.mul_(gl)).scatter_add_(-1, targets[s:e, None], gl)
            g.mul_(inv_t)  # ∂L/∂(hW^T + b), [c, V]
            g_low = g.to(weight.dtype)
            if grad_h is not None:
                grad_h[s:e] = g_low @ weight
            if grad_w is not None:
                grad_w.add_((g_low.t() @ h.to(weight.dtype)).float())
            if grad_b is not None:
                grad_b.add_(g.sum(0))
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None,
            None,
            None,
        )


def _lower_precision_forward(hidden: Tensor, weight: Tensor) -> bool:
    """Whether this forward's logits matmul ran below the weight's precision (autocast on, or
    low-precision inputs against a float32 weight), so the backward's recomputed logits differ
    from the forward's."""
    kind = weight.device.type
    autocast = torch.is_autocast_enabled(kind) if kind in ("cpu", "cuda") else False
    return autocast or hidden.dtype != weight.dtype


def _chunk_logits(h: Tensor, weight: Tensor, bias: Tensor | None, inv_t: float) -> Tensor:
    z = h.to(weight.dtype) @ weight.t()
    if bias is not None:
        z = z + bias
    z = z.float()
    return z * inv_t if inv_t != 1.0 else z


def linear_logprobs_and_entropy(
    hidden: Tensor,
    head: nn.Linear,
    targets: Tensor,
    mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor]:
    """Log-probs of `targets` and entropy under softmax(head(hidden) / temperature), chunked.

    Args:
        hidden: [B, T, H] final hidden states (after the model's last norm).
        head: the LM head (a Linear V×H, possibly tied to the input embeddings).
        targets: [B, T] the token whose log-prob is wanted at each position (the next token).
        mask: [B, T] bool; only these positions are computed (the rest are 0). None: all.
        temperature: the sampling temperature; π_θ at temperature T is softmax(z / T).
        chunk_size: tokens per chunk; None sizes it from the vocabulary (auto_chunk_size).
    Returns:
        logprobs [B, T] float32 (differentiable w.r.t. hidden and head), entropy [B, T] float32
        (differentiable only with entropy_grad=True, for an entropy bonus in the loss).
    """
    b, t, h = hidden.shape
    if chunk_size is None:
        chunk_size = auto_chunk_size(head.weight.shape[0])
    flat = hidden.reshape(b * t, h)
    if mask is None:
        index = torch.arange(b * t, device=hidden.device)
    else:
        index = mask.reshape(-1).nonzero(as_tuple=True)[0]  # [N] positions that matter
    logprobs_sel, entropy_sel = _ChunkedLinearLogprob.apply(
        flat.index_select(0, index),
        head.weight,
        head.bias,
        targets.reshape(-1).index_select(0, index),
        1.0 / temperature,
        chunk_size,
    )
    if not entropy_grad:
        entropy_sel = entropy_sel.detach()
    # Placed by (row, column), not into a flat buffer viewed as [B, T]: the outputs are not
    # views, so an FSDP2 root returning them keeps its pre-backward hook.
    at = (torch.div(index, t, rounding_mode="floor"), index % t)
    logprobs = hidden.new_zeros(b, t, dtype=torch.float32).index_put(at, logprobs_sel)
    entropy = hidden.new_zeros(b, t, dtype=torch.float32).index_put(at, entropy_sel)
    return logprobs, entropy


def naive_logprobs_and_entropy(
    logits: Tensor, targets: Tensor, *, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Reference: full-vocabulary log_softmax over logits [B, T, V]. Tests and benchmarks only."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, T, V]
    logprobs = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
    return logprobs, entropy


def token_logprobs_and_entropy(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    response_mask: Tensor,
    *,
    position_ids: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor]:
    """Per-token log π_θ(o_t | q, o_<t) and entropy of a causal LM's response tokens.

    Runs the decoder body once for hidden states (no logits), then the chunked LM head.
    Either one sequence per row, right-padded (prompt at column 0, so default position ids
    match generation), or several per row (dapo_core.train.batching's packed layout).

    Args:
        input_ids: [B, L] prompt + response tokens.
        attention_mask: [B, L] 1 for real tokens (right-padded rows); None for packed rows.
        response_mask: [B, L] 1 where input_ids is a response token to score.
        position_ids: [B, L] each sequence's positions from 0 (packed rows: transformers
            derives the block-diagonal attention from where they restart); None: 0..L−1.
    Returns:
        logprobs, entropy: [B, L − 1], aligned with input_ids[:, 1:] (position t holds the
        log-prob of token t + 1 given tokens ≤ t); 0 where response_mask[:, 1:] is 0.
    """
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__}: the LM head is not a plain Linear layer")
    hidden = body(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    )[0]
    hidden = hidden[:, :-1]  # [B, L−1, H]: position t predicts token t + 1
    targets = input_ids[:, 1:]
    mask = response_mask[:, 1:].bool()
    return linear_logprobs_and_entropy(
        hidden,
        head,
        targets,
        mask,
        temperature=temperature,
        chunk_size=chunk_size,
        entropy_grad=entropy_grad,
    )
