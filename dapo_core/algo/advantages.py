"""Advantage estimators: how much better each response was than a baseline.

Every estimator is a pure function of one typed record, `AdvantageInputs` (a batch of P prompts,
G responses each: the rewards `[P, G]` plus whatever else the estimator reads), found by name
in `ADVANTAGE_ESTIMATORS` (`algo.adv_estimator`; verl 0.9.1's names). Most return one scalar per
response, `[P, G]`, shared by all of its tokens; the per-token ones return `[P, G, T]` (T the
longest response, 0 past each response's end). R_i is response i's scalar reward (in the trainer:
correctness + the overlong penalty), L_i its length in tokens, g(i) its group.

Group baselines (scale_by_std and eps as GRPO's, unless said otherwise):
  * ``grpo`` (DAPO, arXiv 2503.14476, Eq. 9):  Â_i = (R_i − mean_g R) / (std_g R + ε);
    `scale_by_std=False` is Dr.GRPO's R_i − mean_g R (Liu et al. 2025, arXiv 2503.20783).
  * ``rloo`` (Ahmadian et al. 2024, arXiv 2402.14740):  Â_i = R_i − mean of the other G − 1.
  * ``grpo_batch_std`` (Lite PPO, arXiv 2508.08221):  (R_i − mean_g R) / (std of the batch + ε).
  * ``opo`` (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv 2505.23585):
    a length-weighted group mean, b = Σ_j L_j R_j / Σ_j L_j, the variance-minimising baseline
    when the gradient's norm grows with length;  Â_i = R_i − b.  No std.
  * ``grpo_passk`` (pass@k training: verl cites Tang et al. 2025, arXiv 2503.19595; see also
    Chen et al. 2025, "Pass@k Training", arXiv 2508.10751): only each group's best response
    learns, by its margin over the runner-up:  Â_best = (R_max − R_second) / (std_g R + ε),
    every other Â_i = 0.
  * ``gpg`` (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for
    Model Reasoning", arXiv 2504.02546):  Â_i = α (R_i − mean_g R) / F_norm with F_norm = 1 and
    α = B / #{j : R_j ≠ 0} over the whole batch of B responses, verl 0.9.1's reading of the
    paper's batch rescaling.  scale_by_std and eps are unused.

Batch baselines, then whitening over every response token of the batch (verl's masked_whiten:
mean and unbiased variance over tokens, so a response counts L_i times; ÷ sqrt(var + 1e-8)):
  * ``reinforce_plus_plus`` (Hu 2025, "REINFORCE++", arXiv 2501.03262): no baseline but the
    batch's; the return of token t is γ^(L_i−1−t) R_i (the outcome reward sits on the last
    token), whitened over the batch's tokens. Per-token; with γ = 1 (verl's default) every token
    of a response holds the same value.
  * ``reinforce_plus_plus_baseline`` (the same paper's "REINFORCE++-baseline"): R_i − mean_g R,
    then whitened over the batch's tokens (so a constant group gets −mean/std, not 0).
  * ``gdpo`` (GDPO, arXiv 2601.05242): several reward components R^k, each normalised within
    its group by GRPO, then Σ_k w_k GRPO(R^k), whitened over the batch's tokens; one dominant
    component no longer drowns the others. The trainer's components are the correctness score
    and the overlong penalty; without components GDPO is whitened GRPO.

A baseline from another rollout:
  * ``remax`` (Li et al. 2023, "ReMax", arXiv 2310.10505):  Â_i = R_i − R(greedy response to
    the same prompt); one greedy rollout per prompt (`baseline_rewards`), no normalisation.

Per-token baselines from the policy's own statistics (verl 0.9.1's optimal token baseline):
  * ``optimal_token_baseline``: for every position t a group baseline
        B_t = Σ_j G_{j,t} W_{j,t} / (Σ_j W_{j,t} + 1e-8),   Â_{i,t} = G_{i,t} − B_t,
    G_{i,t} = R_i the return, W_{i,t} = Σ_{s≤t} (1 − 2 π(y_s) + Σ_v π(v)²) the accumulated
    squared score norm of the path (×ρ̄² with rollout-IS weights). The longest response's tail
    past the runner-up's length keeps B_t = 0 (nothing to compare it with).
  * ``tir_optimal_token_baseline``: the same over each response's own tokens compacted (for
    tool-interleaved turns); on one-turn responses it differs only in leaving empty responses
    out of the group.
  The trainer does not run these: they need Σ_v π(v|s_t)² of every response token from the
  old-policy pass (config: ADV_ESTIMATORS_WITHOUT_TRAINER).

Conventions, so that no NaN and no rounding noise leaves `advantages`, for every estimator:
  * std is unbiased (Bessel), as torch.std and verl compute it;
  * for a group-relative estimator (R_i minus a statistic of its own group: grpo, rloo,
    grpo_batch_std, opo, grpo_passk, gpg) a constant group gets exactly 0 and a group of one
    (G = 1) gets 0 (verl gives a lone response R_i / (1 + ε) there);
  * whitening a batch with at most one token, or whose values are all equal, gives 0;
  * responses of length 0 get 0.
The batch is what the caller passes: in the trainer, the groups kept by dynamic sampling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

WHITEN_EPS = 1e-8
"""verl's masked_whiten adds it to the variance (and masked_mean to the token count)."""
OTB_EPS = 1e-8
"""verl's optimal token baseline adds it to the denominator Σ_j W_{j,t}."""


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may read, for P prompts × G responses (group by group).

    Only `rewards` is always needed; `Estimator.needs` names the rest an estimator reads."""

    rewards: Tensor
    """`[P, G]` one scalar reward per response (floating)."""
    eps: float = 1e-6
    """ε added to a std."""
    scale_by_std: bool = True
    """False skips the division by the std where an estimator has one (Dr.GRPO)."""
    lengths: Tensor | None = None
    """`[P, G]` response lengths in tokens (OPO's weights, the whitening's token counts)."""
    baseline_rewards: Tensor | None = None
    """`[P]` the reward of each prompt's greedy response (ReMax)."""
    components: Tensor | None = None
    """`[P, G, K]` reward components normalised one by one (GDPO); None: the reward alone."""
    component_weights: tuple[float, ...] | None = None
    """K weights of the components (GDPO); None: all 1."""
    gamma: float = 1.0
    """Discount of the per-token return (REINFORCE++)."""
    old_logprobs: Tensor | None = None
    """`[P, G, T]` log π_old of each response token (optimal token baseline)."""
    sum_pi_squared: Tensor | None = None
    """`[P, G, T]` Σ_v π_old(v | s_t)² at each response token (optimal token baseline)."""
    is_weights: Tensor | None = None
    """`[P, G, T]` rollout-IS weights ρ̄ (optimal token baseline; None: no correction)."""

    @property
    def width(self) -> int:
        """T of the per-token outputs: the token tensors' width, else the longest response."""
        if self.old_logprobs is not None:
            return int(self.old_logprobs.shape[-1])
        assert self.lengths is not None
        return int(self.lengths.max()) if self.lengths.numel() else 0

    def token_mask(self) -> Tensor:
        """`[P, G, T]` float: 1 on each response's tokens (right-padded), 0 past its end."""
        assert self.lengths is not None
        t = torch.arange(self.width, device=self.rewards.device)
        return (t < self.lengths[..., None]).to(self.rewards.dtype)


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: the function and what it needs."""

    fn: Callable[[AdvantageInputs], Tensor]
    needs: tuple[str, ...] = ()
    """AdvantageInputs fields beyond the rewards it reads (must not be None)."""
    per_token: bool = False
    """Returns `[P, G, T]` instead of `[P, G]`."""
    group_relative: bool = True
    """R_i minus a statistic of its own group: a constant group and a group of one get 0."""


# --- group baselines -------------------------------------------------------------------------
def grpo_advantages(x: AdvantageInputs) -> Tensor:
    """GRPO (DAPO Eq. 9): (R − group mean) / (group std + ε), std unbiased; `[P, G]` → `[P, G]`."""
    r = x.rewards
    adv = r - r.mean(dim=1, keepdim=True)  # [P, G]
    if x.scale_by_std:
        adv = adv / (r.std(dim=1, keepdim=True, correction=1) + x.eps)
    return adv


def rloo_advantages(x: AdvantageInputs) -> Tensor:
    """RLOO (arXiv 2402.14740): R_i − mean of the other G − 1 rewards; `[P, G]` → `[P, G]`.

    Computed as (G·R_i − Σ_j R_j) / (G − 1): one subtraction of the sum, no per-element loop.
    """
    r, g = x.rewards, x.rewards.shape[1]
    return (g * r - r.sum(dim=1, keepdim=True)) / (g - 1)


def grpo_batch_std_advantages(x: AdvantageInputs) -> Tensor:
    """Lite PPO (arXiv 2508.08221): (R − group mean) / (std of every reward in the batch + ε),
    std unbiased; `[P, G]` → `[P, G]`."""
    r = x.rewards
    adv = r - r.mean(dim=1, keepdim=True)  # [P, G]
    if x.scale_by_std:
        adv = adv / (r.std(correction=1) + x.eps)  # one scalar for the whole batch
    return adv


def opo_advantages(x: AdvantageInputs) -> Tensor:
    """OPO (arXiv 2505.23585): R_i − Σ_j L_j R_j / Σ_j L_j (the length-weighted group mean);
    rewards, lengths `[P, G]` → `[P, G]`. A group whose responses are all empty falls back to
    the plain mean (its weights are all 0)."""
    r = x.rewards
    assert x.lengths is not None
    w = x.lengths.to(r.dtype)  # [P, G]
    total = w.sum(dim=1, keepdim=True)  # [P, 1]
    weighted = (w * r).sum(dim=1, keepdim=True) / total.clamp(min=1)
    baseline = torch.where(total > 0, weighted, r.mean(dim=1, keepdim=True))
    return r - baseline


def grpo_passk_advantages(x: AdvantageInputs) -> Tensor:
    """Pass@k (verl: arXiv 2503.19595; arXiv 2508.10751): the best response of each group gets
    (R_max − R_second) / (group std + ε) (no division with scale_by_std=False), the others 0;
    `[P, G]` → `[P, G]`. Ties at the top give a margin of 0, whichever response holds it."""
    r = x.rewards
    top, idx = torch.topk(r, 2, dim=1)  # [P, 2]
    margin = top[:, 0] - top[:, 1]  # [P]
    if x.scale_by_std:
        margin = margin / (r.std(dim=1, correction=1) + x.eps)
    return torch.zeros_like(r).scatter(1, idx[:, :1], margin[:, None])


def gpg_advantages(x: AdvantageInputs) -> Tensor:
    """GPG (arXiv 2504.02546): α (R_i − group mean) / F_norm, F_norm = 1, α = B / #{R_j ≠ 0}
    over the batch's B responses (at least 1 in the count); `[P, G]` → `[P, G]`."""
    r = x.rewards
    alpha = r.numel() / max(int(torch.count_nonzero(r)), 1)
    return alpha * (r - r.mean(dim=1, keepdim=True))


