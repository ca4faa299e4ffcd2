"""Peak memory and time of per-token log-probs + entropy + backward: chunked vs naive.

    python bench/bench_logprobs.py [--tokens 2048] [--hidden 256] [--vocabs 32000 151936]
                                   [--device cpu|cuda]

Each measurement runs in a fresh subprocess; its peak is the growth of the memory high-water
mark over what the inputs already occupied, so only the memory the computation itself needed is
counted: the resident set (resource.getrusage ru_maxrss) on CPU, torch's allocator peak
(torch.cuda.max_memory_allocated) on CUDA. The baseline (naive: full-vocabulary log_softmax of
the whole batch, as `torch.log_softmax(lm_head(h))` does) is measured in the same run, and the
ratio chunked / naive is printed per vocabulary size.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _child(
    mode: str, tokens: int, hidden: int, vocab: int, threads: int, device: str
) -> dict[str, float]:
    import torch
    from torch import nn

    from dapo_core.setup.plan import auto_chunk_size
    from dapo_core.train.logprobs import (
        linear_logprobs_and_entropy,
        naive_logprobs_and_entropy,
    )

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    head = nn.Linear(hidden, vocab, bias=False, device=device, dtype=dtype)
    h = torch.randn(1, tokens, hidden, requires_grad=True, device=device, dtype=dtype)
    targets = torch.randint(0, vocab, (1, tokens), device=device)
    # Touch every input (and the weight-gradient buffer every method needs) before measuring.
    head.weight.grad = torch.zeros_like(head.weight)
    h.grad = torch.zeros_like(h)

    def run() -> None:
        if mode == "naive":
            lp, ent = naive_logprobs_and_entropy(head(h), targets)
        else:
            lp, ent = linear_logprobs_and_entropy(h, head, targets)
        (lp.sum() + 0 * ent.sum()).backward()

    if cuda:
        run()  # warm-up: kernels load and cuBLAS picks its algorithms outside the timing
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    t0 = time.perf_counter()
    run()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "peak_mib": peak - before,
        "seconds": elapsed,
        "chunk": float(auto_chunk_size(vocab)),
    }


def _measure(
    mode: str, tokens: int, hidden: int, vocab: int, threads: int, device: str
) -> dict[str, float]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--tokens",
        str(tokens),
        "--hidden",
        str(hidden),
        "--vocabs",
        str(vocab),
        "--threads",
        str(threads),
        "--device",
        device,
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="response tokens in the batch")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32000, 151936])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda measures in bfloat16"
    )
    parser.add_argument("--child", choices=("naive", "chunked"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(
            json.dumps(
                _child(
                    args.child, args.tokens, args.hidden, args.vocabs[0], args.threads, args.device
                )
            )
        )
        return
    what = "CUDA, bfloat16" if args.device == "cuda" else "CPU, float32"
    print(f"tokens={args.tokens} hidden={args.hidden} (forward + entropy + backward, {what})")
    print(
        f"{'vocab':>8} {'chunk':>6} {'naive MiB':>10} {'chunked MiB':>12} {'ratio':>6} {'naive s':>8} {'chunked s':>9}"
    )
    for vocab in args.vocabs:
        naive = _measure("naive", args.tokens, args.hidden, vocab, args.threads, args.device)
        chunked = _measure("chunked", args.tokens, args.hidden, vocab, args.threads, args.device)
        ratio = chunked["peak_mib"] / naive["peak_mib"]
        print(
            f"{vocab:>8} {int(chunked['chunk']):>6} {naive['peak_mib']:>10.0f} "
            f"{chunked['peak_mib']:>12.0f} {ratio:>6.3f} {naive['seconds']:>8.2f} "
            f"{chunked['seconds']:>9.2f}"
        )


if __name__ == "__main__":
    main()
