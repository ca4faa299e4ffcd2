"""One arm on 2 workers against 1: update throughput and peak memory per worker, in one run.

    python bench/bench_workers.py [--hidden 640] [--layers 8] [--vocab 8192] [--seqs 16]
                                  [--seq-len 128] [--micro 2] [--updates 2] [--rounds 2]
                                  [--threads 1]

The update phase alone (old log-probs once, then timed mini-batch updates: forward, backward,
AdamW step), through the trainer's own pieces (Updater, make_optimizer, shard_policy), on a
Llama-style model of about 45M parameters, so that the update dominates. Both layouts run in
this one invocation, in fresh processes, alternating for `rounds` rounds: 1 worker is the plain
single-process path, 2 workers are FSDP2 ranks over gloo (float32: CPU compute). Each worker
gets `threads` threads, as each gets one GPU on a cluster: the throughput ratio is the scaling
from one worker's hardware to two (2x is perfect), and update times are the best of the rounds
(on a shared machine other people's work only ever slows a round down).

Memory per worker, above the resident set after imports (the interpreter and libraries do not
shard): `peak` over the worker's whole life (ru_maxrss: model load and sharding included) and
`update peak` over the timed updates alone (the high-water mark reset after the warm-up
update, freed heap returned first), and the exact bytes of the training state the worker
holds (parameters, gradients, AdamW moments: its shard of them on 2 workers); memory is the
largest over the rounds. glibc's mmap threshold is fixed (MALLOC_MMAP_THRESHOLD_) so that a
freed tensor goes back to the system and the resident set follows the live tensors instead of
heap fragmentation. Throughput: tokens (prompt + response) through the update per second of
wall time, for the whole job.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _status_mib(field: str) -> float:
    """VmRSS (resident now) or VmHWM (its high-water mark) of this process, in MiB."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    """Return freed heap to the system, then restart the high-water mark (Linux >= 4.0)."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _worker(rank: int, world: int, init: str, args: dict[str, Any], out: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.train.batching import Seq
    from dapo_core.train.collective import LOCAL, Collective, TorchCollective
    from dapo_core.train.distributed import shard_policy
    from dapo_core.train.policy import PolicyForward
    from dapo_core.train.update import Updater, make_optimizer

    torch.set_num_threads(args["threads"])
    base_rss = _status_mib("VmRSS")
    dist: Collective = LOCAL
    if world > 1:
        import torch.distributed as td

        td.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        dist = TorchCollective()
    torch.manual_seed(0)
    heads = max(1, args["hidden"] // 64)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=args["vocab"],
            hidden_size=args["hidden"],
            num_hidden_layers=args["layers"],
            num_attention_heads=heads,
            num_key_value_heads=heads,
            intermediate_size=args["hidden"] * 11 // 4,
            max_position_embeddings=2 * args["seq_len"],
            tie_word_embeddings=True,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=None,
        )
    )
    n_params = sum(p.numel() for p in model.parameters())
    fwd_model: torch.nn.Module = model
    if world > 1:
        fwd_model = shard_policy(model, dtype=torch.float32, device=torch.device("cpu"))
    groups, group_size = args["seqs"] // 4, 4
    cfg = ExperimentConfig().with_overrides(
        {
            "rollout.group_size": group_size,
            "batch.train_batch_size": groups,
            "batch.gen_batch_size": groups,
            "batch.mini_batch_size": groups,  # one gradient update per call
            "batch.micro_batch_size": args["micro"],
            "algo.loss_agg": "token-mean",
            "rollout.max_response_len": args["seq_len"],
            "algo.overlong_cache_len": 4,
            "run.device": "cpu",
        }
    )
    fwd = PolicyForward(fwd_model, compute_dtype=torch.float32, temperature=1.0)
    optimizer, scheduler = make_optimizer(cfg, fwd_model)
    updater = Updater(
        cfg, fwd, optimizer, scheduler, pad_id=0, device=torch.device("cpu"), dist=dist
    )
    gen = torch.Generator().manual_seed(1)
    prompt = args["seq_len"] // 4
    seqs = [
        Seq(
            i // group_size,
            torch.randint(2, args["vocab"], (prompt,), generator=gen).tolist(),
            torch.randint(2, args["vocab"], (args["seq_len"] - prompt,), generator=gen).tolist(),
            False,
            float(torch.randn((), generator=gen)),
        )
        for i in range(groups * group_size)
    ]
    tokens = sum(s.length for s in seqs)
    updater.old_logprobs(seqs)
    shuffle = torch.Generator().manual_seed(2)
    updater.update(seqs, groups, shuffle)  # warm-up: allocator, optimizer states
    _reset_peak()
    times = []
    for _ in range(args["updates"]):
        dist.barrier()
        t0 = time.perf_counter()
        stats = updater.update(seqs, groups, shuffle)
        dist.barrier()
        times.append(time.perf_counter() - t0)
        assert stats.updates == 1, "a skipped update would time nothing"
    state_bytes = 0
    for p in fwd_model.parameters():
        local = getattr(p, "to_local", lambda p=p: p)()
        state_bytes += local.numel() * local.element_size() * 2  # parameter + gradient
    for st in optimizer.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.dim() > 0:
                local = getattr(v, "to_local", lambda v=v: v)()
                state_bytes += local.numel() * local.element_size()
    update_peak = _status_mib("VmHWM")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {
        "rank": rank,
        "params": n_params,
        "tokens_per_update": tokens,
        "update_s": min(times),
        "peak_rss_mib": peak,
        "base_rss_mib": base_rss,
        "training_peak_mib": peak - base_rss,
        "update_peak_mib": update_peak - base_rss,
        "state_mib": state_bytes / 2**20,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    if world > 1:
        import torch.distributed as td

        td.destroy_process_group()


def _run(world: int, args: dict[str, Any]) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    from dapo_common.util import free_port

    with tempfile.TemporaryDirectory() as out:
        init = f"tcp://127.0.0.1:{free_port()}"
        mp.spawn(_worker, args=(world, init, args, out), nprocs=world)
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seqs", type=int, default=16, help="sequences per update (4 a group)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--micro", type=int, default=2, help="sequences per forward/backward")
    parser.add_argument("--updates", type=int, default=2, help="timed updates per worker start")
    parser.add_argument("--rounds", type=int, default=2, help="alternating starts per layout")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    args = vars(parser.parse_args())
    # Read by glibc when each worker process starts (spawn inherits the environment).
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))
    import torch

    print(
        f"torch {torch.__version__}, {platform.platform()}, {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    runs: dict[int, list[list[dict[str, Any]]]] = {1: [], 2: []}
    for _ in range(args["rounds"]):
        for world in (1, 2):
            runs[world].append(_run(world, args))

    # Per layout and rank: the best update time and the largest memory over the rounds.
    rows = {
        world: [
            {
                k: (min if k == "update_s" else max)(rnd[r][k] for rnd in rounds)
                for k in rounds[0][r]
            }
            for r in range(world)
        ]
        for world, rounds in runs.items()
    }
    one, two = rows[1][0], rows[2]
    print(
        f"model {one['params'] / 1e6:.1f}M parameters, {one['tokens_per_update']:.0f} tokens per "
        f"update, micro-batches of {args['micro']} sequences, {args['threads']} thread(s) per "
        f"worker, {args['rounds']} rounds x {args['updates']} timed updates"
    )
    print(
        f"{'workers':>7} {'rank':>4} {'update s':>9} {'tokens/s':>9} {'peak':>6} "
        f"{'update peak':>11} {'state':>6}  (MiB above the process after imports)"
    )
    for world, ranks in rows.items():
        for r in ranks:
            tps = r["tokens_per_update"] / r["update_s"]
            print(
                f"{world:>7} {r['rank']:>4.0f} {r['update_s']:>9.2f} {tps:>9.0f} "
                f"{r['training_peak_mib']:>6.0f} {r['update_peak_mib']:>11.0f} "
                f"{r['state_mib']:>6.0f}"
            )
    print(
        "update time per round (1 worker | 2 workers): "
        + " | ".join(
            ", ".join(f"{max(x['update_s'] for x in rnd):.2f}" for rnd in runs[w]) for w in (1, 2)
        )
    )
    ratio = one["update_s"] / max(r["update_s"] for r in two)
    peak = max(r["training_peak_mib"] for r in two) / one["training_peak_mib"]
    upd = max(r["update_peak_mib"] for r in two) / one["update_peak_mib"]
    state = max(r["state_mib"] for r in two) / one["state_mib"]
    print(f"update throughput, 2 workers / 1: {ratio:.2f}x")
    print(
        f"memory per worker, 2 workers / 1: peak {peak:.2f}x, update peak {upd:.2f}x, "
        f"training state {state:.2f}x (goal: <= 0.6x)"
    )
    json.dump({"args": args, "runs": {str(k): v for k, v in runs.items()}}, sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
