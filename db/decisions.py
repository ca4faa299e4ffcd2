"""What a researcher decides from an ablation table: for each comparison, how sure it is.

Every Δ of the table (each arm against its parent and against the baseline, and any pair the
researcher plans, `--compare A:B`) becomes a `Comparison`: the paired Δ with its 95% interval
and exact sign-flip p (db.stats), the minimum detectable effect at the seeds it has and the
seeds it would need for the effect observed and for one the researcher names (db.power), and
the probability of improvement P(A > B) over every pair of their runs (Agarwal et al. 2021,
"Deep RL at the Edge of the Statistical Precipice": the Mann-Whitney U statistic over n·m).
Per arm, the table also carries its interquartile mean from 5 seeds on (the same paper's IQM:
the mean of the middle half of the seeds, robust to one outlying run) and how many of its runs
collapsed (ended at or below their starting model's score) with an exact Clopper-Pearson
interval. One function computes each, for `dapo table`, the dashboard and the Prefect artifact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from db import power, stats
from db.looks import StoredLook

if TYPE_CHECKING:
    import pandas as pd

IQM_FROM = 5  # seeds; below, the middle half of the runs is one or two runs


@dataclass(frozen=True)
class Share:
    """k of n runs, with the exact (Clopper-Pearson) 95% interval of the underlying rate."""

    k: int
    n: int
    low: float = math.nan
    high: float = math.nan


def collapsed(finals: Sequence[float], starts: Sequence[float]) -> Share:
    """How many runs ended at or below the score they started from, of those with a start:
    an RL run that unlearns the task is a failure a mean over seeds hides."""
    pairs = [(f, s) for f, s in zip(finals, starts, strict=True) if not math.isnan(s)]
    n = len(pairs)
    k = sum(1 for f, s in pairs if f <= s)
    if n == 0:
        return Share(0, 0)
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=stats.LEVEL, method="exact")
    return Share(k, n, float(ci.low), float(ci.high))


def iqm(values: Sequence[float]) -> float:
    """The interquartile mean (25% trimmed from each end, scipy.stats.trim_mean) from IQM_FROM
    values on; NaN below."""
    if len(values) < IQM_FROM:
        return math.nan
    from scipy.stats import trim_mean

    return float(trim_mean([float(v) for v in values], 0.25))


def p_improve(a: Sequence[float], b: Sequence[float]) -> float:
    """P(a run of A scores above a run of B), ties counting half, over all len(a)·len(b) pairs
    (rliable's probability of improvement); NaN when either side has no run."""
    if not a or not b:
        return math.nan
    from scipy.stats import mannwhitneyu

    u = mannwhitneyu([float(x) for x in a], [float(y) for y in b]).statistic
    return float(u) / (len(a) * len(b))


@dataclass(frozen=True)
class Comparison:
    """arm − other, paired by seed (fractions: 0.05 is 5 pp).

    kind: "parent", "base" or "planned"; mde: the minimum detectable |Δ| at delta.n seeds
    (inf below the exact test's floor, NaN without a spread); needed: seeds for the observed Δ;
    needed_effect: seeds for `effect`, the effect the researcher named; p_improve: P(arm >
    other) over run pairs."""

    arm: str
    other: str
    kind: str
    delta: stats.Estimate
    mde: float
    needed: int | None
    effect: float | None
    needed_effect: int | None
    p_improve: float
    # An adaptive sweep's stored looks at this comparison (db.looks), oldest first, and whether
    # the sweep may still look again (it is running).
    looks: tuple[StoredLook, ...] = ()
    open: bool = False
    at_decision: stats.Estimate | None = None  # the Δ over the seeds of the deciding look

    @property
    def name(self) -> str:
        return f"{self.arm} − {self.other}"

    def sequential(self) -> str:
        """An adaptive sweep's decision in words: 'decided at n = 10: +5.1 [+1.2, +9.0]',
        'futile at n = 8', 'undecided at n = 16', 'open at n = 8'; '' for a fixed design."""
        if not self.looks:
            return ""
        last = self.looks[-1]
        delta = ""
        if self.at_decision is not None and self.at_decision.n:
            d = self.at_decision
            delta = f": {100 * d.mean:+.1f}" + (
                f" [{100 * d.low:+.1f}, {100 * d.high:+.1f}]" if d.has_interval else ""
            )
        if last.decision == "real":
            return f"decided at n = {last.n}{delta}"
        if last.decision == "futile":
            return f"futile at n = {last.n}{delta}"
        mde = (
            f": MDE {100 * self.mde:.1f} pp"
            if not (math.isnan(self.mde) or math.isinf(self.mde))
            else ""
        )
        if last.decision == "undecided":
            return f"undecided at n = {last.n}{mde}"
        if self.open:
            return f"open at n = {last.n}"
        return f"undecided at n = {last.n} (stopped){mde}"

    def verdict(self) -> str:
        """The decision in a few words: 'real at 5%', 'not shown', or why it cannot be tested
        ('3 seeds: can't reach 5%', as no test over fewer than 6 can); the numbers behind it are the comparison's other columns."""
        d, floor = self.delta, power.exact_floor(1.0 - self.delta.level)
        level = f"{100 * (1.0 - d.level):.0f}%"
        if d.n == 0:
            return "no shared seed"
        if d.n < floor:
            return f"{d.n} seed{'s' if d.n != 1 else ''}: can't reach {level}"
        return f"real at {level}" if d.significant else "not shown"


def compare(
    arm: str,
    other: str,
    kind: str,
    mine: Mapping[int, float],
    theirs: Mapping[int, float],
    *,
    effect: float | None = None,
    looks: Sequence[StoredLook] = (),
    open_: bool = False,
) -> Comparison:
    """One comparison from two arms' final scores by seed (and an adaptive sweep's looks)."""
    delta = stats.paired(mine, theirs)
    at = None
    if looks:
        used = set(looks[-1].seeds)
        at = stats.paired(
            {s: v for s, v in mine.items() if s in used},
            {s: v for s, v in theirs.items() if s in used},
        )
    return Comparison(
        arm=arm,
        other=other,
        kind=kind,
        delta=delta,
        mde=power.mde(delta.sd, delta.n) if delta.n >= 2 else math.nan,
        needed=power.seeds_needed(delta.mean, delta.sd) if delta.n >= 2 else None,
        effect=effect,
        needed_effect=(
            power.seeds_needed(effect, delta.sd) if effect is not None and delta.n >= 2 else None
        ),
        p_improve=p_improve(list(mine.values()), list(theirs.values())),
        looks=tuple(looks),
        open=open_,
        at_decision=at,
    )


def _finals(row: Mapping[str, Any]) -> dict[int, float]:
    return dict(zip(row["seeds"] or [], row["scores"] or [], strict=True))


def parse_pairs(pairs: Sequence[str], arms: Sequence[str]) -> list[tuple[str, str]]:
    """`--compare A:B` values as (A, B); ValueError in one line for a malformed pair or an arm
    the table does not have."""
    out = []
    for text in pairs:
        a, sep, b = text.partition(":")
        a, b = a.strip(), b.strip()
        if not sep or not a or not b or a == b:
            raise ValueError(
                f"--compare {text!r}: write two different arms as A:B (e.g. dapo:grpo)"
            )
        for name in (a, b):
            if name not in arms:
                raise ValueError(
                    f"--compare {text!r}: the table has no arm {name!r} (it has {', '.join(arms)})"
                )
        out.append((a, b))
    return out


def comparisons(
    table: pd.DataFrame,
    *,
    planned: Sequence[tuple[str, str]] = (),
    effect: float | None = None,
    sequential: Mapping[str, Sequence[StoredLook]] | None = None,
    running: bool = False,
) -> list[Comparison]:
    """Every Δ of the ablation table, in ladder order (each arm against its parent, then against
    the baseline where that is another arm), then the planned pairs not already among them.
    `sequential`: an adaptive sweep's stored looks by comparison (db.looks.of_sweep); `running`:
    whether it may look again."""
    rows = {str(r["arm"]): r for r in table.to_dict("records")}
    order = list(rows)
    base = order[0] if order else None
    out: list[Comparison] = []
    seen: set[tuple[str, str]] = set()

    def add(arm: str, other: str, kind: str) -> None:
        if (arm, other) in seen or arm == other:
            return
        seen.add((arm, other))
        taken = (sequential or {}).get(f"{arm}:{other}", ())
        out.append(
            compare(
                arm,
                other,
                kind,
                _finals(rows[arm]),
                _finals(rows[other]),
                effect=effect,
                looks=taken,
                open_=running,
            )
        )

    for arm in order:
        parent = rows[arm]["parent"]
        if isinstance(parent, str) and parent in rows:
            add(arm, parent, "parent")
        if base is not None:
            add(arm, base, "base")
    for arm, other in planned:
        add(arm, other, "planned")
    return out
