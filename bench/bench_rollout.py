"""Rollout tokens/s of the `hf` engine's own sampling loop against transformers `generate`.

    .venv/bin/python bench/bench_rollout.py [--repeats 7] [--threads 2] [--prompts 16] [--n 8]
                                            [--max-tokens 44] [--sizes tiny wide]

Same prompts (the tiny preset's synthetic ones, 7-13 tokens), same budget, same temperature
and top-p, same model object, in one process. `generate` is what the engine ran before: one
`model.generate(num_return_sequences=n, output_scores=True)` call per chunk (every prompt
encoded n times, finished rows kept until the longest is done), per-token log-probs read off
the processed scores. Candidates:

  ours        the engine: one prompt forward, cache repeated n times, finished rows dropped
  keep-rows   ours with finished rows kept in the batch (what dropping them buys)
  buckets     ours, one call per prompt length (no padding at all; more, smaller batches)
  static      (--static) generate with a static KV cache
  compiled    (--static) generate with a static KV cache and torch.compile (CPU: inductor)

Rounds alternate the candidates (A, B, C, D, A, B, ...), so load from other work on a shared
machine hits all of them alike; printed: tokens/s min / median over the rounds, and the median
of the per-round time ratios candidate / generate (lower is faster). Tokens differ between
candidates (different draws), hence tokens/s. `--sizes wide` adds a 4-layer, 256-wide model
(about 3.4M parameters), where compute starts to matter more than per-step overhead.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


def generate_reference(
    engine: Any, prompts: Sequence[str], n: int, max_tokens: int, *, cache: str = "dynamic"
) -> int:
    """The engine's former path (transformers `generate`), returning the tokens it produced.
    cache="static": a static KV cache; "compiled": a static cache and the forward compiled
    by torch.compile (transformers does it on CPU only when told to: _compile_all_devices)."""
    from transformers import CompileConfig, GenerationConfig

    ids = engine._encode(prompts)
    pad = int(engine.tokenizer.pad_token_id)
    width = max(len(p) for p in ids)
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    attention = torch.zeros((len(ids), width), dtype=torch.long)
    for i, p in enumerate(ids):
        input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        attention[i, width - len(p) :] = 1
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        max_new_tokens=max_tokens,
        min_new_tokens=0,
        num_return_sequences=n,
        pad_token_id=pad,
        eos_token_id=engine._eos_ids,
        output_scores=True,
        return_dict_in_generate=True,
        use_cache=True,
    )
    if cache != "dynamic":
        config.cache_implementation = "static"
        config.disable_compile = cache != "compiled"
        if cache == "compiled":
            compile_config = CompileConfig()
            compile_config._compile_all_devices = True
            config.compile_config = compile_config
    model = engine.model
    model.eval()
    with torch.no_grad():
        result = model.generate(
            input_ids=input_ids, attention_mask=attention, generation_config=config
        )
        new = result.sequences[:, width:]
        scores = torch.stack(result.scores, dim=1).float()
        logprobs = torch.log_softmax(scores, -1).gather(-1, new[..., None]).squeeze(-1)
    eos = set(engine._eos_ids)
    total = 0
    for row in new.tolist():  # as the engine did: cut at the first EOS
        cut = next((t + 1 for t, tok in enumerate(row) if tok in eos), len(row))
        total += cut
    del logprobs
    return total


def _static(engine: Any, prompts: Sequence[str], n: int, max_tokens: int) -> int:
    return generate_reference(engine, prompts, n, max_tokens, cache="static")


def _compiled(engine: Any, prompts: Sequence[str], n: int, max_tokens: int) -> int:
    return generate_reference(engine, prompts, n, max_tokens, cache="compiled")


def _ours(engine: Any, prompts: Sequence[str], n: int, max_tokens: int) -> int:
    from dapo_core.engines.base import SamplingParams

    out = engine.generate(prompts, SamplingParams(n=n, max_tokens=max_tokens))
    return sum(len(c.token_ids) for c in out)


def _keep_rows(engine: Any, prompts: Sequence[str], n: int, max_tokens: int) -> int:
    engine._drop_finished = False
    try:
        return _ours(engine, prompts, n, max_tokens)
    finally:
        engine._drop_finished = True


def _buckets(engine: Any, prompts: Sequence[str], n: int, max_tokens: int) -> int:
    ids = engine._encode(prompts)
    by_len: dict[int, list[str]] = {}
    for p, i in zip(prompts, ids, strict=True):
        by_len.setdefault(len(i), []).append(p)
    return sum(_ours(engine, group, n, max_tokens) for group in by_len.values())


CANDIDATES: dict[str, Callable[[Any, Sequence[str], int, int], int]] = {
    "generate": generate_reference,
    "ours": _ours,
    "keep-rows": _keep_rows,
    "buckets": _buckets,
}


def _model(size: str) -> tuple[Any, Any]:
    from dapo_core.models import load_policy
    from dapo_core.setup.presets import preset_config

    cfg = preset_config("tiny", "grpo")
    model, tok = load_policy(cfg.model, "cpu", dtype="float32")
    if size == "tiny":
        return model, tok
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    wide = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=model.config.vocab_size,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=768,
            max_position_embeddings=512,
            eos_token_id=model.config.eos_token_id,
            pad_token_id=model.config.pad_token_id,
            bos_token_id=None,
            tie_word_embeddings=True,
        )
    )
    with torch.no_grad():  # make EOS likely enough that responses end at mixed lengths
        wide.lm_head.weight[model.config.eos_token_id] += 0.05
    wide.generation_config.eos_token_id = model.config.eos_token_id
    return wide, tok


def compare_logprobs(model: Any, tok: Any, prompts: Sequence[str], n: int, max_tokens: int) -> None:
    """The engine's sampling log-probs against a full forward of the sampled sequences (the
    trainer's old-log-prob computation, packed micro-batches), over every sampled token:
    Δ = log π_sampler − log π_forward and the ratio exp(−Δ) = π_forward / π_sampler that would
    enter the first mini-batch's importance ratio if the sampler's log-probs replaced the pass."""
    from dapo_core.engines.base import SamplingParams
    from dapo_core.engines.hf import HFEngine
    from dapo_core.train.batching import Seq, gather_rows, pack
    from dapo_core.train.policy import PolicyForward

    for dtype in (torch.float32, torch.bfloat16):
        engine = HFEngine(model, tok, max_prompt_len=512, seed=1, compute_dtype=dtype)
        out = engine.generate(prompts, SamplingParams(n=n, max_tokens=max_tokens))
        seqs = [Seq(0, c.prompt_ids, c.token_ids, c.truncated, 0.0) for c in out]
        fwd = PolicyForward(model, compute_dtype=dtype, temperature=1.0)
        forward: list[torch.Tensor] = []
        with torch.no_grad():
            for i in range(0, len(seqs), 64):
                packed = pack(seqs[i : i + 64], int(tok.pad_token_id), "cpu", packed=True)
                forward.extend(gather_rows(fwd(packed)[0], packed))
        delta = torch.cat([torch.tensor(c.logprobs) for c in out]) - torch.cat(forward)
        ratio = torch.exp(-delta.double())
        q = torch.quantile(ratio, torch.tensor([0.0, 0.01, 0.5, 0.99, 1.0], dtype=torch.float64))
        print(
            f"  {str(dtype).removeprefix('torch.'):>8}: {delta.numel()} tokens, max |Δ| "
            f"{delta.abs().max():.2e}, mean |Δ| {delta.abs().mean():.2e}, exactly equal "
            f"{(delta == 0).double().mean():.1%}; ratio min/1%/50%/99%/max "
            + "/".join(f"{x:.7f}" for x in q.tolist())
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="rounds (each runs every candidate)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=44)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "wide"], choices=["tiny", "wide"])
    parser.add_argument(
        "--static",
        action="store_true",
        help="add generate with a static cache, and with it compiled (the compile, tens of "
        "seconds, happens in the warm-up and is printed apart)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.static:
        CANDIDATES["static"] = _static
        CANDIDATES["compiled"] = _compiled

    from dapo_core.data.loaders import format_prompt, load_problems
    from dapo_core.engines.hf import HFEngine
    from dapo_core.setup.presets import preset_config

    cfg = preset_config("tiny", "grpo")
    problems = load_problems(cfg.data.train, seed=0)
    for size in args.sizes:
        model, tok = _model(size)
        prompts = [
            format_prompt(p, cfg.data.prompt_template, tok) for p in problems[: args.prompts]
        ]
        engine = HFEngine(model, tok, max_prompt_len=cfg.rollout.max_prompt_len, seed=0)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(
            f"model {size} ({params:.2f}M params), {args.prompts} prompts x n={args.n}, "
            f"budget {args.max_tokens} tokens, {args.threads} threads, {args.repeats} rounds"
        )
        print("sampler log-probs against a full forward of the same tokens:")
        compare_logprobs(model, tok, prompts, args.n, args.max_tokens)
        for name, fn in CANDIDATES.items():  # warm-up: allocations, kernels, compilation
            t0 = time.perf_counter()
            fn(engine, prompts, args.n, args.max_tokens)
            if name == "compiled":
                print(
                    f"  (compiled: first call, compilation included, {time.perf_counter() - t0:.1f} s)"
                )
        secs: dict[str, list[float]] = {k: [] for k in CANDIDATES}
        rates: dict[str, list[float]] = {k: [] for k in CANDIDATES}
        for _ in range(args.repeats):
            for name, fn in CANDIDATES.items():
                t0 = time.perf_counter()
                tokens = fn(engine, prompts, args.n, args.max_tokens)
                dt = time.perf_counter() - t0
                secs[name].append(dt)
                rates[name].append(tokens / dt)
        print(
            f"{'candidate':>10} {'tok/s min':>10} {'tok/s med':>10} {'s med':>7} {'x generate':>11}"
        )
        for name in CANDIDATES:
            per_round = [a / b for a, b in zip(secs[name], secs["generate"], strict=True)]
            speed = [a / b for a, b in zip(rates[name], rates["generate"], strict=True)]
            print(
                f"{name:>10} {min(rates[name]):>10,.0f} {statistics.median(rates[name]):>10,.0f} "
                f"{statistics.median(secs[name]):>7.3f} {statistics.median(per_round):>6.2f} time"
                f"  tokens/s x{statistics.median(speed):.2f}"
            )


if __name__ == "__main__":
    main()
