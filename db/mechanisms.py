"""Mechanism metrics: does each arm's change show in the training metric it is about?

The ablation table says whether an arm helped; this says whether its mechanism did anything.
Clip-Higher that never reaches its upper bound, or a soft overlong penalty that never fires,
explains a flat Δ better than any seed spread. Input is db.mechanism_table (one row per
arm × metric: per-seed means over the first and last `window` rollout steps, their mean over
seeds with a 95% t-interval, the paired Δ to the parent arm); this module holds what the rows
are about and renders them as text, Markdown or CSV for `scripts/`, the README and the dashboard.

Which metric an arm is about comes from what its change sets, never from its name: the dotted
config keys in which its runs' stored config differs from its parent's (a grid's base arm, which
has no parent, from its swept keys), looked up in FOCUS.

Metric names are dapo_common.metric_names' constants, the ones the trainer logs under.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dapo_common import metric_names as M
from dapo_common.text import fit, hidden_note, terminal_width, wrapped
from dapo_common.util import flatten
from db import stats

# The table's own aligned-text and Markdown writers: one look for both tables.
from db.table_format import (
    FORMATS,
    MISSING,
    SIGNIFICANT_RULE,
    _aligned,
    _escape,
    _markdown,
    _missing,
    estimate_text,
    key_first,
)

if TYPE_CHECKING:  # pandas is imported by the caller
    import pandas as pd

# --- the metrics -----------------------------------------------------------------------------
# loss/long_share and loss/truncated_share are newer than some stored runs: they may be absent.
DEFAULT_METRICS: tuple[str, ...] = (
    M.RESPONSE_CLIP_RATIO,
    M.LOSS_TRUNCATED_SHARE,
    M.OVERLONG_PENALTY_MEAN,
    M.CLIP_RATIO_HIGH,
    M.CLIP_RATIO_LOW,
    M.ENTROPY_MEAN,
    M.LOSS_LONG_SHARE,
    M.KEPT_GROUPS,
    M.TRAIN_INFORMATIVE,
    M.GEN_BATCHES,
    M.RESPONSE_LENGTH_MEAN,
    M.ACC_MEAN,
)
# Fractions, shown in percent (their Δ in percentage points); every other metric in its own
# unit (entropy in nats, lengths in tokens, the penalty in reward units, batches as a count).
PERCENT: frozenset[str] = frozenset(
    {
        M.RESPONSE_CLIP_RATIO,
        M.LOSS_TRUNCATED_SHARE,
        M.CLIP_RATIO_HIGH,
        M.CLIP_RATIO_LOW,
        M.LOSS_LONG_SHARE,
        M.KEPT_GROUPS,
        M.TRAIN_INFORMATIVE,
        M.ACC_MEAN,
        M.CLIP_RATIO_DUAL,
        M.CLIP_RATIO_HIGH_ELIGIBLE,
        M.CLIP_RATIO_HIGH_NATURAL,
        M.COV_SELECTED,
        M.OFF_POLICY_MASKED,
        M.ENTROPY_KEPT,
    }
)
# A metric shown beside another when the sweep's runs logged it, and left out (no row, no
# column) when none did: the eligible share bounds the share at the upper bound (a ratio is at
# most 1 / p_old, so only tokens with p_old < 1 / (1 + ε_high) can reach it), and the entropy at
# the task's decision tokens says where exploration happens, which the mean over every token
# dilutes. Runs older than the eligible share, and tasks that name no decision tokens, have
# neither: a column of dashes there would read as "measured and empty".
COMPANIONS: dict[str, tuple[str, ...]] = {
    M.CLIP_RATIO_HIGH: (M.CLIP_RATIO_HIGH_ELIGIBLE, M.CLIP_RATIO_HIGH_DECISION),
    M.ENTROPY_MEAN: (M.ENTROPY_DECISION,),
}
WHEN_LOGGED: frozenset[str] = frozenset(m for ms in COMPANIONS.values() for m in ms)

# Config key (dotted, as in the runs' stored config) -> the metrics its change is expected to
# move, most telling first. The paper's reading of each technique (arXiv 2503.14476, §3):
FOCUS: dict[str, tuple[str, ...]] = {
    # overlong filtering masks truncated samples: their share of the loss falls to 0; and how
    # many there are
    "algo.overlong_filter": (M.LOSS_TRUNCATED_SHARE, M.RESPONSE_CLIP_RATIO),
    # Clip-Higher leaves room at the upper bound so low-probability tokens can grow: tokens at
    # the bound and entropy (the paper's Figure 2: entropy no longer collapses)
    "algo.clip_high": (M.CLIP_RATIO_HIGH, M.ENTROPY_MEAN),
    "algo.clip_low": (M.CLIP_RATIO_LOW, M.ENTROPY_MEAN),
    "algo.clip_c": (M.CLIP_RATIO_DUAL,),
    # soft overlong punishment (Eq. 13): the penalty paid and the truncation it discourages
    "algo.overlong_penalty": (M.OVERLONG_PENALTY_MEAN, M.RESPONSE_CLIP_RATIO),
    "algo.overlong_cache_len": (M.OVERLONG_PENALTY_MEAN, M.RESPONSE_CLIP_RATIO),
    "algo.overlong_penalty_factor": (M.OVERLONG_PENALTY_MEAN, M.RESPONSE_CLIP_RATIO),
    "rollout.max_response_len": (M.RESPONSE_CLIP_RATIO, M.RESPONSE_LENGTH_MEAN),
    # the token-level loss (Eq. 12) gives long responses their tokens' weight
    "algo.loss_agg": (M.LOSS_LONG_SHARE,),
    # dynamic sampling trains on informative groups only and generates until the batch is full
    "algo.dynamic_sampling": (M.TRAIN_INFORMATIVE, M.GEN_BATCHES),
    "algo.max_gen_batches": (M.GEN_BATCHES, M.TRAIN_INFORMATIVE),
    "algo.entropy_coef": (M.ENTROPY_MEAN,),
    "algo.rollout_correction": (M.IS_MASKED_FRAC,),
    "algo.rollout_is_cap": (M.IS_MASKED_FRAC,),
    # the trust-region family (Cui et al. 2025, arXiv 2505.22617, and the losses beside it): a
    # loss's change shows in the tokens it treats apart (the covariance losses' share; 0 for the
    # others) and in the entropy they are all about; the natural ratio tail says how hard the
    # update pushed against a bound, whether or not the loss clips
    "algo.loss_mode": (M.COV_SELECTED, M.ENTROPY_MEAN, M.CLIP_RATIO_HIGH_NATURAL),
    "algo.clip_cov_ratio": (M.COV_SELECTED, M.ENTROPY_MEAN),
    "algo.clip_cov_lb": (M.COV_SELECTED,),
    "algo.clip_cov_ub": (M.COV_SELECTED,),
    "algo.kl_cov_ratio": (M.COV_SELECTED, M.ENTROPY_MEAN),
    "algo.ppo_kl_coef": (M.ENTROPY_MEAN,),
    "algo.tau_pos": (M.ENTROPY_MEAN,),
    "algo.tau_neg": (M.ENTROPY_MEAN,),
    # the token filters: the share they keep or drop
    "algo.top_entropy_quantile": (M.ENTROPY_KEPT, M.ENTROPY_MEAN),
    "algo.off_policy_mask_threshold": (M.OFF_POLICY_MASKED,),
}
FOCUS_MARK = "◆"  # before a metric the arm's change is about
# Said once under a table whose one-seed values are bare numbers (table_format's, without its n
# column: here a value without an interval is the one-seed one).
SINGLE_NOTE = "n=1: no intervals (a value without one is over one seed)"


def with_companions(metrics: Iterable[str]) -> tuple[str, ...]:
    """`metrics` with each one's COMPANIONS metric right after it (once, where not already
    asked for): the table shows the bound beside the share, the fork beside the mean."""
    asked = list(dict.fromkeys(str(m) for m in metrics))
    out: list[str] = []
    for metric in asked:
        out.append(metric)
        out.extend(c for c in COMPANIONS.get(metric, ()) if c not in asked)
    return tuple(out)


def default_metrics(logged: Iterable[str]) -> tuple[str, ...]:
    """The metrics the mechanism table shows when none are named, for runs that logged
    `logged`: DEFAULT_METRICS (one a run did not log reads "—"), each with its companion where
    logged, then any metric some arm's change is about that the runs logged (e.g.
    mismatch/is_masked of a rollout-correction arm). One list for `dapo table --mechanisms`,
    the dashboard's default and the Prefect artifact."""
    have = {str(m) for m in logged}
    shown = [m for m in with_companions(DEFAULT_METRICS) if m not in WHEN_LOGGED or m in have]
    focus = sorted({m for ms in FOCUS.values() for m in ms if m in have} - set(shown))
    return (*shown, *focus)


