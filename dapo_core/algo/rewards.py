"""Rule-based math rewards (DAPO paper, arXiv 2503.14476, §2.4, Eq. 7), found by name:

    R(ŷ, y) = +1  if is_equivalent(ŷ, y)
              −1  otherwise

where y is the ground-truth answer and ŷ the answer the response states. Two graders decide
"equivalent" (`reward.grader`):

`dapo` (the default, `math_score`): exactly the reference grader of DAPO-Math, verl 0.9.1's
`verl/utils/reward_score/math_dapo.py` (the Minerva / lm-eval normaliser), with which the paper's
numbers and every public DAPO number were measured. Re-implemented here; its verdict on every
(response, ground truth) pair is the reference's:

  1. look only at the last 300 characters of the response (the window);
  2. ŷ is the capture of the LAST match of `(?i)Answer\\s*:\\s*([^\\n]+)` in the window (matches
     are found left to right without overlap, so one line holds at most one), normalised
     (`dapo_normalize`); unless the normalised ŷ is the reference's sentinel "[INVALID]", the
     verdict is normalised ŷ == normalised y;
  3. otherwise (no such line, or it normalises to "[INVALID]"): the content of the last
     `\\boxed{…}` (balanced braces) opened within the last 100 characters of the window, compared
     with y VERBATIM (neither side normalised: `\\boxed{42}` is wrong against "42 ");
  4. with neither, the reference compares its sentinel with y: the verdict is
     normalised y == "[INVALID]" (so a ground truth that normalises to "[INVALID]" is matched by
     silence). Here `pred` is None in that case instead of the sentinel string; no verdict moves.

  Where this module differs from the reference's code, the verdict never does: the `$…$`,
  `\\text{…}`-style and `\\boxed{…}` rewrites of the normaliser are regexes that go quadratic on a
  long string with unclosed delimiters (`"\\text{" * 10**5` takes minutes); here each is one
  left-to-right scan with the same result, and a ground truth's normal form is cached (the
  trainer grades G responses against the same answer), so grading is linear in its input and a
  repeated ground truth costs nothing.

`lenient` (`lenient_score`): this module's own rule, the same steps with these deliberate
differences, each because the reference misjudges an answer:
  * Nothing extracted → `pred` is None and the score is −1, whatever the ground truth; the box
    fallback compares normal forms, like an `Answer:` line.
  * An empty normalised answer never matches, not even an empty ground truth (the reference
    gives +1 to `Answer: cm` against a blank answer field).
  * Unicode: decimal digits of any script (fullwidth '４２', Arabic-Indic '٤٢', Devanagari,
    mathematical bold, …) become ASCII, fullwidth ASCII forms become ASCII and U+2212 '−'
    becomes '-'. The reference's `str.isdigit` accepts '４２' yet the string never equals '42'.
  * `\\dfrac` and `\\tfrac` are `\\frac` (they differ only in rendered size).
  * Digit-grouping commas are removed only from well-formed groups (`-1,234,567.5`); the
    reference removes every comma of a digit string, so a list equals a number (MATH-500's
    answer `3, 5, 7` becomes `357`), and it never ungroups a negative number.
  * An integer written as a decimal with only zeros after the point (`5.0`, `5.00`, `-3.`,
    and so the sentence-final `42.`) is that integer. Other decimals stay as written.
  Kept as in the reference on purpose: markdown is not stripped (`Answer: **42**` is wrong, as
  the prompt asks for a bare answer), nor is a trailing period after non-integers.

Both graders: nothing is ever evaluated, numbers are compared as strings (no float rounding of
huge integers), and the module imports no torch (the dashboard and reference checks use it).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

# The reference's comment: the longest answer in MATH-500 has 159 characters.
RESPONSE_WINDOW = 300
BOXED_WINDOW = 100
# Ground truths whose normal form is remembered per grader; an entry costs about its length.
GROUND_TRUTH_CACHE = 4096

_ANSWER_LINE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)
_BOXED_OPEN = "\\boxed{"
_INVALID = "[INVALID]"  # the reference's "nothing extracted" sentinel

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
)
# Not in the reference: display/text-style fractions are the same fraction.
_LENIENT_SUBSTITUTIONS = (*_SUBSTITUTIONS, ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"))
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
# Wrappers whose content is kept up to the FIRST closing brace on the line (lazy regexes).
_LAZY_WRAPPERS = ("\\text{", "\\textbf{", "\\overline{")

# Shorthand TeX: \frac12 → \frac{1}{2}, \fracabc → \frac{a}{b}c, \sqrt2 → \sqrt{2}. `[^{]` also
# matches a newline, `.` does not. A literal first: linear time.
_FRAC_SHORTHAND = re.compile(r"frac([^{])(.)")
_SQRT_SHORTHAND = re.compile(r"sqrt([^{])")
_GROUPED_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)
_INTEGER_AS_DECIMAL = re.compile(r"(-?\d+)\.0*", re.ASCII)

_MINUS_SIGNS = {"\u2212": "-", "\ufe63": "-"}  # minus sign, small hyphen-minus


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """One response's verdict.

    score: R(ŷ, y) of Eq. 7, +1.0 or −1.0. acc: 1.0 if correct else 0.0.
    pred: the answer the verdict was made on (normalised, or a box's raw content for the
    `dapo` box fallback), None when the response states none.
    """

    score: float
    acc: float
    pred: str | None


Grader = Callable[[str, str], ScoreResult]
"""(response, ground truth) → verdict."""


# --- dapo: the reference grader -------------------------------------------------------------


def math_score(response: str, ground_truth: str) -> ScoreResult:
    """Eq. 7 reward by the reference DAPO-Math grader (the `dapo` grader, the default).

    response: the full generated text; ground_truth: the data set's answer field.
    Returns +1/−1 score, 0/1 accuracy and the answer judged (see the module docstring, steps
    1–4); the verdict is verl 0.9.1 `math_dapo.compute_score`'s on every input.
    """
    _check_strings(response, ground_truth)
    window = response[-RESPONSE_WINDOW:]
    captures = _ANSWER_LINE.findall(window)
    if captures:
        pred = dapo_normalize(captures[-1])
        if pred != _INVALID:
            return _verdict(pred == _dapo_ground_truth(ground_truth), pred)
    boxed = _last_boxed_content(window[-BOXED_WINDOW:])
    if boxed is not None:
        return _verdict(boxed == ground_truth, boxed)
    return _verdict(_dapo_ground_truth(ground_truth) == _INVALID, None)


def dapo_normalize(text: str) -> str:
    """The reference's Minerva normal form of an answer string (math_dapo's
    `normalize_final_answer`): the value after the last '=', the substitution and removal
    tables, the first `$…$` of each line, `\\text{…}`/`\\textbf{…}`/`\\overline{…}` unwrapped up
    to the first '}', `\\boxed{…}` up to the line's last '}', `\\frac12`/`\\sqrt2` shorthands,
    '$' dropped, commas dropped from a string of digits (`str.isdigit`), whitespace stripped.

    Linear in len(text); pure string work, nothing is parsed or evaluated.
    """
    s = text.rpartition("=")[2]
    for old, new in _SUBSTITUTIONS:
        s = s.replace(old, new)
    for expr in _REMOVED:
        s = s.replace(expr, "")
    s = _rewrite_tex(s)
    if s.replace(",", "").isdigit():  # before the strip, as in the reference
        s = s.replace(",", "")
    return s.strip()


@functools.lru_cache(maxsize=GROUND_TRUTH_CACHE)
def _dapo_ground_truth(ground_truth: str) -> str:
    return dapo_normalize(ground_truth)


# --- lenient: this module's own rule --------------------------------------------------------


def lenient_score(response: str, ground_truth: str) -> ScoreResult:
    """Eq. 7 reward by the `lenient` rule: the reference's steps with the deliberate differences
    of the module docstring (Unicode digits, `\\dfrac`, grouped numbers, `42.`, no sentinel)."""
    _check_strings(response, ground_truth)
    raw = extract_answer(response)
    if raw is None:
        return ScoreResult(score=-1.0, acc=0.0, pred=None)
    pred = lenient_normalize(raw)
    return _verdict(pred != "" and pred == _lenient_ground_truth(ground_truth), pred)


def extract_answer(response: str) -> str | None:
    """The raw answer a response states for the `lenient` rule (before normalisation), or None.

    The last `Answer: …` capture in the last 300 characters; failing that, the content of the
    last `\\boxed{…}` opened within the last 100 characters of that window, if its braces close.
    """
    window = response[-RESPONSE_WINDOW:]
    captures = _ANSWER_LINE.findall(window)
    if captures:
        return str(captures[-1])
    return _last_boxed_content(window[-BOXED_WINDOW:])


def lenient_normalize(text: str) -> str:
    """The `lenient` normal form of an answer string (see the module docstring).

    Linear in len(text); pure string work, nothing is parsed or evaluated.
    """
    s = _fold_unicode(text)
    s = s.rpartition("=")[2]  # the value after the last '=': "x = 5" → " 5"
    for old, new in _LENIENT_SUBSTITUTIONS:
        s = s.replace(old, new)
    for expr in _REMOVED:
        s = s.replace(expr, "")
    s = _rewrite_tex(s).strip()
    if _GROUPED_NUMBER.fullmatch(s):
        s = s.replace(",", "")
    integer = _INTEGER_AS_DECIMAL.fullmatch(s)
    if integer:
        s = integer.group(1)
    return s


@functools.lru_cache(maxsize=GROUND_TRUTH_CACHE)
def _lenient_ground_truth(ground_truth: str) -> str:
    return lenient_normalize(ground_truth)


# --- registry ------------------------------------------------------------------------------

GRADERS: dict[str, Grader] = {"dapo": math_score, "lenient": lenient_score}


def get_grader(name: str) -> Grader:
    """The grader registered under `name` (reward.grader)."""
    try:
        return GRADERS[name]
    except KeyError:
        raise ValueError(f"unknown grader {name!r}: use one of {', '.join(GRADERS)}") from None


# --- helpers -------------------------------------------------------------------------------


def _check_strings(response: object, ground_truth: object) -> None:
    if not isinstance(response, str) or not isinstance(ground_truth, str):
        raise TypeError(
            "a grader takes two strings, got "
            f"{type(response).__name__} and {type(ground_truth).__name__}"
        )


def _verdict(correct: bool, pred: str | None) -> ScoreResult:
    return ScoreResult(score=1.0 if correct else -1.0, acc=1.0 if correct else 0.0, pred=pred)


def _rewrite_tex(s: str) -> str:
    """The reference's regex rewrites, in its order. Its regexes use '.', which stops at a
    newline, so the first four act line by line; each is a single scan here."""
    s = _first_math_span_per_line(s)
    for opener in _LAZY_WRAPPERS:
        s = _unwrap_lazy(s, opener)
    s = _unwrap_boxed_greedy(s)
    s = _FRAC_SHORTHAND.sub(r"frac{\1}{\2}", s)
    s = _SQRT_SHORTHAND.sub(r"sqrt{\1}", s)
    return s.replace("$", "")


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


def _first_math_span_per_line(s: str) -> str:
    """`(.*?)(\\$)(.*?)(\\$)(.*)` → `$\\3$`: a line with two '$' keeps only its first `$…$`."""
    if s.count("$") < 2:
        return s
    out: list[str] = []
    emitted = line = 0  # s[:emitted] is in out; `line` starts a line not yet looked at
    while True:
        i = s.find("$", line)
        if i < 0:
            break
        nl = s.rfind("\n", line, i)
        start = line if nl < 0 else nl + 1
        end = s.find("\n", i)
        end = len(s) if end < 0 else end
        j = s.find("$", i + 1, end)
        if j >= 0:
            out += (s[emitted:start], s[i : j + 1])
            emitted = end
        line = end + 1
    out.append(s[emitted:])
    return "".join(out)


def _unwrap_lazy(s: str, opener: str) -> str:
    """`(opener)(.*?)(\\})` → content: `\\text{a}b}` → `ab}`, left to right, no overlap.

    An opener whose line holds no later '}' matches nothing, nor does any later opener of that
    line, so the scan moves to the next line. The next '}' and the next newline are kept as
    forward-only pointers: every character is looked at a bounded number of times.
    """
    if opener not in s:
        return s
    n = len(s)
    out: list[str] = []
    emitted = pos = 0
    close = newline = -1
    while True:
        i = s.find(opener, pos)
        if i < 0:
            break
        content = i + len(opener)
        if close < content:
            close = s.find("}", content)
            close = n if close < 0 else close
        if newline < content:
            newline = s.find("\n", content)
            newline = n if newline < 0 else newline
        if close < newline:
            out += (s[emitted:i], s[content:close])
            emitted = pos = close + 1
        else:
            pos = newline + 1
    out.append(s[emitted:])
    return "".join(out)


def _unwrap_boxed_greedy(s: str) -> str:
    """`(\\boxed\\{)(.*)(\\})` → content: from a line's first `\\boxed{` to the line's LAST '}'
    (greedy); a line matches at most once."""
    if _BOXED_OPEN not in s:
        return s
    n = len(s)
    out: list[str] = []
    emitted = pos = 0
    while True:
        i = s.find(_BOXED_OPEN, pos)
        if i < 0:
            break
        content = i + len(_BOXED_OPEN)
        end = s.find("\n", content)
        end = n if end < 0 else end
        j = s.rfind("}", content, end)
        if j >= 0:
            out += (s[emitted:i], s[content:j])
            emitted = j + 1
        pos = end + 1
    out.append(s[emitted:])
    return "".join(out)
