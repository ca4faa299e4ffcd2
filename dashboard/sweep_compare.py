"""Curves of arms from several sweeps on one chart (the compare page's second half).

A series is one (sweep, arm): its seeds fold into a band as on the curves page (dashboard.curves),
so an arm rerun in a newer sweep (another model, another budget) can be laid over the old one.
Runs may be narrowed by one config value (`algo.clip_high=0.28`), matched against the run's
own config, so arms of different names that share a setting can be found across sweeps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from dapo_common.util import flatten


def series_label(sweep_id: int, sweep_name: str, arm: str) -> str:
    """'#3 ladder · clip_higher': the sweep first, since arm names repeat across sweeps."""
    return f"#{int(sweep_id)} {sweep_name} · {arm}"


def parse_filter(text: str) -> tuple[str, Any] | None:
    """`key=value` -> (key, value typed as JSON where it parses: 0.28, true, null; else the
    text); an empty text is no filter. A text without `=` or without a key is a ValueError."""
    text = text.strip()
    if not text:
        return None
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise ValueError(f"filter {text!r}: write it as key=value, e.g. algo.clip_high=0.28")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def matches(config: dict[str, Any], key: str, value: Any) -> bool:
    """Whether the config's dotted `key` holds `value` (0.28 matches 0.28 and "0.28"; a string
    value matches its text)."""
    flat = flatten(config or {})
    if key not in flat:
        return False
    held = flat[key]
    if isinstance(held, bool) or isinstance(value, bool):  # True is not 1 here; True is true
        return str(held).lower() == str(value).lower()
    return bool(held == value) or str(held) == str(value)


def latest_per_seed(runs: pd.DataFrame) -> pd.DataFrame:
    """The newest attempt of each (sweep, arm, seed): what a rerun replaces, as on the curves
    page (db.reads.latest_attempts is per sweep; here several sweeps share arm names)."""
    if runs.empty:
        return runs
    ordered = runs.sort_values(["sweep_id", "arm", "seed", "attempt"])
    return ordered.groupby(["sweep_id", "arm", "seed"], as_index=False, sort=False).tail(1)


def series_runs(
    runs: pd.DataFrame, series: Sequence[str], where: tuple[str, Any] | None = None
) -> pd.DataFrame:
    """The latest attempts (db.reads.runs_of_sweeps' frame) behind the chosen series labels,
    with their label in `series`, narrowed to the runs whose config holds `where`."""
    latest = latest_per_seed(runs)
    if latest.empty:
        return latest.assign(series=pd.Series(dtype=str))
    labels = [
        series_label(s, n, a)
        for s, n, a in zip(latest["sweep_id"], latest["sweep_name"], latest["arm"], strict=True)
    ]
    latest = latest.assign(series=labels)
    chosen = latest[latest["series"].isin(list(series))]
    if where is not None:
        key, value = where
        keep = [matches(c, key, value) for c in chosen["config"]]
        chosen = chosen[keep]
    return chosen.reset_index(drop=True)


def series_options(runs: pd.DataFrame) -> list[str]:
    """Every (sweep, arm) of the frame as a series label, by sweep then arm's first run."""
    latest = latest_per_seed(runs)
    if latest.empty:
        return []
    ordered = latest.sort_values(["sweep_id", "run_id"])
    seen: dict[str, None] = {}
    for s, n, a in zip(ordered["sweep_id"], ordered["sweep_name"], ordered["arm"], strict=True):
        seen.setdefault(series_label(s, n, a), None)
    return list(seen)


def labelled_curves(long: pd.DataFrame, chosen: pd.DataFrame) -> pd.DataFrame:
    """db.reads.metric_curves' long frame with `arm` replaced by each run's series label, so
    dashboard.curves folds seeds per (sweep, arm) and colours by it."""
    if long.empty:
        return long
    label = dict(zip(chosen["run_id"].astype(int), chosen["series"], strict=True))
    return long.assign(arm=long["run_id"].astype(int).map(label)).dropna(subset=["arm"])


def last_values(band: pd.DataFrame, series: Sequence[str]) -> pd.DataFrame:
    """Each series' value at its last step (dashboard.curves.seed_band's frame): the mean over
    seeds and how many seeds it folds, for reading the chart's right edge as numbers."""
    rows = []
    for label in series:
        mine = band[band["arm"] == label]
        if mine.empty:
            continue
        last = mine.sort_values("step").iloc[-1]
        rows.append(
            {
                "series": label,
                "step": int(last["step"]),
                "mean": float(last["mean"]),
                "seeds": int(last["n_seeds"]),
            }
        )
    return pd.DataFrame(rows, columns=["series", "step", "mean", "seeds"])
