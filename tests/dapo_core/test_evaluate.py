"""avg@k, pass@k (unbiased estimator) and cons@k (majority vote)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.algo.evaluate import avg_at_k, cons_at_k, majority_vote, pass_at_k, summarize

FAST = settings(max_examples=80, deadline=None)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 0.5),  # 1 − C(3,2)/C(4,2) = 1 − 3/6
        (5, 2, 2, 0.7),  # 1 − C(3,2)/C(5,2) = 1 − 3/10
        (10, 3, 1, 0.3),  # pass@1 = c/n
        (10, 0, 5, 0.0),  # no correct sample
        (10, 10, 3, 1.0),  # all correct
        (6, 4, 3, 1.0),  # n − c = 2 < k = 3: every 3-subset holds a correct one
        (32, 1, 32, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@FAST
@given(
    st.integers(1, 60).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_properties(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    p = pass_at_k(n, c, k)
    assert 0.0 <= p <= 1.0
    assert p == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))  # the binomial form
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    if k < n:
        assert pass_at_k(n, c, k + 1) >= p - 1e-12  # grows with k
    if c < n:
        assert pass_at_k(n, c + 1, k) >= p - 1e-12  # grows with c
    if n - c < k:
        assert p == 1.0


def test_pass_at_k_large_n_is_stable() -> None:
    # C(1000, 500) overflows a float; the product form does not: 1 − C(999,500)/C(1000,500) = 0.5
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_validation(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_avg_at_k_hand_computed() -> None:
    # problem 1: 1/4 correct; problem 2: 2/2 → (0.25 + 1) / 2 = 0.625
    assert avg_at_k([[True, False, False, False], [True, True]]) == pytest.approx(0.625)


def test_avg_at_k_validation() -> None:
    with pytest.raises(ValueError, match="no problems"):
        avg_at_k([])
    with pytest.raises(ValueError, match="problem 1 has no samples"):
        avg_at_k([[True], []])


PREDS = [
    ["3", "4", "3", None],  # "3" wins 2:1 and a "3" was judged correct → hit
    ["5", "6", "6", "5"],  # tie 2:2, "5" came first; sample 3 ("5") judged correct → hit
    [None, None],  # no answer at all → miss
    ["7", "7", "8"],  # "7" wins but no "7" was correct → miss
]
CORRECT = [
    [True, False, True, False],
    [False, False, False, True],
    [False, False],
    [False, False, True],
]


def test_majority_vote() -> None:
    assert majority_vote(["a", "b", "b"]) == "b"
    assert majority_vote(["b", "a", "a", "b"]) == "b"  # tie: first occurrence
    assert majority_vote([None, None, "x"]) == "x"  # None never votes
    assert majority_vote([None]) is None


def test_cons_at_k_hand_computed() -> None:
    # hits on problems 1 and 2 of 4 → 0.5
    assert cons_at_k(PREDS, CORRECT) == pytest.approx(0.5)


def test_cons_at_k_validation() -> None:
    with pytest.raises(ValueError, match="2 predictions but 1 judgements"):
        cons_at_k([["a", "b"]], [[True]])
    with pytest.raises(ValueError, match="1 prediction lists for 2 problems"):
        cons_at_k([["a"]], [[True], [False]])


def test_summarize_hand_computed() -> None:
    out = summarize(CORRECT, PREDS, ["3", "5", "1", "8"])
    # avg: (2/4 + 1/4 + 0/2 + 1/3) / 4 = (0.5 + 0.25 + 0 + 0.333333) / 4 = 0.270833
    assert out["avg_at_k"] == pytest.approx(0.270833, abs=1e-6)
    # pass@n per problem: 1, 1, 0, 1 → 0.75
    assert out["pass_at_k"] == pytest.approx(0.75)
    assert out["cons_at_k"] == pytest.approx(0.5)
    assert out["n_problems"] == 4


def test_summarize_with_smaller_k() -> None:
    correct = [[True, False, False, False], [True, True, False, False]]
    preds = [["1", "2", "3", "4"], ["1", "1", "2", "3"]]
    # pass@2: 1 − C(3,2)/C(4,2) = 0.5 and 1 − C(2,2)/C(4,2) = 1 − 1/6 = 0.833333 → 0.666667
    assert summarize(correct, preds, k=2)["pass_at_k"] == pytest.approx(0.666667, abs=1e-6)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        summarize(correct, preds, k=5)
    with pytest.raises(ValueError, match="1 reference answers for 2 problems"):
        summarize(correct, preds, ["1"])


@FAST
@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=8), min_size=1, max_size=6))
def test_metrics_lie_in_unit_interval_and_are_ordered(correct: list[list[bool]]) -> None:
    preds = [[str(j % 3) for j in range(len(s))] for s in correct]
    out = summarize(correct, preds)
    for key in ("avg_at_k", "pass_at_k", "cons_at_k"):
        assert 0.0 <= out[key] <= 1.0
    assert out["pass_at_k"] >= out["avg_at_k"] - 1e-12  # pass@n ≥ pass@1 = avg
    assert (
        out["pass_at_k"] >= out["cons_at_k"] - 1e-12
    )  # a correct majority implies a correct sample
