"""The `dapo` grader against the reference: verl 0.9.1's math_dapo.py, loaded by path from
.venv-verl (see conftest.py). `make test-reference`.

Two generators, both seeded: responses built the way models write them (an answer from a pool of
the awkward cases, dressed in trailing periods, `$…$`, boxes, units, several `Answer:` lines,
long reasoning before it) against ground truths that are the same answer, a near-variant or
another answer; and short random strings over an alphabet of the normaliser's trigger tokens.
For every pair the verdict (score and accuracy) and the judged answer must be the reference's
(its "[INVALID]" sentinel is None here), and so must the normal form of every string.
"""

from __future__ import annotations

import random
import types
from collections import Counter

import pytest

from dapo_core.algo.rewards import dapo_normalize, math_score

pytestmark = pytest.mark.reference

ANSWERS = [
    "42",
    "-7",
    "0",
    "123456789012345678901234567890",
    "5.0",
    "5.00",
    "3.14",
    "42.",
    "\\frac{1}{2}",
    "\\dfrac{1}{2}",
    "\\tfrac12",
    "\\frac12",
    "\\frac{\\sqrt{3}}{2}",
    "\\sqrt2",
    "\\sqrt{2}",
    "４２",
    "٤٢",
    "−7",
    "1,000",
    "1,000,000",
    "-1,234",
    "1,2,3",
    "3, 5, 7",
    "12 cm",
    "5 dollars",
    "2 students",
    "90^\\circ",
    "90^{\\circ}",
    "12 \\text{ inches}",
    "10\\text{ m}",
    "12 ft",
    "$42$",
    "$\\frac{3}{4}$",
    "The value is $\\frac{3}{4}$.",
    "\\text{(A)}",
    "\\textbf{7}",
    "\\overline{12}",
    "\\boxed{42}",
    "\\boxed{\\frac{1}{2}}",
    "x = 5",
    "y = 2x = \\dfrac{3}{4}",
    "(0, 1]",
    "\\{1, 2\\}",
    "**42**",
    "1e3",
    "2+2",
    "\\$5",
    "[INVALID]",
    "[IN VALID]",
    "cm",
    "",
    " ",
    "a 5",
    "an apple",
    "\\text{and}",
    "1{,}000",
    "\\frac{1}{2}.",
    "\\infty",
    "\\pi",
    "2\\sqrt{3}",
]

FILLER = [
    "Let me think. ",
    "We compute the sum step by step. ",
    "So x = 3 and y = 4, ",
    "\\boxed{7} is a guess, ",
    "Answer: 13\n",
    "so $a + b$ = $c$ here.\n",
    "{",
    "}",
    "\n",
    "The answer is ",
    "\\text{ units}",
]


def _variant(rng: random.Random, answer: str) -> str:
    """A ground truth related to `answer`: itself, dressed up, or a near-miss."""
    choice = rng.randrange(8)
    if choice == 0:
        return answer + "."
    if choice == 1:
        return f"${answer}$"
    if choice == 2:
        return f"\\boxed{{{answer}}}"
    if choice == 3:
        return f" {answer} "
    if choice == 4:
        return answer.replace("\\frac", "\\dfrac")
    if choice == 5:
        return answer + " cm"
    if choice == 6:
        return answer.replace(",", "")
    return f"x = {answer}"


def _reasoning(rng: random.Random, max_chars: int) -> str:
    parts: list[str] = []
    size = rng.randint(0, max_chars)
    while sum(map(len, parts)) < size:
        parts.append(rng.choice(FILLER))
    return "".join(parts)


def _response(rng: random.Random, answer: str) -> str:
    """A response stating `answer` the way a model might (or failing to)."""
    prefix = _reasoning(rng, rng.choice([0, 40, 400, 2_000]))
    style = rng.randrange(12)
    if style == 0:
        body = f"Answer: {answer}"
    elif style == 1:
        body = f"Answer: {answer}."
    elif style == 2:
        body = f"answer : ${answer}$"
    elif style == 3:
        body = f"ANSWER:\n{answer}"
    elif style == 4:
        body = f"so the result is \\boxed{{{answer}}}"
    elif style == 5:
        body = f"\\boxed{{{answer}}}" + "." * rng.choice([0, 50, 95, 120])
    elif style == 6:
        body = f"Answer: {rng.choice(ANSWERS)}\nWait, no.\nAnswer: {answer}"
    elif style == 7:
        body = f"Answer: {answer}\nHmm.\nAnswer: {rng.choice(ANSWERS)}"
    elif style == 8:
        body = f"Answer: {answer} Answer: {rng.choice(ANSWERS)}"
    elif style == 9:
        body = f"Answer: {answer}\r\n\\boxed{{{rng.choice(ANSWERS)}}}"
    elif style == 10:
        body = f"Answer: [INVALID]\n\\boxed{{{answer}}}"
    else:
        body = f"The answer is {answer}."
    suffix = rng.choice(["", "", "\n", "  ", "\nDone.", "\n" + "-" * 300])
    return prefix + body + suffix


