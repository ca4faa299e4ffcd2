"""Per-token colouring of a response in the rollout group view: what the update did to each
token (dapo_core.train.rollout.token_record stores it under a sample's `tokens`).

Four colourings, one at a time: the importance ratio r = π_θ / π_θold (diverging around 1),
the clip (the lower bound one colour, the upper another: DAPO Eq. 10's clip, arXiv
2503.14476, and the up-clipped tokens of its Fig. 3a), the entropy (sequential), and whether
the token was clip-eligible (A > 0 and p_old < 1 / (1 + ε_high): the only tokens Clip-Higher
can act on). Pure functions from a record to colours and HTML; the Streamlit page only places
the result.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

TokenRecord = Mapping[str, Sequence[Any]]

# Colourings by key, with the label the page's selector shows.
MODES: dict[str, str] = {
    "ratio": "ratio π_θ/π_old",
    "clip": "clipped",
    "entropy": "entropy",
    "eligible": "clip-eligible",
}
KEYS = ("text", "p_old", "ratio", "clip", "entropy", "eligible")

Rgb = tuple[int, int, int]
WHITE: Rgb = (255, 255, 255)
RATIO_BELOW: Rgb = (33, 102, 172)  # r < 1: the update made the token less likely (blue)
RATIO_ABOVE: Rgb = (178, 24, 43)  # r > 1: more likely (red)
# |log r| at which the ratio's colour is full: r = 1.5 or 1 / 1.5, beyond both default
# clip bounds (0.8, 1.28), so a clipped token is clearly coloured and a wild one no more so.
RATIO_FULL = math.log(1.5)
ENTROPY_HIGH: Rgb = (84, 39, 143)  # purple, from white at 0 nats
CLIP_LOW = "#92c5de"  # clipped at the lower bound: A < 0, r < 1 − ε_low
CLIP_HIGH = "#f4a582"  # clipped at the upper bound: A > 0, r > 1 + ε_high
ELIGIBLE = "#ffe066"  # could reach the upper bound
NOT_IN_LOSS = "#e0e0e0"  # no ratio: the row was not in the loss (overlong filter)

# Characters that Markdown (and Streamlit's LaTeX) could read were our HTML not taken as one
# raw HTML block: written as numeric character references, which display the same and mean
# nothing to either parser.
_MARKDOWN_ACTIVE = "\\`*_[]#|~$"
_HTML_ACTIVE = "&<>\"'"


def has_tokens(record: object) -> bool:
    """Whether `record` is a usable per-token record: every list present, all one length."""
    if not isinstance(record, Mapping):
        return False
    lists = [record.get(k) for k in KEYS]
    if not all(isinstance(x, list) for x in lists):
        return False
    return len({len(x) for x in lists if isinstance(x, list)}) == 1


def mix(colour: Rgb, t: float) -> str:
    """`colour` at strength t ∈ [0, 1] over white, as #rrggbb."""
    t = min(max(t, 0.0), 1.0)
    r, g, b = (int(w + (c - w) * t + 0.5) for w, c in zip(WHITE, colour, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def ratio_colour(ratio: float | None) -> str:
    """Diverging around r = 1 (white) in log space: blue below, red above, full at 1 / 1.5
    and 1.5; grey without a ratio."""
    if ratio is None or not ratio > 0:
        return NOT_IN_LOSS
    x = math.log(ratio)
    return mix(RATIO_ABOVE if x > 0 else RATIO_BELOW, abs(x) / RATIO_FULL)


def clip_colour(clip: int) -> str | None:
    """The lower bound's colour, the upper bound's, or None (unclipped: plain)."""
    return {-1: CLIP_LOW, 1: CLIP_HIGH}.get(int(clip))


def entropy_colour(entropy: float | None, scale: float) -> str | None:
    """Sequential: white at 0 nats, full purple at `scale` nats and above; None unknown."""
    if entropy is None:
        return None
    return mix(ENTROPY_HIGH, entropy / scale if scale > 0 else 0.0)


def eligible_colour(eligible: int | bool) -> str | None:
    return ELIGIBLE if eligible else None


def token_colour(
    record: TokenRecord, i: int, mode: str, *, entropy_scale: float = 1.0
) -> str | None:
    """The background of token i of `record` under colouring `mode` (a key of MODES)."""
    if mode == "ratio":
        return ratio_colour(record["ratio"][i])
    if mode == "clip":
        return clip_colour(record["clip"][i])
    if mode == "entropy":
        return entropy_colour(record["entropy"][i], entropy_scale)
    if mode == "eligible":
        return eligible_colour(record["eligible"][i])
    raise ValueError(f"colouring {mode!r}: use one of {', '.join(MODES)}")


def entropy_scale(records: Iterable[object]) -> float:
    """The largest entropy among the records (one scale for a group's responses, so their
    colours compare); 1 nat when none is known."""
    values = [
        float(h)
        for record in records
        if has_tokens(record)
        for h in record["entropy"]  # type: ignore[index]
        if h is not None
    ]
    top = max(values, default=0.0)
    return top if top > 0 else 1.0


def _number(x: float | None, unit: str = "") -> str:
    return "—" if x is None else f"{x:.4g}{unit}"


def token_title(record: TokenRecord, i: int) -> str:
    """The hover text of token i: every stored value of it, one per line (plain text)."""
    clip = {-1: " · clipped at the low bound", 1: " · clipped at the high bound"}.get(
        int(record["clip"][i]), ""
    )
    ratio = record["ratio"][i]
    return "\n".join(
        [
            f"token {i}: {record['text'][i]!r}",
            f"p_old {_number(record['p_old'][i])}",
            f"ratio {_number(ratio)}{clip}" if ratio is not None else "ratio — (not in the loss)",
            f"entropy {_number(record['entropy'][i], ' nats')}",
            f"clip-eligible {'yes' if record['eligible'][i] else 'no'}",
        ]
    )


def escape(text: str, *, newlines: bool = True) -> str:
    """Text for our HTML inside st.markdown: HTML's and Markdown's active characters as
    numeric references, a newline shown as ↵ and a line break (a raw one could end the HTML
    block; `newlines=False`: a line break only). One pass over the text: escaping the HTML
    first and Markdown's characters after turned the '#' of an entity into one more reference
    ("token's" read "token&#x27;s" on the page)."""
    out = "".join(
        html.escape(c, quote=True)
        if c in _HTML_ACTIVE
        else f"&#{ord(c)};"
        if c in _MARKDOWN_ACTIVE
        else c
        for c in text.replace("\r", "")
    )
    return out.replace("\t", "&#9;").replace("\n", "↵<br>" if newlines else "<br>")


def _attribute(text: str) -> str:
    return html.escape(text, quote=True).replace("\n", "&#10;")


def response_html(record: TokenRecord, mode: str, *, entropy_scale: float = 1.0) -> str:
    """One response as coloured spans, one per token, each with its values as a hover title."""
    spans = []
    for i, text in enumerate(record["text"]):
        colour = token_colour(record, i, mode, entropy_scale=entropy_scale)
        style = f' style="background-color:{colour}"' if colour else ""
        spans.append(
            f'<span class="dapo-token"{style} title="{_attribute(token_title(record, i))}">'
            f"{escape(str(text))}</span>"
        )
    return (
        '<div class="dapo-tokens" style="font-family:monospace;white-space:pre-wrap;'
        'line-height:1.7;font-size:0.85em">' + "".join(spans) + "</div>"
    )


def _swatch(colour: str | None, label: str) -> str:
    style = f"background-color:{colour};" if colour else "border:1px solid #bbb;"
    return f'<span style="{style}padding:0 0.4em;margin-right:0.3em">{escape(label)}</span>'


def legend_html(mode: str, *, entropy_scale: float = 1.0) -> str:
    """A one-line legend of the colouring `mode`."""
    if mode == "ratio":
        parts = [_swatch(ratio_colour(r), f"{r:.3g}") for r in (1 / 1.5, 0.8, 1.0, 1.28, 1.5)]
        parts.append(_swatch(NOT_IN_LOSS, "not in the loss"))
        text = "ratio π_θ/π_old at the token's update step in the last epoch:"
    elif mode == "clip":
        parts = [
            _swatch(CLIP_LOW, "low bound: A<0, r<1−ε_low"),
            _swatch(CLIP_HIGH, "high bound: A>0, r>1+ε_high"),
            _swatch(None, "unclipped"),
        ]
        text = "clipped (DAPO Eq. 10):"
    elif mode == "entropy":
        parts = [
            _swatch(entropy_colour(h, entropy_scale), f"{h:.2g}")
            for h in (0.0, entropy_scale / 2, entropy_scale)
        ]
        text = "entropy of π_θ at the token (nats):"
    elif mode == "eligible":
        parts = [_swatch(ELIGIBLE, "A>0 and p_old<1/(1+ε_high)"), _swatch(None, "not")]
        text = "clip-eligible (could reach the upper bound):"
    else:
        raise ValueError(f"colouring {mode!r}: use one of {', '.join(MODES)}")
    return (
        f'<div class="dapo-legend" style="font-size:0.8em">{escape(text)} '
        + "".join(parts)
        + " · hover a token for all its values</div>"
    )
