"""The rollout-engine protocol: prompts in, G sampled completions per prompt out.

The trainer talks only to this protocol, so `hf` (our sampling loop over a transformers model)
and `vllm` are interchangeable. An engine returns token ids, not only text: the trainer scores the exact tokens
that were sampled and recomputes their log-probabilities under the current policy itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from torch import Tensor

FinishReason = Literal["stop", "length"]


@dataclass
class SamplingParams:
    n: int
    """Completions per prompt (the group size G)."""
    max_tokens: int
    """Generation budget in tokens (L_max of Eq. 13)."""
    temperature: float = 1.0
    """Softmax temperature of the sampling distribution; 0 is greedy decoding (the argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    seed: int | None = None
    """None draws from the engine's own (checkpointed) random stream; an int draws from a fresh
    stream seeded with it and leaves the engine's stream untouched (evaluation uses this, so an
    evaluation never shifts the training samples)."""


@dataclass
class Completion:
    prompt_index: int
    """Which prompt of the call this completion answers."""
    prompt_ids: list[int]
    """The prompt's token ids as the engine saw them (after left truncation, no padding)."""
    token_ids: list[int]
    """Response tokens; the EOS token is included when the model stopped."""
    logprobs: list[float]
    """The sampling distribution's log-probability of each response token (after temperature
    and top-p), one per token. Informational: the trainer recomputes old log-probs itself."""
    finish_reason: FinishReason
    """`stop` (EOS sampled) or `length` (budget reached: truncated)."""
    text: str
    """Decoded response, special tokens skipped."""

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples completions from the current policy."""

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        """`sampling.n` completions per prompt, grouped prompt by prompt:
        result[i * n + j] is completion j of prompts[i]."""
        ...

    def load_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """Make the engine sample from these policy weights (called after each update)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Random-stream state, saved in checkpoints so a resumed run samples the same tokens."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what state_dict() returned."""
        ...

    def close(self) -> None:
        """Give back what the engine holds (vLLM: its engine core, weights and KV cache), so the
        next run in this process finds the device free. Called once a run ends, whether it
        succeeded or failed; idempotent, and the engine is not used afterwards."""
        ...


EngineHost = Callable[[Callable[[], RolloutEngine]], RolloutEngine]
"""Where a run's rollout engine lives: handed the engine's recipe (a picklable call that builds
it), returns the engine to sample with. Without one a run calls the recipe in its own process;
the flows put the engine on a Ray actor of its own (flows/rollout_actor.py)."""
