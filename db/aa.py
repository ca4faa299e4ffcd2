"""`dapo aa`: the A/A noise floor of a task, from one arm run on twice as many seeds.

An A/A check compares an arm with itself: the same config on two disjoint sets of seeds. Any
difference it finds is chance alone (data order, sampling, the seed's eval problems), so it
says how large a Δ in the ablation table must be before it means anything on this task and
budget. Nothing new is trained for it: `dapo sweep --arms grpo --seeds 0,1,2,3,4,5` runs the
arm on 2n seeds and `dapo aa` splits them.

Two figures, both over the arm's final held-out scores (the table's score column):
- the table's own test on a fixed split: seeds sorted, the first n against the last n, paired
  in that order (the i-th of each half), with the t-interval over the n differences that the
  table gives a Δ. A star here is a false positive; at 95% it happens once in twenty.
- the floor over every split: for each of the C(2n, n) / 2 ways to halve the seeds (up to 16
  seeds; a fixed random sample of 10,000 splits beyond), the difference of the halves' means;
  the floor is the 95th percentile of |difference| (nearest rank). Chance alone reaches it in
  one split in twenty.

Arms in the table share their seeds, so a Δ to the parent pairs runs with the same data order
and eval problems; the A/A halves share neither, so this floor is, if anything, wider than the
spread chance gives a table Δ: a Δ inside it is not evidence.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from db import stats
from db.errors import NotFound

MIN_SEEDS = 4  # two pairs: the least a t-interval over pairs can be drawn from
ENUMERATE_UP_TO = 16  # C(16, 8) / 2 = 6,435 splits; beyond, a sample
SAMPLED_SPLITS = 10_000
FLOOR_QUANTILE = 0.95


@dataclass(frozen=True)
class AACheck:
    """One arm's A/A figures (scores as fractions, 0.25 = 25%)."""

    sweep_id: int
    arm: str
    evaluation: str  # e.g. "arith-eval avg@4"
    half_a: tuple[int, ...]
    half_b: tuple[int, ...]
    left_out: tuple[int, ...]  # an odd seed out
    mean_a: float
    mean_b: float
    delta: stats.Estimate  # half A − half B, paired in order
    splits: int
    sampled: bool  # a random sample of the splits (more than ENUMERATE_UP_TO seeds)
    floor: float  # 95th percentile of |mean difference| over the splits
    largest: float  # the largest |mean difference| over the splits


def split_differences(scores: Sequence[float], *, rng_seed: int = 0) -> list[float]:
    """mean(A) − mean(B) for each split of `scores` into two halves of equal size, each split
    counted once (A holds the first score). Every split up to ENUMERATE_UP_TO scores, else a
    fixed random sample of SAMPLED_SPLITS."""
    m = len(scores)
    if m < 2 or m % 2:
        raise ValueError(f"splitting needs an even number of scores, got {m}")
    n = m // 2
    total = math.fsum(scores)

    def diff(a: Sequence[int]) -> float:
        sum_a = math.fsum(scores[i] for i in a)
        return sum_a / n - (total - sum_a) / n

    if m <= ENUMERATE_UP_TO:
        return [diff((0, *rest)) for rest in itertools.combinations(range(1, m), n - 1)]
    rng = random.Random(rng_seed)
    return [diff((0, *rng.sample(range(1, m), n - 1))) for _ in range(SAMPLED_SPLITS)]


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The q-quantile by nearest rank: the ceil(q·N)-th smallest value."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def aa_from_scores(
    sweep_id: int, arm: str, evaluation: str, by_seed: Mapping[int, float]
) -> AACheck:
    """The A/A figures of one arm's final scores by seed."""
    seeds = sorted(by_seed)
    if len(seeds) < MIN_SEEDS:
        raise ValueError(
            f"arm {arm!r} of sweep {sweep_id} has {len(seeds)} scored seed(s); an A/A check "
            f"needs at least {MIN_SEEDS} (two halves of two): run it with e.g. --seeds 0,1,2,3,4,5"
        )
    left_out = tuple(seeds[len(seeds) - len(seeds) % 2 :])
    used = seeds[: len(seeds) - len(left_out)]
    n = len(used) // 2
    half_a, half_b = tuple(used[:n]), tuple(used[n:])
    a = [by_seed[s] for s in half_a]
    b = [by_seed[s] for s in half_b]
    # Paired in order, keyed 0..n-1: the table's paired t over n differences.
    delta = stats.paired(dict(enumerate(a)), dict(enumerate(b)))
    diffs = [abs(d) for d in split_differences([by_seed[s] for s in used])]
    return AACheck(
        sweep_id=sweep_id,
        arm=arm,
        evaluation=evaluation,
        half_a=half_a,
        half_b=half_b,
        left_out=left_out,
        mean_a=math.fsum(a) / n,
        mean_b=math.fsum(b) / n,
        delta=delta,
        splits=len(diffs),
        sampled=len(used) > ENUMERATE_UP_TO,
        floor=nearest_rank(diffs, FLOOR_QUANTILE),
        largest=max(diffs),
    )