# --- what an arm changes ----------------------------------------------------------------------


def config_changes(
    config: Mapping[str, Any], parent_config: Mapping[str, Any], arm: str, parent: str
) -> tuple[str, ...]:
    """The dotted keys in which an arm's run config differs from its parent's (same seed),
    sorted. Bookkeeping that only carries the arm's own name (`arm`: "clip_higher" vs
    "overlong_filter") is left out: it is not a change to the algorithm."""
    mine, theirs = flatten(config), flatten(parent_config)
    out = []
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key), theirs.get(key)
        if a == b or (a == arm and b == parent):
            continue
        out.append(key)
    return tuple(out)


def focus_metrics(changes: Iterable[str]) -> tuple[str, ...]:
    """The metrics the changed keys are about (FOCUS), in the order the keys first name them."""
    out: list[str] = []
    for key in changes:
        for metric in FOCUS.get(key, ()):
            if metric not in out:
                out.append(metric)
    return tuple(out)


# --- as text ----------------------------------------------------------------------------------


def scale(metric: str) -> float:
    """100 for a fraction (shown in percent), 1 otherwise."""
    return 100.0 if metric in PERCENT else 1.0


def unit(metric: str) -> str:
    return "%" if metric in PERCENT else ""


def _decimals(value: float) -> int:
    """Three significant digits of `value`, at most four decimals: 13.5 -> 1, 0.135 -> 3."""
    # rounded first, so that 0.99999999 (a float's 1.0) reads as 1.00, not 1.000
    value = round(value, 9)
    if value == 0.0 or not math.isfinite(value):
        return 2
    return min(4, max(0, 2 - math.floor(math.log10(abs(value)))))


