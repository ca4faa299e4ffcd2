"""Mixed precision done right: float32 masters, bfloat16 compute, float32 log-probs and loss.

`model.dtype=bfloat16` once made the *parameters* bfloat16. At the paper's lr 1e-6 an AdamW step
(about lr per weight) is far below bfloat16's resolution (2^-8 relative: 1e-4 for a weight of
0.02) and rounds away, so 0.3% of the weights moved and the model did not train. These tests
fail on such a build: the weights must move, the checkpoint must hold float32 masters, and the
bfloat16 step must match the float32 one to bfloat16's tolerance.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripted_engine import PROBLEMS, ScriptedEngine
from test_runner import ListSink, small
from tiny_policy import char_tokenizer, tiny_llama

from dapo_common import metric_names as M
from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.batching import Seq, pack
from dapo_core.train.checkpoint import latest_checkpoint
from dapo_core.train.runner import load_masters, train
from dapo_core.train.trainer import Trainer

# Every weight's first AdamW step is about lr = 1e-6; the starting weights are O(0.01-1).
PAPER_LR = {"optim.lr": 1e-6, "optim.warmup_updates": 0, "optim.weight_decay": 0.0}


def moved_fraction(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    changed = sum(int((after[k].float() != v.float()).sum()) for k, v in before.items())
    return changed / sum(v.numel() for v in before.values())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random Llama saved like any local model (independent of the tiny warm start)."""
    path = tmp_path_factory.mktemp("policy")
    tok = char_tokenizer()
    model = tiny_llama(
        len(tok),
        num_hidden_layers=2,
        tie_word_embeddings=True,  # like the tiny model: the head gives every row a gradient
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def scripted_step(
    dtype: str, model_dir: Path
) -> tuple[Trainer, dict[str, float], dict[str, torch.Tensor]]:
    """One rollout step with fixed (scripted) rollouts: 4 groups of 4, two mini-batches,
    token-mean (so that the loss is not 0 by symmetry)."""
    cfg = ExperimentConfig().with_overrides(
        {
            **PAPER_LR,
            "model.name_or_path": str(model_dir),
            "model.dtype": dtype,
            "algo.loss_agg": "token-mean",
            "rollout.group_size": 4,
            "rollout.max_response_len": 24,
            "algo.overlong_cache_len": 8,
            "batch.train_batch_size": 4,
            "batch.gen_batch_size": 4,
            "batch.mini_batch_size": 2,
            "run.device": "cpu",
        }
    )
    # The runner's own loader: it decides the parameters' dtype.
    model, tok = load_masters(cfg, "cpu")
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    engine = ScriptedEngine(tok, correct=[[3, 1, 2, 1]], truncate=[[0, 1, 0, 0]])  # type: ignore[arg-type]
    trainer = Trainer(
        cfg, model, tok, engine, PROBLEMS, format_prompt=lambda p: f"{p.prompt}={p.answer}"
    )
    metrics = trainer.step().metrics
    return trainer, metrics, start


def test_bf16_compute_trains_float32_masters_at_lr_1e_6(model_dir: Path) -> None:
    fp32, m32, start = scripted_step("float32", model_dir)
    bf16, m16, start16 = scripted_step("bfloat16", model_dir)
    for name, p in bf16.model.named_parameters():
        assert p.dtype == torch.float32, f"{name} is {p.dtype}: the masters must be float32"
    assert m16[M.GRAD_UPDATES] == 2 and m16[M.NONFINITE_UPDATES] == 0

    # (Nearly) every weight moved after one rollout step of 2 updates; the only ones that may
    # not are those whose gradient is exactly 0 (none here: the head touches every row).
    after = {k: v.detach() for k, v in bf16.model.state_dict().items()}
    assert moved_fraction(start16, after) > 0.99

    # The forward really ran in bfloat16 (not bit-identical to float32) ...
    assert m16[M.ENTROPY_MEAN] != m32[M.ENTROPY_MEAN]
    # ... and agrees with it to bfloat16's tolerance: 2^-8 ≈ 4e-3 relative per operation,
    # a few times that through the network. (The loss moves more than the entropy: the old
    # log-probs come from a forward over the whole batch, the new ones over a mini-batch, and
    # in bfloat16 another padded shape rounds differently, so the ratio is 1 ± about 1e-2.)
    assert m16[M.ENTROPY_MEAN] == pytest.approx(m32[M.ENTROPY_MEAN], rel=2e-2)
    assert m16[M.POLICY_LOSS] == pytest.approx(m32[M.POLICY_LOSS], rel=5e-2)
    assert math.isfinite(m16[M.POLICY_LOSS]) and abs(m32[M.POLICY_LOSS]) > 1e-3
    assert m16[M.GRAD_NORM] == pytest.approx(m32[M.GRAD_NORM], rel=5e-2)

    # The bfloat16 update points where the float32 one does.
    d32 = torch.cat([(fp32.model.state_dict()[k] - v).flatten() for k, v in start.items()])
    d16 = torch.cat([(after[k] - v).flatten() for k, v in start16.items()])
    assert float(torch.nn.functional.cosine_similarity(d16, d32, dim=0)) > 0.9

    # Log-probs and entropy leave the bfloat16 forward as float32.
    two = [Seq(0, [5, 6, 7], [8, 9, 1], False, 1.0), Seq(0, [5, 6], [9, 1], False, -1.0)]
    lp, ent = bf16.updater.fwd(pack(two, 0, "cpu"))
    assert lp.dtype == ent.dtype == torch.float32


def test_a_bf16_run_checkpoints_float32_masters_that_all_moved(tmp_path: Path) -> None:
    # The measurement: `dapo train --arm grpo --steps 2 --set model.dtype=bfloat16
    # --set optim.lr=1e-6 --set optim.warmup_updates=0`, weights of step 1 against step 2
    # (0.3% moved when the parameters were bfloat16).
    cfg = small(
        "grpo",
        **{**PAPER_LR, "model.dtype": "bfloat16", "run.steps": 2, "run.checkpoint_every": 1},
    )
    train(cfg, sink=ListSink(), out_dir=tmp_path)
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "step_2"
    one = load_file(str(tmp_path / "checkpoints" / "step_1" / "model" / "model.safetensors"))
    two = load_file(str(ckpt / "model" / "model.safetensors"))
    assert {v.dtype for v in two.values()} == {torch.float32}  # the masters, not a cast
    assert moved_fraction(one, two) > 0.99
