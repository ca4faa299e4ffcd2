"""The losses and token filters TRL 1.16 has and verl 0.9.1 lacks, against TRL's own code:
`luspo`, `vespo` (and `sapo`, `dapo` beside them), `top_entropy_quantile` (the 80/20 rule's
filter) and `off_policy_mask_threshold` (DeepSeek-V3.2's off-policy sequence mask).

TRL computes these inside `GRPOTrainer._compute_loss`, not in functions of their own. The method
is taken out of .venv-verl's trl/trainer/grpo_trainer.py the way conftest.py takes verl's
functions (syntax tree, decorators but torch.no_grad dropped; trl's package is never imported: it pulls in
accelerate, datasets and transformers' Trainer), with the three helpers it calls, and run on a
stand-in trainer: one process, no gradient accumulation, and a forward pass that returns given
log-probs and entropies. The loss, its gradient w.r.t. the log-probs and the masks it applied are
compared with ours over seeded random batches (ragged masks, all-masked rows, single-token
responses, rollout-correction weights or none).

Skips when TRL 1.16 is not in .venv-verl (`pip install --no-deps trl==1.16.0` there).
"""

from __future__ import annotations

import ast
import math
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from dapo_core.algo.losses import LossParams, policy_loss
from dapo_core.algo.token_filters import high_entropy_mask, off_policy_sequence_mask

pytestmark = pytest.mark.reference

TRL_VERSION = "1.16.0"
F64 = torch.float64
CASES = 120
METHODS = ("_compute_loss", "get_high_entropy_mask", "get_off_policy_mask", "get_gamma_weights")


def _methods(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """GRPOTrainer's named methods as plain functions, `self` kept; decorators dropped but
    `torch.no_grad()`, which is part of the math (VESPO's weight carries no gradient)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GRPOTrainer"]
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in found} == set(names), f"{path} lacks some of {names}"
    for node in found:
        node.decorator_list = [d for d in node.decorator_list if "no_grad" in ast.unparse(d)]
    namespace: dict[str, Any] = {
        "torch": torch,
        "math": math,
        # TRL's utils.nanmin / nanmax, used only for its logged metrics.
        "nanmin": lambda x: torch.min(x[~torch.isnan(x)]) if (~torch.isnan(x)).any() else x[0],
        "nanmax": lambda x: torch.max(x[~torch.isnan(x)]) if (~torch.isnan(x)).any() else x[0],
    }
    code = compile(ast.Module(body=found, type_ignores=[]), str(path), "exec")
    exec(code, namespace)
    return {name: namespace[name] for name in names}


@pytest.fixture(scope="session")
def trl(verl_site: Path) -> dict[str, Any]:
    dist = list(verl_site.glob("trl-*.dist-info"))
    source = verl_site / "trl" / "trainer" / "grpo_trainer.py"
    if not source.is_file() or [d.name for d in dist] != [f"trl-{TRL_VERSION}.dist-info"]:
        pytest.skip(
            f"TRL {TRL_VERSION} is not in .venv-verl: pip install --no-deps trl=={TRL_VERSION}"
        )
    return _methods(source, METHODS)


class _Accelerator:
    """One process: gathering and reducing change nothing."""

    num_processes = 1

    def pad_across_processes(
        self, x: torch.Tensor, dim: int = 0, pad_index: float = 0
    ) -> torch.Tensor:
        return x

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def reduce(self, x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return x


def _trainer(trl: dict[str, Any], loss_type: str, **args: Any) -> Any:
    """A stand-in GRPOTrainer whose forward returns `self.forward`'s log-probs and entropies."""
    t = types.SimpleNamespace()
    t.loss_type = loss_type
    t.importance_sampling_level = "sequence" if loss_type == "luspo" else "token"
    t.epsilon_low, t.epsilon_high = args.pop("eps")
    t.top_entropy_quantile = args.pop("top_entropy_quantile", 1.0)
    t.off_policy_mask_threshold = args.pop("off_policy_mask_threshold", None)
    t.use_vllm = t.vllm_importance_sampling_correction = args.pop("is_correction", False)
    t.beta = 0.0
    t.aux_loss_enabled = t._entropy_bonus_enabled = False
    t.current_gradient_accumulation_steps = 1
    t.max_completion_length = None
    t.model = types.SimpleNamespace(training=True)
    t.accelerator = _Accelerator()
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t.args = types.SimpleNamespace(
        delta=None,
        steps_per_generation=1,
        sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05,
        vespo_k_pos=args.pop("vespo_k_pos", 2.0),
        vespo_lambda_pos=args.pop("vespo_lambda_pos", 3.0),
        vespo_k_neg=args.pop("vespo_k_neg", 3.0),
        vespo_lambda_neg=args.pop("vespo_lambda_neg", 2.0),
        use_bias_correction_kl=True,
    )
    assert not args, args
    t.get_high_entropy_mask = types.MethodType(trl["get_high_entropy_mask"], t)
    t.get_off_policy_mask = trl["get_off_policy_mask"]
    t.get_gamma_weights = trl["get_gamma_weights"]
    t._get_per_token_logps_and_entropies = lambda *a, **k: (*t.forward, None)
    return t


def _batch(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, 7, (1,), generator=g))
    T = 1 if seed % 7 == 0 else int(torch.randint(1, 13, (1,), generator=g))
    lp = -3.0 * torch.rand(B, T, generator=g, dtype=F64)
    # TRL does not clamp its ratios; kept where ours do not clamp either (|log s| ≤ 10).
    spread = [0.05, 0.3, 1.0][seed % 3]
    old = (lp + spread * torch.randn(B, T, generator=g, dtype=F64)).clamp(max=-1e-4)
    sampler = (old + 0.3 * torch.randn(B, T, generator=g, dtype=F64)).clamp(max=-1e-4)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = max(int(lengths[0]), 1)
    if B > 1 and seed % 5 == 0:
        lengths[-1] = 0  # an all-masked row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    adv = torch.randn(B, generator=g, dtype=F64)
    adv[torch.rand(B, generator=g) < 0.2] = 0.0
    # float32, as a model computes it (TRL takes its quantile in float32).
    entropy = 2.0 * torch.rand(B, T, generator=g)
    entropy[:, 0] = entropy[0, 0]  # ties at the quantile
    weights = (
        2.0 * torch.rand(B, T, generator=g, dtype=F64) * mask + (1 - mask) if seed % 2 else None
    )
    return {
        "lp": lp,
        "old": old,
        "sampler": sampler,
        "mask": mask,
        "adv": adv,
        "ent": entropy,
        "w": weights,
    }