# --- batch baselines, whitened over the batch's tokens ------------------------------------------
def masked_whiten(values: Tensor, counts: Tensor) -> Tensor:
    """verl's masked_whiten over tokens: (v − mean) / sqrt(var + 1e-8), mean and unbiased
    variance over the entries with weight `counts` (a 0/1 token mask, or a `[P, G]` length per
    value that stands for its L_i tokens). Returns 0 where counts is 0, and everywhere when the
    batch holds at most one token or one value (verl raises on a single token)."""
    c = counts.to(values.dtype)
    n = c.sum()
    kept = c > 0
    if float(n) <= 1 or bool((values[kept] == values[kept].flatten()[0]).all()):
        return torch.zeros_like(values)
    mean = (values * c).sum() / (n + WHITEN_EPS)
    var = ((values - mean) ** 2 * c).sum() / (n + WHITEN_EPS) * (n / (n - 1))
    out = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    return torch.where(kept, out, torch.zeros_like(out))


def _centred(r: Tensor) -> Tensor:
    """R − group mean with a constant group exactly 0 (a group of one included)."""
    out = r - r.mean(dim=1, keepdim=True)
    return out.masked_fill((r == r[:, :1]).all(dim=1, keepdim=True), 0.0)


def reinforce_plus_plus_advantages(x: AdvantageInputs) -> Tensor:
    """REINFORCE++ (arXiv 2501.03262): returns γ^(L_i−1−t) R_i on each response token, whitened
    over all the batch's tokens; rewards, lengths `[P, G]` → `[P, G, T]`."""
    assert x.lengths is not None
    mask = x.token_mask()  # [P, G, T]
    t = torch.arange(mask.shape[-1], device=mask.device, dtype=x.rewards.dtype)
    steps_left = (x.lengths[..., None].to(t.dtype) - 1 - t).clamp(min=0)  # [P, G, T]
    returns = x.rewards[..., None] * torch.pow(torch.as_tensor(x.gamma, dtype=t.dtype), steps_left)
    return masked_whiten(returns * mask, mask)