def aa_check(
    engine: sa.Engine,
    sweep_id: int,
    arm: str | None = None,
    *,
    dataset: str | None = None,
    k: int | None = None,
) -> AACheck:
    """The A/A check of `arm` in the sweep (default: its one arm with enough scored seeds)."""
    from db import ablation

    table = ablation.ablation_table(engine, sweep_id, dataset=dataset, k=k)
    if table.empty:
        raise NotFound(f"sweep {sweep_id} has no arms with evaluations yet")
    rows = {str(r["arm"]): r for r in table.to_dict("records")}
    if arm is None:
        enough = [name for name, r in rows.items() if len(r["seeds"]) >= MIN_SEEDS]
        if len(enough) != 1:
            have = ", ".join(f"{name} ({len(r['seeds'])} seeds)" for name, r in rows.items())
            raise ValueError(
                f"sweep {sweep_id}: name the arm to check with --arm ({have}; at least "
                f"{MIN_SEEDS} scored seeds needed)"
            )
        arm = enough[0]
    if arm not in rows:
        raise NotFound(f"sweep {sweep_id} has no arm {arm!r}: it has {', '.join(rows)}")
    row = rows[arm]
    by_seed = {int(s): float(v) for s, v in zip(row["seeds"], row["scores"], strict=True)}
    evaluation = f"{row['eval_dataset']} avg@{row['eval_k']}"
    return aa_from_scores(sweep_id, arm, evaluation, by_seed)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _points(x: float) -> str:
    return f"{100 * x:+.1f}"


MIN_SPLITS_FOR_FLOOR = math.ceil(1 / (1 - FLOOR_QUANTILE))
"""Below 20 splits the 95th percentile by nearest rank is the largest difference itself: 4
seeds split 3 ways, 6 seeds 10, 8 seeds 35."""


def render(check: AACheck, width: int | None = None) -> str:
    """The A/A check in words, scores and differences in % and percentage points, each line
    wrapped to `width` columns (default: dapo_common.text.terminal_width(), which reads
    $COLUMNS), its continuation indented under it."""
    import textwrap

    from dapo_common.text import terminal_width

    d = check.delta

    def seeds(half: tuple[int, ...]) -> str:
        return " ".join(str(s) for s in half)

    interval = (
        f"[{_points(d.low)}, {_points(d.high)}]" if d.has_interval else "(no interval: one pair)"
    )
    verdict = (
        "starred: a false positive, which chance gives one split in twenty"
        if d.significant
        else "not starred, as chance alone should be nineteen times in twenty"
    )
    lines = [
        f"A/A check of arm {check.arm!r}, sweep {check.sweep_id}, on {check.evaluation}: "
        "the same arm on two disjoint sets of seeds",
        f"  half A (seeds {seeds(check.half_a)}): {_pct(check.mean_a)}",
        f"  half B (seeds {seeds(check.half_b)}): {_pct(check.mean_b)}",
    ]
    if check.left_out:
        lines.append(f"  seed {seeds(check.left_out)} left out (an even number splits in halves)")
    lines += [
        f"  Δ A − B: {_points(d.mean)} points {interval} ({int(100 * d.level)}% t-interval over "
        f"{d.n} pairs, the table's test): {verdict}",
    ]
    over = f"over {'a sample of' if check.sampled else 'all'} {check.splits:,} ways to halve these seeds"
    if check.splits >= MIN_SPLITS_FOR_FLOOR:
        lines.append(
            f"  noise floor: {over} the halves' means differ by up to "
            f"{100 * check.floor:.1f} points in 95% of them (largest {100 * check.largest:.1f})"
        )
    else:  # a 95th percentile of 3 or 10 splits is their largest: say that, not "95%"
        lines.append(
            f"  noise floor: {over} the halves' means differ by up to "
            f"{100 * check.largest:.1f} points; {check.splits} ways are too few for a 95% "
            f"floor (it takes {MIN_SPLITS_FOR_FLOOR}: 8 seeds split 35 ways)"
        )
    lines.append(
        "  a Δ in the ablation table inside the floor is not evidence on this task and budget"
    )
    limit = width or terminal_width()
    out = [
        textwrap.fill(line, limit, subsequent_indent="    ", break_on_hyphens=False)
        for line in lines
    ]
    return "\n".join(out) + "\n"
