"""The DAPO-Math rule-based reward (DAPO paper, arXiv 2503.14476, §2.4, Eq. 7):

    R(ŷ, y) = +1  if is_equivalent(ŷ, y)
              −1  otherwise

where y is the ground-truth answer and ŷ the answer the model states. "Equivalent" is the
DAPO-Math rule (verl's `verl/utils/reward_score/math_dapo.py`, itself the Minerva / lm-eval
normaliser), reproduced here without copying it:

  1. look only at the last 300 characters of the response;
  2. ŷ is the capture of the LAST match of `(?i)Answer\\s*:\\s*([^\\n]+)` in that window
     (matches are found left to right without overlap, so one line holds at most one);
  3. with no such line, fall back to the content of the last `\\boxed{…}` (balanced braces)
     that starts within the last 100 characters of the window (current verl; older
     releases had no fallback and scored such a response −1);
  4. normalise ŷ and y the Minerva way (`normalize_answer`) and compare the strings.

Deliberate differences from verl, each because the reference misjudges an answer or can hang:
  * Nothing extracted → `pred` is None (verl reports the string "[INVALID]", so a model that
    writes `Answer: [INVALID]` is treated as having said nothing).
  * An empty normalised answer never matches, not even an empty ground truth (verl gives +1
    to `Answer: cm` against a blank answer field).
  * Unicode: decimal digits of any script (fullwidth '４２', Arabic-Indic '٤٢', Devanagari,
    mathematical bold, …) become ASCII, fullwidth ASCII forms become ASCII and U+2212 '−'
    becomes '-'. verl's `str.isdigit` accepts '４２' yet the string never equals '42'.
  * `\\dfrac` and `\\tfrac` are `\\frac` (they differ only in rendered size); verl keeps them
    apart, so `\\dfrac{1}{2}` is wrong against `\\frac{1}{2}`.
  * Digit-grouping commas are removed only from well-formed groups (`-1,234,567.5`); verl
    removes every comma of a digit string, so a list equals a number (MATH-500's answer
    `3, 5, 7` becomes `357`), and it never ungroups a negative number.
  * An integer written as a decimal with only zeros after the point (`5.0`, `5.00`, `-3.`,
    and so the sentence-final `42.`) is that integer. Other decimals stay as written.
  * Bounded time: verl's `$…$`, `\\text{…}`-style and `\\boxed{…}` rewrites are regexes that
    go quadratic on a long ground truth with unclosed delimiters (`"\\text{" * 10**5`); here
    they are single left-to-right scans, so the whole score is linear in its input. Nothing
    is ever evaluated, and numbers are compared as strings (no float rounding of huge ints).
Kept as in verl on purpose: markdown is not stripped (`Answer: **42**` is wrong, as the prompt
asks for a bare answer), nor is a trailing period after non-integers (`\\frac{1}{2}.`).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

# verl's comment: the longest answer in MATH-500 has 159 characters.
RESPONSE_WINDOW = 300
BOXED_WINDOW = 100

_ANSWER_LINE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)
_BOXED_OPEN = "\\boxed{"

# Minerva's normalisation tables, in order (order matters: "students" goes before "\text{s}").
_SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
    # Not in verl: display/text-style fractions are the same fraction.
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
)
_REMOVED: tuple[str, ...] = (
    # units and counted nouns
    *("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units"),
    *("\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm"),
    *("gm", "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples"),
    # TeX leftovers
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
# Wrappers whose content is kept up to the FIRST closing brace on the line (lazy, like verl).
_LAZY_WRAPPERS = ("\\text{", "\\textbf{", "\\overline{")

# Shorthand TeX: \frac12 → \frac{1}{2}, \fracabc → \frac{a}{b}c, \sqrt2 → \sqrt{2}.
# Fixed-width after a literal: linear time.
_FRAC_SHORTHAND = re.compile(r"frac([^{])(.)")
_SQRT_SHORTHAND = re.compile(r"sqrt([^{])")
_GROUPED_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)
_INTEGER_AS_DECIMAL = re.compile(r"(-?\d+)\.0*", re.ASCII)

_MINUS_SIGNS = {"\u2212": "-", "\ufe63": "-"}  # minus sign, small hyphen-minus


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """One response's verdict.

    score: R(ŷ, y) of Eq. 7, +1.0 or −1.0. acc: 1.0 if correct else 0.0.
    pred: the normalised extracted answer, None when the response states none.
    """

    score: float
    acc: float
    pred: str | None


def extract_answer(response: str) -> str | None:
    """The raw answer a response states (before normalisation), or None.

    The last `Answer: …` capture in the last 300 characters; failing that, the content of the
    last `\\boxed{…}` opened within the last 100 characters of that window, if its braces close.
    """
    window = response[-RESPONSE_WINDOW:]
    captures = _ANSWER_LINE.findall(window)
    if captures:
        return str(captures[-1])
    return _last_boxed_content(window[-BOXED_WINDOW:])


def normalize_answer(text: str) -> str:
    """Minerva-style canonical form of an answer string (see the module docstring).

    Linear in len(text); pure string work, nothing is parsed or evaluated.
    """
    s = _fold_unicode(text)
    s = s.rpartition("=")[2]  # the value after the last '=': "x = 5" → " 5"
    for old, new in _SUBSTITUTIONS:
        s = s.replace(old, new)
    for expr in _REMOVED:
        s = s.replace(expr, "")
    # verl's regexes here use '.', which stops at a newline: each rewrite acts line by line.
    lines = s.split("\n")
    lines = [_first_math_span(line) for line in lines]
    for opener in _LAZY_WRAPPERS:
        lines = [_unwrap_lazy(line, opener) for line in lines]
    lines = [_unwrap_boxed_greedy(line) for line in lines]
    s = "\n".join(lines)
    s = _FRAC_SHORTHAND.sub(r"frac{\1}{\2}", s)
    s = _SQRT_SHORTHAND.sub(r"sqrt{\1}", s)
    s = s.replace("$", "").strip()
    if _GROUPED_NUMBER.fullmatch(s):
        s = s.replace(",", "")
    integer = _INTEGER_AS_DECIMAL.fullmatch(s)
    if integer:
        s = integer.group(1)
    return s


def math_score(response: str, ground_truth: str) -> ScoreResult:
    """DAPO-Math reward of one response: +1/−1 score (Eq. 7), 0/1 accuracy, normalised pred."""
    if not isinstance(response, str) or not isinstance(ground_truth, str):
        raise TypeError(
            "math_score takes two strings, got "
            f"{type(response).__name__} and {type(ground_truth).__name__}"
        )
    raw = extract_answer(response)
    if raw is None:
        return ScoreResult(score=-1.0, acc=0.0, pred=None)
    pred = normalize_answer(raw)
    correct = pred != "" and pred == normalize_answer(ground_truth)
    return ScoreResult(score=1.0 if correct else -1.0, acc=1.0 if correct else 0.0, pred=pred)


def __getattr__(name: str) -> Any:
    # DESIGN.md names `dapo_core.rewards.overlong_penalty`; it lives in dapo_core.overlong
    # (torch). Resolved lazily so that importing the math reward never imports torch.
    if name == "overlong_penalty":
        from dapo_core.overlong import overlong_penalty

        return overlong_penalty
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- helpers -------------------------------------------------------------------------------


def _last_boxed_content(text: str) -> str | None:
    start = text.rfind(_BOXED_OPEN)
    if start < 0:
        return None
    depth = 0
    for i in range(start + len(_BOXED_OPEN) - 1, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(_BOXED_OPEN) : i]
    return None  # the last box never closes (e.g. truncated): no fallback to earlier boxes


def _fold_unicode(text: str) -> str:
    if text.isascii():
        return text
    out = []
    for ch in text:
        if ch < "\x80":
            out.append(ch)
            continue
        digit = unicodedata.decimal(ch, None)
        if digit is not None:
            out.append(chr(0x30 + digit))
        elif "\uff01" <= ch <= "\uff5e":  # fullwidth ASCII forms sit at a fixed offset
            out.append(chr(ord(ch) - 0xFEE0))
        elif ch == "\u3000":
            out.append(" ")
        else:
            out.append(_MINUS_SIGNS.get(ch, ch))
    return "".join(out)


def _first_math_span(line: str) -> str:
    # A line with two '$' keeps only the first $…$ span (text around the math is dropped).
    i = line.find("$")
    if i < 0:
        return line
    j = line.find("$", i + 1)
    if j < 0:
        return line
    return line[i : j + 1]


def _unwrap_lazy(line: str, opener: str) -> str:
    # `\text{a}b}` → `ab}`: content up to the first '}', left to right, no overlap.
    parts = []
    pos = 0
    while True:
        i = line.find(opener, pos)
        if i < 0:
            break
        j = line.find("}", i + len(opener))
        if j < 0:
            break  # no '}' left on the line: no later opener can close either
        parts.append(line[pos:i])
        parts.append(line[i + len(opener) : j])
        pos = j + 1
    parts.append(line[pos:])
    return "".join(parts)


def _unwrap_boxed_greedy(line: str) -> str:
    # `\boxed{…}` inside an answer: content up to the LAST '}' of the line (greedy, like verl).
    i = line.find(_BOXED_OPEN)
    if i < 0:
        return line
    content_start = i + len(_BOXED_OPEN)
    j = line.rfind("}")
    if j < content_start:
        return line
    return line[:i] + line[content_start:j] + line[j + 1 :]
