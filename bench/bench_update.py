"""Old log-probs + update time per rollout step: padded micro-batches against packed ones.

    .venv/bin/python bench/bench_update.py [--rounds 5] [--threads 2] [--batches 4]

Batches come from real rollout steps of the tiny preset's `token_loss` arm (16 prompts × G = 8,
budget 44, μ = 2, mini-batches of 4 groups, micro-batches of 64 sequences). Each variant has
its own copy of the model and optimizer and runs `Updater.run` (step 5, old log-probs, and
step 6, the μ-epoch update) on the same batches with the same shuffles:

  padded        one sequence per row, right-padded (the layout before packing)
  one-row       every sequence of a micro-batch in ONE row, block-diagonal mask (C = Σ lengths)
  packed        first-fit decreasing into rows of C = the longest sequence (the trainer's)
  packed+reuse  packed, and the first mini-batch's old log-probs from its own forward (the
                trainer's default where allowed; the others run the separate pass on all rows)

Rounds alternate the variants (A, B, C, D, A, ...); printed: old-log-prob and update seconds
per rollout step (median), their sum (min / median) and the median of the per-step ratios to
`padded` (lower is faster).
"""

from __future__ import annotations

import argparse
import copy
import statistics
from typing import Any

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, default=4, help="rollout steps' batches")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from dapo_core.data.loaders import load_problems
    from dapo_core.engines import make_engine
    from dapo_core.models import load_policy
    from dapo_core.setup.ladders import paper_ladder
    from dapo_core.train.batching import Seq, pack
    from dapo_core.train.collective import LOCAL
    from dapo_core.train.policy import PolicyForward
    from dapo_core.train.trainer import Trainer
    from dapo_core.train.update import Updater, make_optimizer

    cfg = paper_ladder().config(
        "token_loss",
        "tiny",
        {"algo.overlong_penalty": False, "algo.overlong_filter": False, "run.seed": 0},
    )
    model, tok = load_policy(cfg.model, "cpu")
    problems = load_problems(cfg.data.train, seed=0)
    trainer = Trainer(cfg, model, tok, make_engine("hf", model, tok, cfg), problems)

    def fresh(seqs: list[Seq]) -> list[Seq]:
        return [Seq(s.group, s.prompt_ids, s.response_ids, s.truncated, s.advantage) for s in seqs]

    batches: list[tuple[list[Seq], int]] = []
    run = trainer.updater.run

    def keep(seqs: list[Seq], n_groups: int, shuffle: torch.Generator, **kw: Any) -> Any:
        batches.append((fresh(seqs), n_groups))
        return run(seqs, n_groups, shuffle, **kw)  # kw: the trainer's `watch`

    trainer.updater.run = keep  # type: ignore[method-assign]
    for _ in range(args.batches):
        trainer.step()

    class Variant(Updater):
        reuse = False
        one_row = False

        @property
        def reuses_first_forward(self) -> bool:
            return self.reuse and super().reuses_first_forward

        def _pack(self, rows: Any) -> Any:
            if self.one_row:
                width = sum(s.length for s in rows)
                return pack(rows, self.pad_id, self.device, packed=True, capacity=width)
            return super()._pack(rows)

    def make(packed: bool, reuse: bool = False, one_row: bool = False) -> Variant:
        m = copy.deepcopy(model)
        optimizer, scheduler = make_optimizer(cfg, m)
        fwd = PolicyForward(m, compute_dtype=torch.float32, temperature=1.0)
        u = Variant(
            cfg, fwd, optimizer, scheduler, pad_id=0, device=torch.device("cpu"), dist=LOCAL
        )
        u._packed, u.reuse, u.one_row = packed, reuse, one_row
        return u

    variants = {
        "padded": make(False),
        "one-row": make(True, one_row=True),
        "packed": make(True),
        "packed+reuse": make(True, reuse=True),
    }
    slots = {k: 0 for k in variants}
    tokens = 0
    for seqs, _ in batches:
        for i in range(0, len(seqs), cfg.batch.micro_batch_size):
            part = seqs[i : i + cfg.batch.micro_batch_size]
            tokens += sum(s.length for s in part)
            for name, u in variants.items():
                slots[name] += u._pack(part).input_ids.numel()
    print(
        f"{len(batches)} batches of {len(batches[0][0])} sequences, {args.threads} threads, "
        f"{args.rounds} rounds; slots per real token (old-log-prob micro-batches): "
        + ", ".join(f"{k} {v / tokens:.2f}" for k, v in slots.items())
    )
    for u in variants.values():  # warm-up
        u.run(fresh(batches[0][0]), batches[0][1], torch.Generator().manual_seed(0))
    times: dict[str, dict[str, list[float]]] = {k: {"old": [], "upd": []} for k in variants}
    for r in range(args.rounds):
        for seqs, n_groups in batches:
            for name, u in variants.items():
                st = u.run(fresh(seqs), n_groups, torch.Generator().manual_seed(r))
                times[name]["old"].append(st.old_logprob_s)
                times[name]["upd"].append(st.update_s)
    total = {k: [a + b for a, b in zip(v["old"], v["upd"], strict=True)] for k, v in times.items()}
    print(
        f"{'variant':>13} {'old s':>7} {'update s':>9} {'sum min':>8} {'sum med':>8} {'x padded':>9}"
    )
    for name, v in times.items():
        ratio = [a / b for a, b in zip(total[name], total["padded"], strict=True)]
        print(
            f"{name:>13} {statistics.median(v['old']):>7.4f} {statistics.median(v['upd']):>9.4f} "
            f"{min(total[name]):>8.4f} {statistics.median(total[name]):>8.4f} "
            f"{statistics.median(ratio):>9.3f}"
        )


if __name__ == "__main__":
    main()
