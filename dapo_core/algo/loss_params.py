"""The knobs of the registered policy losses beyond the clip range, torch-free: the experiment
config (dapo_core.setup.config.AlgoConfig) inherits them, so a store or a dashboard reading a
config never imports torch, and the defaults and checks exist once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossParams:
    """The knobs of the loss modes beyond the clip range, by verl's (and TRL's) names; each mode
    reads its own. Defaults are verl 0.9.1's (`actor.policy_loss.*`, `actor.tau_*`) and TRL
    1.16's (`vespo_*`)."""

    clip_cov_ratio: float = 2e-4
    """clip_cov: share of the loss tokens to detach (at least one)."""
    clip_cov_lb: float = 1.0
    """clip_cov: a token is a candidate when its covariance term lies in (lb, ub)."""
    clip_cov_ub: float = 5.0
    """clip_cov: upper end of the candidates' covariance band."""
    kl_cov_ratio: float = 2e-4
    """kl_cov: share of the loss tokens (those of highest covariance) given the KL penalty."""
    ppo_kl_coef: float = 0.1
    """kl_cov: coefficient of the |log r| penalty on the selected tokens."""
    tau_pos: float = 1.0
    """sapo: gate temperature where A > 0."""
    tau_neg: float = 1.05
    """sapo: gate temperature where A ≤ 0."""
    dro_beta: float | None = None
    """dro: the quadratic log-ratio penalty β > 0 (verl has no default: required for dro)."""
    vespo_k_pos: float = 2.0
    """vespo: power k of the Gamma weight where A ≥ 0."""
    vespo_lambda_pos: float = 3.0
    """vespo: decay λ of the Gamma weight where A ≥ 0."""
    vespo_k_neg: float = 3.0
    """vespo: power k where A < 0."""
    vespo_lambda_neg: float = 2.0
    """vespo: decay λ where A < 0."""

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError(problems[0])

    def problems(self, prefix: str = "") -> list[str]:
        """What is wrong with these knobs, one line each (empty when nothing is), each knob named
        with `prefix` (the config says `algo.`): the one place they are checked, for a direct
        call here and for the experiment config that carries them."""
        checks = [
            (
                0 < self.clip_cov_ratio <= 1,
                f"{prefix}clip_cov_ratio={self.clip_cov_ratio}: a share of the loss tokens in (0, 1]",
            ),
            (
                0 < self.kl_cov_ratio <= 1,
                f"{prefix}kl_cov_ratio={self.kl_cov_ratio}: a share of the loss tokens in (0, 1]",
            ),
            (
                self.clip_cov_lb < self.clip_cov_ub,
                f"{prefix}clip_cov_lb={self.clip_cov_lb} must be below {prefix}clip_cov_ub="
                f"{self.clip_cov_ub}: the covariance band clip_cov draws its tokens from",
            ),
            (self.ppo_kl_coef >= 0, f"{prefix}ppo_kl_coef={self.ppo_kl_coef} must be >= 0"),
            (
                self.tau_pos > 0 and self.tau_neg > 0,
                f"{prefix}tau_pos={self.tau_pos}, {prefix}tau_neg={self.tau_neg}: SAPO's "
                "temperatures must be > 0",
            ),
            (
                self.dro_beta is None or self.dro_beta > 0,
                f"{prefix}dro_beta={self.dro_beta} must be > 0 (or unset)",
            ),
            (
                self.vespo_k_pos >= 0 and self.vespo_k_neg >= 0,
                f"{prefix}vespo_k_pos={self.vespo_k_pos}, {prefix}vespo_k_neg={self.vespo_k_neg}: "
                "VESPO's powers must be >= 0",
            ),
            (
                self.vespo_lambda_pos > 0 and self.vespo_lambda_neg > 0,
                f"{prefix}vespo_lambda_pos={self.vespo_lambda_pos}, {prefix}vespo_lambda_neg="
                f"{self.vespo_lambda_neg}: VESPO's decays must be > 0",
            ),
        ]
        return [message for ok, message in checks if not ok]
