"""`hf` rollout engine: our own sampling loop over a transformers causal LM, on CPU or GPU.

On one worker it samples from the very model object the trainer updates (float32 masters), so
weight sync is free, and it samples under autocast to the compute dtype, like the trainer's
forward. On many workers each rank's engine holds its own unsharded copy in the compute dtype,
filled after each update with weights gathered from the shards (dapo_core.train.distributed).

The loop (one call of `_sample_chunk`), for P prompts and n samples each:
  1. one forward over the P left-padded prompts fills a DynamicCache and gives each prompt's
     next-token logits; the cache is then repeated n times along the batch (each prompt is
     encoded once, not n times as `generate(num_return_sequences=n)` does);
  2. per step: the sampling distribution (temperature, then top-p), one draw per live row (by
     inverse CDF, `draw`), its log-probability, then one forward of the drawn tokens (position
     ids and the growing attention mask passed explicitly; with sdpa the one-query mask is
     handed over ready-made, exactly as transformers would build it);
  3. a row that draws an EOS token (the tokenizer's or the model's generation EOS) is finished
     and leaves the batch, with its cache rows: later steps compute only live rows.
Top-k is off and there is no repetition penalty, whatever the checkpoint's generation_config
says: the algorithm assumes π_sample = softmax(z / T) restricted to the top-p nucleus.

Random stream: draws come from a torch.Generator on the model's device whose state the engine
keeps between calls and in its state_dict, so a resumed run samples exactly the tokens an
uninterrupted run would have, and nothing else that uses torch's global RNG shifts the samples
(nor do they shift it). `SamplingParams.seed` draws from a fresh stream instead and leaves the
engine's as it was (evaluation).

Log-probabilities: every token's log π_sample(o_t | q, o_<t) = log softmax(z_t / T restricted to
the nucleus)[o_t], read off the very distribution the token was drawn from (free: the loop
computes it anyway). They come from incremental decoding, so they agree with a full forward of
the sampled sequence only to float tolerance (bench/RESULTS.md gives the numbers); the trainer
recomputes old log-probs itself and uses these for rollout correction and its metrics.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from dapo_core.engines.base import Completion, FinishReason, SamplingParams


class HFEngine:
    """Rollouts with our own KV-cached sampling loop; shares the trainer's model object."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_prompt_len: int,
        seed: int = 0,
        max_batch_seqs: int = 512,
        return_logprobs: bool | None = None,
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        """
        Args:
            max_prompt_len: prompts longer than this many tokens are left-truncated.
            seed: seeds the engine's random stream.
            compute_dtype: sample under autocast to this dtype (model.dtype); float32: none.
            max_batch_seqs: at most this many sequences (prompts × n) per sampling loop.
            return_logprobs: False leaves Completion.logprobs empty; True or None (the default)
                fills them (they cost nothing extra).
        """
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token first")
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_len = max_prompt_len
        self.max_batch_seqs = max_batch_seqs
        self.return_logprobs = return_logprobs
        self.compute_dtype = compute_dtype
        self._device = next(model.parameters()).device
        # The state of the generator the draws use (on the model's device): CPU, or CUDA.
        self._cpu_state: Tensor = torch.Generator(device="cpu").manual_seed(seed).get_state()
        self._cuda_state: Tensor | None = None
        if self._device.type == "cuda":
            self._cuda_state = torch.Generator(device=self._device).manual_seed(seed).get_state()
        self._eos_ids = eos_token_ids(model, tokenizer)
        # Only the last position's logits are needed after the prompt forward.
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        # False keeps finished rows in the batch to the end (bench/bench_rollout.py measures
        # what dropping them buys); the samples' distribution is the same either way.
        self._drop_finished = True
        # Decode steps hand sdpa a ready-made mask (see _sample_chunk), where every layer
        # attends to the whole context: not with sliding-window or chunked layers, whose masks
        # transformers builds differently.
        self._sdpa = getattr(
            model.config, "_attn_implementation", None
        ) == "sdpa" and full_attention_only(model.config)

    # --- RolloutEngine -----------------------------------------------------------------
    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        if not sampling.temperature >= 0:
            raise ValueError(f"temperature={sampling.temperature}: must be > 0, or 0 for greedy")
        if not 0 < sampling.top_p <= 1:
            raise ValueError(f"top_p={sampling.top_p}: must be in (0, 1]")
        prompt_ids = self._encode(prompts)
        n = sampling.n
        per_call = max(1, self.max_batch_seqs // n)
        # Prompts sorted by length before chunking, so that a chunk pads little; the result
        # goes back to prompt order.
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        by_prompt: dict[int, list[Completion]] = {}
        gen = self._generator(sampling.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), per_call):
                chunk = order[start : start + per_call]
                done = self._sample_chunk([prompt_ids[i] for i in chunk], sampling, gen)
                for k, i in enumerate(chunk):
                    by_prompt[i] = [
                        Completion(
                            prompt_index=i,
                            prompt_ids=list(prompt_ids[i]),
                            token_ids=c.token_ids,
                            logprobs=c.logprobs,
                            finish_reason=c.finish_reason,
                            text=c.text,
                        )
                        for c in done[k * n : (k + 1) * n]
                    ]
        finally:
            self.model.train(was_training)
        if sampling.seed is None:  # the engine's stream advanced; a seeded call leaves it
            if self._cuda_state is not None:
                self._cuda_state = gen.get_state()
            else:
                self._cpu_state = gen.get_state()
        return [c for i in range(len(prompt_ids)) for c in by_prompt[i]]

    def load_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """No-op when the engine shares the trainer's model (the usual case): the parameters
        it samples with are the ones the optimizer just updated. Tensors that are not the
        model's own are copied in place."""
        params: dict[str, Tensor] = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        with torch.no_grad():
            for name, value in state_dict.items():
                target = params.get(name)
                if target is None or target.data_ptr() == value.data_ptr():
                    continue
                target.copy_(value)

    def state_dict(self) -> dict[str, Any]:
        return {"cpu_rng": self._cpu_state.clone(), "cuda_rng": self._cuda_state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._cpu_state = state["cpu_rng"].clone()
        if self._cuda_state is not None and state.get("cuda_rng") is not None:
            self._cuda_state = state["cuda_rng"].clone()

    def close(self) -> None:
        """Drop the engine's reference to its model. On N workers that model is the rank's
        own rollout copy (distributed.rollout_copy), which only the engine holds, so this frees
        it; on one worker it is the trainer's model, freed with the trainer. Idempotent."""
        self.__dict__.pop("model", None)

    # --- internals ---------------------------------------------------------------------
    def _encode(self, prompts: Sequence[str]) -> list[list[int]]:
        ids: list[list[int]] = []
        for i, text in enumerate(prompts):
            tokens = list(self.tokenizer(text)["input_ids"])
            if not tokens:
                raise ValueError(f"prompt {i} encodes to no tokens: nothing to condition on")
            ids.append(tokens[-self.max_prompt_len :])  # left truncation keeps the question's end
        return ids

    def _generator(self, seed: int | None) -> torch.Generator:
        """The engine's stream (a copy of its saved state), or a fresh one seeded with `seed`."""
        gen = torch.Generator(device=self._device)
        if seed is not None:
            gen.manual_seed(seed)
        elif self._cuda_state is not None:
            gen.set_state(self._cuda_state)
        else:
            gen.set_state(self._cpu_state)
        return gen

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The compute dtype's autocast: float32 masters sample like the trainer computes."""
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self._device.type, dtype=self.compute_dtype)

    @torch.no_grad()
    def _sample_chunk(
        self, prompt_ids: list[list[int]], sampling: SamplingParams, gen: torch.Generator
    ) -> list[Completion]:
        """n completions of each prompt, grouped prompt by prompt (prompt_index is the
        position in `prompt_ids`; the caller renumbers)."""
        n, budget, dev = sampling.n, sampling.max_tokens, self._device
        P = len(prompt_ids)
        pad = int(self.tokenizer.pad_token_id)  # type: ignore[arg-type]
        width = max(len(p) for p in prompt_ids)
        # Left padding: every prompt ends at the same column, so new tokens line up; a prompt's
        # positions count its own tokens from 0, as in the trainer's right-padded forward.
        lengths = torch.tensor([len(p) for p in prompt_ids])
        flat = torch.tensor([t for p in prompt_ids for t in p], dtype=torch.long)
        attention = torch.arange(width)[None, :] >= (width - lengths)[:, None]  # [P, W] bool
        input_ids = torch.full((P, width), pad, dtype=torch.long)
        input_ids[attention] = flat  # row-major order: each prompt's tokens, in order
        positions = (attention.long().cumsum(1) - 1).clamp_min(0)
        attention_l = attention.long().to(dev)
        eos = torch.tensor(self._eos_ids, device=dev)

        tokens = torch.full((P * n, max(budget, 0)), pad, dtype=torch.long, device=dev)
        logps = torch.zeros((P * n, max(budget, 0)), dtype=torch.float32, device=dev)
        out_len = torch.full((P * n,), max(budget, 0), dtype=torch.long, device=dev)
        # One autocast for the whole loop: leaving the outermost autocast block clears its
        # cache of weights cast to the compute dtype, so a block per decode step would cast
        # every weight again for every token. (Sampling itself is float32 / float64.)
        with self._autocast():
            if budget > 0:
                cache = DynamicCache(config=self.model.config)
                kw: dict[str, Any] = {"logits_to_keep": 1} if self._logits_to_keep else {}
                logits = self.model(
                    input_ids=input_ids.to(dev),
                    attention_mask=attention_l,
                    position_ids=positions.to(dev),
                    past_key_values=cache,
                    use_cache=True,
                    **kw,
                ).logits[:, -1]  # [P, V]
                # Step 0: the n draws of a prompt share its distribution: n draws with
                # replacement from each prompt's row are n independent samples.
                logp = sampling_logprobs(logits, sampling.temperature, sampling.top_p)  # [P, V]
                nxt = draw(logp, n, gen)  # [P, n]
                lp = logp.gather(1, nxt).reshape(-1)
                nxt = nxt.reshape(-1)  # [P*n], grouped prompt by prompt
                cache.batch_repeat_interleave(n)
                attention_l = attention_l.repeat_interleave(n, dim=0)
                pos = positions[:, -1:].to(dev).repeat_interleave(n, dim=0)  # [P*n, 1]
                alive = torch.arange(P * n, device=dev)  # rows of the output each live row fills
                for t in range(budget):
                    if t > 0:
                        logp = sampling_logprobs(logits, sampling.temperature, sampling.top_p)
                        nxt = draw(logp, 1, gen).squeeze(1)
                        lp = logp.gather(1, nxt[:, None]).squeeze(1)
                    tokens[alive, t] = nxt
                    logps[alive, t] = lp
                    stop = torch.isin(nxt, eos)
                    if t == budget - 1:
                        break
                    if not self._drop_finished:
                        stop = stop & (out_len[alive] == budget)  # only rows not stopped before
                        out_len[alive[stop]] = t + 1
                        if bool((out_len < budget).all()):
                            break
                    elif bool(stop.any()):
                        out_len[alive[stop]] = t + 1
                        keep = (~stop).nonzero().squeeze(1)
                        if keep.numel() == 0:
                            break
                        # Finished rows leave the batch, cache rows included.
                        alive, nxt, pos = alive[keep], nxt[keep], pos[keep]
                        attention_l = attention_l[keep]
                        cache.batch_select_indices(keep)
                    attention_l = torch.cat([attention_l, attention_l.new_ones(len(alive), 1)], 1)
                    pos = pos + 1
                    # sdpa: the one-query mask as transformers would build it ([live, 1, 1, K],
                    # True = attend), handed over ready-made instead of rebuilt from the 2D one.
                    mask = attention_l[:, None, None, :].bool() if self._sdpa else attention_l
                    logits = self.model(
                        input_ids=nxt[:, None],
                        attention_mask=mask,
                        position_ids=pos,
                        past_key_values=cache,
                        use_cache=True,
                    ).logits[:, -1]  # [live, V]
        token_rows = tokens.cpu().tolist()
        logp_rows = logps.cpu().tolist()
        keep_lp = self.return_logprobs is not False
        eos_set = set(self._eos_ids)
        rows = [r[:k] for r, k in zip(token_rows, out_len.cpu().tolist(), strict=True)]
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        out: list[Completion] = []
        for i, (row, text) in enumerate(zip(rows, texts, strict=True)):
            finish: FinishReason = "stop" if row and row[-1] in eos_set else "length"
            out.append(
                Completion(
                    prompt_index=i // n,
                    prompt_ids=prompt_ids[i // n],
                    token_ids=row,
                    logprobs=logp_rows[i][: len(row)] if keep_lp else [],
                    finish_reason=finish,
                    text=str(text),
                )
            )
        return out


def sampling_logprobs(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """log π_sample over the vocabulary: log softmax(z / T) restricted to the top-p nucleus.

    The nucleus is the smallest set of most probable tokens whose probability reaches top_p: a
    token stays when the tokens ranked strictly above it hold less than top_p (so the most
    probable one always stays). Outside it the log-probability is −inf. T = 0 is greedy
    decoding, the limit T → 0: all the mass on the most probable token (the first of a tie), so
    every draw takes it.

    Args:
        logits: [B, V] next-token logits z (any float dtype; computed in float32).
    Returns:
        [B, V] float32 log-probabilities of the distribution tokens are drawn from.
    """
    z = logits.float()
    if temperature == 0:
        top = z.argmax(dim=-1, keepdim=True)
        return torch.full_like(z, float("-inf")).scatter(-1, top, 0.0)
    if temperature != 1.0:
        z = z / temperature
    logp = torch.log_softmax(z, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    above = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()  # mass ranked above each token
    drop_sorted = above >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(z.masked_fill(drop, float("-inf")), dim=-1)


def draw(logp: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """k independent draws per row from the distribution exp(logp), by inverse CDF.

    One uniform number per draw instead of one exponential per vocabulary entry (what
    torch.multinomial's exponential race costs): 6x less time than it at V = 99 on CPU. The CDF
    is summed in float64, so a token's chance is its float64 probability to about 1e-16;
    a token of probability 0 (outside the top-p nucleus) has an empty interval and is never
    drawn, and u·total is kept strictly below the total so the index stays in range.

    Args:
        logp: [B, V] log-probabilities (float32).
    Returns:
        [B, k] long token ids.
    """
    cdf = logp.double().exp_().cumsum_(dim=-1)  # [B, V]
    total = cdf[:, -1:]
    if not bool(torch.isfinite(total).all()):
        raise ValueError("the sampling distribution holds NaN or inf: the policy has diverged")
    u = torch.rand((logp.shape[0], k), generator=gen, dtype=torch.float64, device=logp.device)
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True)  # first index whose CDF exceeds x


def full_attention_only(config: Any) -> bool:
    """Whether every layer attends to the whole context (no sliding-window or chunked layers):
    the config's `layer_types` when it has them, else no `sliding_window` set."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return getattr(config, "sliding_window", None) is None


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokens that end a response: the tokenizer's EOS plus the model's generation EOS
    (chat models often stop on an end-of-turn token that is not the tokenizer's EOS)."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        gen_eos = [gen_eos]
    for tok in gen_eos or []:
        if int(tok) not in ids:
            ids.append(int(tok))
    if not ids:
        raise ValueError("the tokenizer has no EOS token: responses could never stop")
    return ids


def rollout_copy(
    model: torch.nn.Module, dtype: torch.dtype, device: torch.device | str
) -> PreTrainedModel:
    """An unsharded copy of `model` for an engine of its own: parameters cast to `dtype` one at
    a time (never a second float32 model), buffers (rotary tables) copied as they are, ties
    between parameters kept (deepcopy's memo maps each parameter to its cast copy). A rank's
    engine gets one on the rank's device; a hosted engine's recipe carries one on the CPU."""
    import copy

    memo: dict[int, Any] = {
        id(p): torch.nn.Parameter(p.detach().to(device=device, dtype=dtype), requires_grad=False)
        for p in model.parameters()
    }
    out: Any = copy.deepcopy(model, memo)
    if getattr(out, "is_gradient_checkpointing", False):
        out.gradient_checkpointing_disable()
    return out.to(device).eval()  # type: ignore[no-any-return]
