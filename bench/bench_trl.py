"""Rollout-step time of the DAPO Lab trainer against TRL's GRPOTrainer, same work on both sides.

    bash scripts/setup_bench.sh && .venv-bench/bin/python bench/bench_trl.py [--steps 4]

Both train the same warm-started tiny model (the `tiny` preset) on the same synthetic prompts,
with the same G, response budget, μ, mini-batch and loss: TRL's loss_type="dapo" (token-level
normalisation), ε_low 0.2, ε_high 0.28, β = 0 (no KL, no reference model), temperature 1,
top-p 1, constant LR, no gradient checkpointing, no dynamic sampling (TRL has none), on CPU with
the same number of threads. One rollout step = generate train_batch_size × G completions, then
train_batch_size / mini_batch_size optimizer steps per epoch; in TRL terms
per_device_train_batch_size = mini_batch_size × G completions and steps_per_generation =
train_batch_size / mini_batch_size. The first rollout step of each is a warm-up and is not timed.

Prints seconds per rollout step for each and the ratio DAPO Lab / TRL (lower is faster).
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from typing import Any


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
    from dapo_core.arms import build_arm_config
    from dapo_core.data import load_problems
    from dapo_core.models import load_policy

    cfg = build_arm_config(
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
        f"updates of {b.mini_batch_size * G} completions, μ={cfg.algo.ppo_epochs}, "
        f"{args.threads} threads"
    )

    ours = _time_dapo_lab(cfg, copy.deepcopy(model), tokenizer, problems, args.steps)
    theirs = _time_trl(cfg, copy.deepcopy(model), tokenizer, problems, args.steps)
    print(f"DAPO Lab: {ours:.2f} s per rollout step")
    print(f"TRL GRPOTrainer: {theirs:.2f} s per rollout step")
    print(f"ratio DAPO Lab / TRL = {ours / theirs:.2f}")


def _time_dapo_lab(cfg: Any, model: Any, tokenizer: Any, problems: list[Any], steps: int) -> float:
    from dapo_core.engines import make_engine
    from dapo_core.trainer import Trainer

    engine = make_engine("hf", model, tokenizer, cfg)
    trainer = Trainer(cfg, model, tokenizer, engine, problems)
    trainer.step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    return (time.perf_counter() - t0) / steps


def _time_trl(cfg: Any, model: Any, tokenizer: Any, problems: list[Any], steps: int) -> float:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from dapo_core.data import format_prompt
    from dapo_core.rewards import math_score

    G = cfg.rollout.group_size
    b = cfg.batch
    updates_per_rollout = b.train_batch_size // b.mini_batch_size
    rows = [
        {"prompt": format_prompt(p, cfg.data.prompt_template, tokenizer), "answer": p.answer}
        for p in problems
    ]

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [float(math_score(c, a).score) for c, a in zip(completions, answer, strict=True)]

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            marks.append(time.perf_counter())

    out = tempfile.mkdtemp(prefix="bench-trl-")
    config = GRPOConfig(
        output_dir=out,
        use_cpu=True,
        seed=cfg.run.seed,
        per_device_train_batch_size=b.mini_batch_size * G,
        gradient_accumulation_steps=1,
        steps_per_generation=updates_per_rollout,
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
        max_steps=(steps + 1) * updates_per_rollout,
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
        callbacks=[Clock()],
    )
    trainer.train()
    first_timed = updates_per_rollout - 1  # end of the warm-up rollout step
    return (marks[-1] - marks[first_timed]) / steps


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