def reinforce_plus_plus_baseline_advantages(x: AdvantageInputs) -> Tensor:
    """REINFORCE++-baseline (arXiv 2501.03262): R_i − group mean, whitened over the batch's
    tokens (each response counts L_i times); rewards, lengths `[P, G]` → `[P, G]`."""
    assert x.lengths is not None
    return masked_whiten(_centred(x.rewards), x.lengths)


def gdpo_advantages(x: AdvantageInputs) -> Tensor:
    """GDPO (arXiv 2601.05242): Σ_k w_k GRPO(R^k), each component normalised within its group
    (ε, scale_by_std as GRPO's; a constant group gives that component 0), then whitened over
    the batch's tokens; components `[P, G, K]` (default: the reward alone), lengths `[P, G]`
    → `[P, G]`."""
    assert x.lengths is not None
    if x.rewards.shape[1] == 1:  # every component of a group of one normalises to 0
        return torch.zeros_like(x.rewards)
    comps = x.components if x.components is not None else x.rewards[..., None]
    k = comps.shape[-1]
    weights = x.component_weights if x.component_weights is not None else (1.0,) * k
    total = torch.zeros_like(x.rewards)
    for j in range(k):
        r = comps[..., j].to(x.rewards.dtype)
        adv = grpo_advantages(dataclasses.replace(x, rewards=r))
        adv = adv.masked_fill((r == r[:, :1]).all(dim=1, keepdim=True), 0.0)
        total = total + weights[j] * adv
    return masked_whiten(total, x.lengths)


