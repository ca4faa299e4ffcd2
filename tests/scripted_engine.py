"""The trainer with a scripted rollout engine whose outcomes are known (the rig of
tests/dapo_core/test_trainer.py, shared with the modules that step a Trainer the same way).

ScriptedEngine is a real RolloutEngine: it returns token ids the model scores, but which groups
are informative, which responses are truncated and how long they are is fixed by a script.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tiny_policy import EOS, tiny_llama
from transformers import PreTrainedTokenizerFast

from dapo_core.data.loaders import Problem
from dapo_core.engines.base import Completion, SamplingParams
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.trainer import Trainer


class ScriptedEngine:
    """Call k answers prompt i correctly in `correct[k][i]` of its G responses (the first ones),
    wrongly in the rest; `truncate[k][i]` responses (the last ones) are cut at the budget."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast,
        correct: Sequence[Sequence[int]],
        truncate: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.tok = tokenizer
        self.correct = correct
        self.truncate = truncate
        self.calls: list[list[str]] = []

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        k = len(self.calls)
        self.calls.append(list(prompts))
        out = []
        for i, prompt in enumerate(prompts):
            answer = prompt.split("=")[-1]  # prompts are "what is a+b=<answer>" below
            n_ok = self.correct[k % len(self.correct)][i]
            n_cut = self.truncate[k % len(self.truncate)][i] if self.truncate else 0
            for j in range(sampling.n):
                text = f"so Answer: {answer}" if j < n_ok else "so Answer: 999"
                ids = self.tok(text)["input_ids"]
                if j >= sampling.n - n_cut:  # truncated: the budget filled, no EOS
                    ids = (ids * sampling.max_tokens)[: sampling.max_tokens]
                    reason = "length"
                else:
                    ids = [*ids, EOS]
                    reason = "stop"
                out.append(
                    Completion(
                        prompt_index=i,
                        prompt_ids=self.tok(prompt)["input_ids"],
                        token_ids=ids,
                        logprobs=[],
                        finish_reason=reason,  # type: ignore[arg-type]
                        text=self.tok.decode(ids, skip_special_tokens=True),
                    )
                )
        return out

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"calls": len(self.calls)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


# Single-digit answers, so every correct response has the same length.
PROBLEMS = [
    Problem(prompt=f"what is {i}+1", answer=str(i + 1), source="t", idx=i) for i in range(8)
]


def make_cfg(**overrides: Any) -> ExperimentConfig:
    base = {
        "rollout.group_size": 4,
        "rollout.max_response_len": 24,
        "algo.overlong_cache_len": 8,
        "batch.train_batch_size": 4,
        "batch.gen_batch_size": 4,
        "batch.mini_batch_size": 2,
        "batch.micro_batch_size": 8,
        "optim.lr": 1e-3,
        "optim.warmup_updates": 0,
        "run.samples_per_step": 3,
        "run.device": "cpu",
    }
    base.update(overrides)
    return ExperimentConfig().with_overrides(base)


def make_trainer(cfg: ExperimentConfig, engine: ScriptedEngine, seed: int = 0) -> Trainer:
    tok = engine.tok
    return Trainer(
        cfg,
        tiny_llama(len(tok), seed),
        tok,
        engine,
        PROBLEMS,
        format_prompt=lambda p: f"{p.prompt}={p.answer}",
    )
