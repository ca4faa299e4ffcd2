"""Which rollouts a step keeps for the rollout browser (dapo_core.train.rollout.kept_positions):
whole groups by default, a bounded number of them; single responses only below one group."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dapo_core.setup.config import ExperimentConfig
from dapo_core.train.rollout import kept_positions


class _Group:
    """What kept_positions reads of a Group: its rollouts (only how many)."""

    def __init__(self, n: int) -> None:
        self.rollouts = [object()] * n


def test_whole_groups_evenly_spaced() -> None:
    groups = [_Group(8) for _ in range(16)]
    # 16 rollouts at G = 8: groups 0 and 16 // 2 = 8, every member of each
    kept = kept_positions(groups, 16)
    assert kept == [(0, j) for j in range(8)] + [(8, j) for j in range(8)]
    # 20 rollouts still make 2 whole groups (the bound is never passed: 16 <= 20)
    assert kept_positions(groups, 20) == kept
    # more than the step has: every group, once
    assert kept_positions(groups[:3], 1000) == [(g, j) for g in range(3) for j in range(8)]


def test_below_one_group_single_responses_as_before() -> None:
    # 3 of 4 groups of 4: evenly spaced over the 16 responses -> 0, 5, 10
    groups = [_Group(4) for _ in range(4)]
    assert kept_positions(groups, 3) == [(0, 0), (1, 1), (2, 2)]
    assert kept_positions(groups, 0) == [] and kept_positions([], 16) == []


def test_the_default_keeps_two_whole_groups_of_the_default_size() -> None:
    cfg = ExperimentConfig()
    size, k = cfg.rollout.group_size, cfg.run.samples_per_step
    assert k // size >= 1  # a whole group by default (the browser was "1 of 8 stored")
    kept = kept_positions([_Group(size) for _ in range(32)], k)
    assert len(kept) == (k // size) * size <= k
    assert len({g for g, _ in kept}) == k // size


@given(
    sizes=st.integers(min_value=2, max_value=16),
    n_groups=st.integers(min_value=1, max_value=40),
    k=st.integers(min_value=0, max_value=200),
)
def test_bounded_and_whole(sizes: int, n_groups: int, k: int) -> None:
    groups = [_Group(sizes) for _ in range(n_groups)]
    kept = kept_positions(groups, k)
    assert len(kept) <= k and len(set(kept)) == len(kept)
    if k >= sizes:  # whole groups only
        by_group: dict[int, int] = {}
        for g, _ in kept:
            by_group[g] = by_group.get(g, 0) + 1
        assert set(by_group.values()) == {sizes}
        assert len(by_group) == min(k // sizes, n_groups)