# --- a baseline from another rollout --------------------------------------------------------
def remax_advantages(x: AdvantageInputs) -> Tensor:
    """ReMax (arXiv 2310.10505): R_i − R(the prompt's greedy response); rewards `[P, G]`,
    baseline_rewards `[P]` → `[P, G]`."""
    assert x.baseline_rewards is not None
    return x.rewards - x.baseline_rewards.to(x.rewards.dtype)[:, None]


# --- per-token baselines from the policy's statistics ---------------------------------------
def _optimal_token_baseline(x: AdvantageInputs, *, drop_empty: bool) -> Tensor:
    """B_t = Σ_j R_j W_{j,t} / (Σ_j W_{j,t} + 1e-8) over the group at each position t,
    W_{j,t} = Σ_{s≤t} (1 − 2 π_old(y_s) + Σ_v π_old(v)²) · ρ̄_s²; Â_{i,t} = R_i − B_t on each
    response token `[P, G, T]`. A group of one response (`drop_empty`: one non-empty one) has
    no baseline; the longest response, when it alone is longest, has none past the runner-up's
    length."""
    assert x.lengths is not None and x.old_logprobs is not None and x.sum_pi_squared is not None
    mask = x.token_mask()  # [P, G, T]
    returns = x.rewards[..., None] * mask  # reward-to-go of an outcome reward: R on every token
    w = 1 - 2 * torch.exp(x.old_logprobs) + x.sum_pi_squared
    if x.is_weights is not None:
        w = w * x.is_weights**2
    cum = (w * mask).cumsum(dim=-1)  # [P, G, T]
    num = (returns * cum * mask).sum(dim=1, keepdim=True)  # [P, 1, T]
    den = (cum * mask).sum(dim=1, keepdim=True) + OTB_EPS
    baseline = (num / den).expand_as(returns).clone()  # [P, G, T]
    lengths = x.lengths.long()
    members = lengths > 0 if drop_empty else torch.ones_like(lengths, dtype=torch.bool)
    n = members.sum(dim=1)  # [P]
    baseline[n <= 1] = 0.0
    # The tail of a uniquely longest response: compare lengths among the group's members.
    ranked = torch.where(members, lengths, torch.full_like(lengths, -1))
    top = ranked.topk(min(2, ranked.shape[1]), dim=1)
    for p in range(ranked.shape[0]):
        if int(n[p]) < 2:
            continue
        longest, runner_up = int(top.values[p, 0]), int(top.values[p, 1])
        if longest > runner_up:
            baseline[p, int(top.indices[p, 0]), runner_up:] = 0.0
    return (returns - baseline) * mask


def optimal_token_baseline_advantages(x: AdvantageInputs) -> Tensor:
    """verl 0.9.1's optimal token baseline (see `_optimal_token_baseline`): rewards, lengths
    `[P, G]`, old_logprobs, sum_pi_squared (is_weights) `[P, G, T]` → `[P, G, T]`."""
    return _optimal_token_baseline(x, drop_empty=False)


