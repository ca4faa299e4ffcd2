"""The policy's forward pass for training: per-token log-probs and entropy in float32, with the
compute dtype applied the way the worker layout needs it.

One worker keeps float32 parameters (the masters) and runs forward and backward under autocast
to `model.dtype`; many workers shard the model with FSDP2, whose MixedPrecisionPolicy casts the
gathered parameters instead (then `autocast=False` here). Either way the LM head's log-softmax,
the entropy and everything after them are float32 (dapo_core.train.logprobs).

`LogprobModel` is the root module FSDP2 wraps: the log-prob computation calls the decoder body
and the LM head directly (never the causal LM's own forward, which would build full logits), so
the root's pre-forward hook, which gathers the embedding, final norm and head, has to belong to
a module whose forward *is* that computation.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from dapo_core.train.batching import Packed, Seq, gather_rows, pack
from dapo_core.train.logprobs import token_logprobs_and_entropy

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class LogprobModel(nn.Module):
    """A causal LM whose forward returns per-token log-probs and entropy (the FSDP2 root).

    `policy` keeps the causal LM under its usual attribute names (parameter names gain a
    `policy.` prefix here; checkpoints and weight sync use `policy`'s own names).
    """

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        response_tokens: Tensor,
        *,
        position_ids: Tensor | None = None,
        temperature: float = 1.0,
        chunk_size: int | None = None,
        entropy_grad: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """input_ids, attention_mask, response_tokens (and position_ids) `[B, L]` → logprobs,
        entropy `[B, L−1]`; see token_logprobs_and_entropy for the two layouts."""
        return token_logprobs_and_entropy(
            self.policy,  # type: ignore[arg-type]
            input_ids,
            attention_mask,
            response_tokens,
            position_ids=position_ids,
            temperature=temperature,
            chunk_size=chunk_size,
            entropy_grad=entropy_grad,
        )


class PolicyForward:
    """`fwd(packed)` → (logprobs, entropy), both `[B, L−1]` float32 (see batching.Packed).

    `model` is a causal LM (one worker) or a LogprobModel (the FSDP2 root on many workers)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        compute_dtype: torch.dtype,
        temperature: float,
        chunk_size: int | None = None,
        autocast: bool = True,
    ) -> None:
        self.model = model
        self.compute_dtype = compute_dtype
        self.temperature = temperature
        self.chunk_size = chunk_size
        self.autocast = autocast and compute_dtype != torch.float32

    def __call__(
        self, packed: Packed, model: nn.Module | None = None, *, entropy_grad: bool = False
    ) -> tuple[Tensor, Tensor]:
        target = model or self.model
        # A LogprobModel through its forward (FSDP's hooks run), a causal LM through the function.
        score = (
            target
            if isinstance(target, LogprobModel)
            else functools.partial(token_logprobs_and_entropy, target)  # type: ignore[arg-type]
        )
        with self.compute():
            return score(  # type: ignore[no-any-return]
                packed.input_ids,
                packed.attention_mask,
                packed.response_tokens,
                position_ids=packed.position_ids,
                temperature=self.temperature,
                chunk_size=self.chunk_size,
                entropy_grad=entropy_grad,
            )

    @torch.no_grad()
    def packs_exactly(self, pad_id: int, device: torch.device) -> bool:
        """Whether this model keeps the sequences of a packed row apart (the packed layout of
        dapo_core.train.batching), checked once by experiment rather than by model name.

        One sequence is packed behind two different prefixes; with a block-diagonal mask (or
        variable-length attention) its log-probs and entropies cannot depend on the prefix
        (both runs have the same shapes, so in practice they agree bit for bit), while a model
        that ignored the restarting position ids would let it attend to the prefix. Every rank
        calls this at the same point (FSDP: the forwards are collectives).
        """
        policy = self.model.policy if isinstance(self.model, LogprobModel) else self.model
        vocab: int = policy.config.vocab_size  # type: ignore[union-attr,assignment]
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (3, 8), generator=gen).tolist()
        probe = Seq(0, ids[0][:1], ids[0][1:], False, 0.0)  # 7 tokens scored
        out = []
        was_training = self.model.training
        self.model.eval()
        try:
            for prefix in ids[1:]:
                rows = [Seq(0, prefix[:3], prefix[3:], False, 0.0), probe]
                packed = pack(rows, pad_id, device, packed=True, capacity=16)
                lp, ent = self(packed)
                out.append(torch.cat([gather_rows(lp, packed)[1], gather_rows(ent, packed)[1]]))
        finally:
            self.model.train(was_training)
        return bool(torch.allclose(out[0], out[1], rtol=1e-5, atol=1e-6))

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """Autocast to the compute dtype when this worker holds float32 masters."""
        if not self.autocast:
            yield
            return
        device = next(self.model.parameters()).device.type
        with torch.autocast(device_type=device, dtype=self.compute_dtype):
            yield


def compute_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def as_masters(model: PreTrainedModel) -> PreTrainedModel:
    """Float32 parameters, whatever dtype the checkpoint was stored in (the optimizer's masters)."""
    if any(p.dtype != torch.float32 for p in model.parameters()):
        model.to(torch.float32)  # type: ignore[arg-type]
    return model
