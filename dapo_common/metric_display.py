"""How each metric reads on a screen: its display name, its unit, the factor from the stored value.

The store keeps what the trainer logs: shares as fractions in [0, 1] (accuracy, clip ratios,
truncation), entropy in nats, lengths in tokens. A researcher reads one unit per kind of number
everywhere, the ablation table's: a share in percent, one decimal. This table says, per metric
name of dapo_common.metric_names, what the dashboard titles an axis with ("training accuracy
(%)"), and by how much a stored value is multiplied for it (100 for a share, 1 otherwise).
docs/units.md lists the same for every tracker a run reports to. Standard library only.

A name the table does not hold reads as itself, with no unit and no factor: a metric a newer
trainer logs is shown raw rather than guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass

from dapo_common import metric_names as M

PERCENT = "%"
NATS = "nats"
TOKENS = "tokens"
SECONDS = "s"
GIB = "GiB"
COUNT = "count"  # a number of things: shown whole, titled without a unit


@dataclass(frozen=True)
class Display:
    """One metric on screen: `name` (an axis or column title), `unit` (after it, in brackets;
    "" or COUNT for none), `scale` (stored value × scale = shown value)."""

    name: str
    unit: str = ""
    scale: float = 1.0

    @property
    def label(self) -> str:
        """'training accuracy (%)'; the bare name for a dimensionless number or a count."""
        return f"{self.name} ({self.unit})" if self.unit not in ("", COUNT) else self.name


def _share(name: str) -> Display:
    return Display(name, PERCENT, 100.0)


DISPLAY: dict[str, Display] = {
    # rewards and accuracy (every response generated at the step, before filtering)
    M.ACC_MEAN: _share("training accuracy"),
    M.REWARD_MEAN: Display("mean reward"),  # the score (±1) plus the overlong penalty
    M.SCORE_MEAN: Display("mean score (±1)"),
    M.OVERLONG_PENALTY_MEAN: Display("mean overlong penalty"),
    # policy
    M.ENTROPY_MEAN: Display("entropy", NATS),
    M.ENTROPY_DECISION: Display("entropy at decision tokens", NATS),
    M.POLICY_LOSS: Display("policy loss"),
    M.KL_LOSS: Display("KL loss"),
    M.APPROX_KL: Display("approx. KL(old ‖ new), k1", NATS),
    M.CLIP_RATIO_HIGH: _share("tokens clipped at 1 + ε_high"),
    M.CLIP_RATIO_LOW: _share("tokens clipped at 1 − ε_low"),
    M.CLIP_RATIO_DUAL: _share("tokens bounded by the dual clip"),
    M.CLIP_RATIO_HIGH_ELIGIBLE: _share("tokens that can reach 1 + ε_high"),
    M.CLIP_RATIO_HIGH_DECISION: _share("decision tokens past 1 + ε_high (A > 0)"),
    # newer loss-variant metrics, by name (their constants are being added to metric_names)
    "clip_ratio/high_natural": _share("eligible tokens past 1 + ε_high, unclipped"),
    "ratio/max": Display("largest token ratio π_θ/π_old"),
    "loss/cov_selected_share": _share("tokens a covariance loss selected"),
    "loss/off_policy_masked_share": _share("tokens the off-policy mask dropped"),
    "loss/entropy_kept_share": _share("tokens the top-entropy filter kept"),
    M.LOSS_LONG_SHARE: _share("loss weight of the longer half"),
    M.LOSS_TRUNCATED_SHARE: _share("loss weight of truncated responses"),
    M.GRAD_NORM: Display("gradient norm"),
    M.LR: Display("learning rate"),
    M.NONFINITE_UPDATES: Display("updates skipped (NaN/inf)", COUNT),
    # sampler vs trainer
    M.MISMATCH_ABS_LOGP: Display("abs. log-prob gap, sampler vs old", NATS),
    M.MISMATCH_KL: Display("KL(sampler ‖ old), k3", NATS),
    M.IS_MASKED_FRAC: _share("tokens capped or masked (correction)"),
    # responses
    M.RESPONSE_LENGTH_MEAN: Display("mean response length", TOKENS),
    M.RESPONSE_LENGTH_MAX: Display("longest response", TOKENS),
    M.RESPONSE_CLIP_RATIO: _share("responses truncated"),
    # dynamic sampling
    M.KEPT_GROUPS: _share("informative groups generated"),
    M.TRAIN_INFORMATIVE: _share("informative groups trained"),
    M.GEN_BATCHES: Display("generation batches", COUNT),
    M.CARRIED_GROUPS: Display("groups carried over", COUNT),
    M.TRAIN_GROUPS: Display("groups trained", COUNT),
    # progress counters
    M.ROLLOUT_STEP: Display("rollout step", COUNT),
    M.GRAD_UPDATES: Display("gradient updates", COUNT),
    M.GEN_BATCHES_TOTAL: Display("generation batches, total", COUNT),
    M.TOKENS_TOTAL: Display("generated tokens", TOKENS),
    # performance
    M.TOKENS_PER_S: Display("rollout throughput", "tokens/s"),
    M.UPDATE_TOKENS_PER_S: Display("update throughput", "tokens/s"),
    M.ROLLOUT_S: Display("rollout time", SECONDS),
    M.REWARD_S: Display("reward time", SECONDS),
    M.OLD_LOGPROB_S: Display("old log-prob time", SECONDS),
    M.UPDATE_S: Display("update time", SECONDS),
    M.STEP_S: Display("step time", SECONDS),
    M.TRAIN_TOKENS_PER_S: Display("trainer throughput", "tokens/s"),
    M.ROLLOUT_IDLE_S: Display("rollout worker idle", SECONDS),
    M.TRAINER_IDLE_S: Display("trainer idle, waiting for rollouts", SECONDS),
    # staleness of the trained samples (policy versions behind; docs/async.md)
    M.STALENESS_MEAN: Display("mean sample staleness", "versions"),
    M.STALENESS_MAX: Display("largest sample staleness", "versions"),
    M.STALE_DROPPED: Display("samples dropped as too stale", COUNT),
    # evaluation (k is the run's: held_out names it)
    M.EVAL_AVG_AT_K: _share("held-out avg@k"),
    M.EVAL_PASS_AT_K: _share("held-out pass@k"),
    M.EVAL_CONS_AT_K: _share("held-out cons@k"),
}


def display(metric: str) -> Display:
    """The metric's Display: DISPLAY's entry, else one made from a family's prefix (peak
    memory per phase, a worker's own timings), else the name itself, unscaled."""
    found = DISPLAY.get(metric)
    if found is not None:
        return found
    if metric.startswith(M.PEAK_MEM_PREFIX):
        return Display(f"peak memory, {metric.removeprefix(M.PEAK_MEM_PREFIX)}", GIB)
    if metric.startswith(M.STALENESS_LAG_PREFIX):
        lag = metric.removeprefix(M.STALENESS_LAG_PREFIX)
        return Display(f"samples {lag} versions behind", COUNT)
    if metric.startswith(M.TIME_PREFIX) and metric.endswith("_s"):
        rest = metric.removeprefix(M.TIME_PREFIX).removesuffix("_s")
        worker, _, phase = rest.rpartition("/")
        return Display(f"{phase.replace('_', ' ')} time" + (f", {worker}" if worker else ""), "s")
    return Display(metric)


