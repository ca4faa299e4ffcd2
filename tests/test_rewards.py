"""The DAPO-Math rule-based reward (DAPO §2.4, Eq. 7): R = +1 if is_equivalent(ŷ, y) else −1.

Rows marked "≠ verl" pin a deliberate difference from verl's math_dapo.py (see the module
docstring of dapo_core.rewards for why); every other row is verl's verdict too.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.rewards import ScoreResult, extract_answer, math_score, normalize_answer

FAST = settings(max_examples=200, deadline=None)

D280 = "1" + "2345678901" * 27 + "987654321"  # 280 digits: "Answer: " + D280 fits in 300 chars
D300 = "9" * 300
PAD = "Some reasoning. " * 40  # 640 characters: pushes anything before it out of the window

CASES = [
    # (response, ground truth, acc, pred), id = why
    pytest.param("Answer: 42", "42", 1, "42", id="plain"),
    pytest.param("answer: 42", "42", 1, "42", id="lowercase-answer"),
    pytest.param("ANSWER:42", "42", 1, "42", id="uppercase-no-space"),
    pytest.param("Answer : 42", "42", 1, "42", id="space-before-colon"),
    pytest.param("Answer:\n42", "42", 1, "42", id="colon-then-newline-\\s*-crosses-it"),
    pytest.param("Answer: 43", "42", 0, "43", id="wrong-answer"),
    pytest.param("Answer: 41\nwait, no.\nAnswer: 42", "42", 1, "42", id="several-lines-last-wins"),
    pytest.param("Answer: 42\nhmm.\nAnswer: 41", "42", 0, "41", id="last-wins-even-if-wrong"),
    pytest.param(
        "Answer: x Answer: 5", "5", 0, "xAnswer:5", id="one-match-per-line-greedy-capture"
    ),
    pytest.param("The answer is 42.", "42", 0, None, id="no-answer-line-no-box"),
    pytest.param("", "42", 0, None, id="empty-response"),
    pytest.param("Answer: 42", "", 0, "42", id="empty-ground-truth"),
    pytest.param("Answer:   \n", "", 0, "", id="blank-never-matches-blank ≠ verl"),
    pytest.param("Answer: cm", "", 0, "", id="normalized-to-empty-never-matches ≠ verl"),
    pytest.param("so \\boxed{42}", "42", 1, "42", id="boxed-fallback"),
    pytest.param("\\boxed{41} or \\boxed{42}", "42", 1, "42", id="last-box-wins"),
    pytest.param("\\boxed{42}" + "." * 95, "42", 0, None, id="box-opened-before-last-100"),
    pytest.param(PAD + "\\boxed{42}" + "." * 80, "42", 1, "42", id="box-opened-within-last-100"),
    pytest.param(
        "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1, "\\frac{1}{2}", id="boxed-nested-braces"
    ),
    pytest.param(
        "\\boxed{\\frac{\\sqrt{3}}{2}}",
        "\\frac{\\sqrt{3}}{2}",
        1,
        "\\frac{\\sqrt{3}}{2}",
        id="boxed-deeply-nested",
    ),
    pytest.param("\\boxed{42} \\boxed{4", "42", 0, None, id="last-box-unclosed-no-fallback"),
    pytest.param("\\boxed{41}\nAnswer: 42", "42", 1, "42", id="answer-line-beats-box"),
    pytest.param("Answer: 41\n\\boxed{42}", "42", 0, "41", id="answer-line-beats-later-box"),
    pytest.param("Answer: \\boxed{42}", "42", 1, "42", id="boxed-inside-answer-line"),
    pytest.param("Answer: 12 cm", "12", 1, "12", id="unit-cm"),
    pytest.param("Answer: 12 \\text{ inches}", "12", 1, "12", id="unit-in-text"),
    pytest.param("Answer: 5 dollars", "5", 1, "5", id="unit-dollars"),
    pytest.param("Answer: 2 students", "2", 1, "2", id="unit-students"),
    pytest.param("Answer: 12 ft", "12", 0, "12ft", id="ft-is-not-in-verls-unit-list"),
    pytest.param("Answer: 90^\\circ", "90", 1, "90", id="degree-sign"),
    pytest.param("Answer: 12", "12 \\text{cm}", 1, "12", id="ground-truth-normalized-too"),
    pytest.param("Answer: 3", "\\boxed{3}", 1, "3", id="boxed-ground-truth"),
    pytest.param("Answer: $42$", "42", 1, "42", id="dollar-math"),
    pytest.param(
        "Answer: The value is $\\frac{3}{4}$.",
        "\\frac{3}{4}",
        1,
        "\\frac{3}{4}",
        id="text-around-math-dropped",
    ),
    pytest.param("Answer: \\text{(A)}", "(A)", 1, "(A)", id="text-wrapper"),
    pytest.param("Answer: \\frac12", "\\frac{1}{2}", 1, "\\frac{1}{2}", id="frac-shorthand"),
    pytest.param("Answer: \\dfrac{1}{2}", "\\frac{1}{2}", 1, "\\frac{1}{2}", id="dfrac ≠ verl"),
    pytest.param("Answer: \\frac{1}{2}", "1/2", 0, "\\frac{1}{2}", id="no-fraction-arithmetic"),
    pytest.param(
        "Answer: \\tfrac12", "\\frac{1}{2}", 1, "\\frac{1}{2}", id="tfrac-shorthand ≠ verl"
    ),
    pytest.param("Answer: 0.5", "\\frac{1}{2}", 0, "0.5", id="no-decimal-fraction-equivalence"),
    pytest.param("Answer: \\sqrt2", "\\sqrt{2}", 1, "\\sqrt{2}", id="sqrt-shorthand"),
    pytest.param("Answer: x = 5", "5", 1, "5", id="after-last-equals"),
    pytest.param("Answer: 2+2", "4", 0, "2+2", id="never-evaluated"),
    pytest.param("Answer: 1e3", "1000", 0, "1e3", id="no-numeric-parsing"),
    pytest.param("Answer: 1,000", "1000", 1, "1000", id="digit-commas"),
    pytest.param("Answer: 1,000,000", "1000000", 1, "1000000", id="digit-commas-millions"),
    pytest.param("Answer: $1,000$", "1000", 1, "1000", id="digit-commas-in-math"),
    pytest.param("Answer: 1{,}000", "1000", 1, "1000", id="latex-thousands-separator"),
    pytest.param("Answer: 1,2,3", "123", 0, "1,2,3", id="list-is-not-a-grouped-number ≠ verl"),
    # MATH-500 has the answer "3, 5, 7"; verl turns it into "357", so "357" would score +1.
    pytest.param("Answer: 357", "3, 5, 7", 0, "357", id="math500-list-answer ≠ verl"),
    pytest.param("Answer: 5.0", "5", 1, "5", id="integer-float ≠ verl"),
    pytest.param("Answer: 6.00", "6", 1, "6", id="integer-float-two-zeros ≠ verl"),
    pytest.param("Answer: 42.", "42", 1, "42", id="trailing-period-on-integer ≠ verl"),
    pytest.param(
        "Answer: \\frac{1}{2}.",
        "\\frac{1}{2}",
        0,
        "\\frac{1}{2}.",
        id="trailing-period-on-non-integer-kept",
    ),
    pytest.param("Answer: 5.5", "5", 0, "5.5", id="real-decimal-kept"),
    pytest.param("Answer: 5.50", "5.5", 0, "5.50", id="non-integer-trailing-zeros-kept"),
    pytest.param("Answer: -7", "-7", 1, "-7", id="negative"),
    pytest.param("Answer: -7", "7", 0, "-7", id="sign-matters"),
    pytest.param("Answer: −7", "-7", 1, "-7", id="unicode-minus ≠ verl"),
    pytest.param("Answer: -1,234", "-1234", 1, "-1234", id="negative-grouped ≠ verl"),
    pytest.param("Answer: ４２", "42", 1, "42", id="fullwidth-digits ≠ verl"),
    pytest.param("Answer: ٤٢", "42", 1, "42", id="arabic-indic-digits ≠ verl"),
    pytest.param("Answer: ४२", "४२", 1, "42", id="devanagari-both-sides ≠ verl"),
    pytest.param("Answer: 42", "４２", 1, "42", id="fullwidth-ground-truth ≠ verl"),
    pytest.param("Answer: " + D280, D280, 1, D280, id="280-digit-integer"),
    pytest.param(
        "Answer: " + D280[:-1] + "0", D280, 0, D280[:-1] + "0", id="280-digits-differ-in-last"
    ),
    pytest.param("Answer: " + D300, D300, 0, None, id="300-digits-push-answer-out-of-window"),
    pytest.param("Answer: 42\n" + PAD, "42", 0, None, id="answer-before-window-ignored"),
    pytest.param("Answer: 42\n" + PAD + "Answer: 41", "42", 0, "41", id="only-window-counts"),
    pytest.param("Answer: 7\n" + PAD + "Answer: 42", "42", 1, "42", id="early-wrong-ignored"),
    pytest.param("Answer: **42**", "42", 0, "**42**", id="markdown-not-stripped-like-verl"),
    pytest.param("Answer: 42   ", "42", 1, "42", id="trailing-spaces"),
    pytest.param("Answer: 42\r\n", "42", 1, "42", id="crlf"),
]


@pytest.mark.parametrize(("response", "ground_truth", "acc", "pred"), CASES)
def test_reward_table(response: str, ground_truth: str, acc: int, pred: str | None) -> None:
    r = math_score(response, ground_truth)
    assert r.pred == pred
    assert r.acc == float(acc)
    assert r.score == (1.0 if acc else -1.0)


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 40


def test_result_has_the_names_the_trainer_reads() -> None:
    r = math_score("Answer: 3", "3")
    assert r == ScoreResult(score=1.0, acc=1.0, pred="3")
    assert [f.name for f in dataclasses.fields(ScoreResult)] == ["score", "acc", "pred"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.score = -1.0  # type: ignore[misc]


def test_non_string_ground_truth_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="two strings"):
        math_score("Answer: 42", 42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("response", "raw"),
    [
        ("Answer:   \\boxed{42} cm", "\\boxed{42} cm"),  # raw: leading spaces eaten by \s*
        ("x\nanswer: 7\nAnswer: 8 \n", "8 "),
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("nothing here", None),
        ("\\boxed{4", None),
    ],
)
def test_extract_answer_raw(response: str, raw: str | None) -> None:
    assert extract_answer(response) == raw


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("\\frac12", "\\frac{1}{2}"),
        ("\\fracabc", "\\frac{a}{b}c"),  # Minerva's shorthand rule takes two characters only
        ("\\sqrtab", "\\sqrt{a}b"),
        ("y = 2x = \\dfrac{3}{4}", "\\frac{3}{4}"),
        ("10\\text{ m}", "10"),  # "\text{m}" → "\text{}" → removed
        ("\\text{a}b}", "ab}"),  # lazy: up to the first closing brace
        ("\\overline{12}", "12"),
        ("\\textbf{7}", "7"),
        ("$x$ and $y$", "x"),  # only the first $…$ span of a line survives
        ("\\$5", "5"),
        ("1,234.5", "1234.5"),
        ("12,34", "12,34"),  # not a well-formed digit group: left alone
        ("-0.000", "-0"),
        ("٣٫١٤", "3٫14"),  # the Arabic decimal separator is not '.': no integer rule
    ],
)
def test_normalize_answer(text: str, normalized: str) -> None:
    assert normalize_answer(text) == normalized


# --- properties ------------------------------------------------------------------------------

INTS = st.integers(min_value=-(10**250), max_value=10**250)


@FAST
@given(INTS)
def test_any_integer_stated_is_correct(n: int) -> None:
    r = math_score(f"Let me compute.\nSo we get {n}.\nAnswer: {n}", str(n))
    assert r.acc == 1.0
    assert r.score == 1.0
    assert r.pred == str(n)


@FAST
@given(INTS, INTS)
def test_a_different_integer_is_wrong(n: int, m: int) -> None:
    if n == m:
        m = n + 1
    r = math_score(f"Answer: {n}", str(m))
    assert r.acc == 0.0
    assert r.score == -1.0


@FAST
@given(st.text(), st.text())
def test_never_raises_and_verdict_is_consistent(response: str, ground_truth: str) -> None:
    r = math_score(response, ground_truth)
    assert r.score in (1.0, -1.0)
    assert r.acc == (1.0 if r.score > 0 else 0.0)
    assert (r.pred is None) == (extract_answer(response) is None)
    if r.acc:
        assert r.pred == normalize_answer(ground_truth) != ""


@FAST
@given(st.text(alphabet=st.characters(blacklist_characters=":")), INTS)
def test_reasoning_before_the_answer_line_does_not_matter(prefix: str, n: int) -> None:
    # Any text without a colon (so it holds no "Answer:" of its own), however long.
    assert math_score(f"{prefix}\nAnswer: {n}", str(n)).acc == 1.0


@FAST
@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200))
def test_stating_the_ground_truth_verbatim_is_correct(answer: str) -> None:
    # Self-consistency: "Answer: y" against y is correct whenever y normalizes to something.
    if normalize_answer(answer) != "":
        assert math_score(f"Answer: {answer}", answer).acc == 1.0


# --- bounded time ----------------------------------------------------------------------------

ADVERSARIAL = [
    pytest.param("Answer:" * 200_000, "42", id="200k-answer-colons"),
    pytest.param("Answer: 1\n" * 5_000 + "Answer: 42", "42", id="5k-answer-lines"),
    pytest.param("{" * 1_000_000, "42", id="1M-open-braces"),
    pytest.param("\\boxed{" * 100_000, "42", id="100k-unclosed-boxes"),
    pytest.param("a" * 3_000_000 + "\nAnswer: 42", "42", id="3MB-then-answer"),
    pytest.param("Answer: 1", "\\text{" * 100_000, id="100k-unclosed-text-in-ground-truth"),
    pytest.param("Answer: 1", "$" + "x" * 1_000_000, id="1M-after-lone-dollar-in-ground-truth"),
    pytest.param("Answer: 1", "\\boxed{" * 100_000, id="100k-boxes-in-ground-truth"),
    pytest.param("Answer: 1", "frac" * 250_000 + "٤" * 100_000, id="1M-frac-and-unicode-gt"),
]


@pytest.mark.timeout(30)  # a quadratic regression fails here rather than hanging the suite
@pytest.mark.parametrize(("response", "ground_truth"), ADVERSARIAL)
def test_megabytes_of_adversarial_text_score_fast(response: str, ground_truth: str) -> None:
    # A correctness bound, not a benchmark: verl's normaliser needs ~97 s on
    # "\text{" * 20_000 (quadratic regex backtracking); here each case is linear.
    t0 = time.perf_counter()
    r = math_score(response, ground_truth)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, f"{elapsed:.2f} s"
    assert r.score in (1.0, -1.0)


def test_adversarial_answers_keep_their_meaning() -> None:
    # The fast paths above still give the rule's verdicts.
    assert math_score("Answer: 1\n" * 5_000 + "Answer: 42", "42").acc == 1.0
    assert math_score("a" * 3_000_000 + "\nAnswer: 42", "42").acc == 1.0
    assert math_score("\\boxed{" * 100_000, "42").pred is None


def test_overlong_penalty_is_reachable_by_its_design_name_without_eager_torch() -> None:
    # DESIGN.md names dapo_core.rewards.overlong_penalty; the math reward itself stays torch-free.
    import subprocess
    import sys

    code = "import sys, dapo_core.rewards; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

    import dapo_core.overlong
    import dapo_core.rewards

    assert dapo_core.rewards.overlong_penalty is dapo_core.overlong.overlong_penalty
