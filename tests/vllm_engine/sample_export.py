"""Sample a run's checkpoint with vLLM in a process of its own, as `dapo eval --engine vllm`
starts it (runner.evaluate_checkpoint: the export loaded from disk as it is, no weights pushed
from memory), and write the completions as JSON for test_vllm_real_model.py to score.

Why a process of its own: vLLM's CPU backend refuses to start unless the memory still free on
the machine covers its whole share, and its share must also cover what its process already
holds. In the test process that is the module's first engine and two float32 copies of the
model (~12 GiB held, ~12 GiB free on a 24 GiB runner): no share satisfies both there. A fresh
process holds ~1 GiB.

    python sample_export.py CHECKPOINT PROMPTS.json OUT.json MAX_TOKENS SEED
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path


def memory_share(need_gib: float = 3.0) -> float:
    """rollout.gpu_memory_utilization for the CPU backend: this process's memory plus what the
    engine needs (538 MB of float32 weights, activations, a small KV cache), as a share of the
    machine's memory."""
    import psutil

    held = psutil.Process().memory_info().rss
    return min(0.9, (held + need_gib * 2**30) / psutil.virtual_memory().total)


def main(ckpt: Path, prompts_json: Path, out_json: Path, max_tokens: int, seed: int) -> None:
    import torch

    from dapo_core.engines import make_engine
    from dapo_core.engines.base import SamplingParams
    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.train.checkpoint import load_checkpoint_config
    from dapo_core.train.run_dir import MODEL_DIR
    from dapo_core.train.runner import load_checkpoint_policy

    torch.set_num_threads(1)  # a shared 2-core runner
    prompts = json.loads(prompts_json.read_text())
    cfg = ExperimentConfig.from_dict(load_checkpoint_config(ckpt)).with_overrides(
        {
            "rollout.engine": "vllm",
            "rollout.max_response_len": max_tokens,
            "algo.overlong_cache_len": 4,
            "rollout.gpu_memory_utilization": memory_share(),
        }
    )
    model, tokenizer = load_checkpoint_policy(ckpt, cfg, "cpu")
    engine = make_engine(
        "vllm",
        model,
        tokenizer,
        cfg,
        init_dir=ckpt / MODEL_DIR,
        llm_kwargs={"enforce_eager": True},
    )
    try:
        out = engine.generate(prompts, SamplingParams(n=2, max_tokens=max_tokens, seed=seed))
    finally:
        engine.close()
    out_json.write_text(json.dumps([asdict(c) for c in out]))


if __name__ == "__main__":
    ckpt, prompts_json, out_json, max_tokens, seed = sys.argv[1:6]
    main(Path(ckpt), Path(prompts_json), Path(out_json), int(max_tokens), int(seed))