def value_text(
    estimate: stats.Estimate | None,
    metric: str,
    *,
    signed: bool = False,
    bare_single: bool = False,
) -> str:
    """table_format.estimate_text in the metric's own unit and precision: '13.5 [7.1, 19.9]',
    ' *' on a difference the exact paired test calls real, '(n=1, no interval)' (bare with
    `bare_single`), '—'."""
    if estimate is None or estimate.n == 0 or _missing(estimate.mean):
        return MISSING
    k = scale(metric)
    places = _decimals(k * estimate.mean)
    sign = "+" if signed else ""
    return estimate_text(
        estimate,
        signed=signed,
        number=lambda x: f"{k * x:{sign}.{places}f}",
        bare_single=bare_single,
    )


def metric_label(metric: str) -> str:
    """'clip_ratio/high (%)': the name with its unit when it is shown in percent."""
    return f"{metric} ({unit(metric)})" if unit(metric) else metric


def window_of(table: pd.DataFrame) -> int:
    """The table's window in rollout steps (0 for an empty table)."""
    return int(table["window"].iloc[0]) if len(table) else 0


def mechanism_records(
    table: pd.DataFrame, *, focus_only: bool = False, bare_single: bool = False
) -> list[dict[str, str]]:
    """One dict of display strings per (arm, metric), in the table's order. `focus_only`
    keeps the metrics each arm's change is about (its signature); an arm that changes keys
    no metric is about shows one row saying so (as does one whose runs logged none of its
    metrics, naming them), and an arm that changes nothing (the base) none. `bare_single`: one-seed values without '(n=1, no interval)' (the table says
    SINGLE_NOTE once)."""
    w = window_of(table)
    records: list[dict[str, str]] = []
    shown_arms: set[str] = set()
    rows = table.to_dict("records")
    # An arm whose change is about metrics its runs did not log says which, rather than
    # showing nothing (a loss mode's covariance share, say, from runs older than it).
    focused = {str(r["arm"]) for r in rows if r["focus"]}
    for row in rows:
        arm = str(row["arm"])
        changes = tuple(row["changes"] or ())
        if focus_only and not row["focus"]:
            if changes and arm not in shown_arms and arm not in focused:
                shown_arms.add(arm)
                about = focus_metrics(changes)
                said = (
                    f"(not logged: {', '.join(metric_label(m) for m in about)})"
                    if about
                    else f"(none for {', '.join(changes)})"
                )
                records.append(_record(row, w, metric=said))
            continue
        shown_arms.add(arm)
        records.append(_record(row, w, bare_single=bare_single))
    return records


