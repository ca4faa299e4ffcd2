"""`dapo sweep --until-decided`: seeds in rounds, each round a subflow, the looks after it.

The plan is fixed before the first run (db.sequential): the first round runs the sweep's seeds,
filled up to the fewest the exact test can decide on (6); each later round adds
`seeds_per_round` new seeds, up to `max_seeds`. After each round every open comparison is
looked at once (db.sequential.look) and the look is stored (db.looks); the next round runs
only the arms that an open comparison still needs. A killed sweep run again (`dapo sweep
--sweep ID`) redoes the same plan: its completed runs are skipped, and its stored looks are
read back rather than taken again, so it resumes at its round with no α spent twice.

The decisions (which seeds a round gets, which comparisons are open, which arms go on) are
plain functions the tests call without Prefect; `run_rounds` is the glue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from prefect import flow

from db import looks, power, sequential
from db.reads import parents
from flows import plan, progress
from flows.params import SweepParams

ROUND_FLOW = "ablation-round"
Pair = tuple[str, str]


def planned_pairs(params: SweepParams) -> list[Pair]:
    """The comparisons that matter: those asked for, else each arm against its parent among
    the sweep's arms and the last arm against the first (dapo against grpo on the paper's)."""
    from db.decisions import parse_pairs

    if params.adaptive.compare:
        return parse_pairs(params.adaptive.compare, params.arms)
    ladder = SimpleNamespace(ladder=params.parsed_ladder.rows())
    parent_of = parents(ladder, params.arms)
    pairs = [(arm, p) for arm, p in parent_of.items() if p is not None]
    last = (params.arms[-1], params.arms[0])
    return pairs if last in pairs or last[0] == last[1] else [*pairs, last]


def rounds(params: SweepParams) -> list[list[int]]:
    """The seeds each round adds: the sweep's own seeds filled with the next unused integers
    up to power.exact_floor() seeds, then seeds_per_round more a round up to max_seeds."""
    plan_ = params.adaptive
    seeds = list(params.seeds)
    taken = set(seeds)

    def fresh(count: int) -> list[int]:
        out, candidate = [], 0
        while len(out) < count:
            if candidate not in taken:
                out.append(candidate)
                taken.add(candidate)
            candidate += 1
        return out

    first = seeds + fresh(max(0, min(plan_.max_seeds, power.exact_floor()) - len(seeds)))
    out, total = [first], len(first)
    while total < plan_.max_seeds:
        more = fresh(min(plan_.seeds_per_round, plan_.max_seeds - total))
        out.append(more)
        total += len(more)
    return out


def design_of(params: SweepParams) -> sequential.Design:
    plan_ = params.adaptive
    sizes = [len(r) for r in rounds(params)]
    counts = tuple(int(sum(sizes[: i + 1])) for i in range(len(sizes)))
    return sequential.design(counts, spending=plan_.spending, futility=plan_.futility)


def open_pairs(
    pairs: Sequence[Pair], stored: Mapping[str, Sequence[looks.StoredLook]]
) -> list[Pair]:
    """The comparisons not decided yet: no look, or the last one said "continue"."""
    out = []
    for a, b in pairs:
        seen = stored.get(looks.key(a, b), [])
        if not seen or seen[-1].decision == "continue":
            out.append((a, b))
    return out


def arms_needed(pairs: Sequence[Pair], order: Sequence[str]) -> list[str]:
    """The arms the open comparisons need, in the sweep's order."""
    wanted = {arm for pair in pairs for arm in pair}
    return [arm for arm in order if arm in wanted]


def take_look(
    engine: Any,
    sweep_id: int,
    d: sequential.Design,
    k: int,
    pair: Pair,
    finals: Mapping[str, Mapping[int, float]],
    seeds: Sequence[int],
) -> looks.StoredLook:
    """Look k at `pair` over the first d.looks[k] seeds of the plan (stored, or read back if it
    was stored before). A seed without a final score on either side is a round that did not
    finish: an error, so that the sweep fails and a rerun finishes the round first."""
    a, b = pair
    used = list(seeds[: d.looks[k]])
    missing = [s for s in used if s not in finals.get(a, {}) or s not in finals.get(b, {})]
    if missing:
        raise RuntimeError(
            f"look {k + 1} at {a} − {b} needs seeds {used}; no final score for seed(s) "
            f"{missing}: run the sweep again to finish the round"
        )
    seen = sequential.look(d, k, [finals[a][s] - finals[b][s] for s in used])
    return looks.record(
        engine,
        sweep_id,
        looks.key(a, b),
        look=k,
        seeds=used,
        mean=seen.mean,
        p=seen.p,
        nominal=seen.nominal,
        conditional_power=seen.conditional_power,
        decision=seen.decision,
    )


def look_line(pair: Pair, stored: looks.StoredLook) -> str:
    a, b = pair
    level = "tests nothing" if stored.nominal == 0 else f"needs p <= {stored.nominal:.3g}"
    return (
        f"{a} − {b} at n = {stored.n}: {100 * stored.mean:+.1f} pp, exact p = {stored.p:.3g} "
        f"({level}): {stored.decision}"
    )


