"""The ablation table as text: aligned columns for a terminal, CSV, and Markdown.

Input is db.ablation.ablation_table (fractions, and db.stats.Estimate records); everything
printed is in percent, Δs in percentage points. `ablation_records` is the one place that
decides the columns and their cells: `dapo table`, the dashboard and the Prefect artifact all
show its output. The CSV (`render(table, "csv")`) is the one export, intervals included.

The text format is for a terminal: it fits `width` columns (dapo_common.text: $COLUMNS, else
the terminal's, else 120) by hiding the least telling columns first and says which it hid, and a value over
one seed is a bare number with "n=1: no intervals" said once under the table (not in every
cell). The dashboard and the Prefect artifact keep the word in each cell: a cell there is read
alone, without the table's notes.

The Prefect artifacts show the same cells with the key columns first (`key_first`,
ARTIFACT_KEY): Prefect's UI gives a table about 880 px of a 1440 px screen, so what each arm
scored comes before what is wide or secondary (tests/dashboard/test_artifact_layout.py checks it).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dapo_common.text import fit, hidden_note, terminal_width, wrapped
from dapo_common.util import duration
from db import power, stats
from db.cells import MISSING, SIGNIFICANT_RULE, estimate_text, pct
from db.cells import aligned as _aligned
from db.cells import escape as _escape
from db.cells import markdown as _markdown
from db.cells import missing as _missing

if TYPE_CHECKING:  # pandas is imported by the caller; `dapo --help` need not pay for it
    import pandas as pd

FORMATS = ("text", "csv", "markdown")
SINGLE_NOTE = "n=1: no intervals (one seed; the n column says how many seeds each arm has)"
# The Prefect artifacts' order: which arm, whether it is done, over how many seeds, its score
# and its Δ to the parent; then the other Δs and the context, the seeds, the bookkeeping, and
# what the arm adds (the widest text) last, whole.
ARTIFACT_KEY = ("arm", "status", "n", "final", "Δ parent")
ARTIFACT_REST = ("Δ base", "gain", "start", "parent")
ARTIFACT_LAST = ("adds",)


def count(value: Any) -> str:
    return MISSING if _missing(value) else f"{float(value):,.0f}"


def seed_list(table: pd.DataFrame) -> list[int]:
    """Every seed with a score in some arm, sorted."""
    return sorted({int(s) for seeds in table["seeds"] for s in (seeds or [])})


def share_text(share: Any) -> str:
    """A decisions.Share as '1/8 [0, 53]' (k of n, the exact 95% interval of the rate in %);
    '—' for no run."""
    if share is None or _missing(share) or share.n == 0:
        return MISSING
    return f"{share.k}/{share.n} [{100 * share.low:.0f}, {100 * share.high:.0f}]"


def wants_iqm(table: pd.DataFrame) -> bool:
    """Whether some arm has enough seeds for an interquartile mean (decisions.IQM_FROM)."""
    return any(not _missing(v) for v in table.get("iqm", []))


def ablation_records(
    table: pd.DataFrame, *, bare_single: bool = False, iqm: bool = False
) -> list[dict[str, str]]:
    """One dict of display strings per arm, in the table's (ladder) order: the columns of
    `dapo table`, the dashboard's table and the Prefect artifact alike. `bare_single`: see
    estimate_text (for a table that carries SINGLE_NOTE). `iqm`: an IQM column beside the final
    score (the interquartile mean over seeds, from 5 seeds on; '—' below)."""
    seeds = seed_list(table)
    records = []
    for row in table.to_dict("records"):
        n = int(row["n_seeds"] or 0)
        per_seed = dict(zip(row["seeds"] or [], row["scores"] or [], strict=False))
        record = {"arm": str(row["arm"]), "adds": str(row["adds"] or ""), "n": str(n)}
        record["start"] = pct(row["start_mean"])
        # The final score is over the row's own n; a difference may pair fewer seeds.
        record["final"] = estimate_text(row["score"], bare_single=bare_single)
        if iqm:
            record["IQM"] = pct(row.get("iqm"))
        gain, d_parent, d_base = (
            estimate_text(row[name], signed=True, n_expected=n, bare_single=bare_single)
            for name in ("gain", "delta_parent", "delta_base")
        )
        record["gain"] = gain
        record["parent"] = MISSING if _missing(row["parent"]) else str(row["parent"])
        record["Δ parent"], record["Δ base"] = d_parent, d_base
        for seed in seeds:
            record[f"seed {seed}"] = pct(per_seed.get(seed))
        paper = row["paper_score"]
        record["paper"] = MISSING if _missing(paper) else f"{float(paper):.1f}"
        record["steps"] = count(row["steps"])
        record["updates"] = count(row["grad_updates"])
        record["tokens"] = count(row["tokens"])
        record["time"] = duration(row["wall_s"], compact=True, missing=MISSING)
        record["collapsed"] = share_text(row.get("collapsed"))
        record["status"] = str(row["status"])
        records.append(record)
    return records


def key_first(
    records: Sequence[Mapping[str, str]], first: Sequence[str], last: Sequence[str] = ()
) -> list[dict[str, str]]:
    """The records with the columns of `first` leading and those of `last` at the end (each
    as far as present), the others between them in their own order; every cell is kept."""
    columns = list(records[0]) if records else []
    head = [c for c in first if c in columns]
    tail = [c for c in last if c in columns and c not in head]
    order = [*head, *(c for c in columns if c not in head and c not in tail), *tail]
    return [{c: record[c] for c in order} for record in records]


def artifact_records(records: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """ablation_records in the Prefect artifacts' order: ARTIFACT_KEY, ARTIFACT_REST, the seeds
    and the rest as the table has them, ARTIFACT_LAST."""
    return key_first(records, [*ARTIFACT_KEY, *ARTIFACT_REST], ARTIFACT_LAST)


def metric_label(table: pd.DataFrame) -> str:
    """'aime2024 avg@4': the evaluation that scores the table."""
    dataset = next((d for d in table["eval_dataset"] if not _missing(d)), None)
    k = next((int(v) for v in table["eval_k"] if not _missing(v)), None)
    return f"{dataset} avg@{k}" if dataset is not None and k is not None else "avg@k"


def caption(
    table: pd.DataFrame, sweep: Mapping[str, Any] | None = None, *, single_note: bool = True
) -> str:
    """What the numbers are (and of which sweep), in one line. `single_note=False` leaves out
    what n=1 means, for a table that says SINGLE_NOTE under itself."""
    what = (
        f"final {metric_label(table)} in %, mean over seeds [95% t-interval over seeds]; "
        "start = the starting model (step-0 evaluation); gain = final − start; Δ parent, "
        f"Δ base: paired by seed, in percentage points, {SIGNIFICANT_RULE}; "
        + ("n=1: one seed, no interval; " if single_note else "")
        + "paper = Table 1 (AIME 2024 avg@32, Qwen2.5-32B)"
    )
    if sweep is None:
        return what
    return f"sweep {sweep['id']} '{sweep['name']}' (preset {sweep['preset']}, {sweep['status']}): {what}"


def leader_of(table: pd.DataFrame) -> stats.Leader:
    """The arm with the highest mean final score and its lead over the runner-up, paired by
    seed (stats.leader over the table's per-seed scores)."""
    return stats.leader_of_rows(table.to_dict("records"))


def p_text(estimate: stats.Estimate) -> str:
    """The exact test of a difference in words: 'p = 0.031', or at too few seeds
    'p = 0.25, the smallest 3 seeds allow' (no number of seeds below 6 can reach 5%);
    '' for a value that is not a test."""
    if not estimate.tested:
        return ""
    p = f"p = {estimate.p:.2g}" + ("" if estimate.exact else " (Monte Carlo)")
    if estimate.p <= stats.smallest_p(estimate.n) and stats.smallest_p(estimate.n) >= stats.ALPHA:
        return f"{p}, the smallest {estimate.n} seed{'s' if estimate.n != 1 else ''} allow"
    return p


def headline(lead: stats.Leader) -> str:
    """The 'best arm' line: it names an arm only when the exact paired test of its lead over
    the runner-up calls the lead real; otherwise it says no arm leads, with that test's p."""
    if lead.best is None:
        return "No arm has a score yet."
    if lead.runner_up is None:
        return f"Only {lead.best} has a score ({pct(lead.best_mean)}%): nothing to compare yet."
    gap = f"{lead.best} − {lead.runner_up}"
    diff = lead.lead
    if lead.significant:
        return (
            f"Best arm: {lead.best} ({pct(lead.best_mean)}%), ahead of {lead.runner_up} by "
            f"{pct(diff.mean, True)} pp [{pct(diff.low, True)}, {pct(diff.high, True)}] "
            f"(paired over {diff.n} seeds, exact {p_text(diff)})."
        )
    if diff.n == 0:
        return (
            f"No arm leads significantly: {lead.best} has the highest mean "
            f"({pct(lead.best_mean)}%) but shares no seed with {lead.runner_up}."
        )
    if not diff.has_interval:
        return (
            f"No arm leads significantly: {gap} = {pct(diff.mean, True)} pp "
            f"(n={diff.n}, no interval)."
        )
    return (
        f"No arm leads significantly: {gap} = {pct(diff.mean, True)} pp "
        f"[{pct(diff.low, True)}, {pct(diff.high, True)}] (paired over {diff.n} seeds, "
        f"exact {p_text(diff)})."
    )


def _csv(table: pd.DataFrame) -> str:
    """Numbers for a spreadsheet: scores and Δs in percent (columns suffixed _pct), each
    statistic with its 95% interval (_low/_high; empty where there is none) and n."""
    seeds = seed_list(table)
    buffer = io.StringIO()
    writer: Any = None

    def p(value: Any) -> Any:
        return "" if _missing(value) else round(100.0 * float(value), 6)

    for row in table.to_dict("records"):
        per_seed = dict(zip(row["seeds"] or [], row["scores"] or [], strict=False))
        per_seed_best = dict(zip(row["seeds"] or [], row["best_scores"] or [], strict=False))
        per_seed_start = dict(zip(row["seeds"] or [], row["start_scores"] or [], strict=False))
        out: dict[str, Any] = {"arm": row["arm"], "adds": row["adds"] or ""}
        out["parent"] = "" if _missing(row["parent"]) else row["parent"]
        out["paper_score_pct"] = "" if _missing(row["paper_score"]) else row["paper_score"]
        out["n_seeds"] = row["n_seeds"]
        for seed in seeds:
            out[f"score_seed{seed}_pct"] = p(per_seed.get(seed))
        for seed in seeds:
            out[f"start_seed{seed}_pct"] = p(per_seed_start.get(seed))
        for seed in seeds:
            out[f"best_seed{seed}_pct"] = p(per_seed_best.get(seed))
        out["start_mean_pct"] = p(row["start_mean"])
        for name in ("score", "gain", "delta_parent", "delta_base"):
            estimate: stats.Estimate = row[name]
            out[f"{name}_mean_pct" if name == "score" else f"{name}_pct"] = p(estimate.mean)
            out[f"{name}_low_pct"], out[f"{name}_high_pct"] = p(estimate.low), p(estimate.high)
            out[f"{name}_n"] = estimate.n
            if name != "score":
                out[f"{name}_significant"] = int(estimate.significant)
                # the exact test and what the design can detect (db.power)
                out[f"{name}_p"] = "" if _missing(estimate.p) else round(estimate.p, 9)
                out[f"{name}_p_exact"] = "" if _missing(estimate.p) else int(estimate.exact)
                mde = power.mde(estimate.sd, estimate.n)
                out[f"{name}_mde_pct"] = "" if _missing(mde) or math.isinf(mde) else p(mde)
                needed = power.seeds_needed(estimate.mean, estimate.sd)
                out[f"{name}_seeds_needed"] = "" if needed is None else needed
        out["score_std_pct"] = p(row["score_std"])
        for name in ("gain", "delta_parent", "delta_base"):
            # one seed only: the interval over eval problems (problem sampling, not seeds)
            problems: stats.Estimate = row[f"{name}_problems"]
            out[f"{name}_problems_low_pct"] = p(problems.low)
            out[f"{name}_problems_high_pct"] = p(problems.high)
        out["best_mean_pct"], out["best_std_pct"] = p(row["best_mean"]), p(row["best_std"])
        out["iqm_pct"] = p(row.get("iqm"))
        share = row.get("collapsed")
        out["collapsed"] = "" if share is None or _missing(share) else share.k
        out["collapsed_of"] = "" if share is None or _missing(share) else share.n
        out["collapsed_low_pct"] = "" if share is None or _missing(share) else p(share.low)
        out["collapsed_high_pct"] = "" if share is None or _missing(share) else p(share.high)
        for name in ("steps", "grad_updates", "tokens", "wall_s"):
            value = row[name]
            out[name] = "" if _missing(value) else (round(float(value), 3))
        out["status"] = row["status"]
        out["eval_dataset"] = "" if _missing(row["eval_dataset"]) else row["eval_dataset"]
        out["eval_k"] = "" if _missing(row["eval_k"]) else int(row["eval_k"])
        out["interval"] = f"{round(100 * stats.LEVEL)}% {stats.OVER_SEEDS}"
        if writer is None:
            writer = csv.DictWriter(buffer, fieldnames=list(out), lineterminator="\n")
            writer.writeheader()
        writer.writerow(out)
    return buffer.getvalue()


def drop_order(records: Sequence[Mapping[str, str]]) -> list[str]:
    """The ablation table's columns in the order a narrow terminal hides them: bookkeeping
    first, then each seed's score, then context. arm, n (what a bare one-seed number needs
    beside it), final and Δ parent always stay."""
    seeds = [c for c in (records[0] if records else ()) if c.startswith("seed ")]
    return [
        *("updates", "tokens", "paper", "collapsed"),
        *reversed(seeds),
        *("steps", "time", "parent", "adds", "status", "start", "IQM", "Δ base", "gain"),
    ]


def has_single(table: pd.DataFrame) -> bool:
    """Whether some statistic of the table is over one seed (so it shows no interval)."""
    names = ("score", "gain", "delta_parent", "delta_base")
    return any(getattr(row[n], "n", 0) == 1 for row in table.to_dict("records") for n in names)


def render(
    table: pd.DataFrame,
    fmt: str,
    sweep: Mapping[str, Any] | None = None,
    *,
    width: int | None = None,
    wide: bool = False,
    artifact: bool = False,
    planned: Sequence[tuple[str, str]] = (),
    effect: float | None = None,
    iqm: bool | None = None,
    protocol: str | None = None,
    sequential: Mapping[str, Sequence[Any]] | None = None,
    running: bool = False,
) -> str:
    """The table in `fmt` (text, csv or markdown); text and Markdown carry a caption line, the
    headline (which arm leads, if any does significantly), the comparisons under it (every Δ
    with its exact p, MDE, seeds needed and verdict: db.decisions, `planned` pairs and the
    `effect` the researcher names included; an adaptive sweep's `sequential` looks and whether
    it is `running`, db.report.extras) and the `protocol` line.

    Text fits `width` columns (default: terminal_width(); `wide`: no limit) and, like
    Markdown, shows a one-seed value bare with SINGLE_NOTE under the table. `artifact`:
    Markdown in the Prefect artifacts' column order (artifact_records). `iqm`: the IQM column
    (None: when some arm has the seeds for one)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if table.empty:
        return "" if fmt == "csv" else "(no arms)\n"
    if fmt == "csv":
        return _csv(table)
    from db import decisions, decisions_format

    single = has_single(table)
    records = ablation_records(
        table, bare_single=True, iqm=wants_iqm(table) if iqm is None else iqm
    )
    note, lead = caption(table, sweep, single_note=False), headline(leader_of(table))
    notes = [SINGLE_NOTE] if single else []
    comps = decisions.comparisons(
        table, planned=planned, effect=effect, sequential=sequential, running=running
    )
    limit = None if wide or fmt != "text" else (width or terminal_width())
    compared = decisions_format.render(comps, fmt, width=limit)
    tail = "".join(
        f"\n{part}"
        for part in (compared, wrapped(protocol, limit) + "\n" if protocol else "")
        if part
    )
    if fmt == "text":
        shown, hidden = fit(records, limit, drop=drop_order(records), shrink={"adds": 16})
        if hidden:
            notes.append(hidden_note(hidden, limit))
        under = "".join(f"{wrapped(n, limit)}\n" for n in notes)  # right under the rows
        return (
            f"{wrapped(note, limit)}\n\n{_aligned(shown)}\n{under}\n{wrapped(lead, limit)}\n" + tail
        )
    body = "\n\n".join([_markdown(artifact_records(records) if artifact else records), *notes])
    return f"{body}\n\n*{_escape(note)}*\n\n{lead}\n" + tail