def tir_optimal_token_baseline_advantages(x: AdvantageInputs) -> Tensor:
    """verl 0.9.1's tool-interleaved optimal token baseline: the same, over each response's
    own tokens compacted; on one-turn (right-padded) responses that is the same baseline, with
    empty responses left out of their group. Shapes as `optimal_token_baseline_advantages`."""
    return _optimal_token_baseline(x, drop_empty=True)


_OTB_NEEDS = ("lengths", "old_logprobs", "sum_pi_squared")

ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator(grpo_advantages),
    "rloo": Estimator(rloo_advantages),
    "grpo_batch_std": Estimator(grpo_batch_std_advantages),
    "reinforce_plus_plus": Estimator(
        reinforce_plus_plus_advantages, ("lengths",), per_token=True, group_relative=False
    ),
    "reinforce_plus_plus_baseline": Estimator(
        reinforce_plus_plus_baseline_advantages, ("lengths",), group_relative=False
    ),
    "remax": Estimator(remax_advantages, ("baseline_rewards",), group_relative=False),
    "opo": Estimator(opo_advantages, ("lengths",)),
    "grpo_passk": Estimator(grpo_passk_advantages),
    "gpg": Estimator(gpg_advantages),
    "optimal_token_baseline": Estimator(
        optimal_token_baseline_advantages, _OTB_NEEDS, per_token=True, group_relative=False
    ),
    "tir_optimal_token_baseline": Estimator(
        tir_optimal_token_baseline_advantages, _OTB_NEEDS, per_token=True, group_relative=False
    ),
    "gdpo": Estimator(gdpo_advantages, ("lengths",), group_relative=False),
}

_WHAT = {
    "lengths": "[P, G] response lengths in tokens",
    "baseline_rewards": "[P] the reward of each prompt's greedy response (ReMax's baseline)",
    "old_logprobs": "[P, G, T] log π_old of each response token",
    "sum_pi_squared": "[P, G, T] Σ_v π_old(v|s_t)² at each response token",
}


