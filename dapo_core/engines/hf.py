"""`hf` rollout engine: transformers `generate`, batched, on CPU or GPU.

It samples from the very model object the trainer updates, so weight sync is free. Sampling
draws from the engine's own random stream (a saved torch RNG state, swapped in around each
`generate` call with `torch.random.fork_rng`): the stream is checkpointed, so a resumed run
samples exactly the tokens an uninterrupted run would have, and nothing else that uses torch's
global RNG shifts the samples.

Log-probabilities: `generate(output_scores=True)` returns, per step, the scores after every
logits processor, i.e. after temperature scaling and top-p filtering. Their log-softmax at the
sampled token is the log-probability under the distribution the token was drawn from,
log π_sample(o_t | q, o_<t) = log softmax(z_t / T restricted to the top-p nucleus)[o_t].
The trainer does not use them (it recomputes old log-probs with a forward pass, as verl does);
they are kept for diagnostics and skipped when they would cost much memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import Tensor
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from dapo_core.engines.base import Completion, FinishReason, SamplingParams

# Above this many bytes of per-step scores (sequences × new tokens × vocab × 4) the engine does
# not keep scores, and Completion.logprobs is empty.
_LOGPROB_SCORES_BUDGET = 1 << 30


class HFEngine:
    """Rollouts with `model.generate`; shares the trainer's model object."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_prompt_len: int,
        seed: int = 0,
        max_batch_seqs: int = 512,
        return_logprobs: bool | None = None,
    ) -> None:
        """
        Args:
            max_prompt_len: prompts longer than this many tokens are left-truncated.
            seed: seeds the engine's random stream.
            max_batch_seqs: at most this many sequences (prompts × n) per `generate` call.
            return_logprobs: True/False forces per-token logprobs on/off; None keeps them when
                the scores fit in about 1 GiB per call.
        """
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token first")
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_len = max_prompt_len
        self.max_batch_seqs = max_batch_seqs
        self.return_logprobs = return_logprobs
        self._device = next(model.parameters()).device
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self._cpu_state: Tensor = gen.get_state()
        self._cuda_state: Tensor | None = None
        if self._device.type == "cuda":
            cuda_gen = torch.Generator(device=self._device).manual_seed(seed)
            self._cuda_state = cuda_gen.get_state()
        self._eos_ids = eos_token_ids(model, tokenizer)

    # --- RolloutEngine -----------------------------------------------------------------
    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        prompt_ids = self._encode(prompts)
        n = sampling.n
        per_call = max(1, self.max_batch_seqs // n)
        out: list[Completion] = []
        with self._rng(sampling.seed):
            for start in range(0, len(prompt_ids), per_call):
                chunk = prompt_ids[start : start + per_call]
                out.extend(self._generate_chunk(chunk, start, sampling))
        return out

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

    # --- internals ---------------------------------------------------------------------
    def _encode(self, prompts: Sequence[str]) -> list[list[int]]:
        ids: list[list[int]] = []
        for text in prompts:
            tokens = self.tokenizer(text)["input_ids"]
            ids.append(
                list(tokens[-self.max_prompt_len :])
            )  # left truncation keeps the question's end
        return ids

    def _rng(self, seed: int | None) -> _RngScope:
        return _RngScope(self, seed)

    @torch.no_grad()
    def _generate_chunk(
        self, prompt_ids: list[list[int]], offset: int, sampling: SamplingParams
    ) -> list[Completion]:
        n = sampling.n
        pad = int(self.tokenizer.pad_token_id)  # type: ignore[arg-type]
        width = max(len(p) for p in prompt_ids)
        # Left padding: every prompt ends at the same column, so new tokens line up.
        input_ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        want_logprobs = self.return_logprobs
        if want_logprobs is None:
            want_logprobs = len(prompt_ids) * n * sampling.max_tokens * vocab * 4 <= (
                _LOGPROB_SCORES_BUDGET
            )
        # Every knob explicit: unset fields would be filled from the checkpoint's own
        # generation_config (e.g. top_k=20, repetition_penalty=1.05 for Qwen), silently changing
        # the sampling distribution the algorithm assumes.
        config = GenerationConfig(
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0,
            repetition_penalty=1.0,
            max_new_tokens=sampling.max_tokens,
            min_new_tokens=0,
            num_return_sequences=n,
            pad_token_id=pad,
            eos_token_id=self._eos_ids,
            output_scores=want_logprobs,
            return_dict_in_generate=True,
            use_cache=True,
        )
        was_training = self.model.training
        self.model.eval()
        try:
            result = self.model.generate(  # type: ignore[operator]
                input_ids=input_ids.to(self._device),
                attention_mask=attention.to(self._device),
                generation_config=config,
            )
        finally:
            self.model.train(was_training)
        new_tokens = result.sequences[:, width:].cpu()  # [P*n, T_new], grouped prompt by prompt
        token_logprobs: Tensor | None = None
        if want_logprobs and result.scores:
            scores = torch.stack(result.scores, dim=1).float()  # [P*n, T_new, V], processed
            token_logprobs = (
                torch.log_softmax(scores, dim=-1)
                .gather(-1, new_tokens.to(scores.device).unsqueeze(-1))
                .squeeze(-1)
                .cpu()
            )
        eos = set(self._eos_ids)
        completions: list[Completion] = []
        for row in range(new_tokens.shape[0]):
            tokens = new_tokens[row].tolist()
            finish: FinishReason = "length"
            for t, tok in enumerate(tokens):
                if tok in eos:
                    tokens = tokens[: t + 1]
                    finish = "stop"
                    break
            logprobs = (
                token_logprobs[row, : len(tokens)].tolist() if token_logprobs is not None else []
            )
            completions.append(
                Completion(
                    prompt_index=offset + row // n,
                    prompt_ids=list(prompt_ids[row // n]),
                    token_ids=tokens,
                    logprobs=logprobs,
                    finish_reason=finish,
                    text=str(self.tokenizer.decode(tokens, skip_special_tokens=True)),
                )
            )
        return completions


class _RngScope:
    """Swaps the engine's random stream in for torch's global one for the duration of a call.

    With a fixed `seed`, a fresh stream seeded with it is used and the engine's stream is left
    as it was (evaluation); otherwise the engine's stream advances and is kept.
    """

    def __init__(self, engine: HFEngine, seed: int | None) -> None:
        self.engine = engine
        self.seed = seed
        devices = [engine._device.index or 0] if engine._device.type == "cuda" else []
        self._fork = torch.random.fork_rng(devices=devices)

    def __enter__(self) -> None:
        self._fork.__enter__()
        if self.seed is not None:
            torch.manual_seed(self.seed)
            return
        torch.set_rng_state(self.engine._cpu_state)
        if self.engine._cuda_state is not None:
            torch.cuda.set_rng_state(self.engine._cuda_state, self.engine._device)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.seed is None:
            self.engine._cpu_state = torch.get_rng_state()
            if self.engine._cuda_state is not None:
                self.engine._cuda_state = torch.cuda.get_rng_state(self.engine._device)
        self._fork.__exit__(exc_type, exc, tb)


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