def _record(
    row: Mapping[str, Any], w: int, metric: str | None = None, *, bare_single: bool = False
) -> dict[str, str]:
    """One row's cells; `metric` replaces the metric's (and empties the numbers) when given."""
    name = str(row["metric"])
    empty = metric is not None
    label = (f"{FOCUS_MARK} " if row["focus"] else "") + metric_label(name)

    def cell(column: str, signed: bool = False) -> str:
        if empty:
            return MISSING
        return value_text(row[column], name, signed=signed, bare_single=bare_single)

    return {
        "arm": str(row["arm"]),
        "parent": MISSING if _missing(row["parent"]) else str(row["parent"]),
        "changes": ", ".join(row["changes"] or ()) or MISSING,
        "metric": metric if metric is not None else label,
        f"first {w}": cell("first"),
        f"last {w}": cell("last"),
        **{label: cell(delta, signed=True) for delta, label in delta_labels(w).items()},
    }


def delta_labels(w: int) -> dict[str, str]:
    """Each Δ column of the table (DELTAS) -> its heading, for a window of `w` steps: the
    first window first, as everywhere (the start of training, then where it ended)."""
    return {"delta_parent_first": f"Δ parent, first {w}", "delta_parent": f"Δ parent, last {w}"}


def caption(table: pd.DataFrame) -> str:
    """What the numbers are, in one line."""
    w = window_of(table)
    return (
        f"per seed, the metric's mean over the first and the last {w} rollout steps of its "
        "run (the runs behind the scores); mean over seeds [95% t-interval over seeds]; "
        f"Δ parent, first {w} / last {w}: that window's mean − the parent arm's, paired by "
        f"seed; a share's interval is cut at 0 and 100%, where a share ends; {SIGNIFICANT_RULE}; "
        f"{FOCUS_MARK} = a metric the arm's change (its config diff to its parent) is about; (%) metrics in percent, their Δ in percentage points; — = not "
        "logged"
    )


_LEFT = {"arm", "parent", "changes", "metric"}