def finals_of(engine: Any, sweep_id: int) -> dict[str, dict[int, float]]:
    """arm -> seed -> final score, from the ablation table (its rule for which attempt counts)."""
    from db.ablation import ablation_table

    table = ablation_table(engine, sweep_id)
    return {
        str(row["arm"]): dict(zip(row["seeds"] or [], row["scores"] or [], strict=True))
        for row in table.to_dict("records")
    }


RunJobs = Callable[[list[plan.ArmJob]], list[dict[str, Any]]]


# The arm runner of each adaptive sweep in this process, by sweep id: a round's flow run takes
# only plain parameters (what the Prefect UI shows), and finds how to run its arms here.
_RUNNERS: dict[int, tuple[SweepParams, RunJobs]] = {}


@flow(name=ROUND_FLOW, validate_parameters=False, persist_result=False)
def sweep_round(
    sweep_id: int, round_number: int, seeds: list[int], arms: list[str]
) -> list[dict[str, Any]]:
    """One round of an adaptive sweep: the arms still needed × the round's seeds (its own flow
    run in the Prefect UI, the arms' runs under it)."""
    params, run_jobs = _RUNNERS[sweep_id]
    jobs = [plan.arm_job(params, arm, seed) for arm in arms for seed in seeds]
    progress.say(
        f"sweep {sweep_id} round {round_number}: {', '.join(arms)} × seeds {seeds} "
        f"({len(jobs)} run(s))"
    )
    return list(run_jobs(jobs))


def run_rounds(
    params: SweepParams,
    store: Any,
    sweep_id: int,
    run_jobs: RunJobs,
    round_flow: Callable[..., list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Every round until the planned comparisons are decided, the seeds run out or the time
    budget is spent; the arms' results of every round. A round with a failed run raises after
    its results are in (the sweep fails; running it again resumes the round). `round_flow`:
    what runs a round (default the `ablation-round` subflow; tests pass a plain function)."""
    d = design_of(params)
    pairs = planned_pairs(params)
    plan_rounds = rounds(params)
    order = [s for r in plan_rounds for s in r]
    progress.say(
        f"sweep {sweep_id}: until decided, comparisons {', '.join(f'{a} − {b}' for a, b in pairs)}; "
        f"looks at {', '.join(map(str, d.looks))} seeds (levels "
        f"{', '.join(f'{x:.3g}' for x in d.nominal)}, {d.spending}), futility below "
        f"{d.futility:.0%} conditional power"
    )
    _RUNNERS[sweep_id] = (params, run_jobs)
    try:
        return _rounds(
            params, store, sweep_id, d, pairs, plan_rounds, order, round_flow or sweep_round
        )
    finally:
        _RUNNERS.pop(sweep_id, None)


def _rounds(
    params: SweepParams,
    store: Any,
    sweep_id: int,
    d: sequential.Design,
    pairs: list[Pair],
    plan_rounds: list[list[int]],
    order: list[int],
    round_flow: Callable[..., list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    budget = params.adaptive.budget_minutes
    results: list[dict[str, Any]] = []
    started, last_round = time.monotonic(), 0.0
    for r, seeds in enumerate(plan_rounds):
        stored = looks.of_sweep(store.engine, sweep_id)
        still = open_pairs(pairs, stored)
        if not still:
            break
        if r and budget is not None:
            spent = time.monotonic() - started
            if spent + last_round > 60.0 * budget:
                progress.say(
                    f"sweep {sweep_id}: the time budget ({budget:g} min) would be passed by "
                    f"round {r + 1} ({progress.duration(spent)} spent, the last round took "
                    f"{progress.duration(last_round)}): stopping with "
                    f"{len(still)} comparison(s) undecided",
                    level="warning",
                )
                break
        arms = arms_needed(still, params.arms)
        sweep_seeds = [s for past in plan_rounds[: r + 1] for s in past]
        stored_sweep = store.get_sweep(sweep_id)
        if set(sweep_seeds) - set(stored_sweep["seeds"]):
            # The arms' flow runs accept only the sweep's own seeds: widen it by this round's.
            store.extend_sweep(
                sweep_id,
                arms=list(stored_sweep["arms"]),
                seeds=sorted(set(stored_sweep["seeds"]) | set(sweep_seeds)),
                params=stored_sweep.get("params"),
            )
        t0 = time.monotonic()
        done = round_flow(sweep_id, r + 1, list(seeds), arms)
        last_round = time.monotonic() - t0
        results.extend(done)
        status, error = plan.sweep_outcome(done)
        if status != "completed":
            raise RuntimeError(f"round {r + 1}: {error}")
        k = d.looks.index(len(sweep_seeds)) if len(sweep_seeds) in d.looks else None
        if k is None:
            continue
        finals = finals_of(store.engine, sweep_id)
        for pair in still:
            seen = take_look(store.engine, sweep_id, d, k, pair, finals, order)
            progress.say(f"sweep {sweep_id} look {k + 1}: {look_line(pair, seen)}")
    return results