def get_estimator(name: str) -> Estimator:
    """The registered estimator `name`; ValueError naming the choices otherwise."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"estimator={name!r}: use one of {', '.join(ADVANTAGE_ESTIMATORS)}"
        ) from None


def _check_inputs(x: AdvantageInputs, name: str, spec: Estimator) -> None:
    if x.rewards.dim() != 2:
        raise ValueError(f"rewards has shape {tuple(x.rewards.shape)}: pass [P, G]")
    P, G = x.rewards.shape
    for field in spec.needs:
        if getattr(x, field) is None:
            raise ValueError(f"estimator {name!r} needs {field}: {_WHAT[field]}")
    shapes: dict[str, tuple[int | str, ...]] = {
        "lengths": (P, G),
        "baseline_rewards": (P,),
        "components": (P, G, "K"),
        "old_logprobs": (P, G, "T"),
        "sum_pi_squared": (P, G, "T"),
        "is_weights": (P, G, "T"),
    }
    for field, want in shapes.items():
        value = getattr(x, field)
        if value is None:
            continue
        got = tuple(value.shape)
        fits = len(got) == len(want) and all(
            isinstance(w, str) or g == w for g, w in zip(got, want, strict=False)
        )
        if not fits:
            shown = ", ".join(str(w) for w in want)
            raise ValueError(f"{field} has shape {got}: expected [{shown}] for rewards [{P}, {G}]")
    if x.components is not None:
        k = x.components.shape[-1]
        if x.component_weights is not None and len(x.component_weights) != k:
            raise ValueError(
                f"component_weights has {len(x.component_weights)} entries for {k} components"
            )
    if x.lengths is not None and bool((x.lengths < 0).any()):
        raise ValueError("lengths must be >= 0")
    longest = int(x.lengths.max()) if x.lengths is not None and x.lengths.numel() else 0
    if x.old_logprobs is not None and longest > x.old_logprobs.shape[-1]:
        raise ValueError("a length exceeds the width T of the per-token tensors")
    if not 0 < x.gamma <= 1:
        raise ValueError(f"gamma={x.gamma}: the discount must be in (0, 1]")


def advantages(x: AdvantageInputs, estimator: str = "grpo") -> Tensor:
    """Advantages by the named estimator: `[P, G]`, or `[P, G, T]` for a per-token one
    (`ADVANTAGE_ESTIMATORS[estimator].per_token`), in the rewards' floating dtype (float32 for
    integer rewards). See the module docstring for each formula and the conventions."""
    spec = get_estimator(estimator)
    _check_inputs(x, estimator, spec)
    r = x.rewards if x.rewards.is_floating_point() else x.rewards.float()
    x = dataclasses.replace(x, rewards=r)
    P, G = r.shape
    empty = P * G == 0 or (spec.group_relative and G == 1)
    if empty:
        shape = (P, G, x.width if P * G else 0) if spec.per_token else (P, G)
        return torch.zeros(shape, dtype=r.dtype, device=r.device)
    adv = spec.fn(x)
    if spec.group_relative:  # exactly 0, not ±1e-11 of float noise, for a constant group
        constant = (r == r[:, :1]).all(dim=1, keepdim=True)  # [P, 1]
        adv = adv.masked_fill(constant[..., None] if spec.per_token else constant, 0.0)
    if x.lengths is not None:  # an empty response has no token to carry an advantage
        empty_rows = x.lengths == 0
        adv = adv.masked_fill(empty_rows[..., None] if spec.per_token else empty_rows, 0.0)
    return adv


def group_advantages(
    rewards: Tensor,
    group_size: int,
    eps: float = 1e-6,
    scale_by_std: bool = True,
    estimator: str = "grpo",
    *,
    lengths: Tensor | None = None,
    baseline_rewards: Tensor | None = None,
    components: Tensor | None = None,
    component_weights: tuple[float, ...] | None = None,
) -> Tensor:
    """One advantage per response, relative to its group, by the named estimator.

    Args:
        rewards: `[P*G]` one scalar reward per response, ordered group by group (the G responses
            of prompt 0, then the G of prompt 1, ...).
        group_size: G, responses per prompt.
        eps: added to the std so that a near-constant group does not blow up.
        scale_by_std: False skips the division by the std (Dr.GRPO); the result is then r − mean.
        estimator: a name of ADVANTAGE_ESTIMATORS (see the module docstring).
        lengths: `[P*G]` response lengths in tokens (opo, reinforce_plus_plus(_baseline), gdpo).
        baseline_rewards: `[P]` the reward of each prompt's greedy response (remax).
        components: `[P*G, K]` reward components (gdpo); component_weights: K weights.

    Returns:
        `[P*G]` advantages (floating dtype of `rewards`, float32 for integer input). A per-token
        estimator is accepted when each response's tokens get one value (reinforce_plus_plus with
        γ = 1); the optimal token baselines need `advantages` with per-token statistics.
    """
    spec = get_estimator(estimator)
    if group_size < 1:
        raise ValueError(f"group_size={group_size}: need at least one response per group")
    if rewards.dim() != 1:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)}: pass a flat [P*G] tensor, group by group"
        )
    n = rewards.numel()
    if n % group_size != 0:
        raise ValueError(
            f"{n} rewards do not split into groups of {group_size}: "
            "pass G responses for every prompt, ordered group by group"
        )
    for name, value in (("lengths", lengths), ("components", components)):
        if value is not None and value.shape[0] != n:
            raise ValueError(f"{name} has {value.shape[0]} rows for {n} rewards")
    if any(f in spec.needs for f in ("old_logprobs", "sum_pi_squared")):
        raise ValueError(
            f"estimator {estimator!r} is per-token and needs per-token statistics: call "
            "advantages(AdvantageInputs(...), estimator) instead"
        )

    def grouped(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.reshape(-1, group_size, *t.shape[1:])

    x = AdvantageInputs(
        rewards=rewards.view(-1, group_size),
        eps=eps,
        scale_by_std=scale_by_std,
        lengths=grouped(lengths),
        baseline_rewards=baseline_rewards,
        components=grouped(components),
        component_weights=component_weights,
    )
    adv = advantages(x, estimator)
    if spec.per_token:
        mask = x.token_mask().bool() if n else torch.zeros(adv.shape, dtype=torch.bool)
        first = adv[..., :1] if adv.shape[-1] else torch.zeros_like(adv[..., :1])
        if not bool(((adv == first) | ~mask).all()):
            raise ValueError(
                f"estimator {estimator!r} gives advantages that vary along a response: call "
                "advantages(AdvantageInputs(...), estimator) for them per token"
            )
        adv = first.squeeze(-1)
    return adv.reshape(-1)
