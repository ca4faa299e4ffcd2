"""Rollout-step time of the DAPO Lab trainer against TRL's GRPOTrainer, same work on both sides.

    bash scripts/setup_bench.sh && .venv-bench/bin/python bench/bench_trl.py [--steps 12]

Both train the same warm-started tiny model (the `tiny` preset) on the same synthetic prompts,
with the same G, response budget, μ, mini-batches and loss: TRL's loss_type="dapo" (token-level
normalisation), ε_low 0.2, ε_high 0.28, β = 0 (no KL, no reference model), temperature 1,
top-p 1, constant LR, no gradient checkpointing, no dynamic sampling (TRL has none), on CPU with
the same number of threads. One rollout step = generate train_batch_size × G completions, old
log-probs of all of them, then μ epochs of train_batch_size / mini_batch_size optimizer steps.
In TRL terms: per_device_train_batch_size = mini_batch_size × G completions, one gradient
accumulation step, steps_per_generation = train_batch_size / mini_batch_size and
num_iterations = μ, so TRL generates once every steps_per_generation × μ optimizer steps and
computes old log-probs in a separate pass (gradient_accumulation_steps is not a multiple of
that), as DAPO Lab does.

What TRL does differently (same amount of work, other choices): its mini-batches are random
sets of completions, split once per generation and reused in the same order for every epoch
(DAPO Lab's are whole groups, reshuffled each epoch); its token-level loss divides by the
generation batch's token count / steps_per_generation (DAPO Lab: the mini-batch's own token
count); it samples with transformers `generate` and computes old log-probs for every
completion (DAPO Lab: its own sampling loop, packed sequences in the update, and the first
mini-batch's old log-probs from that mini-batch's own first forward).

Interleaved in one process: TRL's training loop runs, and at the end of each of its rollout
steps (a callback) one DAPO Lab step runs, so that load from other work on a shared machine
hits both alike. The first rollout step of each is a warm-up and is not timed. Prints seconds
per rollout step of each (mean, median, min), the per-phase split of each (medians), the ratio
of the means and of the medians, and last the headline: the median over the steps of the
paired ratio DAPO Lab step / TRL step (lower is faster).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from typing import Any

PHASES = ("rollout", "old log-probs", "update")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=4, help="timed rollout steps (after 1 warm-up)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from dapo_core.data.loaders import load_problems
    from dapo_core.models import load_policy
    from dapo_core.setup.ladders import paper_ladder

    cfg = paper_ladder().config(
        "token_loss",
        "tiny",
        {
            "algo.overlong_penalty": False,  # TRL has no soft overlong punishment
            "algo.overlong_filter": False,  # TRL's mask_truncated_completions=False
            "run.seed": args.seed,
            "run.steps": args.steps + 1,
        },
    )
    model, tokenizer = load_policy(cfg.model, "cpu")
    problems = load_problems(cfg.data.train, seed=cfg.run.seed)
    G = cfg.rollout.group_size
    b = cfg.batch
    print(
        f"tiny model {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params; "
        f"{b.train_batch_size} prompts × G={G} per rollout step, budget "
        f"{cfg.rollout.max_response_len} tokens, {b.train_batch_size // b.mini_batch_size} "
        f"updates of {b.mini_batch_size * G} completions per epoch, μ={cfg.algo.ppo_epochs}, "
        f"{args.threads} threads, interleaved"
    )

    ours = _DapoLab(cfg, copy.deepcopy(model), tokenizer, problems)
    theirs = _run_trl(cfg, copy.deepcopy(model), tokenizer, problems, args.steps, ours)
    mine = ours.times[1:]  # the first is the warm-up
    assert len(mine) == len(theirs["step"]) == args.steps, (len(mine), len(theirs["step"]))
    for name, xs in (("DAPO Lab", mine), ("TRL GRPOTrainer", theirs["step"])):
        print(
            f"{name}: {statistics.mean(xs):.3f} s per rollout step (median "
            f"{statistics.median(xs):.3f}, min {min(xs):.3f})"
        )
    for name, split in (("DAPO Lab", ours.phase_medians()), ("TRL", _trl_split(theirs))):
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in split.items())
        print(f"{name} per step (medians): {parts}")
    paired = [a / t for a, t in zip(mine, theirs["step"], strict=True)]
    print(
        f"ratio of the means {statistics.mean(mine) / statistics.mean(theirs['step']):.2f}, "
        f"of the medians {statistics.median(mine) / statistics.median(theirs['step']):.2f}; "
        f"paired per-step ratios min {min(paired):.2f}, max {max(paired):.2f}"
    )
    # The headline: the median of the paired ratios (each DAPO Lab step against the TRL step
    # just before it), which one slow step on a shared machine cannot move.
    print(f"ratio DAPO Lab / TRL = {statistics.median(paired):.2f} (median of {len(paired)} pairs)")


class _DapoLab:
    """The DAPO Lab trainer, stepped from TRL's callback; keeps each step's time and phases."""

    def __init__(self, cfg: Any, model: Any, tokenizer: Any, problems: list[Any]) -> None:
        from dapo_core.engines import make_engine
        from dapo_core.train.trainer import Trainer

        engine = make_engine("hf", model, tokenizer, cfg)
        self.trainer = Trainer(cfg, model, tokenizer, engine, problems)
        self.times: list[float] = []
        self.phases: list[dict[str, float]] = []

    def step(self) -> None:
        from dapo_common import metric_names as M

        t0 = time.perf_counter()
        m = self.trainer.step().metrics
        self.times.append(time.perf_counter() - t0)
        self.phases.append(
            {
                "rollout": m[M.ROLLOUT_S],
                "old log-probs": m[M.OLD_LOGPROB_S],
                "update": m[M.UPDATE_S],
            }
        )

    def phase_medians(self) -> dict[str, float]:
        timed = self.phases[1:]
        return {k: statistics.median(p[k] for p in timed) for k in PHASES}


def _trl_split(theirs: dict[str, list[float]]) -> dict[str, float]:
    """TRL's phases per timed rollout step (medians): generation + scoring with its
    old-log-prob pass taken out, the old-log-prob pass, and the rest of the step (the μ epochs
    of updates and TRL's own bookkeeping)."""
    gen, old = theirs["generate_and_score"][1:], theirs["old"][1:]
    return {
        "rollout": statistics.median(g - o for g, o in zip(gen, old, strict=True)),
        "old log-probs": statistics.median(old),
        "update": statistics.median(t - g for t, g in zip(theirs["step"], gen, strict=True)),
    }


def _run_trl(
    cfg: Any, model: Any, tokenizer: Any, problems: list[Any], steps: int, ours: _DapoLab
) -> dict[str, list[float]]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from dapo_core.algo.rewards import math_score
    from dapo_core.data.loaders import format_prompt

    G = cfg.rollout.group_size
    b = cfg.batch
    updates_per_generation = b.train_batch_size // b.mini_batch_size
    per_rollout = updates_per_generation * cfg.algo.ppo_epochs  # optimizer steps
    rows = [
        {"prompt": format_prompt(p, cfg.data.prompt_template, tokenizer), "answer": p.answer}
        for p in problems
    ]

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [float(math_score(c, a).score) for c, a in zip(completions, answer, strict=True)]

    out: dict[str, list[float]] = {"step": [], "generate_and_score": [], "old": []}
    started = [time.perf_counter()]

    class Interleave(TrainerCallback):
        """At the end of each TRL rollout step: note its time, then run one DAPO Lab step."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step % per_rollout:
                return
            end = time.perf_counter()
            if state.global_step > per_rollout:  # the first was TRL's warm-up
                out["step"].append(end - started[0])
            ours.step()
            started[0] = time.perf_counter()

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        use_cpu=True,
        seed=cfg.run.seed,
        per_device_train_batch_size=b.mini_batch_size * G,
        gradient_accumulation_steps=1,
        steps_per_generation=updates_per_generation,
        num_generations=G,
        max_completion_length=cfg.rollout.max_response_len,
        num_iterations=cfg.algo.ppo_epochs,
        loss_type="dapo",
        epsilon=cfg.algo.clip_low,
        epsilon_high=cfg.algo.clip_high,
        beta=0.0,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        learning_rate=cfg.optim.lr,
        lr_scheduler_type="constant",
        weight_decay=cfg.optim.weight_decay,
        max_grad_norm=cfg.optim.grad_clip,
        gradient_checkpointing=False,
        max_steps=(steps + 1) * per_rollout,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Interleave()],
    )
    # Phase clocks around TRL's own methods (instance attributes: the class is untouched).
    gen_and_score = trainer._generate_and_score_completions
    logps = trainer._get_per_token_logps_and_entropies

    def timed_gen(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return gen_and_score(*a, **k)
        finally:
            out["generate_and_score"].append(time.perf_counter() - t0)
            if len(out["old"]) < len(out["generate_and_score"]):  # no old pass this time
                out["old"].append(0.0)

    def timed_logps(*a: Any, **k: Any) -> Any:
        if torch.is_grad_enabled():  # the update's forward, not the old-log-prob pass
            return logps(*a, **k)
        t0 = time.perf_counter()
        try:
            return logps(*a, **k)
        finally:
            out["old"].append(time.perf_counter() - t0)

    trainer._generate_and_score_completions = timed_gen  # type: ignore[method-assign]
    trainer._get_per_token_logps_and_entropies = timed_logps  # type: ignore[method-assign]
    started[0] = time.perf_counter()
    trainer.train()
    return out


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
