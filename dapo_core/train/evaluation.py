"""Evaluation of the policy being trained: avg@k, pass@k and cons@k on held-out problems.

`evaluate_policy` is what a run calls at step 0 and every data.eval_every steps (a collective on
N workers), and what `dapo eval` calls on a checkpoint (runner.evaluate_checkpoint).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from dapo_core.engines.base import RolloutEngine, SamplingParams
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.collective import LOCAL, Collective, shard

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def evaluate_policy(
    cfg: ExperimentConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    engine: RolloutEngine | None = None,
    *,
    step: int = 0,
    dist: Collective = LOCAL,
) -> dict[str, Any]:
    """avg@k, pass@k and cons@k of the policy on cfg.data.eval (first data.eval_problems), and
    the number of correct samples per problem (`correct_per_problem`).

    Samples k responses per problem at data.eval_temperature with a seed derived from
    (run.seed, step): an evaluation never advances the training sampler's random stream, so
    evaluating (or not) leaves the training run unchanged, and it is reproducible for a given
    number of workers. On N workers (a collective) each rank samples a share of the problems
    with its own engine and every rank returns the whole result.
    """
    from dapo_core.algo.evaluate import summarize
    from dapo_core.algo.rewards import math_score
    from dapo_core.data.loaders import format_prompt, response_prefix

    problems = eval_problems(cfg)
    if engine is None:
        from dapo_core.engines import make_engine

        engine = make_engine("hf", model, tokenizer, cfg)
    k = cfg.data.eval_k
    mine = shard(list(range(len(problems))), dist.rank, dist.world_size)
    prompts = [format_prompt(problems[i], cfg.data.prompt_template, tokenizer) for i in mine]
    completions = (
        engine.generate(
            prompts,
            SamplingParams(
                n=k,
                max_tokens=cfg.rollout.max_response_len,
                temperature=cfg.data.eval_temperature,
                top_p=cfg.rollout.top_p,
                seed=cfg.run.seed * 1_000_003 + step + 17 + 7919 * dist.rank,
            ),
        )
        if prompts
        else []
    )
    scored: dict[int, tuple[list[bool], list[str | None]]] = {}
    for j, i in enumerate(mine):
        results = [
            math_score(response_prefix(cfg.data.prompt_template) + c.text, problems[i].answer)
            for c in completions[j * k : (j + 1) * k]
        ]
        scored[i] = ([bool(r.acc) for r in results], [r.pred for r in results])
    if dist.world_size > 1:
        for part in dist.all_gather_object(scored):
            scored.update(part)
    correct = [scored[i][0] for i in range(len(problems))]
    preds = [scored[i][1] for i in range(len(problems))]
    answers = [p.answer for p in problems]
    summary = summarize(correct, preds, answers, k)
    return {
        "dataset": cfg.data.eval,
        "k": k,
        "avg_at_k": float(summary["avg_at_k"]),
        "pass_at_k": float(summary["pass_at_k"]),
        "cons_at_k": float(summary["cons_at_k"]),
        "n_problems": len(problems),
        # Correct samples (of k) per problem, in the eval set's order: what a paired comparison
        # of two arms on the same problems, or a bootstrap over problems, needs.
        "correct_per_problem": [sum(c) for c in correct],
        # The protocol under every table (db/protocol.py): how the score was taken and where;
        # CPU kinds with other vector units round differently, so the same seed differs.
        "grader": GRADER,
        "temperature": cfg.data.eval_temperature,
        "device": device_kind(model),
        "torch": torch_version(),
    }


GRADER = "math_score (DAPO-Math: the last 'Answer:' line, normalized, as a string)"


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def device_kind(model: Any) -> str:
    """'NVIDIA H200' on a GPU; on a CPU its model name and widest vector unit ('AMD EPYC 7B13,
    avx2'), read once from /proc/cpuinfo (where there is none: the platform's word)."""
    try:
        device = next(model.parameters()).device
    except (StopIteration, AttributeError):
        device = None
    if device is not None and device.type == "cuda":
        import torch

        return str(torch.cuda.get_device_name(device))
    return _cpu_kind()


@functools.lru_cache(maxsize=1)
def _cpu_kind() -> str:
    import platform

    name, flags = "", set[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
                if name and flags:
                    break
    except OSError:
        pass
    unit = next((u for u in ("avx512f", "avx2", "avx", "neon", "asimd") if u in flags), "")
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    return f"CPU {name}" + (f", {unit.removesuffix('f')}" if unit else "")


def eval_problems(cfg: ExperimentConfig) -> list[Any]:
    """The problems an evaluation samples: the first data.eval_problems of data.eval (0: all)."""
    from dapo_core.data.loaders import load_problems

    problems = load_problems(cfg.data.eval, seed=cfg.run.seed)
    if cfg.data.eval_problems:
        problems = problems[: cfg.data.eval_problems]
    if not problems:
        raise ValueError(f"data.eval={cfg.data.eval!r} holds no problems")
    return list(problems)