def label(metric: str) -> str:
    """An axis title: 'training accuracy (%)', 'entropy (nats)', 'gradient norm'."""
    return display(metric).label


def scale(metric: str) -> float:
    """The factor from the stored value to the shown one (100 for a share)."""
    return display(metric).scale


def unit(metric: str) -> str:
    """The shown unit: '%', 'nats', 'tokens', ...; '' for a dimensionless number or a count."""
    shown = display(metric).unit
    return "" if shown == COUNT else shown


def is_share(metric: str) -> bool:
    """Whether the metric is a share (a fraction stored, a percentage shown: 0 to 100)."""
    return display(metric).unit == PERCENT


def held_out(k: int | None = None, statistic: str = "avg") -> str:
    """The held-out score's axis title: 'held-out avg@4 (%)' ('avg@k' when k is unknown)."""
    at = f"@{int(k)}" if k is not None else "@k"
    return f"held-out {statistic}{at} ({PERCENT})"


def number_format(metric: str) -> str:
    """A d3 format for a shown value: one decimal for a percentage, whole numbers for counts
    and tokens, else three significant digits."""
    shown = display(metric).unit
    if shown == PERCENT:
        return ".1f"
    if shown in (COUNT, TOKENS):
        return ",.0f"
    return ".3~g"


def text(metric: str, value: float | None) -> str:
    """A stored value as shown: '43.4%', '1.23 nats', '512 tokens', '0.00312'; '—' unknown."""
    if value is None or value != value:  # NaN is unequal to itself
        return "—"
    shown = display(metric)
    number = float(value) * shown.scale
    if shown.unit == PERCENT:
        return f"{number:.1f}%"
    body = f"{number:,.0f}" if shown.unit in (COUNT, TOKENS) else f"{number:.3g}"
    return f"{body} {shown.unit}" if shown.unit not in ("", COUNT) else body
