"""Rollout shaping: filters, the reward split into correctness and overlong penalty, titles.

The shaped reward of DAPO is R = score + overlong penalty (Eq. 13 of the paper adds the soft
punishment R_length to the rule-based ±1 score), so the two parts are shown side by side.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from dashboard.token_colours import has_tokens

# Keyword arguments of db.reads.samples for each filter of the page.
FILTERS: dict[str, dict[str, Any]] = {
    "All": {},
    "Correct": {"correct": True},
    "Wrong": {"correct": False},
    "Truncated": {"truncated": True},
}

REWARD_COLUMNS = ["idx", "correct", "reward", "score", "overlong_penalty", "length", "truncated"]


def reward_table(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per sample: the reward and its two parts (score + overlong penalty)."""
    frame = samples[REWARD_COLUMNS].copy()
    frame["correct"] = frame["correct"].astype(bool)
    frame["truncated"] = frame["truncated"].astype(bool)
    return frame.rename(columns={"overlong_penalty": "overlong penalty"})


def reward_text(sample: pd.Series) -> str:
    """'reward -1.25 = score -1 + overlong penalty -0.25'."""
    return (
        f"reward {float(sample['reward']):+.3g} = score {float(sample['score']):+.3g} "
        f"+ overlong penalty {float(sample['overlong_penalty']):+.3g}"
    )


def sample_title(sample: pd.Series) -> str:
    """Expander title: index, verdict, reward, length (and truncation)."""
    verdict = "✔ correct" if bool(sample["correct"]) else "✖ wrong"
    cut = " · truncated" if bool(sample["truncated"]) else ""
    return (
        f"#{int(sample['idx'])} · {verdict} · reward {float(sample['reward']):+.3g} · "
        f"{int(sample['length'])} tokens{cut}"
    )


def step_summary(samples: pd.DataFrame) -> str:
    """One line over all samples of a step: counts, accuracy, truncation, mean reward parts."""
    n = len(samples)
    if n == 0:
        return "No samples at this step."
    correct = int(samples["correct"].astype(bool).sum())
    truncated = int(samples["truncated"].astype(bool).sum())
    return (
        f"{n} samples · {correct} correct ({100.0 * correct / n:.0f}%) · {truncated} truncated · "
        f"mean reward {samples['reward'].mean():+.3f} = score {samples['score'].mean():+.3f} "
        f"+ penalty {samples['overlong_penalty'].mean():+.3f}"
    )


# --- the group view: a prompt's G responses side by side --------------------------------------
GROUP_COLUMNS = ["idx", "member", "correct", "reward", "advantage", "length", "truncated"]


def group_frames(samples: pd.DataFrame) -> list[pd.DataFrame]:
    """The step's stored responses (db.reads.sample_groups) split into their groups, in the
    order the trainer generated them: by the stored group index, else (rows written before
    the trainer recorded it) by prompt, which at one step names the group as well unless two
    groups drew the same problem."""
    if samples.empty:
        return []
    key = samples["group"].map(lambda g: None if pd.isna(g) else f"g{int(g):09d}")
    key = key.where(key.notna(), "p" + samples["prompt"].astype(str))
    frames = [part for _, part in samples.groupby(key, sort=False)]
    # Groups by the trainer's order, members by their place in the group, else by index.
    frames.sort(key=lambda f: (_first_group(f), int(f["idx"].min())))
    return [
        f.assign(_m=f["member"].fillna(-1).astype(int))
        .sort_values(["_m", "idx"])
        .drop(columns="_m")
        .reset_index(drop=True)
        for f in frames
    ]


def _first_group(frame: pd.DataFrame) -> int:
    groups = [int(g) for g in frame["group"].dropna()]
    return min(groups) if groups else -1


def advantage_text(advantage: Any) -> str:
    """'+0.866'; '—' where the trainer recorded none (the group was not trained that step, or
    the row is older than the record): never 'None' or 'nan' in a number column."""
    return "—" if advantage is None or pd.isna(advantage) else f"{float(advantage):+.3f}"


def group_table(group: pd.DataFrame) -> pd.DataFrame:
    """One row per stored response of a group: reward, advantage (as text, '—' for none),
    length, truncation."""
    frame = group[GROUP_COLUMNS].copy()
    frame["correct"] = frame["correct"].astype(bool)
    frame["truncated"] = frame["truncated"].astype(bool)
    frame["advantage"] = frame["advantage"].map(advantage_text)
    return frame