def _trl_loss(
    trl: dict[str, Any], b: dict[str, Any], loss_type: str, **args: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    t = _trainer(trl, loss_type, is_correction=b["w"] is not None, **args)
    lp = b["lp"].clone().requires_grad_(True)
    t.forward = (lp, b["ent"])
    B, T = lp.shape
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": b["mask"],
        "advantages": b["adv"],
        "old_per_token_logps": b["old"],
        "sampling_per_token_logps": b["sampler"],
        "num_items_in_batch": b["mask"].sum(),
    }
    if b["w"] is not None:
        inputs["importance_sampling_ratio"] = b["w"]
    loss = trl["_compute_loss"](t, None, inputs)
    loss.backward()
    assert lp.grad is not None
    return loss.detach(), lp.grad


def _our_loss(
    b: dict[str, Any],
    mode: str,
    agg: str,
    eps: tuple[float, float],
    *,
    quantile: float = 1.0,
    threshold: float | None = None,
    params: LossParams | None = None,
    num_seqs: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    lp = b["lp"].clone().requires_grad_(True)
    keep = b["mask"].bool()
    if quantile < 1.0:
        keep = keep & high_entropy_mask(b["ent"], b["mask"], top_quantile=quantile)
    if threshold is not None:
        seqs = off_policy_sequence_mask(b["adv"], lp, b["sampler"], b["mask"], threshold=threshold)
        keep = keep & seqs[:, None]
    weights = keep.to(F64) * (b["w"] if b["w"] is not None else 1.0)
    loss, _ = policy_loss(
        lp,
        b["old"],
        b["adv"],
        b["mask"],
        clip_low=eps[0],
        clip_high=eps[1],
        agg=agg,
        num_seqs=num_seqs,
        loss_mode=mode,
        token_weights=weights,
        params=params,
    )
    loss.backward()
    assert lp.grad is not None
    return loss.detach(), lp.grad


def _close(
    ours: tuple[torch.Tensor, torch.Tensor], theirs: tuple[torch.Tensor, torch.Tensor], where: str
) -> None:
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=1e-9, msg=where)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-6, atol=1e-9, msg=where)


EPS = [(0.2, 0.28), (0.2, 0.2), (0.1, 0.4)]