def _structured_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        answer = rng.choice(ANSWERS)
        kind = rng.randrange(3)
        truth = answer if kind == 0 else _variant(rng, answer) if kind == 1 else rng.choice(ANSWERS)
        pairs.append((_response(rng, answer), truth))
    return pairs


TOKENS = [
    *("4", "2", "-", ".", ",", " ", "\n", "$", "{", "}", "=", "x", "a ", "an ", "\\$"),
    *("\\boxed{", "\\text{", "\\textbf{", "\\overline{", "frac", "\\dfrac", "sqrt", "cm"),
    *("Answer:", "answer :", "[INVALID]", "１", "²", "٣", "\\!", "^\\circ", "mbox", "\\text{m}"),
    *("\\;", "1,000", "[", "]", "INVALID", "\\text{and}", ",\\!", "{,}", '"'),
]


def _random_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        response = "".join(rng.choice(TOKENS) for _ in range(rng.randint(0, 16)))
        if rng.random() < 0.4:  # often the ground truth is what the response says
            truth = response.rpartition(":")[2]
        else:
            truth = "".join(rng.choice(TOKENS) for _ in range(rng.randint(0, 6)))
        pairs.append((response, truth))
    return pairs


STRUCTURED = _structured_pairs(600, seed=14)
RANDOM = _random_pairs(3_000, seed=16)


def _reference_verdict(math_dapo: types.ModuleType, response: str, truth: str) -> tuple:
    out = math_dapo.compute_score(response, truth)
    pred = None if out["pred"] == "[INVALID]" else out["pred"]
    return out["score"], float(bool(out["acc"])), pred


@pytest.mark.parametrize(("name", "pairs"), [("structured", STRUCTURED), ("random", RANDOM)])
def test_verdicts_equal_the_reference(
    math_dapo: types.ModuleType, name: str, pairs: list[tuple[str, str]]
) -> None:
    mismatches = []
    outcomes: Counter[str] = Counter()
    for response, truth in pairs:
        want = _reference_verdict(math_dapo, response, truth)
        r = math_score(response, truth)
        if (r.score, r.acc, r.pred) != want:
            mismatches.append((response, truth, want, (r.score, r.acc, r.pred)))
        outcomes["right" if want[1] else "wrong"] += 1
        outcomes["no-pred" if want[2] is None else "pred"] += 1
    assert not mismatches, f"{len(mismatches)} of {len(pairs)} differ, e.g. {mismatches[:3]}"
    # The comparison is not vacuous: both verdicts and silent responses occur often.
    assert min(outcomes.values()) >= len(pairs) // 50, outcomes


def test_the_structured_pairs_reach_every_branch(math_dapo: types.ModuleType) -> None:
    # Box fallback (pred is the raw box content) and the sentinel branch are both exercised.
    box = sentinel = 0
    for response, truth in STRUCTURED:
        out = math_dapo.compute_score(response, truth)
        window = response[-300:]
        has_line = bool(math_dapo.re.findall(r"(?i)Answer\s*:\s*([^\n]+)", window))
        box += not has_line and out["pred"] != "[INVALID]"
        sentinel += out["pred"] == "[INVALID]"
    assert box >= 30 and sentinel >= 30, (box, sentinel)


def test_normal_forms_equal_the_reference(math_dapo: types.ModuleType) -> None:
    texts = {t for pair in STRUCTURED + RANDOM for t in pair} | set(ANSWERS)
    texts |= {r.rpartition("Answer:")[2] for r, _ in STRUCTURED}
    differ = [
        (t, math_dapo.normalize_final_answer(t), dapo_normalize(t))
        for t in sorted(texts)
        if math_dapo.normalize_final_answer(t) != dapo_normalize(t)
    ]
    assert not differ, f"{len(differ)} of {len(texts)} differ, e.g. {differ[:3]}"
    assert len(texts) > 2_000


@pytest.mark.parametrize(
    "truth",
    [
        "\\text{" * 300,  # the reference's lazy regex rescans the rest of the line per opener
        "\\boxed{" * 300,
        "$" + "x" * 3_000,
        "\\text{a}" * 200 + "\n" + "\\text{" * 100 + "}" * 3,
    ],
)
def test_quadratic_inputs_get_the_reference_verdict(
    math_dapo: types.ModuleType, truth: str
) -> None:
    # Small enough for the reference to finish; ours is linear on the large versions
    # (tests/dapo_core/test_rewards.py::test_megabytes_of_adversarial_text_score_fast).
    for response in ("Answer: 1", f"Answer: {truth}", f"\\boxed{{{truth}}}"):
        assert math_score(response, truth).acc == _reference_verdict(math_dapo, response, truth)[1]
    assert dapo_normalize(truth) == math_dapo.normalize_final_answer(truth)