# What a group's verdicts say about its training signal (GRPO's advantage is 0 on a group whose
# rewards are all equal; dynamic sampling keeps only the mixed ones).
MIXED, ALL_RIGHT, ALL_WRONG, PARTIAL = "mixed", "all right", "all wrong", "partial"
GROUP_FILTERS: dict[str, str | None] = {
    "All groups": None,
    "Mixed (0 < correct < G)": MIXED,
    "All right": ALL_RIGHT,
    "All wrong": ALL_WRONG,
}


def group_kind(group: pd.DataFrame, group_size: int | None) -> str:
    """MIXED when its stored responses are both right and wrong; ALL_RIGHT / ALL_WRONG when
    every one of its G responses is stored and they agree; PARTIAL when they agree but some
    are not stored (the rest could differ)."""
    correct = int(group["correct"].astype(bool).sum())
    if 0 < correct < len(group):
        return MIXED
    whole = group_size is not None and len(group) >= group_size
    if not whole:
        return PARTIAL
    return ALL_RIGHT if correct else ALL_WRONG


def groups_summary(kinds: list[str]) -> str:
    """'8 groups stored: 3 mixed, 4 all right, 1 all wrong'."""
    counts = {k: kinds.count(k) for k in (MIXED, ALL_RIGHT, ALL_WRONG, PARTIAL) if k in kinds}
    parts = ", ".join(f"{n} {k}" for k, n in counts.items())
    return f"{len(kinds)} group(s) stored" + (f": {parts}" if parts else "")


def group_title(group: pd.DataFrame, group_size: int | None) -> str:
    """'Group 3 · 2 of 4 responses stored · 1 correct · trained' (prompt shown below it)."""
    first = group.iloc[0]
    known = not pd.isna(first["group"])
    name = f"Group {int(first['group'])}" if known else "Prompt"
    n = len(group)
    stored = f"{n} of {group_size} responses stored" if group_size else f"{n} responses stored"
    correct = int(group["correct"].astype(bool).sum())
    has_advantage = group["advantage"].notna().any()
    if has_advantage:
        trained = " · trained"
    elif known:
        # The trainer records advantages of the groups it trained on; none here means
        # dynamic sampling left the group out (all correct or all wrong) or carried it over.
        trained = " · not trained this step"
    else:
        trained = ""
    return f"{name} · {stored} · {correct} correct{trained}"


def response_caption(sample: pd.Series) -> str:
    """The header of one response's column: verdict, reward, advantage, length, truncation."""
    verdict = "✔" if bool(sample["correct"]) else "✖"
    adv = f"A {advantage_text(sample['advantage'])}"
    cut = " · truncated" if bool(sample["truncated"]) else ""
    return (
        f"#{int(sample['idx'])} {verdict} · reward {float(sample['reward']):+.3g} · {adv} · "
        f"{int(sample['length'])} tokens{cut}"
    )


NO_TOKENS = (
    "No per-token data at this step (ratio, clip, entropy, eligibility): the run was recorded "
    "before the trainer stored it, or trained none of these groups. Responses are plain text."
)


def group_tokens(group: pd.DataFrame, tokens: dict[int, Any]) -> dict[int, Any]:
    """The usable per-token records (dashboard.token_colours.has_tokens) of a group's
    responses, by sample index; a response without one is shown as plain text."""
    records = {int(i): tokens.get(int(i)) for i in group["idx"]}
    return {i: r for i, r in records.items() if has_tokens(r)}


def group_size(config: dict[str, Any]) -> int | None:
    """G of the run (rollout.group_size of its config), None when the config does not say."""
    size = (config.get("rollout") or {}).get("group_size")
    return int(size) if isinstance(size, int) else None


RESPONSE_BOX_EM = 10  # a response's box scrolls beyond this height (about 9 lines of text)


def boxed(inner_html: str) -> str:
    """A response's HTML in a box of bounded height that scrolls, so that 16 groups of long
    responses do not make a page of thousands of pixels."""
    return (
        f'<div class="dapo-response" style="max-height:{RESPONSE_BOX_EM}em;overflow-y:auto;'
        'border:1px solid #e6e6e6;border-radius:4px;padding:0.3em">' + inner_html + "</div>"
    )


def plain_html(text: str) -> str:
    """A response without a per-token record, as escaped text in the same box."""
    from dashboard.token_colours import escape

    return boxed(
        '<div style="font-family:monospace;white-space:pre-wrap;font-size:0.85em">'
        + escape(str(text), newlines=False)
        + "</div>"
    )
