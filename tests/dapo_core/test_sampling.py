"""Dynamic sampling's filter (DAPO §3.2, the constraint of Eq. 11): 0 < #correct < G."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.algo.advantages import group_advantages
from dapo_core.algo.sampling import informative_groups

FAST = settings(max_examples=60, deadline=None)


def test_hand_computed_groups() -> None:
    # G = 4: all correct (4 of 4) ✗, all wrong (0 of 4) ✗, 1 of 4 ✓, 3 of 4 ✓
    acc = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1])
    assert informative_groups(acc, 4).tolist() == [False, False, True, True]


def test_bool_and_float_inputs() -> None:
    acc = [True, False, True, True]
    assert informative_groups(torch.tensor(acc), 2).tolist() == [True, False]
    assert informative_groups(torch.tensor(acc, dtype=torch.float32), 2).tolist() == [True, False]


def test_group_of_one_is_never_informative() -> None:
    assert informative_groups(torch.tensor([1, 0, 1]), 1).tolist() == [False, False, False]


def test_shaped_rewards_are_refused() -> None:
    # ±1 scores (or scores plus an overlong penalty) are not accuracies.
    with pytest.raises(ValueError, match="not the shaped reward"):
        informative_groups(torch.tensor([1.0, -1.0, -1.25, 1.0]), 2)


@pytest.mark.parametrize(
    ("acc", "g", "match"),
    [
        (torch.tensor([1, 0, 1]), 2, "do not split into groups of 2"),
        (torch.tensor([1, 0]), 0, "at least one response"),
        (torch.tensor([[1, 0]]), 2, r"flat \[P\*G\]"),
    ],
)
def test_bad_input(acc: torch.Tensor, g: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        informative_groups(acc, g)


groups = st.integers(1, 8).flatmap(
    lambda g: st.tuples(
        st.just(g),
        st.lists(st.lists(st.booleans(), min_size=g, max_size=g), min_size=1, max_size=6),
    )
)


@FAST
@given(groups)
def test_kept_iff_group_has_a_right_and_a_wrong_answer(data: tuple[int, list[list[bool]]]) -> None:
    g, rows = data
    acc = torch.tensor([a for row in rows for a in row])
    kept = informative_groups(acc, g).tolist()
    assert kept == [any(row) and not all(row) for row in rows]


@FAST
@given(groups, st.booleans(), st.integers(0, 5))
def test_a_constant_group_is_never_kept(
    data: tuple[int, list[list[bool]]], value: bool, where: int
) -> None:
    g, rows = data
    rows = list(rows)
    at = where % (len(rows) + 1)
    rows.insert(at, [value] * g)
    kept = informative_groups(torch.tensor([a for row in rows for a in row]), g)
    assert not bool(kept[at])


@FAST
@given(groups)
def test_kept_groups_are_exactly_those_with_nonzero_advantages(
    data: tuple[int, list[list[bool]]],
) -> None:
    # With the ±1 correctness reward, a group teaches something iff its advantages are not all 0.
    g, rows = data
    acc = torch.tensor([a for row in rows for a in row], dtype=torch.float32)
    adv = group_advantages(2 * acc - 1, g).view(-1, g)
    assert informative_groups(acc, g).tolist() == (adv != 0).any(dim=1).tolist()