def _blank_repeats(records: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """For a terminal: an arm's name, parent and changes only on its first row."""
    out, previous = [], None
    for record in records:
        copy = dict(record)
        if record["arm"] == previous:
            copy["arm"] = copy["parent"] = copy["changes"] = ""
        previous = record["arm"]
        out.append(copy)
    return out


DITTO = '"'
"""The Prefect artifact's cell for "as the row above" (an arm's parent and changes)."""


def _ditto_repeats(records: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """For the Prefect artifact: an arm's parent and changes on its first row, DITTO below
    (the arm's name stays on every row: it is the key a row is read by)."""
    out, previous = [], None
    for record in records:
        copy = dict(record)
        if record["arm"] == previous:
            copy["parent"] = copy["changes"] = DITTO
        previous = record["arm"]
        out.append(copy)
    return out


# The table's Estimate columns: the paired Δs to the parent, and all of them.
DELTAS = ("delta_parent_first", "delta_parent")
ESTIMATES = ("first", "last", *DELTAS)


def _csv(table: pd.DataFrame) -> str:
    """Numbers for a spreadsheet, in the metric's own unit (fractions stay fractions): each
    statistic's mean, 95% interval (_low / _high, empty without one) and n."""
    buffer = io.StringIO()
    columns = ["arm", "parent", "changes", "metric", "focus", "window"]
    for name in ESTIMATES:
        columns += [f"{name}_mean", f"{name}_low", f"{name}_high", f"{name}_n"]
    columns += [*(f"{name}_significant" for name in DELTAS), "interval"]
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()

    def num(value: float) -> Any:
        return "" if _missing(value) else round(float(value), 9)

    for row in table.to_dict("records"):
        out: dict[str, Any] = {
            "arm": row["arm"],
            "parent": "" if _missing(row["parent"]) else row["parent"],
            "changes": " ".join(row["changes"] or ()),
            "metric": row["metric"],
            "focus": int(bool(row["focus"])),
            "window": row["window"],
        }
        for name in ESTIMATES:
            estimate: stats.Estimate = row[name]
            out[f"{name}_mean"], out[f"{name}_n"] = num(estimate.mean), estimate.n
            out[f"{name}_low"], out[f"{name}_high"] = num(estimate.low), num(estimate.high)
        for name in DELTAS:
            out[f"{name}_significant"] = int(row[name].significant)
        out["interval"] = f"{round(100 * stats.LEVEL)}% {stats.OVER_SEEDS}"
        writer.writerow(out)
    return buffer.getvalue()


def _single(table: pd.DataFrame) -> bool:
    """Whether some value of the table is over one seed (so it shows no interval)."""
    rows = table.to_dict("records")
    return any(getattr(row[name], "n", 0) == 1 for row in rows for name in ESTIMATES)


def render(
    table: pd.DataFrame,
    fmt: str = "text",
    *,
    focus_only: bool = False,
    width: int | None = None,
    wide: bool = False,
    artifact: bool = False,
) -> str:
    """The mechanism table as text (aligned columns), Markdown or CSV; text and Markdown carry
    the caption. `focus_only`: only the metrics each arm's change is about. Text fits `width`
    columns (default: dapo_common.text.terminal_width(); `wide`: no limit), hiding the parent
    and the changes first, the windows only after them; a one-seed value is bare, with
    SINGLE_NOTE said once under the table. `artifact`: Markdown with arm, metric, the Δs to
    the parent (first window, then last), the windows, then parent and changes (the widest
    text): Prefect's UI leaves a table about 880 px of a 1440 px screen."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "csv":
        return _csv(table)
    records = mechanism_records(table, focus_only=focus_only, bare_single=True)
    if not records:
        return "(no mechanism metrics)\n"
    notes = [SINGLE_NOTE] if _single(table) else []
    if fmt == "text":
        limit = None if wide else (width or terminal_width())
        w = window_of(table)
        # What a reader needs least goes first, then the windows' own values (the last, so
        # that the first window leads whatever the width); the Δs to the parent stay.
        drop = ["parent", "changes", f"last {w}", f"first {w}"]
        shown, hidden = fit(_blank_repeats(records), limit, drop=drop, shrink={"changes": 12})
        if hidden:
            notes.append(hidden_note(hidden, limit))
        under = "".join(f"{wrapped(n, limit)}\n" for n in notes)
        return f"{wrapped(caption(table), limit)}\n\n{_aligned(shown, left=_LEFT)}\n{under}"
    if artifact:
        w = window_of(table)
        # What each arm did to its metric first, the start before the end; the windows' own
        # values after them (Prefect's UI shows about 880 px of a 1440 px screen).
        first = ["arm", "metric", *delta_labels(w).values(), f"first {w}", f"last {w}"]
        # An arm's parent and changes (up to ~90 characters) on its first row only; the
        # rows below it say DITTO (a table cell left empty reads as "none").
        records = key_first(_ditto_repeats(records), first, ["parent", "changes"])
    body = "\n\n".join([_markdown(records, left=_LEFT), *notes])
    return f"{body}\n\n*{_escape(caption(table))}*\n"
