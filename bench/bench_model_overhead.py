"""How much of the tiny model's time is transformers' module overhead, and how much is arithmetic.

    .venv/bin/python bench/bench_model_overhead.py [--rounds 15] [--threads 2]

The trainer runs the model through transformers' Llama modules. Against them, a minimal forward
of the same Llama math on the same parameter tensors: no module calls, the q/k/v and gate/up
projections each one matrix product (their weights concatenated per call), the rotary tables
computed once per forward, and for decoding a preallocated KV cache written in place (instead
of `DynamicCache`'s concatenation per step). Two measurements, rounds alternating:

  update   forward + backward of one packed micro-batch of the tiny preset's `token_loss` arm
           (32 sequences of a real rollout step): per-token log-probs through the trainer's
           chunked head, summed, backward. Same log-probs to float tolerance (printed).
  decode   `--steps` KV-cached decode steps of 128 rows (16 prompts x 8) after the prompt
           forward, the same tokens fed to both (no sampling): the rollout's inner loop.

Printed: median seconds of each and the ratio minimal / transformers. A ratio near 1 says the
time is the arithmetic (a faster trainer needs fewer or cheaper operations, not less Python); a
ratio well below 1 says the module stack costs that share. The minimal forward is a measuring
stick only: the trainer does not use it (it would have to be kept equal to every architecture
transformers supports).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


class MinimalLlama:
    """The forward of a transformers Llama (default RoPE, no biases, SiLU MLP) on its own
    parameter tensors, as few operations as the math allows."""

    def __init__(self, model: Any) -> None:
        cfg = model.config
        self.m = model.model
        self.heads, self.kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.dim = cfg.hidden_size // self.heads
        assert self.heads == self.kv, "sketch: no grouped-query attention"
        assert cfg.rope_parameters["rope_type"] == "default" and cfg.hidden_act == "silu"

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = self.dim // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    def _tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        f = positions[..., None].float() * self.m.rotary_emb.inv_freq
        e = torch.cat((f, f), -1)
        return e.cos()[:, None], e.sin()[:, None]

    def _layer(
        self,
        layer: Any,
        h: Tensor,
        cos: Tensor,
        sin: Tensor,
        attend: Callable[[Tensor, Tensor, Tensor], Tensor],
    ) -> Tensor:
        b, s, _ = h.shape
        a, n1, n2, mlp = (
            layer.self_attn,
            layer.input_layernorm,
            layer.post_attention_layernorm,
            layer.mlp,
        )
        x = F.rms_norm(h, (h.shape[-1],), n1.weight, n1.variance_epsilon)
        w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        q, k, v = F.linear(x, w).view(b, s, 3 * self.heads, self.dim).transpose(1, 2).chunk(3, 1)
        o = attend(self._rope(q, cos, sin), self._rope(k, cos, sin), v)
        h = h + F.linear(o.transpose(1, 2).reshape(b, s, -1), a.o_proj.weight)
        x = F.rms_norm(h, (h.shape[-1],), n2.weight, n2.variance_epsilon)
        g, u = F.linear(x, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])).chunk(2, -1)
        return h + F.linear(F.silu(g) * u, mlp.down_proj.weight)

    def hidden(self, ids: Tensor, positions: Tensor) -> Tensor:
        """Final hidden states of packed rows (positions restart at 0 for each sequence)."""
        s = ids.shape[1]
        seg = (positions == 0).cumsum(1)
        mask = (seg[:, :, None] == seg[:, None, :]) & torch.ones(s, s, dtype=torch.bool).tril()
        cos, sin = self._tables(positions)
        h = self.m.embed_tokens(ids)
        for layer in self.m.layers:
            h = self._layer(
                layer,
                h,
                cos,
                sin,
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None]),
            )
        return self.m.norm(h)

    @torch.no_grad()
    def decode(self, prompt: Tensor, mask: Tensor, feed: Tensor) -> Tensor:
        """Prompt forward of left-padded `prompt` [B, W] (mask: real tokens), then one step per
        column of `feed` [B, T]; returns the last step's logits."""
        b, w = prompt.shape
        t = feed.shape[1]
        cap = w + t
        keys = [
            prompt.new_zeros(b, self.kv, cap, self.dim, dtype=torch.float32) for _ in self.m.layers
        ]
        values = [torch.zeros_like(k) for k in keys]
        valid = torch.zeros(b, cap, dtype=torch.bool)
        valid[:, :w] = mask
        length = 0

        def cached(i: int, s: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
            def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                keys[i][:, :, length : length + s] = k
                values[i][:, :, length : length + s] = v
                end = length + s
                if s == 1:
                    m = valid[:, None, None, :end]
                else:  # the prompt: causal over real tokens; a padding row sees itself
                    m = torch.ones(s, s, dtype=torch.bool).tril()[None] & valid[:, None, :end]
                    m = (m | torch.eye(s, dtype=torch.bool))[:, None]
                return F.scaled_dot_product_attention(
                    q, keys[i][:, :, :end], values[i][:, :, :end], attn_mask=m
                )

            return attend

        def step(ids: Tensor, positions: Tensor) -> Tensor:
            nonlocal length
            cos, sin = self._tables(positions)
            h = self.m.embed_tokens(ids)
            for i, layer in enumerate(self.m.layers):
                h = self._layer(layer, h, cos, sin, cached(i, ids.shape[1]))
            length += ids.shape[1]
            return F.linear(self.m.norm(h[:, -1]), self.m.embed_tokens.weight)

        positions = (mask.long().cumsum(1) - 1).clamp_min(0)
        logits = step(prompt, positions)
        pos = positions[:, -1:]
        for j in range(t):
            valid[:, w + j] = True
            pos = pos + 1
            logits = step(feed[:, j : j + 1], pos)
        return logits


@torch.no_grad()
def hf_decode(model: Any, prompt: Tensor, mask: Tensor, feed: Tensor) -> Tensor:
    """The same with the transformers model and a DynamicCache (as the hf engine calls it)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    attention = mask.long()
    positions = (attention.cumsum(1) - 1).clamp_min(0)
    logits = model(
        input_ids=prompt,
        attention_mask=attention,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    ).logits[:, -1]
    pos = positions[:, -1:]
    for j in range(feed.shape[1]):
        attention = torch.cat([attention, attention.new_ones(len(attention), 1)], 1)
        pos = pos + 1
        logits = model(
            input_ids=feed[:, j : j + 1],
            attention_mask=attention[:, None, None, :].bool(),
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
    return logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="decode steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from dapo_core.data.loaders import load_problems
    from dapo_core.engines import make_engine
    from dapo_core.models import load_policy
    from dapo_core.setup.ladders import paper_ladder
    from dapo_core.train.batching import Seq, pack
    from dapo_core.train.logprobs import linear_logprobs_and_entropy, token_logprobs_and_entropy
    from dapo_core.train.trainer import Trainer

    cfg = paper_ladder().config("token_loss", "tiny", {"run.seed": 0})
    model, tok = load_policy(cfg.model, "cpu")
    trainer = Trainer(
        cfg, model, tok, make_engine("hf", model, tok, cfg), load_problems(cfg.data.train, seed=0)
    )
    batch: list[Seq] = []
    run = trainer.updater.run

    def keep(seqs: list[Seq], *a: Any, **kw: Any) -> Any:
        batch.extend(seqs)
        return run(seqs, *a, **kw)

    trainer.updater.run = keep  # type: ignore[method-assign]
    trainer.step()
    packed = pack(batch[:32], tok.pad_token_id, torch.device("cpu"), packed=True)
    minimal = MinimalLlama(model)
    targets, scored = packed.input_ids[:, 1:], packed.response_tokens[:, 1:].bool()

    def hf_update() -> Tensor:
        return token_logprobs_and_entropy(
            model, packed.input_ids, None, packed.response_tokens, position_ids=packed.position_ids
        )[0]

    def min_update() -> Tensor:
        hidden = minimal.hidden(packed.input_ids, packed.position_ids)[:, :-1]
        return linear_logprobs_and_entropy(hidden, model.lm_head, targets, scored)[0]

    gap = (hf_update() - min_update()).abs().max().item()
    ids = [tok(p.prompt)["input_ids"] for p in load_problems(cfg.data.train, seed=0)[:16]]
    width = max(map(len, ids))
    prompt = torch.tensor(
        [[tok.pad_token_id] * (width - len(i)) + i for i in ids]
    ).repeat_interleave(8, 0)
    mask = torch.tensor(
        [[False] * (width - len(i)) + [True] * len(i) for i in ids]
    ).repeat_interleave(8, 0)
    feed = torch.randint(
        3,
        model.config.vocab_size,
        (len(prompt), args.steps),
        generator=torch.Generator().manual_seed(0),
    )
    logit_gap = (
        (hf_decode(model, prompt, mask, feed) - minimal.decode(prompt, mask, feed))
        .abs()
        .max()
        .item()
    )
    print(
        f"tiny model, {args.threads} threads, {args.rounds} rounds; update: packed rows "
        f"{tuple(packed.input_ids.shape)}, max |Δ log-prob| {gap:.1e}; decode: {len(prompt)} rows, "
        f"{args.steps} steps, max |Δ logit| {logit_gap:.1e}"
    )

    def timed(fn: Callable[[], Any], backward: bool) -> float:
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        out = fn()
        if backward:
            out.sum().backward()
        return time.perf_counter() - start

    cases = {
        "update": (hf_update, min_update, True),
        "decode": (
            lambda: hf_decode(model, prompt, mask, feed),
            lambda: minimal.decode(prompt, mask, feed),
            False,
        ),
    }
    for name, (hf, mini, backward) in cases.items():
        timed(hf, backward), timed(mini, backward)  # warm-up
        a, b = [], []
        for _ in range(args.rounds):
            a.append(timed(hf, backward))
            b.append(timed(mini, backward))
        ratio = statistics.median(x / y for x, y in zip(b, a, strict=True))
        print(
            f"{name:7s} transformers {statistics.median(a):.4f} s  minimal {statistics.median(b):.4f} s  "
            f"minimal / transformers {ratio:.2f} (median of {args.rounds} paired rounds)"
        )


if __name__ == "__main__":
    main()