def test_luspo_equals_trls(trl: dict[str, Any]) -> None:
    # TRL: GSPO's sequence ratio, (per_token_loss · mask).sum(−1).mean() over every row; ours
    # luspo under "seq-mean-token-mean" with num_seqs = B.
    for seed in range(CASES):
        b, eps = _batch(seed), EPS[seed % 3]
        theirs = _trl_loss(trl, b, "luspo", eps=eps)
        ours = _our_loss(b, "luspo", "seq-mean-token-mean", eps, num_seqs=b["lp"].shape[0])
        _close(ours, theirs, f"seed {seed}")


@pytest.mark.parametrize(
    "knobs",
    [
        {},  # TRL's defaults: k 2 / 3, λ 3 / 2
        {"vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5, "vespo_k_neg": 4.0, "vespo_lambda_neg": 5.0},
    ],
)
def test_vespo_equals_trls(trl: dict[str, Any], knobs: dict[str, float]) -> None:
    # TRL normalises VESPO by the token count (its "dapo" normaliser), rollout-correction
    # weights folded into the sequence ratio.
    params = LossParams(**knobs)
    for seed in range(CASES):
        b = _batch(seed)
        theirs = _trl_loss(trl, b, "vespo", eps=(0.2, 0.28), **knobs)
        ours = _our_loss(b, "vespo", "token-mean", (0.2, 0.28), params=params)
        _close(ours, theirs, f"seed {seed}")


def test_sapo_equals_trls(trl: dict[str, Any]) -> None:
    # TRL's sequence mean runs over every row, all-masked ones too: num_seqs = B. Its
    # torch.where over two Python floats makes the temperatures float32: 1.05 is 1.0499999523.
    tau_neg = float(torch.tensor(1.05, dtype=torch.float32))
    for seed in range(CASES):
        b = _batch(seed)
        theirs = _trl_loss(trl, b, "sapo", eps=(0.2, 0.28))
        B = b["lp"].shape[0]
        params = LossParams(tau_pos=1.0, tau_neg=tau_neg)
        ours = _our_loss(b, "sapo", "seq-mean-token-mean", (0.2, 0.28), num_seqs=B, params=params)
        _close(ours, theirs, f"seed {seed}")


@pytest.mark.parametrize("quantile", [0.0, 0.2, 0.5, 0.999])
def test_top_entropy_quantile_equals_trls(trl: dict[str, Any], quantile: float) -> None:
    # DAPO's loss (vanilla, token-mean) with the 80/20 filter: the dropped tokens weigh 0 and
    # stay in the normaliser, as in TRL.
    dropped = 0
    for seed in range(CASES):
        b, eps = _batch(seed), EPS[seed % 3]
        theirs = _trl_loss(trl, b, "dapo", eps=eps, top_entropy_quantile=quantile)
        ours = _our_loss(b, "vanilla", "token-mean", eps, quantile=quantile)
        _close(ours, theirs, f"ρ {quantile}, seed {seed}")
        kept = high_entropy_mask(b["ent"], b["mask"], top_quantile=quantile)
        dropped += int(b["mask"].sum()) - int(kept.sum())
    assert dropped > 0


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.3])
def test_off_policy_mask_equals_trls(trl: dict[str, Any], threshold: float) -> None:
    masked = 0
    for seed in range(CASES):
        b, eps = _batch(seed), EPS[seed % 3]
        theirs = _trl_loss(trl, b, "dapo", eps=eps, off_policy_mask_threshold=threshold)
        ours = _our_loss(b, "vanilla", "token-mean", eps, threshold=threshold)
        _close(ours, theirs, f"δ {threshold}, seed {seed}")
        keep = off_policy_sequence_mask(
            b["adv"], b["lp"], b["sampler"], b["mask"], threshold=threshold
        )
        masked += int((~keep).sum())
    assert masked > 0


def test_the_filters_equal_trls_own_functions(trl: dict[str, Any]) -> None:
    t = _trainer(trl, "dapo", eps=(0.2, 0.2))
    for seed in range(CASES):
        b = _batch(seed)
        for rho in (0.0, 0.2, 1.0):
            theirs = t.get_high_entropy_mask(b["ent"], b["mask"], 1 - rho)
            assert torch.equal(high_entropy_mask(b["ent"], b["mask"], top_quantile=rho), theirs)
        theirs = trl["get_off_policy_mask"](
            b["adv"][:, None], b["lp"], b["sampler"], b["mask"], 0.05
        )
        ours = off_policy_sequence_mask(b["adv"], b["lp"], b["sampler"], b["mask"], threshold=0.05)
        assert torch.equal(ours, theirs[:, 0].bool())
